"""Closed-loop load on an engine in this process, the yardsticks' common loop (benchmark/engine_yardstick.py and the
served models' own functions in benchmark/served_model_yardsticks.py): requests sent as the ones before end, each
load's rows as llmlaunch-bench's metrics compute them."""

from __future__ import annotations

import asyncio
import time

from benchmark.host_pulse import text as host_text
from launcher.bench import metrics


def parse_loads(items: list) -> list:
    """["1:32", "64:1000"] -> [(1, 32), (64, 1000)]: concurrency and requests counted."""
    loads = []
    for item in items:
        c, _, n = item.partition(":")
        loads.append((int(c), int(n) if n else 10 * int(c)))
    return loads


async def closed_loop(stream_of, samples, streams: int, take, clock: dict) -> list:
    """`streams` closed-loop workers: each sends the request `take()` names (None: no more) as soon as its previous
    one ended. `stream_of(sample)` is the engine's request as an async iterator of (new tokens, prompt tokens,
    finish reason) per output; times are seconds since clock["t0"]."""
    results = []

    async def one(index: int) -> None:
        sample = samples[index % len(samples)]
        t0 = clock["t0"]
        sent = time.perf_counter() - t0
        times, n_out, n_in, finish = [], 0, 0, ""
        async for new, prompt_tokens, reason in stream_of(sample):
            if new:
                times.append(time.perf_counter() - t0)
                n_out += new
            n_in = prompt_tokens or n_in
            finish = reason or finish
        results.append(
            metrics.RequestResult(
                index=index,
                prompt_len=sample.prompt_len,
                max_tokens=sample.output_len,
                sent=sent,
                token_times=times,
                end=time.perf_counter() - t0,
                input_tokens=n_in,
                output_tokens=n_out,
                responses=len(times),
                finish_reason=finish,
            )
        )

    async def worker() -> None:
        while (index := take()) is not None:
            await one(index)

    await asyncio.gather(*(worker() for _ in range(streams)))
    return results


def load_seed(c: int, run: int = 0) -> int:
    """The seed of load C's prompts in pass `run` (0: the first), its warm-up's the next one: llmlaunch-bench's under
    serve_bench, which the in-process yardsticks send too.  New to the engine at every load and every pass, so a prefix
    cache serves none of them from an earlier one."""
    return 2 * c + 10000 * run


def counter(start: int, stop: int):
    """take() for one process: start, start+1, ..., stop-1, then None."""
    it = iter(range(start, stop))
    return lambda: next(it, None)


async def load_rows(args, drive, path: str, load_s: float) -> list:
    """Each --concurrency C:N on one engine: C warm-up requests, then N counted in closed loops of C, one row each.
    `drive(streams, take, clock)` runs closed loops on the engine (closed_loop over its stream_of)."""
    rows = []
    for c, n in parse_loads(args.concurrency):
        warmup = c if args.warmup < 0 else args.warmup
        clock = {"t0": time.perf_counter()}
        await drive(warmup, counter(0, warmup), clock)
        clock["t0"] = time.perf_counter()
        results = await drive(c, counter(warmup, warmup + n), clock)
        m = metrics.compute(results, max(r.end for r in results))
        rows.append({"path": path, "concurrency": c, "requests": n, "load_s": load_s, **m})
        print_row(rows[-1])
    return rows


def print_row(r: dict) -> None:
    def ms(stats: dict) -> str:  # None where no request had two responses (every token came in one)
        return "-" if stats.get("p50") is None else f"{stats['p50']:.2f}"

    print(
        f"{r['path']:<22} C={r['concurrency']:>4} n={r['requests']:>5}: {r['output_throughput']:>10.1f} tok/s  "
        f"TTFT p50 {ms(r['ttft_ms'])} ms  ITL p50 {ms(r['itl_ms'])} ms  failed {r['failed']}"
        + host_text(r.get("host")),
        flush=True,
    )
