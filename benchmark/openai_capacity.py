#!/usr/bin/env python3
"""How many streamed chunks/s one OpenAI API process (launcher/openai_api) passes on, with a no-op model behind it.

    python -m benchmark.openai_capacity                                   # 1 tritonserver x 4 emitter instances
    python -m benchmark.openai_capacity --instances 8 --clients 8 --processes 1,2,4

Backend: one tritonserver serving `emitter` (launcher/testing/models/emitter: one-token responses as fast as the
python backend sends them, until cancelled) with --instances instances; intermediate responses carry text_output
only.  Load: --clients client processes, each with --concurrency endless streaming /v1/completions requests
(`max_tokens` huge, `ignore_eos`) on its own HTTP connections; a client counts the SSE `data:` events it receives in a
--seconds window that starts --warmup seconds after the load, then closes its connections (the API cancels the
requests).

Runs, in order: (1) the same clients over KServe gRPC straight to the tritonserver (the ceiling the backend and
the machine allow), (2) through the OpenAI API with each count of worker processes in --processes.  For each: chunks/s, the API process's CPU in cores and
microseconds per chunk, the machine's busy cores.  One API process sustains about 1e6 / us_per_chunk chunks/s on a
core of its own; it is the bottleneck when it is busy ~1 core while (1) is higher.

A table on stderr and one JSON document on stdout (--json FILE also writes it there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from benchmark import frontend_capacity as fc  # the gRPC load and the CPU accounting
from benchmark.servers import fixture_servers, openai_api

MODEL = fc.MODEL


def log(msg: str) -> None:
    print(f"[openai_capacity] {msg}", file=sys.stderr, flush=True)


def sse_client_main(url: str, model: str, concurrency: int, t_a: float, t_b: float, tag: str, out) -> None:
    """One client process: `concurrency` endless streams, each on its own connection; counts the `data:` events
    received in [t_a, t_b) (perf_counter: CLOCK_MONOTONIC, shared by the processes)."""
    import asyncio

    import aiohttp

    counts = [0]
    errors: list = []
    body = {"model": model, "prompt": "capacity", "max_tokens": 2**31 - 1, "ignore_eos": True, "stream": True}

    async def one(session) -> None:
        perf = time.perf_counter
        try:
            async with session.post(url + "/v1/completions", json=body) as r:
                if r.status != 200:
                    errors.append(f"HTTP {r.status}: {(await r.text())[:200]}")
                    return
                async for line in r.content:  # one SSE line at a time
                    if line.startswith(b"data:"):
                        t = perf()
                        if t >= t_a:
                            if t >= t_b:
                                return
                            counts[0] += 1
        except Exception as e:  # reported, not raised: the parent prints it
            errors.append(f"{type(e).__name__}: {e}")

    async def run() -> None:
        conn = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
            await asyncio.gather(*(one(session) for _ in range(concurrency)))

    try:
        asyncio.run(run())
    except Exception as e:
        errors.append(f"{type(e).__name__}: {e}")
    out.put((tag, counts[0], "; ".join(errors[:2])))


def run_sse_load(url: str, clients: int, concurrency: int, warmup: float, seconds: float, api_pgid: int) -> dict:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start = time.perf_counter() + 2.0 + 0.1 * clients
    t_a, t_b = start + warmup, start + warmup + seconds
    procs = [
        ctx.Process(target=sse_client_main, args=(url, MODEL, concurrency, t_a, t_b, f"c{k}", out), daemon=True)
        for k in range(clients)
    ]
    for p in procs:
        p.start()
    time.sleep(max(0.0, t_a - time.perf_counter()))
    cpu_a, (busy_a, _) = fc.group_cpu(api_pgid), fc.machine_busy()
    time.sleep(max(0.0, t_b - time.perf_counter()))
    cpu_b, (busy_b, _) = fc.group_cpu(api_pgid), fc.machine_busy()
    results = [out.get(timeout=seconds + warmup + 120) for _ in procs]
    for p in procs:
        p.join(30)
    n = sum(r[1] for r in results)
    api_cpu = cpu_b - cpu_a
    return {
        "chunks_per_s": n / seconds,
        "chunks": n,
        "per_client_per_s": [round(r[1] / seconds) for r in sorted(results)],
        "api_cores": api_cpu / seconds,
        "api_us_per_chunk": api_cpu / n * 1e6 if n else None,
        "machine_busy_cores": (busy_b - busy_a) / seconds,
        "machine_cores": os.cpu_count(),
        "client_errors": [r[2] for r in results if r[2]],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--instances", type=int, default=4, help="emitter instances in the tritonserver (default 4)")
    p.add_argument("--clients", type=int, default=4, help="client processes (default 4)")
    p.add_argument("--concurrency", type=int, default=2, help="endless streams per client (default 2)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of load before the window")
    p.add_argument("--seconds", type=float, default=5.0, help="measuring window")
    p.add_argument("--processes", default="1", help="API worker process counts to try, e.g. 1,2 (default 1)")
    p.add_argument("--json", help="also write the JSON document here")
    args = p.parse_args(argv)

    report = {
        "machine_cores": os.cpu_count(),
        "instances": args.instances,
        "clients": args.clients,
        "concurrency_per_client": args.concurrency,
        "seconds": args.seconds,
        "model": MODEL,
        "runs": [],
    }
    with fixture_servers(1, args.instances, {MODEL: {"full_outputs": "false"}}) as (grpc_url,):
        log(f"tritonserver x {args.instances} {MODEL} instances: {grpc_url}")
        r = fc.run_load([grpc_url], args.clients, args.concurrency, args.warmup, args.seconds)
        r = {
            "mode": "grpc-direct",
            "chunks_per_s": r["responses_per_s"],
            "machine_busy_cores": r["machine_busy_cores"],
            "client_errors": r["client_errors"],
        }
        report["runs"].append(r)
        log(
            f"gRPC straight to tritonserver: {r['chunks_per_s']:,.0f} responses/s; machine {r['machine_busy_cores']:.2f} cores busy"
        )
        time.sleep(1.0)
        for n in [int(x) for x in args.processes.split(",")]:
            with openai_api(grpc_url, MODEL, processes=n, timeout_s=60) as api:
                r = run_sse_load(api.cfg.url, args.clients, args.concurrency, args.warmup, args.seconds, api.proc.pid)
            r.update(mode="openai", processes=n, chunks_per_s_per_process=r["chunks_per_s"] / n)
            report["runs"].append(r)
            log(
                f"OpenAI API ({n} process(es)): {r['chunks_per_s']:,.0f} chunks/s = {r['chunks_per_s'] / n:,.0f} a process, "
                f"API {r['api_cores']:.2f} cores = {r['api_us_per_chunk'] or 0:.1f} us/chunk -> "
                f"{1e6 / (r['api_us_per_chunk'] or 1e9):,.0f} chunks/s on a core; "
                f"machine {r['machine_busy_cores']:.2f}/{r['machine_cores']} cores busy"
                + (f"; ERRORS {r['client_errors'][:2]}" if r["client_errors"] else "")
            )
            time.sleep(1.0)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
