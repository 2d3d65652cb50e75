"""Keys and values moved between two hf engines on CPU (launcher/hf/kv_transfer.py), the engine's part of
disaggregated prefill and decode: one engine computes a prompt, its cached blocks leave it as a KVPrefix (through the
wire form), a second engine stores them and computes only the rest of the prompt, and its greedy answer is
transformers' generate."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from launcher.hf.engine import InvalidRequest, SamplingParams  # noqa: E402
from launcher.hf.kv_transfer import KVPrefix  # noqa: E402
from tests.integration.test_hf_engine import PROMPTS, collect, joined, make_engine  # noqa: E402

BS = 4  # tokens a block: small, so the tiny prompts fill several
LONG = "The history of the river begins in the mountains, where snow melts " * 3


@pytest.fixture(scope="module")
def pair(tiny_model_dir):
    prefill = make_engine(tiny_model_dir, device="cpu", max_num_seqs=4, block_size=BS).start()
    decode = make_engine(tiny_model_dir, device="cpu", max_num_seqs=4, block_size=BS).start()
    yield prefill, decode
    prefill.shutdown()
    decode.shutdown()


def moved(prefill, prompt_ids) -> KVPrefix:
    """A prefill's work on `prompt_ids` (one token), exported and through the wire form."""
    prefill.generate(prompt_ids, SamplingParams(max_tokens=1), timeout=60)
    return KVPrefix.from_bytes(prefill.export_prefix(prompt_ids).to_bytes())


def test_a_prompt_prefilled_on_one_engine_is_decoded_on_another_as_generate(pair, reference):
    """Every prompt's whole blocks but the last token's are computed on the prefill engine only: the decode engine
    stores them, finds them in its prefix cache, prefills the rest, and answers as generate does."""
    prefill, decode = pair
    for i, prompt in enumerate(PROMPTS + [LONG]):
        ids = prefill.tokenizer(prompt).input_ids
        prefix = moved(prefill, ids)
        whole = (len(ids) - 1) // BS * BS
        assert list(prefix.tokens) == ids[:whole] and prefix.num_blocks == whole // BS
        assert prefix.nbytes == whole * 4 * 2 * 64 * 2 * 4  # 4 layers, keys and values, 2 heads x 64, float32
        cached, imported = decode.stats.cached_prompt_tokens, decode.stats.imported_prompt_tokens
        done, outs = collect(decode, ids, SamplingParams(max_tokens=12), request_id=f"moved-{i}", kv_prefix=prefix)
        assert done.wait(60)
        assert joined(outs)[1] == reference(prompt, 12)[0], prompt
        assert decode.stats.imported_prompt_tokens - imported == whole
        assert decode.stats.cached_prompt_tokens - cached == whole  # found, not prefilled again


def test_the_decode_engine_uses_the_moved_keys_and_values_not_its_own(pair, reference):
    """The same prompt's blocks with their keys and values zeroed: the decode engine's answer changes, so what it
    answered above came from the moved blocks (and a prefix already cached there is not overwritten)."""
    prefill, decode = pair
    prompt = "A long and winding sentence about the weather in the northern hills, told slowly"
    ids = prefill.tokenizer(prompt).input_ids
    prefix = moved(prefill, ids)
    blank = KVPrefix(prefix.tokens, prefix.block_size, torch.zeros_like(prefix.data))
    done, outs = collect(decode, ids, SamplingParams(max_tokens=12), request_id="zeroed", kv_prefix=blank)
    assert done.wait(60)
    assert joined(outs)[1] != reference(prompt, 12)[0]


def test_a_prefix_of_another_shape_or_prompt_is_refused_naming_why(pair, tiny_model_dir):
    prefill, decode = pair
    ids = prefill.tokenizer(LONG).input_ids
    prefix = moved(prefill, ids)
    other_bs = KVPrefix(prefix.tokens[: 4 * BS], 2 * BS, prefix.data[:, :, :4].reshape(4, 2, 2, 2 * BS, 2, 64))
    with pytest.raises(InvalidRequest, match="its blocks hold 8 tokens and this engine's 4: give both one block_size"):
        decode.add_request("bs", ids, SamplingParams(max_tokens=2), lambda o: None, kv_prefix=other_bs)
    with pytest.raises(InvalidRequest, match="not the prompt's first ones: it was computed for another prompt"):
        decode.add_request("other", [7, *ids[1:]], SamplingParams(max_tokens=2), lambda o: None, kv_prefix=prefix)
    half = KVPrefix(prefix.tokens, BS, prefix.data.to(torch.float16))
    with pytest.raises(InvalidRequest, match="torch.float16 and this engine's pool torch.float32"):
        decode.add_request("dtype", ids, SamplingParams(max_tokens=2), lambda o: None, kv_prefix=half)


def test_a_prefix_no_longer_cached_exports_empty_and_decode_computes_the_whole_prompt(tiny_model_dir, reference):
    """Prefix caching off on the prefill engine: nothing is kept to move, the KVPrefix is empty, and the decode
    engine computes the whole prompt (slower, never wrong)."""
    prefill = make_engine(tiny_model_dir, device="cpu", max_num_seqs=2, block_size=BS, prefix_caching=False).start()
    decode = make_engine(tiny_model_dir, device="cpu", max_num_seqs=2, block_size=BS).start()
    try:
        ids = prefill.tokenizer(PROMPTS[3]).input_ids
        prefix = moved(prefill, ids)
        assert prefix.num_blocks == 0 and prefix.tokens == () and prefix.nbytes == 0
        done, outs = collect(decode, ids, SamplingParams(max_tokens=8), request_id="empty", kv_prefix=prefix)
        assert done.wait(60)
        assert joined(outs)[1] == reference(PROMPTS[3], 8)[0]
        assert decode.stats.prefill_tokens == len(ids) and decode.stats.imported_prompt_tokens == 0
    finally:
        prefill.shutdown()
        decode.shutdown()


def test_a_kv_export_prefill_holds_its_blocks_until_fetched_its_time_is_up_or_the_engine_needs_them(tiny_model_dir):
    """A small pool (23 blocks of 4 tokens), a 64-token prompt (15 whole blocks to move) and short prompts of 6 blocks:
    after a plain prefill the short ones evict its blocks and its export comes back short; a kv_export prefill's
    blocks are held (ExportPins) through the same pressure and leave whole, once: the fetch ends the hold.  A hold
    whose decode never comes ends after pin_s; and a request that cannot run beside a hold takes its blocks at once
    (the engine's own requests come first) instead of waiting pin_s."""
    import time

    from tests.integration.test_hf_kv_cache import TINY_TOKEN_BYTES

    engine = make_engine(
        tiny_model_dir, device="cpu", max_num_seqs=2, block_size=BS, kv_cache_memory=24 * BS * TINY_TOKEN_BYTES / 2**30
    ).start()
    try:
        pins = engine.scheduler.pins
        assert engine.scheduler.pool.capacity == 23
        tok = engine.tokenizer
        ids = tok(LONG).input_ids
        whole = (len(ids) - 1) // BS
        note = "snow melts in the hills and the streams run down to the valley floor"
        short = [tok(f"Note {k}: {note}").input_ids[:22] for k in range(6)]  # 6 blocks with their 2 new tokens
        assert len(ids) == 64 and all(len(s) == 22 for s in short)

        def pressure(batch):
            for other in batch:
                engine.generate(other, SamplingParams(max_tokens=2), timeout=60)

        engine.generate(ids, SamplingParams(max_tokens=1), timeout=60)
        pressure(short[:3])
        assert engine.export_prefix(ids).num_blocks < whole  # evicted: a decode would compute most of it

        engine.generate(ids, SamplingParams(max_tokens=1, kv_export=True), timeout=60)
        assert len(pins) == 1
        pressure(short[3:])
        assert engine.export_prefix(ids).num_blocks == whole  # held through the pressure
        assert len(pins) == 0  # fetched: held no more

        pins.pin_s = 0.2
        engine.generate(ids, SamplingParams(max_tokens=1, kv_export=True), timeout=60)
        assert len(pins) == 1
        time.sleep(0.3)
        pressure(short[:3])  # the next step lets the hold go; the pressure evicts the blocks
        assert len(pins) == 0 and engine.export_prefix(ids).num_blocks < whole

        pins.pin_s = 600.0
        engine.generate(ids, SamplingParams(max_tokens=1, kv_export=True), timeout=60)
        big = tok("Story: " + LONG.replace("river", "valley")).input_ids  # 21 blocks: not beside the 15 held
        began = time.monotonic()
        engine.generate(big, SamplingParams(max_tokens=2), timeout=60)
        assert time.monotonic() - began < 30 and len(pins) == 0
    finally:
        engine.shutdown()


# ------------------------------------------------------------------------------------------ between two servers
@pytest.fixture(scope="module")
def servers(tiny_model_dir, tmp_path_factory):
    """Two tritonservers with the hf model: a prefill one whose engine serves its computed prompts' keys and values
    (RankEnv.kv_transfer: the rank sets it for a prefill replica), and a decode one."""
    from launcher.ports import free_port
    from launcher.testing.serve import hf_server

    kv = f"127.0.0.1:{free_port()}"
    args = {"device": "cpu", "max_num_seqs": 4, "block_size": BS}
    prefill = hf_server(
        str(tiny_model_dir), tmp_path_factory.mktemp("prefill"), args, env={"_LLMLAUNCH_KV_TRANSFER": kv}
    )
    decode = hf_server(str(tiny_model_dir), tmp_path_factory.mktemp("decode"), args)
    with prefill, decode:
        yield prefill, decode, kv


def test_a_decode_server_given_kv_from_takes_the_prompt_from_the_prefill_server_and_answers_as_generate(
    servers, reference, tiny_model_dir
):
    """Over gRPC, as the front end will route it: the prompt to the prefill server (one token), then to the decode
    server with kv_from naming the prefill engine's address; the decode server's answer is generate's and its engine
    counts the prompt's whole blocks as imported and found cached (llmlaunch_engine_prompt_tokens), not prefilled,
    and the transfer with their bytes (llmlaunch_kv_transfer*: 2 x layers x KV heads x head dim float32s a token)."""
    import json

    from transformers import AutoTokenizer

    from launcher.client.request import Generation
    from launcher.python_backend.cache_splits import kv_transfer_split
    from launcher.python_backend.timings import settled_engine_metrics
    from tests.integration.test_hf_serving import MODEL, Stream, _text

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    c = json.loads((tiny_model_dir / "config.json").read_text())
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    token_bytes = 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * head_dim * 4
    prefill, decode, kv = servers
    p, d = Stream(prefill.grpc_url), Stream(decode.grpc_url)
    try:
        for prompt in (LONG, PROMPTS[3]):
            n = len(tokenizer(prompt).input_ids)
            parts, err = p.run(Generation(prompt, max_tokens=1))
            assert err is None and parts[-1][1] == 1
            before = settled_engine_metrics(decode.metrics_url, MODEL, wait_s=10)
            parts, err = d.run(Generation(prompt, max_tokens=10, kv_from=kv))
            assert err is None, err
            assert _text(parts) == reference(prompt, 10)[1], prompt
            after = settled_engine_metrics(decode.metrics_url, MODEL, wait_s=10)
            whole = (n - 1) // BS * BS
            assert after["imported_prompt_tokens"] - before["imported_prompt_tokens"] == whole
            assert after["cached_prompt_tokens"] - before["cached_prompt_tokens"] == whole
            assert after["prefill_tokens"] - before["prefill_tokens"] == n - whole
            moved = kv_transfer_split(before, after)
            assert (moved["transfers"], moved["failed"], moved["bytes"]) == (1, 0, whole * token_bytes), moved
            assert moved["ms_per_transfer"] > 0, moved
    finally:
        p.close()
        d.close()


def test_kv_from_an_address_nobody_serves_computes_the_whole_prompt_and_a_bad_one_is_refused(servers, reference):
    """A prefill engine that cannot be reached (gone, never there) costs the decode server its own prefill, never
    an error; an address that is not host:port is the request's error, naming it."""
    from launcher.client.request import Generation
    from launcher.ports import free_port
    from launcher.python_backend.cache_splits import kv_transfer_split
    from launcher.python_backend.timings import settled_engine_metrics
    from tests.integration.test_hf_serving import MODEL, Stream, _text

    _, decode, _ = servers
    d = Stream(decode.grpc_url)
    try:
        prompt = "A sentence nobody prefilled anywhere, about lighthouses and the sea"
        before = settled_engine_metrics(decode.metrics_url, MODEL, wait_s=10)
        parts, err = d.run(Generation(prompt, max_tokens=8, kv_from=f"127.0.0.1:{free_port()}"))
        assert err is None and _text(parts) == reference(prompt, 8)[1]
        moved = kv_transfer_split(before, settled_engine_metrics(decode.metrics_url, MODEL, wait_s=10))
        assert (moved["transfers"], moved["failed"]) == (0, 1), moved  # counted as failed, computed whole
        parts, err = d.run(Generation(prompt, max_tokens=8, kv_from="nowhere"))
        assert "kv_from 'nowhere' is not host:port" in str(err)
    finally:
        d.close()


# ------------------------------------------------------------------------------------------ the front end as P/D router
def test_through_the_front_end_a_request_is_prefilled_on_one_replica_and_decoded_on_the_other(
    servers, reference, tiny_model_dir
):
    """The front end with one prefill and one decode replica (FrontendConfig.kv_transfer): each client request's
    prompt is computed on the prefill replica (one token), then the decode replica takes its keys and values and
    streams the answer, which is generate's; the client sees one stream.  The engines' counters say where the
    prompts were computed.  Then the prefill replica is gone: requests are answered whole by the decode replica."""
    from launcher.client.request import Generation
    from launcher.frontend import FrontendConfig, FrontendProcess
    from launcher.ports import free_port
    from launcher.python_backend.timings import settled_engine_metrics
    from tests.integration.test_frontend import _env
    from tests.integration.test_hf_serving import MODEL, Stream, _text

    prefill, decode, kv = servers
    replicas = [tuple(s.grpc_url.rsplit(":", 1)) for s in (prefill, decode)]
    cfg = FrontendConfig(
        [(h, int(p)) for h, p in replicas],
        "127.0.0.1",
        free_port(),
        0,
        MODEL,
        probe_interval_s=0.5,
        kv_transfer=[kv, ""],
    )
    fe = FrontendProcess(cfg, env=_env()).start()
    try:
        fe.wait_ready(60)
        url = f"127.0.0.1:{cfg.port}"
        prompts = ["The quick brown fox jumps over the lazy dog, then sleeps " + w for w in ("at noon", "in the barn")]
        before = {s: settled_engine_metrics(s.metrics_url, MODEL, wait_s=10) for s in (prefill, decode)}
        s = Stream(url)
        try:
            for prompt in prompts:
                parts, err = s.run(Generation(prompt, max_tokens=8))
                assert err is None, err
                assert _text(parts) == reference(prompt, 8)[1] and parts[-1][1] == 8
        finally:
            s.close()
        after = {s: settled_engine_metrics(s.metrics_url, MODEL, wait_s=10) for s in (prefill, decode)}
        delta = {s: {k: after[s][k] - before[s][k] for k in after[s]} for s in (prefill, decode)}
        assert delta[prefill]["decode_tokens"] == 0 and delta[prefill]["admitted"] == 2  # one token each: prefill
        assert delta[decode]["admitted"] == 2 and delta[decode]["imported_prompt_tokens"] > 0
        assert delta[decode]["prefill_tokens"] < delta[prefill]["prefill_tokens"]  # the rest of each prompt only
        prefill.stop()  # the prefill replica is gone: the decode replica computes each prompt whole
        s = Stream(url)
        try:
            prompt = "Lighthouses stand on rocky coasts and warn the ships at night"
            parts, err = s.run(Generation(prompt, max_tokens=8))
            assert err is None, err
            assert _text(parts) == reference(prompt, 8)[1]
        finally:
            s.close()
    finally:
        fe.stop()


# ------------------------------------------------------------------------------------------ launched by llmlaunch
def test_llmlaunch_disagg_prefills_on_one_replica_and_decodes_on_the_other_over_both_apis(tmp_path, reference):
    """`llmlaunch disagg.prefill=1 disagg.decode=1` on this machine: replica 0's engine serves the prompts it
    computed at the address its rank picked (RankEnv.kv_transfer), rank 0's front end routes every request through
    it and then to replica 1; greedy answers over gRPC and the OpenAI API are generate's, and the engines' counters
    say replica 0 computed the prompts and replica 1 generated."""
    import json
    import signal
    import subprocess
    import sys
    import urllib.request
    from pathlib import Path

    from launcher.client.request import Generation
    from launcher.client.stream import generate
    from launcher.handoff.rank_env import RankEnv
    from launcher.python_backend.timings import settled_engine_metrics
    from tests.integration.test_frontend import LocalLaunch
    from tests.integration.test_slurm_launch import server_pid

    job = LocalLaunch(tmp_path, "disagg.prefill=1", "disagg.decode=1", f"engine.block_size={BS}")
    try:
        ep = job.wait_endpoint()
        environ = Path(f"/proc/{server_pid(ep.job_id, 0)}/environ").read_bytes().decode().split("\0")
        kv = RankEnv.from_environ(dict(v.split("=", 1) for v in environ if "=" in v)).kv_transfer
        assert kv and kv.startswith("127.0.0.1:")
        metrics = {r.replica: r.metrics_url for r in ep.replicas}
        before = {k: settled_engine_metrics(u, ep.model, wait_s=10) for k, u in metrics.items()}
        prompt = "The history of the river begins in the mountains"
        rec = generate(ep.url, ep.model, Generation(prompt, max_tokens=8))
        assert not rec.error and rec.text == reference(prompt, 8)[1], rec.error
        body = json.dumps({"model": ep.model, "prompt": LONG, "max_tokens": 8, "temperature": 0}).encode()
        req = urllib.request.Request(ep.openai_url + "/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            assert json.loads(r.read())["choices"][0]["text"] == reference(LONG, 8)[1]
        after = {k: settled_engine_metrics(u, ep.model, wait_s=10) for k, u in metrics.items()}
        prefill, decode = ({k: after[i][k] - before[i][k] for k in after[i]} for i in (0, 1))
        assert prefill["admitted"] == 2 and prefill["decode_tokens"] == 0
        assert decode["admitted"] == 2 and decode["imported_prompt_tokens"] > 0
        assert decode["decode_tokens"] > 0 and decode["prefill_tokens"] < prefill["prefill_tokens"]
        # llmlaunch-bench splits each first token by role: the prefill replica's request, the decode replica's,
        # and what lies outside both (the front end's two legs, gRPC, the client), adding up to the client's TTFT
        out = tmp_path / "bench.json"
        argv = [sys.executable, "-m", "launcher.bench.cli", "--url", ep.url, "--model", ep.model]
        argv += ["--dataset-name", "synthetic", "--input-len", "96", "--output-len", "4", "--ignore-eos"]
        argv += [
            "--num-prompts",
            "4",
            "--concurrency",
            "1",
            "--warmup",
            "1",
            "--no-progress",
            "--result-json",
            str(out),
        ]
        argv += ["--server-metrics", f"{metrics[0]},{metrics[1]}", "--prefill-metrics", metrics[0]]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "prefill replica, inside (ms):" in done.stdout, done.stdout
        doc = json.loads(out.read_text())
        split, ttft = doc["server_first_token_ms"], doc["metrics"]["ttft_ms"]["mean"]
        assert split["requests"] == split["prefill"]["requests"] == 4, split
        assert split["prefill"]["engine"] > 0 and split["engine"] > 0 and split["outside_server"] > 0, split
        assert split["inside_server"] + split["prefill"]["inside_server"] + split["outside_server"] == pytest.approx(
            ttft, abs=0.01
        )
        # the prefix cache is the prefill replica's (new prompts: no hits); the decode replica's moved blocks are the
        # transfer, not hits
        prefix, moved = doc["server_prefix_cache"], doc["server_kv_transfer"]
        assert prefix["prompt_tokens"] >= 4 * 90 and prefix["cached_prompt_tokens"] == 0, prefix
        assert moved["transfers"] == 4, moved
        job.proc.send_signal(signal.SIGINT)
        assert job.proc.wait(90) == 0, job.tail()
    finally:
        job.kill()
    job.assert_nothing_left(ep)


def test_on_two_slurm_nodes_the_prompt_moves_between_nodes_and_a_lost_prefill_replica_costs_no_request(
    local_slurm, tmp_path, reference
):
    """`cluster=local_slurm nodes=2 disagg.prefill=1 disagg.decode=1`: the prefill replica on node1, the decode one
    on node2; the keys and values cross the nodes' network, and the answer is generate's.  The prefill replica's
    server killed (restarts off): the front end's prefill fails over to the decode replica, which computes the
    prompt whole; no request fails."""
    import os
    import signal
    import time

    from launcher.python_backend.timings import settled_engine_metrics
    from tests.integration.test_slurm_launch import greedy, launch, server_pid, stop

    spec, job_id, run, ep = launch(
        tmp_path, "nodes=2", "disagg.prefill=1", "disagg.decode=1", f"engine.block_size={BS}", "serve.max_restarts=0"
    )
    try:
        nodes = {r.replica: r.addr for r in ep.replicas}
        assert nodes[0] != nodes[1]  # one replica a node
        metrics = {r.replica: r.metrics_url for r in ep.replicas}
        before = settled_engine_metrics(metrics[1], ep.model, wait_s=10)
        assert greedy(ep.url, ep.model, LONG, 8)[0] == reference(LONG, 8)[1]
        after = settled_engine_metrics(metrics[1], ep.model, wait_s=10)
        assert after["imported_prompt_tokens"] - before["imported_prompt_tokens"] > 0
        os.kill(server_pid(job_id, 0), signal.SIGKILL)
        time.sleep(1.0)
        for prompt in ("Lighthouses stand on rocky coasts", "The quick brown fox jumps over the lazy dog"):
            assert greedy(ep.url, ep.model, prompt, 8)[0] == reference(prompt, 8)[1]
    finally:
        stop(job_id)
