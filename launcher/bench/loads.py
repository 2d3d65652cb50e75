"""Load shapes shared by benchmarks that drive several paths with the same requests: a closed loop (C requests in
flight) or an open loop (Poisson arrivals at a rate, launcher.bench.runner's pacing), and the output lengths drawn
for them.

    add_open_loop_args(ap, "...")      # --request-rate / --open-seconds
    check_open_loop_args(ap, args)
    for load in make_loads(args, args.client_processes): ...
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Load:
    """One row of the comparison, the same for every path: a closed loop (`concurrency` requests in flight, each
    finished one's successor sent at once), or with a `rate` an open loop: request i is sent at its arrival time
    whatever is in flight, the same times on every path, so that a path's TTFT cannot differ by when its requests
    came (a closed loop's successors arrive when the last piece reached the client, later through a server)."""

    requests: int  # requests a round
    concurrency: int = 0  # closed loop: requests in flight (0 with a rate)
    rate: float = 0.0  # open loop: mean requests/s, Poisson arrivals (launcher.bench.runner's pacing)
    processes: int = 1  # the served path's client processes (a closed loop: at most C); an open loop's arrivals
    # are the same however many send them (arrival_times)
    seed: int = 0  # prompts, drawn output lengths and arrival times
    name_processes: bool = False  # the label names `processes` (several --client-processes: rows differ by it)

    def label(self) -> str:
        base = f"rate={self.rate:g}/s" if self.rate else f"C={self.concurrency}"
        return f"{base}, {self.processes} client processes" if self.name_processes else base

    def open_spec(self, streams: int = 1):
        """The load generator's LoadSpec of this open loop (no concurrency cap: the engine queues what it has no
        slot for, on every path alike)."""
        from launcher.bench.runner import LoadSpec

        return LoadSpec(
            concurrency=None,
            request_rate=self.rate,
            num_requests=self.requests,
            processes=self.processes,
            streams=streams,
            seed=self.seed,
        )

    def warmup(self, max_num_seqs: int) -> "Load":
        """The warm-up before the rounds (allocator, first-call costs): this closed loop itself, or for an open loop a
        closed one of up to 32 requests."""
        if self.concurrency:
            return self
        n = min(self.requests, 32, max_num_seqs)
        return Load(requests=n, concurrency=n)

    def arrivals(self) -> list[float] | None:
        """Send times (s after the start) of an open loop's requests, those the served path's generator keeps; None
        for a closed loop."""
        from launcher.bench.runner import arrival_times

        return arrival_times(self.open_spec(), self.requests) if self.rate else None


def add_open_loop_args(ap: argparse.ArgumentParser, same: str) -> None:
    """--request-rate / --open-seconds: open loops after the closed ones (`same`: who gets the same arrival times);
    check them with `check_open_loop_args`, make the loads with `make_loads`."""
    ap.add_argument(
        "--request-rate",
        type=float,
        nargs="+",
        default=[],
        metavar="R",
        help=f"open loops after the closed ones: requests sent at R/s (Poisson), {same}, whatever is in flight",
    )
    ap.add_argument(
        "--open-seconds",
        type=float,
        default=4.0,
        metavar="S",
        help="an open loop sends R x S requests a round (at least 16)",
    )


def check_open_loop_args(ap: argparse.ArgumentParser, args) -> None:
    bad_rate = [r for r in args.request_rate if not 0 < r < float("inf")]
    if bad_rate or not args.open_seconds > 0:
        ap.error(
            f"--request-rate {bad_rate[0]:g}: a rate is a number of requests/s above 0"
            if bad_rate
            else f"--open-seconds {args.open_seconds:g}: an open loop needs a length above 0 s"
        )


def make_loads(args, processes: list[int] = (1,)) -> list[Load]:
    """The closed loops of --concurrency (--requests-per-stream x C requests), then the open loops of --request-rate
    (R x --open-seconds, at least 16); each once per count of `processes` (the served path's client processes), side
    by side: a load's rows for 8 and 16 clients follow each other, on the same prompts and arrivals."""
    several = len(processes) > 1
    loads = [
        Load(requests=c * args.requests_per_stream, concurrency=c, processes=p, seed=c, name_processes=several)
        for c in args.concurrency
        for p in dict.fromkeys(max(1, min(p, c)) for p in processes)
    ]  # a closed loop has at most C clients
    return loads + [
        Load(requests=max(16, round(r * args.open_seconds)), rate=r, processes=p, seed=round(r), name_processes=several)
        for r in args.request_rate
        for p in processes
    ]


def draw_output_lengths(n: int, low: int, high: int, seed: int) -> list[int]:
    """n exact output lengths drawn from [low, high] (seeded: every path and round gets the same ones)."""
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(n)]
