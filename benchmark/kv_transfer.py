"""Disaggregated prefill and decode on the hf engine (launcher/hf/kv_transfer.py), in one process: is a decode
engine's greedy answer, from keys and values a prefill engine computed, the aggregated engine's answer; how many
bytes a prompt's keys and values are and how long moving them takes, per 1,000 prompt tokens; what the decode engine's
first token costs with them against computing the prompt itself.

Three engines of one model: a prefill engine whose keys and values are served over TCP on loopback (the path two
engine processes take: serve_prefixes / fetch_prefix, the wire form included), a decode engine that takes them, and
an aggregated engine with prefix caching off (each prompt computed whole, the reference).  A prompt is prefilled
(one token), its prefix fetched (timed: the prefill engine's copy to the host, the wire form, TCP, back), then
decoded with it (the decode engine stores it and prefills the rest; its first token timed) and, for the same
prompt, computed whole by the aggregated engine (its first token timed).

    python -m benchmark.kv_transfer [--model tiny|smollm2|PATH] [--prompts 100] [--lengths 128,512,1024,1536]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time


def _model(name: str) -> str:
    if name == "tiny":
        from launcher.tiny import ensure_tiny_model

        return str(ensure_tiny_model())
    if name == "smollm2":
        from launcher.models.smollm2 import ensure_smollm2_model

        return str(ensure_smollm2_model())
    return name


def _prompt_ids(tokenizer, n: int, rng: random.Random) -> list[int]:
    """`n` token ids of text-like prompt (words the tokenizer knows), new for every call."""
    words = "river mountain snow light harbour ship quiet evening market bread stone bridge garden winter".split()
    text = " ".join(rng.choice(words) for _ in range(n))
    return tokenizer(text).input_ids[:n]


def _first_token_s(engine, ids, params, **kw) -> tuple[float, list[int]]:
    """Seconds from add_request to the first output, and every token id of the answer."""
    import threading

    done, first, tokens = threading.Event(), [], []
    t0 = time.perf_counter()

    def on(out):
        if not first:
            first.append(time.perf_counter() - t0)
        tokens.extend(out.token_ids)
        if out.finished:
            done.set()

    engine.add_request(f"b{random.random()}", ids, params, on, **kw)
    done.wait(600)
    return first[0], tokens


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny | smollm2 | a HF model folder (float32 on CPU)")
    p.add_argument("--prompts", type=int, default=100, help="prompts checked for equal answers (default 100)")
    p.add_argument("--check-len", type=int, default=96, help="prompt tokens of the checked prompts (default 96)")
    p.add_argument("--new-tokens", type=int, default=16, help="greedy tokens each checked answer has (default 16)")
    p.add_argument("--lengths", default="128,512,1024,1536", help="prompt lengths timed (default 128,512,1024,1536)")
    p.add_argument("--repeat", type=int, default=5, help="timed prompts a length (default 5)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args(argv)

    from launcher.engines.hf.config import HFEngineArgs
    from launcher.hf.engine import Engine, SamplingParams
    from launcher.hf.kv_transfer import fetch_prefix, serve_prefixes
    from launcher.ports import free_port

    path = _model(a.model)
    args = dict(model_path=path, device="cpu", max_num_seqs=4, block_size=a.block_size, dtype="float32")
    prefill = Engine.from_args(HFEngineArgs(**args)).start()
    decode = Engine.from_args(HFEngineArgs(**args)).start()
    whole = Engine.from_args(HFEngineArgs(**args, prefix_caching=False)).start()
    address = f"127.0.0.1:{free_port()}"
    server = serve_prefixes(prefill, address)
    rng = random.Random(0)
    tok = prefill.tokenizer
    one = SamplingParams(max_tokens=1)
    out: dict = {"model": a.model, "block_size": a.block_size, "equal": 0, "checked": a.prompts, "lengths": []}
    try:
        greedy = SamplingParams(max_tokens=a.new_tokens, ignore_eos=True)
        for i in range(a.prompts):
            ids = _prompt_ids(tok, a.check_len + rng.randrange(a.block_size), rng)
            prefill.generate(ids, one, timeout=600)
            prefix = fetch_prefix(address, ids)
            _, moved = _first_token_s(decode, ids, greedy, kv_prefix=prefix)
            _, ref = _first_token_s(whole, ids, greedy)
            out["equal"] += moved == ref
            if (i + 1) % 10 == 0:
                print(f"checked {i + 1}/{a.prompts}: {out['equal']} equal", file=sys.stderr, flush=True)
        for n in (int(x) for x in a.lengths.split(",")):
            fetch, ttft_moved, ttft_whole, nbytes = [], [], [], 0
            for _ in range(a.repeat):
                ids = _prompt_ids(tok, n, rng)
                prefill.generate(ids, one, timeout=600)
                t0 = time.perf_counter()
                prefix = fetch_prefix(address, ids)
                fetch.append(time.perf_counter() - t0)
                nbytes = prefix.nbytes
                ttft_moved.append(_first_token_s(decode, ids, one, kv_prefix=prefix)[0])
                ttft_whole.append(_first_token_s(whole, ids, one)[0])
            row = {
                "prompt_tokens": n,
                "moved_tokens": len(prefix.tokens),
                "bytes_per_1k_tokens": round(nbytes / len(prefix.tokens) * 1000),
                "fetch_ms_per_1k_tokens": round(statistics.median(fetch) * 1000 / len(prefix.tokens) * 1000, 2),
                "fetch_ms": round(statistics.median(fetch) * 1000, 2),
                "decode_first_token_ms_moved": round(statistics.median(ttft_moved) * 1000, 2),
                "first_token_ms_whole": round(statistics.median(ttft_whole) * 1000, 2),
            }
            out["lengths"].append(row)
    finally:
        server.shutdown()
        for e in (prefill, decode, whole):
            e.shutdown()
    print(f"\nhf engine, {a.model}, float32 on CPU, block_size {a.block_size}", file=sys.stderr)
    print(
        f"greedy answers from moved keys and values equal to aggregated: {out['equal']} of {out['checked']}",
        file=sys.stderr,
    )
    print(
        f"{'prompt':>7} {'moved':>6} {'MB/1k tok':>10} {'fetch ms':>9} {'ms/1k tok':>10} {'TTFT moved':>11} "
        f"{'TTFT whole':>11}",
        file=sys.stderr,
    )
    for r in out["lengths"]:
        print(
            f"{r['prompt_tokens']:>7} {r['moved_tokens']:>6} {r['bytes_per_1k_tokens'] / 1e6:>10.2f} "
            f"{r['fetch_ms']:>9.2f} {r['fetch_ms_per_1k_tokens']:>10.2f} {r['decode_first_token_ms_moved']:>11.2f} "
            f"{r['first_token_ms_whole']:>11.2f}",
            file=sys.stderr,
        )
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    return 0 if out["equal"] == out["checked"] else 1


if __name__ == "__main__":
    sys.exit(main())
