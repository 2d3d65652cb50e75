#!/usr/bin/env python3
"""OpenAI streaming through rank 0's API (launcher/openai_api) against KServe gRPC streaming to the same server.

One tritonserver serves the hf engine on --model (default: the tiny random-weight Llama, built once into the cache);
the OpenAI API runs in front of its gRPC endpoint as rank 0 runs it (its worker processes by
launcher.python_backend.responders.api_processes).  At each --concurrency, llmlaunch-bench's load
(synthetic prompts of --input-len tokens, exactly --output-len new tokens) goes over triton-grpc and over
openai-completions (or --openai-backend openai-chat), alternating over --rounds rounds; the medians of the rounds
are compared.

    python -m benchmark.openai_vs_grpc                        # C=1 and C=8, tiny model, CPU
    python -m benchmark.openai_vs_grpc --concurrency 1 64 128 --device cuda --model /path/to/hf/model

Per protocol and concurrency: output tokens/s and median TTFT; then OpenAI / gRPC tokens/s (target >= 0.95) and
the TTFT difference in ms (target <= +1 ms).  One JSON document on stdout; the table on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from benchmark.servers import openai_api


def bench(backend: str, url: str, concurrency: int, args, workdir: Path) -> dict:
    from launcher.bench import cli

    out = workdir / f"{backend}-{concurrency}.json"
    code = cli.main(
        [
            "--no-progress",
            "--result-json",
            str(out),
            "--backend",
            backend,
            "--url",
            url,
            "--dataset-name",
            "synthetic",
            "--input-len",
            args.input_len,
            "--output-len",
            args.output_len,
            "--num-prompts",
            max(args.requests, 2 * concurrency),
            "--concurrency",
            concurrency,
            "--ignore-eos",
            "--warmup",
            concurrency,
            "--temperature",
            0,
        ]
    )
    m = json.loads(out.read_text())["metrics"]
    if code != 0:
        raise SystemExit(f"{backend} at C={concurrency} failed: {m.get('errors')}")
    return {"tok_s": m["output_throughput"], "ttft_p50_ms": m["ttft_ms"]["p50"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=32, help="requests per run (at least 2 x the concurrency)")
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--model", default="", help="HF model folder (default: the tiny model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--openai-backend", default="openai-completions", choices=("openai-completions", "openai-chat"))
    args = ap.parse_args(argv)

    from launcher.python_backend.responders import api_processes
    from launcher.testing.serve import hf_server
    from launcher.tiny import ensure_tiny_model

    model = args.model or str(ensure_tiny_model())
    workdir = Path(tempfile.mkdtemp(prefix="openai_vs_grpc"))
    srv = hf_server(model, workdir, {"device": args.device, "max_num_seqs": max(64, max(args.concurrency))})
    results = {c: {"triton-grpc": [], args.openai_backend: []} for c in args.concurrency}
    processes = api_processes(len(os.sched_getaffinity(0)))  # as rank 0 starts it
    with srv, openai_api(srv.grpc_url, "hf_model", processes=processes, tokenizer=model) as api:
        urls = {"triton-grpc": srv.grpc_url, args.openai_backend: api.cfg.url + "/v1"}
        for r in range(args.rounds):
            for c in args.concurrency:
                order = list(urls) if r % 2 == 0 else list(urls)[::-1]
                for backend in order:
                    results[c][backend].append(bench(backend, urls[backend], c, args, workdir))
    summary = {}
    print(f"{'C':>4} {'protocol':<20} {'tok/s':>9} {'TTFT p50 ms':>12}", file=sys.stderr)
    for c, per in results.items():
        row = {}
        for backend, runs in per.items():
            row[backend] = {k: statistics.median(run[k] for run in runs) for k in ("tok_s", "ttft_p50_ms")}
            print(
                f"{c:>4} {backend:<20} {row[backend]['tok_s']:>9.1f} {row[backend]['ttft_p50_ms']:>12.2f}",
                file=sys.stderr,
            )
        g, o = row["triton-grpc"], row[args.openai_backend]
        row["tok_s_ratio"] = o["tok_s"] / g["tok_s"]
        row["ttft_p50_delta_ms"] = o["ttft_p50_ms"] - g["ttft_p50_ms"]
        print(
            f"{c:>4} {'OpenAI / gRPC':<20} {row['tok_s_ratio']:>9.3f} {row['ttft_p50_delta_ms']:>+12.2f}",
            file=sys.stderr,
        )
        summary[c] = row
    print(
        json.dumps(
            {
                "model": model,
                "device": args.device,
                "api_processes": processes,
                "rounds": args.rounds,
                "input_len": args.input_len,
                "output_len": args.output_len,
                "results": summary,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
