"""The load generator: sends a list of generations to one model with a given
load shape and collects a StreamRecord per request.

Load shapes (LoadSpec):
* fixed concurrency: at most `concurrency` requests in flight, the next one
  sent as soon as one finishes;
* request rate: arrivals spaced by gamma-distributed gaps of mean
  1/`request_rate` (shape `burstiness`; 1 = Poisson), optionally capped by
  `concurrency` (a request then waits for a free slot);
* limits: `num_requests` and/or `duration` (stop sending after that many
  seconds; the dataset is cycled), `warmup` requests first, not counted.

Several client processes (`processes`) split the load: each gets 1/P of the
concurrency, and all start at the same instant (perf_counter is CLOCK_MONOTONIC,
shared by the processes of one machine, so their timestamps are comparable). In
a closed loop they share one queue of requests: a process whose request ended
takes the next one not yet sent, whichever process sent the ones before, as one
process would. (Dealing request i to process i % P instead leaves the process
dealt the longest ones running alone at the end: at 8 streams in 8 processes,
64-192 new tokens, an H200 server then seemed to keep 0.905 of in-process
tokens/s instead of 0.991.) At a request rate the arrival
times are one schedule (`arrival_schedule`) whatever P is: request i is due at
the i-th time and its process sends it then, so a run with 16 processes offers
the server the same arrivals as one with 8 (and the load stays one Poisson
stream, not P of them, each starting with a request at 0). Each process can
spread its requests over several gRPC streams (`streams`).

Nothing here runs on the receive path except `on_done`, once per request.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
import traceback
from dataclasses import dataclass, field, replace
from typing import Optional

from launcher.client.connection import ClientError
from launcher.client.request import Generation
from launcher.client.response import StreamRecord


@dataclass
class LoadSpec:
    concurrency: Optional[int] = None  # max requests in flight (None: no cap; needs a request_rate)
    request_rate: float = math.inf  # mean requests/s; inf = no pacing
    burstiness: float = 1.0  # gamma shape of the arrival gaps; 1 = Poisson, < 1 burstier
    num_requests: Optional[int] = None  # measured requests (None: one per sample, or unlimited with duration)
    duration: Optional[float] = None  # stop sending after this many seconds
    warmup: int = 0  # requests sent and awaited before measuring, not counted
    streams: int = 1  # gRPC streams per client process
    processes: int = 1  # client processes
    seed: int = 0  # seed of the arrival times
    timeout: float = 600.0  # give up on requests still running this long after the last send

    def check(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"--concurrency must be >= 1, got {self.concurrency}")
        if not (self.request_rate > 0):
            raise ValueError(f"--request-rate must be > 0 (or inf), got {self.request_rate}")
        if self.concurrency is None and math.isinf(self.request_rate):
            raise ValueError(
                "give --concurrency N, or --request-rate R (use --request-rate inf to send everything at once)"
            )
        if self.burstiness <= 0:
            raise ValueError(f"--burstiness must be > 0, got {self.burstiness}")
        if self.processes < 1 or self.streams < 1:
            raise ValueError("--processes and --streams must be >= 1")
        if self.concurrency is not None and self.concurrency < self.processes:
            raise ValueError(f"--concurrency {self.concurrency} is below --processes {self.processes}")
        if self.duration is not None and self.duration <= 0:
            raise ValueError(f"--duration must be > 0 s, got {self.duration}")


def arrival_schedule(rate: float, burstiness: float, seed: int, chunk: int = 4096):
    """The arrival times (s after the start) of requests 0, 1, 2, ... at `rate` requests/s, without end: the first at
    0, then gamma-distributed gaps of shape `burstiness` (1 = Poisson) and mean 1/rate, seeded by `seed` alone, so
    every client process draws the same schedule and sends its own share of it.  Drawn `chunk` gaps at a time (a
    process skips the others' requests: P draws a send)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    scale = 1.0 / (rate * burstiness)
    at = 0.0
    while True:
        for gap in rng.gamma(burstiness, scale, size=chunk).tolist():
            yield at
            at += gap


def arrival_times(spec: LoadSpec, count: int) -> list:
    """When (s after the start) each of requests 0 .. count-1 is due under `spec`'s pacing, as `run_load` paces them
    (`arrival_schedule`; every process, whichever sends request i, sends it at the i-th time).  A concurrency cap may
    hold a request back past its time; nothing else does.  Pure, so that another driver can send the same requests at
    the same times (benchmark/overhead.py gives an in-process engine the served path's arrivals)."""
    if math.isinf(spec.request_rate):
        return [0.0] * count
    return list(itertools.islice(arrival_schedule(spec.request_rate, spec.burstiness, spec.seed), count))


@dataclass
class Job:
    """What one client process does."""

    url: str
    model: str
    gens: list  # the dataset as Generations; request i uses gens[i % len(gens)]
    spec: LoadSpec
    parameters: dict = field(default_factory=dict)  # Triton request parameters for every request
    rank: int = 0  # this process's number
    world: int = 1  # number of processes
    backend: str = "triton-grpc"  # the protocol requests go over: a name of launcher.bench.backends
    # the warm-up requests' Generations (warm-up request i uses warm_gens[i % len]); empty: the measured ones'
    warm_gens: list = field(default_factory=list)


@dataclass
class RunOutput:
    records: list  # (request index, StreamRecord), sorted by index
    t0: float  # perf_counter() of the start of the measured phase
    warmup_errors: list  # error strings of failed warm-up requests


def share(total: Optional[int], rank: int, world: int) -> Optional[int]:
    """Process `rank`'s share of `total` (the concurrency) split over `world` client processes, the first ones taking
    one more where it does not divide; None stays None (no cap)."""
    if total is None:
        return None
    return total // world + (1 if rank < total % world else 0)


def shared_indices(queue, total: Optional[int]):
    """Request numbers 0, 1, 2, ... (below `total`; without end for None) taken one at a time from `queue`, a
    multiprocessing Value shared by the client processes: each number goes to exactly one of them."""
    while True:
        with queue.get_lock():
            i = queue.value
            queue.value = i + 1
        if total is not None and i >= total:
            return
        yield i


class _Driver:
    def __init__(self, job: Job):
        self.job = job
        spec = job.spec
        self.concurrency = share(spec.concurrency, job.rank, job.world)
        self.rate = spec.request_rate  # the whole run's: the schedule is shared, this process sends its share
        self.slots = threading.Semaphore(self.concurrency) if self.concurrency else None
        self.finished: list = []  # StreamRecords of measured requests, in completion order
        self.measuring = False
        from launcher.bench.backends import get

        backend = get(job.backend)
        self.build = backend.build
        self.streams = [backend.stream(job.url, on_done=self._on_done) for _ in range(spec.streams)]

    def _on_done(self, rec) -> None:  # receive thread, once per request
        if self.measuring:
            self.finished.append(rec)
        if self.slots is not None:
            self.slots.release()

    def counts(self, state: list) -> tuple:
        """(done, output tokens, failed) so far; `state` = [position, tokens, failed] carried between calls."""
        fin = self.finished
        n = len(fin)
        for rec in fin[state[0] : n]:
            state[1] += rec.output_tokens if rec.output_tokens is not None else len(rec.times)
            state[2] += 1 if rec.error else 0
        state[0] = n
        return n, state[1], state[2]

    def _send_all(
        self, indices, prefix: str, start_at: float, pace: bool, duration: Optional[float], gens=None
    ) -> list:
        job, spec = self.job, self.job.spec
        gens = gens or job.gens
        n_gens, model, params, build = len(gens), job.model, job.parameters, self.build
        perf, sleep = time.perf_counter, time.sleep
        due = None  # paced: the times of this process's requests (indices rank, rank + world, ...) in the schedule
        if pace and math.isfinite(self.rate):
            due = itertools.islice(arrival_schedule(self.rate, spec.burstiness, spec.seed), job.rank, None, job.world)
        # a closed loop takes a free slot first and then its next request: from a queue shared with other client
        # processes (`shared_indices`), a request is taken only by a process that can send it at once
        slot_first = self.slots is not None and due is None
        records = []
        streams, n_streams = self.streams, len(self.streams)
        indices = iter(indices)
        for j in itertools.count():
            if slot_first:
                self.slots.acquire()
            idx = next(indices, None)
            if idx is None:
                if slot_first:
                    self.slots.release()
                break
            req = build(model, gens[idx % n_gens], f"{prefix}{idx}", params)
            if due is not None:
                delay = start_at + next(due) - perf()
                if delay > 0:
                    sleep(delay)
            if duration is not None and perf() - start_at >= duration:
                if slot_first:
                    self.slots.release()
                break
            if self.slots is not None and not slot_first:
                self.slots.acquire()
                if duration is not None and perf() - start_at >= duration:
                    self.slots.release()
                    break
            rec = StreamRecord(req.id, client=job.rank)
            try:
                streams[j % n_streams].submit(req, rec)
            except ClientError as exc:  # the stream died (server gone): a failed request, not a crash
                rec.queued = rec.sent = perf()
                rec.error = str(exc)
                self._on_done(rec)
                rec.done = True
            records.append((idx, rec))
        return records

    def _wait(self, records: list) -> None:
        """Wait for every record (record j went to stream j % streams); on
        --timeout, cancel the streams so the rest end as errors."""
        spec, perf = self.job.spec, time.perf_counter
        streams, n = self.streams, len(self.streams)
        deadline = perf() + spec.timeout
        try:
            for j, (_, rec) in enumerate(records):
                streams[j % n].wait(rec, max(0.0, deadline - perf()))
        except TimeoutError:
            reason = f"still running {spec.timeout:g} s after the last request was sent (--timeout)"
            for s in streams:
                s.cancel(reason)
            for j, (_, rec) in enumerate(records):
                streams[j % n].wait(rec, 30.0)

    def warmup(self) -> list:
        spec, job = self.job.spec, self.job
        if not spec.warmup:
            return []
        indices = range(job.rank, spec.warmup, job.world)
        records = self._send_all(indices, "warmup-", time.perf_counter(), pace=False, duration=None, gens=job.warm_gens)
        self._wait(records)
        return [rec.error for _, rec in records if rec.error]

    def run(self, start_at: float, queue=None) -> list:
        """The measured requests.  `queue`: the closed loop's next request number, shared by the client processes
        (a multiprocessing Value; `shared_indices`); without it this process sends requests rank, rank + world, ..."""
        spec, job = self.job.spec, self.job
        total = spec.num_requests
        if total is None and spec.duration is None:
            total = len(job.gens)
        if queue is not None:
            indices = shared_indices(queue, total)
        else:
            indices = itertools.count(job.rank, job.world) if total is None else range(job.rank, total, job.world)
        delay = start_at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        self.measuring = True
        records = self._send_all(indices, "", start_at, pace=True, duration=spec.duration)
        self._wait(records)
        return records

    def close(self) -> None:
        for s in self.streams:
            s.close()


def run_load(job: Job, progress=None, after_warmup=None) -> RunOutput:
    """Run `job.spec` against the server. `progress(read)` builds a progress
    reporter (see launcher.bench.progress.Progress) from a read() function.
    `after_warmup()` is called once every warm-up request has ended (with several
    processes, every process's) and before the first measured one is sent: a
    reading of the server's own counters there covers the measured requests alone."""
    job.spec.check()
    if job.spec.processes > 1:
        return _run_processes(job, progress, after_warmup)
    driver = _Driver(job)
    try:
        warm_errors = driver.warmup()
        if after_warmup is not None:
            after_warmup()
        state = [0, 0, 0]
        bar = progress(lambda: driver.counts(state)) if progress else None
        start_at = time.perf_counter()
        if bar:
            bar.start()
        try:
            records = driver.run(start_at)
        finally:
            if bar:
                bar.close()
    finally:
        driver.close()
    records.sort(key=lambda x: x[0])
    return RunOutput(records, start_at, warm_errors)


# --------------------------------------------------------------------------- several processes


def _worker(job: Job, events, go, start_value, counters, queue) -> None:
    """Entry point of a client process (spawned)."""
    driver = None
    try:
        driver = _Driver(job)
        warm_errors = driver.warmup()
        events.put(("ready", job.rank, None))
        go.wait()
        stop = threading.Event()
        state = [0, 0, 0]

        def publish():
            base = 3 * job.rank
            while True:
                done, tokens, failed = driver.counts(state)
                counters[base], counters[base + 1], counters[base + 2] = done, tokens, failed
                if stop.wait(0.2):
                    return

        pub = threading.Thread(target=publish, daemon=True)
        pub.start()
        records = driver.run(start_value.value, queue)
        stop.set()
        pub.join()
        for _, rec in records:
            rec.on_response = None
        events.put(("result", job.rank, (records, warm_errors)))
    except BaseException as exc:
        events.put(("error", job.rank, f"{exc.__class__.__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        if driver is not None:
            try:
                driver.close()
            except Exception:
                pass


def _run_processes(job: Job, progress, after_warmup=None) -> RunOutput:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # never fork a process that has gRPC threads
    world = job.spec.processes
    events = ctx.Queue()
    go = ctx.Event()
    start_value = ctx.Value("d", 0.0)
    counters = ctx.Array("q", 3 * world, lock=False)
    # a closed loop's queue of requests, shared (a paced run's requests are dealt by the schedule instead: request i
    # to process i % world, sent at the i-th time)
    queue = ctx.Value("q", 0) if math.isinf(job.spec.request_rate) else None
    procs = []
    for rank in range(world):
        p = ctx.Process(
            target=_worker,
            args=(replace(job, rank=rank, world=world), events, go, start_value, counters, queue),
            name=f"llmlaunch-bench-{rank}",
            daemon=True,
        )
        p.start()
        procs.append(p)

    def fail(message):
        raise ClientError(message)  # the client processes are stopped below, as on any way out

    def next_event(timeout):
        import queue as _q

        deadline = time.monotonic() + timeout
        while True:
            try:
                return events.get(timeout=1.0)
            except _q.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    fail(f"client process {dead[0].name} died with exit code {dead[0].exitcode}")
                if time.monotonic() > deadline:
                    fail("client processes did not report in time")

    bar, records, warm_errors, results = None, [], [], 0
    try:
        ready = 0
        while ready < world:
            kind, rank, payload = next_event(300)
            if kind == "error":
                fail(f"client process {rank} failed: {payload}")
            ready += 1
        if after_warmup is not None:  # every process's warm-up has ended; none has sent a measured request
            after_warmup()
        start_value.value = time.perf_counter() + 0.05  # everyone starts at the same instant
        go.set()
        bar = (
            progress(lambda: tuple(sum(counters[3 * r + k] for r in range(world)) for k in range(3)))
            if progress
            else None
        )
        if bar:
            bar.start()
        while results < world:
            kind, rank, payload = next_event(job.spec.timeout + (job.spec.duration or 0) + 3600)
            if kind == "error":
                fail(f"client process {rank} failed: {payload}")
            recs, werr = payload
            records.extend(recs)
            warm_errors.extend(werr)
            results += 1
    except BaseException:  # a failure, Ctrl-C or SIGTERM: the client processes stop now, not at interpreter exit
        for p in procs:
            if p.is_alive():
                p.terminate()
        raise
    finally:
        if bar:
            bar.close()
    for p in procs:
        p.join(10)
    records.sort(key=lambda x: x[0])
    return RunOutput(records, start_value.value, warm_errors)


def generations(samples, sampling: dict, stream: bool = True, ignore_eos: bool = False) -> list:
    """Generations for dataset samples: max_tokens = the sample's output length;
    `ignore_eos` enforces it (ignore_eos and min_length = max_tokens)."""
    out = []
    for s in samples:
        g = Generation(prompt=s.prompt, max_tokens=s.output_len, stream=stream, session=s.session, **sampling)
        if ignore_eos:
            g.ignore_eos = True
            g.min_tokens = s.output_len
        out.append(g)
    return out
