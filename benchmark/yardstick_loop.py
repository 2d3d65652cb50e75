"""Closed-loop load on an engine in this process, the yardsticks' common loop (benchmark/engine_yardstick.py and the
served models' own functions in benchmark/served_model_yardsticks.py): requests sent as the ones before end, each
load's rows as llmlaunch-bench's metrics compute them."""

from __future__ import annotations

import asyncio
import time

from benchmark import host_pulse
from benchmark.host_pulse import text as host_text
from launcher.bench import datasets, metrics


def parse_loads(items: list) -> list:
    """["1:32", "64:1000"] -> [(1, 32), (64, 1000)]: concurrency and requests counted."""
    loads = []
    for item in items:
        c, _, n = item.partition(":")
        loads.append((int(c), int(n) if n else 10 * int(c)))
    return loads


async def closed_loop(stream_of, samples, streams: int, take, clock: dict, gap_s: float = 0.0) -> list:
    """`streams` closed-loop workers: each sends the request `take()` names (None: no more) `gap_s` after its previous
    one ended (0: at once). `stream_of(sample)` is the engine's request as an async iterator of (new tokens, prompt
    tokens, finish reason) per output; times are seconds since clock["t0"]."""
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
        first = True
        while (index := take()) is not None:
            if gap_s > 0 and not first:
                await asyncio.sleep(gap_s)
            first = False
            await one(index)

    await asyncio.gather(*(worker() for _ in range(streams)))
    return results


def load_seed(c: int, run: int = 0) -> int:
    """The seed of load C's prompts in pass `run` (0: the first), its warm-up's the next one: llmlaunch-bench's under
    serve_bench, which the in-process yardsticks send too.  New to the engine at every load and every pass, so a prefix
    cache serves none of them from an earlier one."""
    return 2 * c + 10000 * run


def samples_for(tokenizer: str, num: int, input_len: int, output_len: int, seed: int):
    """llmlaunch-bench's synthetic prompts (launcher.bench.datasets), the same for the same arguments."""
    return datasets.load(
        "synthetic", None, num, datasets.TokenCounter(tokenizer), seed=seed, input_len=input_len, output_len=output_len
    )


class LoadPrompts:
    """The prompts each load sends (--prompts).  per-load: llmlaunch-bench's under serve_bench, new to the engine at
    every load and pass (measured seed load_seed(C, pass), warm-up the next), so the yardstick's prefill is the served
    runs' prefill; shared: one list for every load (the warm-up's first, the measured after it), so a later load
    resends prompts an earlier one sent, whose prefill an engine's prefix cache serves."""

    def __init__(self, args, tokenizer: str, shared: list):
        self.args, self.tokenizer, self.shared = args, tokenizer, shared

    def for_load(self, c: int, n: int, warmup: int, run: int = 0) -> tuple:
        """(warm-up samples, their take, measured samples, their take) of load C in the run-th pass (0: the first)."""
        if self.args.prompts == "shared":
            return self.shared, counter(0, warmup), self.shared, counter(warmup, warmup + n)
        a, seed = self.args, load_seed(c, run)
        warm = samples_for(self.tokenizer, warmup, a.input_len, a.output_len, seed + 1) if warmup else []
        measured = samples_for(self.tokenizer, n, a.input_len, a.output_len, seed)
        return warm, counter(0, warmup), measured, counter(0, n)


def counter(start: int, stop: int):
    """take() for one process: start, start+1, ..., stop-1, then None."""
    it = iter(range(start, stop))
    return lambda: next(it, None)


async def load_rows(args, stream_of, prompts: LoadPrompts, path: str, load_s: float) -> list:
    """Each --concurrency C:N on one engine, --repeat passes: C warm-up requests, then N counted in closed loops of C,
    one row each, with its wall-clock window (and with --pulse, how fast the host ran then).  `stream_of(sample)` is
    the engine's request (closed_loop's)."""
    rows = []
    for run in range(args.repeat):
        for c, n in parse_loads(args.concurrency):
            warmup = c if args.warmup < 0 else args.warmup
            warm, w_take, measured, m_take = prompts.for_load(c, n, warmup, run)
            clock = {"t0": time.perf_counter()}
            await closed_loop(stream_of, warm, warmup, w_take, clock)
            clock["t0"] = time.perf_counter()
            wall = [time.time()]
            results = await closed_loop(stream_of, measured, c, m_take, clock)
            wall.append(time.time())
            m = metrics.compute(results, max(r.end for r in results))
            row = {"path": path, "pass": run + 1, "prompts": args.prompts, "concurrency": c, "requests": n}
            row["wall"] = wall
            if args.pulse:
                row["host"] = host_pulse.window(args.pulse, *wall)
            rows.append({**row, "load_s": load_s, **m})
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
