#!/usr/bin/env python3
"""What the data-parallel front end (launcher/frontend) adds to TTFT and ITL (re-run on a new host).

The same load sent straight to one replica's tritonserver and through a front end in front of that same server,
in one run.

    python -m benchmark.frontend_overhead                               # LLM-paced load, 3 rounds
    python -m benchmark.frontend_overhead --concurrency 64 --itl-ms 10 --rounds 5
    python -m benchmark.frontend_overhead --flat-out                    # also: emitter flat out

The load (default): launcher.bench's load generator (the benchmark clients use, unchanged) keeps
--concurrency requests in flight on the `timed` fixture model (launcher/testing/models/timed), which streams
--max-tokens tokens on an LLM's schedule: the first after --first-token-ms, then one every --itl-ms
(absolute deadlines, so the model's own timing does not drift). --requests requests per path and
round. The two paths alternate over --rounds rounds (the machine may be shared); medians of the
rounds are compared.

Per path: TTFT p50/p99 (first response with text minus send), inter-token latency p50/p99 (gaps
between responses with text, pooled), streamed responses/s (responses with text / (last completion
- first send)). Then the deltas and ratios; targets: p50 TTFT grows by <= 1 ms, responses/s within
2%.

--flat-out adds a saturation run: the `emitter` fixture sending as fast as it can, direct
vs through the front end (responses/s only; on a machine with few cores the front end competes
with the backend and the client for them, see benchmark/frontend_capacity.py).

Prints a summary on stderr and one JSON document on stdout (--json FILE also writes it there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from benchmark.frontend_capacity import MODEL as EMITTER, run_load as capacity_load
from benchmark.servers import fixture_servers, frontend


def log(msg: str) -> None:
    print(f"[frontend_overhead] {msg}", file=sys.stderr, flush=True)


def pct(values, p):
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] if s else float("nan")


def measure(
    url: str, model: str, concurrency: int, requests: int, max_tokens: int, warmup: int, prompt_bytes: int = 0
) -> dict:
    from launcher.bench.runner import Job, LoadSpec, run_load
    from launcher.client.request import Generation

    words = "You are a careful assistant who answers every question in one short sentence. "
    shared = (words * (prompt_bytes // len(words) + 1))[:prompt_bytes]  # one system prompt, then a question each
    gens = [Generation(f"{shared}overhead prompt {i} with a few words", max_tokens=max_tokens) for i in range(requests)]
    out = run_load(
        Job(
            url=url,
            model=model,
            gens=gens,
            spec=LoadSpec(concurrency=concurrency, num_requests=requests, warmup=warmup, timeout=600),
        )
    )
    recs = [rec for _, rec in out.records]
    errors = [r.error for r in recs if r.error]
    ttft, itl, n, end = [], [], 0, out.t0
    for r in recs:
        tt = r.token_times
        if not tt:
            continue
        ttft.append(tt[0] - r.sent)
        itl += [b - a for a, b in zip(tt, tt[1:])]
        n += len(tt)
        end = max(end, r.times[-1])
    ms = 1000.0
    return {
        "ttft_p50_ms": pct(ttft, 50) * ms,
        "ttft_p99_ms": pct(ttft, 99) * ms,
        "itl_p50_ms": pct(itl, 50) * ms,
        "itl_p99_ms": pct(itl, 99) * ms,
        "responses_per_s": n / (end - out.t0),
        "requests": len(recs),
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
    }


def median_of(rounds: list) -> dict:
    keys = [k for k, v in rounds[0].items() if isinstance(v, (int, float))]
    return {k: statistics.median(r[k] for r in rounds) for k in keys}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight (default 16)")
    p.add_argument("--requests", type=int, default=96, help="requests per path and round (default 96)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default 64)")
    p.add_argument("--first-token-ms", type=float, default=20.0, help="the model's time to first token (default 20)")
    p.add_argument("--itl-ms", type=float, default=20.0, help="the model's time between tokens (default 20)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of both paths (default 3)")
    p.add_argument("--warmup", type=int, default=8, help="warm-up requests per run, not counted")
    p.add_argument("--loop", default="auto", help="front-end event loop: auto, asyncio, uvloop")
    p.add_argument("--processes", type=int, default=1, help="front-end worker processes (default 1)")
    p.add_argument("--routing", default="least_outstanding", help="the front end's serve.routing policy")
    p.add_argument(
        "--migrations",
        type=int,
        default=0,
        help="the front end's max_migrations (default 0); above 0 it asks for and keeps each stream's output ids, "
        "as it does to move engine=hf streams: run with 0 and 3 to see what that adds",
    )
    p.add_argument("--prompt-bytes", type=int, default=0, help="a shared prompt this long before each question")
    p.add_argument("--tokenizer", default="", help="--routing kv: the tokenizer folder (default: the tiny model's)")
    p.add_argument("--flat-out", action="store_true", help="also compare responses/s with the emitter flat out")
    p.add_argument("--flat-out-clients", type=int, default=2)
    p.add_argument("--json", help="also write the JSON document here")
    args = p.parse_args(argv)

    models = {"timed": {"first_token_delay_ms": args.first_token_ms, "inter_token_delay_ms": args.itl_ms}}
    if args.flat_out:
        models["emitter"] = {"full_outputs": "false"}
    report = {
        "load": {
            k: getattr(args, k)
            for k in (
                "concurrency",
                "requests",
                "max_tokens",
                "first_token_ms",
                "itl_ms",
                "rounds",
                "loop",
                "processes",
                "routing",
                "prompt_bytes",
                "migrations",
            )
        }
    }
    with fixture_servers(1, 1, models) as (url,):
        if args.routing == "kv" and not args.tokenizer:
            from launcher.tiny import ensure_tiny_model

            args.tokenizer = str(ensure_tiny_model())
        with frontend(
            [url], args.processes, args.loop, "timed", args.routing, args.tokenizer, max_migrations=args.migrations
        ) as (fe_url, _, _):
            paths = {"direct": url, "frontend": fe_url}
            runs = {"direct": [], "frontend": []}
            for rnd in range(args.rounds):
                order = ("direct", "frontend") if rnd % 2 == 0 else ("frontend", "direct")
                for name in order:
                    r = measure(
                        paths[name],
                        "timed",
                        args.concurrency,
                        args.requests,
                        args.max_tokens,
                        args.warmup,
                        args.prompt_bytes,
                    )
                    runs[name].append(r)
                    log(
                        f"round {rnd + 1} {name:8s}: TTFT p50 {r['ttft_p50_ms']:.2f} ms p99 {r['ttft_p99_ms']:.2f} ms, ITL p50 {r['itl_p50_ms']:.2f} ms "
                        f"p99 {r['itl_p99_ms']:.2f} ms, {r['responses_per_s']:,.0f} responses/s, errors {r['errors']}"
                    )
            d, f = median_of(runs["direct"]), median_of(runs["frontend"])
            report["rounds"] = runs
            report["direct"], report["frontend"] = d, f
            report["ttft_p50_added_ms"] = f["ttft_p50_ms"] - d["ttft_p50_ms"]
            report["ttft_p99_added_ms"] = f["ttft_p99_ms"] - d["ttft_p99_ms"]
            report["itl_p50_added_ms"] = f["itl_p50_ms"] - d["itl_p50_ms"]
            report["itl_p99_added_ms"] = f["itl_p99_ms"] - d["itl_p99_ms"]
            report["ttft_p50_ratio"] = f["ttft_p50_ms"] / d["ttft_p50_ms"]
            report["responses_per_s_ratio"] = f["responses_per_s"] / d["responses_per_s"]
            report["targets_met"] = {
                "ttft_p50_added_le_1ms": report["ttft_p50_added_ms"] <= 1.0,
                "throughput_within_2pct": report["responses_per_s_ratio"] >= 0.98,
            }
        if args.flat_out:
            with frontend([url], args.processes, args.loop, EMITTER) as (fe_url, _, pgid):
                direct = capacity_load([url], args.flat_out_clients, 1, 1.0, 4.0)
                through = capacity_load([fe_url], args.flat_out_clients, 1, 1.0, 4.0, pgid)
            report["flat_out"] = {
                "direct_responses_per_s": direct["responses_per_s"],
                "frontend_responses_per_s": through["responses_per_s"],
                "ratio": through["responses_per_s"] / direct["responses_per_s"],
                "frontend_us_per_response": through["frontend_us_per_response"],
                "machine_cores": direct["machine_cores"],
            }
    log(
        f"median of {args.rounds} rounds, {args.concurrency} in flight, {args.max_tokens} tokens, model TTFT {args.first_token_ms} ms / ITL {args.itl_ms} ms:"
    )
    for name in ("direct", "frontend"):
        r = report[name]
        log(
            f"  {name:8s}: TTFT p50 {r['ttft_p50_ms']:.2f} ms, p99 {r['ttft_p99_ms']:.2f} ms; ITL p50 {r['itl_p50_ms']:.2f} ms, p99 {r['itl_p99_ms']:.2f} ms; "
            f"{r['responses_per_s']:,.1f} responses/s"
        )
    log(
        f"  front end adds: TTFT p50 {report['ttft_p50_added_ms']:+.2f} ms (target <= 1 ms), p99 {report['ttft_p99_added_ms']:+.2f} ms; ITL p50 "
        f"{report['itl_p50_added_ms']:+.2f} ms, p99 {report['itl_p99_added_ms']:+.2f} ms; responses/s ratio {report['responses_per_s_ratio']:.4f} (target >= 0.98)"
    )
    if "flat_out" in report:
        fo = report["flat_out"]
        log(
            f"  flat out ({fo['machine_cores']} cores): direct {fo['direct_responses_per_s']:,.0f}/s, through the front end {fo['frontend_responses_per_s']:,.0f}/s "
            f"(ratio {fo['ratio']:.3f}; front end {fo['frontend_us_per_response']:.1f} us CPU/response)"
        )
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
