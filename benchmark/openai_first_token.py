#!/usr/bin/env python3
"""Where the OpenAI API's first-token time goes at one stream: the same requests one after another over three routes.

    python -m benchmark.openai_first_token                                     # tiny model, CPU
    python -m benchmark.openai_first_token --device cuda --model /path/to/hf/model --requests 100

One tritonserver serves the hf engine on --model; the OpenAI API (one worker process) runs in front of its gRPC port
as rank 0 runs it.  Each request asks for --max-tokens tokens of a fixed prompt, so the first response is the engine's
prefill and nothing else.  Routes, alternating over --rounds rounds:

  stream    one persistent KServe ModelStreamInfer stream carrying every request (llmlaunch-bench's triton-grpc)
  call      one grpc.aio ModelStreamInfer call per request: what the API does for each HTTP request
            (launcher/openai_api/backend.py; a call per request is what lets a disconnecting client cancel
            exactly its own request)
  openai    POST /v1/completions with stream=true through the API, read as llmlaunch-bench reads it (aiohttp)

call - stream is the per-request gRPC call; openai - call is HTTP, the API's own work and one more process hop.
A table of median and 10th-percentile times to the first response on stderr, one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmark.servers import openai_api

PROMPT = "The quick brown fox jumps over the lazy dog. " * 12


def _gen(max_tokens: int):
    from launcher.client.request import Generation

    return Generation(prompt=PROMPT, max_tokens=max_tokens, ignore_eos=True, temperature=0.0)


def stream_route(url: str, model: str, n: int, max_tokens: int) -> list:
    from launcher.client.request import build_request
    from launcher.client.stream import TritonStream

    times = []
    with TritonStream(url) as ts:
        for i in range(n):
            rec = ts.wait(ts.submit(build_request(model, _gen(max_tokens), f"s{i}")))
            if rec.error:
                raise SystemExit(f"stream route: {rec.error}")
            times.append(rec.times[0] - rec.sent)
    return times


async def call_route(url: str, model: str, n: int, max_tokens: int) -> list:
    from launcher.openai_api.backend import GrpcBackend

    backend, times = GrpcBackend(url, model), []
    try:
        for _ in range(n):
            t0, first = time.perf_counter(), None
            async for _item in backend.generate(_gen(max_tokens)):
                first = first or time.perf_counter() - t0
            times.append(first)
    finally:
        await backend.close()
    return times


async def openai_route(url: str, model: str, n: int, max_tokens: int) -> list:
    import aiohttp

    body = json.dumps(
        {
            "model": model,
            "prompt": PROMPT,
            "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True,
            "temperature": 0,
        }
    ).encode()
    times = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for _ in range(n):
            t0, first = time.perf_counter(), None
            async with session.post(
                url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
            ) as resp:
                if resp.status != 200:
                    raise SystemExit(f"openai route: HTTP {resp.status}: {await resp.text()}")
                async for line in resp.content:
                    if line.startswith(b"data:"):
                        first = first or time.perf_counter() - t0
            times.append(first)
    return times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="", help="HF model folder (default: the tiny model)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--requests", type=int, default=40, help="timed requests per route and round")
    ap.add_argument("--warmup", type=int, default=5, help="untimed requests before each route's timed ones")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=2)
    args = ap.parse_args(argv)

    from launcher.testing.serve import hf_server
    from launcher.tiny import ensure_tiny_model

    model = args.model or str(ensure_tiny_model())
    srv = hf_server(
        model, Path(tempfile.mkdtemp(prefix="openai_first_token")), {"device": args.device, "max_num_seqs": 8}
    )
    n = args.warmup + args.requests
    rounds = []
    with srv, openai_api(srv.grpc_url, "hf_model", processes=1, tokenizer=model) as api:
        routes = {
            "stream": lambda: stream_route(srv.grpc_url, "hf_model", n, args.max_tokens),
            "call": lambda: asyncio.run(call_route(srv.grpc_url, "hf_model", n, args.max_tokens)),
            "openai": lambda: asyncio.run(openai_route(api.cfg.url, "hf_model", n, args.max_tokens)),
        }
        for r in range(args.rounds):
            order = list(routes) if r % 2 == 0 else list(routes)[::-1]
            rounds.append({name: [t * 1e3 for t in routes[name]()[args.warmup :]] for name in order})
    table = []
    print(f"{'round':>5} {'route':<8} {'p50 ms':>8} {'p10 ms':>8} {'+p50 vs stream':>15}", file=sys.stderr)
    for r, per in enumerate(rounds):
        base = statistics.median(per["stream"])
        for name in ("stream", "call", "openai"):
            xs = sorted(per[name])
            row = {"round": r, "route": name, "p50_ms": statistics.median(xs), "p10_ms": xs[len(xs) // 10]}
            row["p50_vs_stream_ms"] = row["p50_ms"] - base
            table.append(row)
            print(
                f"{r:>5} {name:<8} {row['p50_ms']:>8.2f} {row['p10_ms']:>8.2f} {row['p50_vs_stream_ms']:>+15.2f}",
                file=sys.stderr,
            )
    print(
        json.dumps(
            {
                "model": model,
                "device": args.device,
                "max_tokens": args.max_tokens,
                "requests": args.requests,
                "rows": table,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
