"""The checks of `serve.routing=prefix` on a serving `replicas=2` job, shared by the local launch
(tests/integration/test_frontend.py) and the two-node Slurm launch (tests/integration/test_slurm_launch.py)."""

from __future__ import annotations

import json
import urllib.request

from launcher.handoff.endpoint import EndpointRecord


def routed(metrics_url: str) -> list:
    """Requests the front end routed to each replica (its /metrics)."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    return [
        int(float(ln.rsplit(" ", 1)[1]))
        for ln in text.splitlines()
        if ln.startswith("llmlaunch_frontend_requests_total{")
    ]


def engine_tokens(metrics_url: str) -> dict:
    """The replicas' engines' prompt tokens the front end's /metrics shows: {(replica, kind): tokens}."""
    import re

    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    rows = re.findall(
        r'^llmlaunch_frontend_replica_prompt_tokens_total\{replica="(\d+)",addr="[^"]*",kind="(\w+)"\} (\d+)$',
        text,
        re.M,
    )
    return {(int(r), kind): int(n) for r, kind, n in rows}


def check_prefix_routing(ep: EndpointRecord, ready: list, tokenizer_dir) -> None:
    """Each turn of a conversation sends the whole history: every turn goes to the replica the first went to, whose
    prefix cache holds the history (its engine's own counters say each later turn prefilled only what is new), while
    requests of other prefixes still reach the other replica; and requests of one session (X-Session-ID on the
    OpenAI API) reach one replica whatever their prompts; the front end's /metrics shows each replica's engine's own
    prompt and cached prompt tokens.  ready: the replica leaders' ready records, rank order."""
    from transformers import AutoTokenizer

    from launcher.client.request import Generation
    from launcher.client.stream import generate
    from launcher.python_backend.timings import settled_engine_metrics

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    engines = [f"http://{r.get('addr', '127.0.0.1')}:{r['ports']['metrics_port']}/metrics" for r in ready]
    assert len(engines) == 2, ready
    history = "You are a careful assistant who answers in one short sentence. " * 8 + "User: the sky?\nAssistant:"
    prompts, cached = [], []
    for turn in range(3):
        before = [settled_engine_metrics(u, ep.model, wait_s=10)["cached_prompt_tokens"] for u in engines]
        rec = generate(ep.url, ep.model, Generation(history, max_tokens=8, ignore_eos=True))
        assert not rec.error, rec.error
        after = [settled_engine_metrics(u, ep.model, wait_s=10)["cached_prompt_tokens"] for u in engines]
        cached.append([a - b for a, b in zip(after, before)])
        prompts.append(history)
        history += rec.text + f"\nUser: and question {turn}?\nAssistant:"
    counts = routed(ep.metrics_url)
    home = counts.index(3)
    assert counts == [3 if i == home else 0 for i in range(2)], counts
    ids = [tok(p).input_ids for p in prompts]
    for turn in (1, 2):  # every full block of the turn before came from the cache, on the home replica only
        same = [a == b for a, b in zip(ids[turn - 1], ids[turn])]
        common = same.index(False) if False in same else len(same)
        assert cached[turn][home] >= common // 16 * 16 > 0, (cached, common)
        assert cached[turn][1 - home] == 0, cached
    # other prefixes: a new one goes where its hash says, so some of a few reach the other replica
    for g in range(6):
        rec = generate(ep.url, ep.model, Generation(f"Group {g}. " * 40, max_tokens=2, ignore_eos=True))
        assert not rec.error, rec.error
    assert routed(ep.metrics_url)[1 - home] > 0, routed(ep.metrics_url)
    start = routed(ep.metrics_url)
    for q in range(4):
        body = json.dumps({"model": ep.model, "prompt": f"Unrelated question {q}. " * 30, "max_tokens": 2})
        req = urllib.request.Request(
            f"{ep.openai_url}/completions",
            body.encode(),
            {"Content-Type": "application/json", "X-Session-ID": "chat-7"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200
    added = [b - a for a, b in zip(start, routed(ep.metrics_url))]
    assert sorted(added) == [0, 4], added
    # the engines' own prefix-cache counters, as the front end's /metrics shows them beside its routing counters
    own = [settled_engine_metrics(u, ep.model, wait_s=10) for u in engines]
    kinds = (("admitted", "prompt_tokens"), ("cached", "cached_prompt_tokens"))
    expected = {(i, kind): int(o[key]) for i, o in enumerate(own) for kind, key in kinds}
    assert engine_tokens(ep.metrics_url) == expected, (engine_tokens(ep.metrics_url), expected)
    assert expected[(home, "cached")] > 0, expected


def predicted_tokens(metrics_url: str, block_size: int = 16) -> list:
    """The prompt tokens the front end predicted each replica's engine held (serve.routing=kv: whole token blocks)."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    return [
        int(float(ln.rsplit(" ", 1)[1])) * block_size
        for ln in text.splitlines()
        if ln.startswith("llmlaunch_frontend_predicted_cached_blocks_total{")
    ]


def check_kv_routing(ep: EndpointRecord, ready: list, tokenizer_dir) -> None:
    """`serve.routing=kv` on top of what check_prefix_routing checks: what the front end predicted each replica's
    engine held, from the engines' KV-cache events, is what the engines found in their prefix caches, request for
    request, and stays so once other prompts evicted a conversation's blocks (the replicas' pools hold ~1,000 tokens:
    engine.kv_cache_memory): the front end then credits nobody with them, where routing by where prompts were sent
    still would."""
    import random

    from launcher.client.request import Generation
    from launcher.client.stream import generate

    check_prefix_routing(ep, ready, tokenizer_dir)
    actual = lambda: [engine_tokens(ep.metrics_url)[(i, "cached")] for i in range(2)]  # noqa: E731
    assert predicted_tokens(ep.metrics_url) == actual(), (predicted_tokens(ep.metrics_url), actual())
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    words = "river stone cloud lamp orbit maple quartz harbor violet engine meadow copper".split()
    rng = random.Random(7)
    history = "Notes on a long trip, kept day by day. " * 6
    for turn in range(2):
        rec = generate(ep.url, ep.model, Generation(history, max_tokens=4, ignore_eos=True))
        assert not rec.error, rec.error
        last, history = history, history + rec.text + f" Day {turn}: more."
    for i in range(16):  # other prompts, new to both replicas, fill both pools (~1,000 tokens each)
        flood = f"{i} " + " ".join(rng.choice(words) for _ in range(220))
        rec = generate(ep.url, ep.model, Generation(flood, max_tokens=2, ignore_eos=True))
        assert not rec.error, rec.error
    assert all(n > 0 for n in routed(ep.metrics_url)), routed(ep.metrics_url)
    before, seen = actual(), predicted_tokens(ep.metrics_url)
    rec = generate(ep.url, ep.model, Generation(history, max_tokens=4, ignore_eos=True))
    assert not rec.error, rec.error
    assert predicted_tokens(ep.metrics_url) == actual(), (predicted_tokens(ep.metrics_url), actual())
    gained = [a - b for a, b in zip(actual(), before)]
    assert gained == [p - s for p, s in zip(predicted_tokens(ep.metrics_url), seen)]
    a, b = tok(last).input_ids, tok(history).input_ids
    common = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert sum(gained) < common // 16 * 16, (gained, common)  # the flood evicted the conversation's blocks
