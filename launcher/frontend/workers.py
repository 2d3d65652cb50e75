"""Several front-end processes: workers share the gRPC port (SO_REUSEPORT), each routes by the
in-flight counts of all of them (shared memory), and the parent serves the metrics, summing the
workers' counters, and fails if a worker dies. `run_frontend` picks one process or several.

The shared array: per worker, its HEAD counters then REPLICA_KEYS of each replica place (a fixed replica, or a
members file's slot: FrontendConfig.slot_count).  With a members file every worker follows the file itself; the
parent reads it too, for the labels of each slot's counters."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from launcher.frontend import first_tokens
from launcher.frontend.metrics import (
    REPLICA_KEYS,
    _serve_metrics,
    members_text,
    metrics_text,
    with_engines,
    with_member_engines,
)
from launcher.frontend.proxy import Frontend
from launcher.frontend.server import FrontendConfig, _run_loop, _serve
from launcher.frontend.wire import log
from launcher.procs.drain import DRAIN_SIGNAL

# a worker's counters of its own, before its replicas': its streams, refusals, the members version it applied and its
# first-token histogram (launcher/frontend/first_tokens.py), which the parent adds up as it does the others
HEAD = ("streams_active", "rejected", "members_version") + first_tokens.KEYS
_LEAST = ("up", "draining")  # up (draining): only where every worker routes to it (none does); the others add up


def _width(n_replicas: int) -> int:
    """A worker's part of the shared array."""
    return len(HEAD) + len(REPLICA_KEYS) * n_replicas


def _slot_index(worker: int, replica: int, key: str, n_replicas: int) -> int:
    """Where `worker` keeps counter `key` of `replica` (its index: a members file's slot) in the shared array."""
    return worker * _width(n_replicas) + len(HEAD) + replica * len(REPLICA_KEYS) + REPLICA_KEYS.index(key)


def _worker_main(cfg: FrontendConfig, worker: int, shared, bound) -> None:
    n = cfg.slot_count
    base = worker * _width(n)

    def attach(r) -> None:  # its in-flight count, shared with the other workers
        r.shared = shared
        r.shared_at = _slot_index(worker, r.index, "in_flight", n)
        r.peers_at = tuple(_slot_index(w, r.index, "in_flight", n) for w in range(cfg.processes) if w != worker)

    def share_load(fe: Frontend) -> None:
        fe.attach = attach  # the replicas a members file adds
        for r in fe.replicas:
            attach(r)

    def publish(snap: dict) -> None:
        for i, k in enumerate(HEAD):
            shared[base + i] = snap.get(k, 0)
        at = base + len(HEAD)
        for r in snap["replicas"]:
            for k in REPLICA_KEYS:
                shared[at] = r[k]
                at += 1

    _run_loop(_serve(cfg, reuse_port=True, publish=publish, on_bound=bound.set, setup=share_load), cfg.loop)


def _sum_shared(shared, processes: int, n_replicas: int) -> dict:
    width = _width(n_replicas)
    snap = {k: 0 for k in HEAD}
    snap["replicas"] = [dict.fromkeys(REPLICA_KEYS, 0) for _ in range(n_replicas)]
    for r in snap["replicas"]:
        for k in _LEAST:
            r[k] = 1
    for w in range(processes):
        base = w * width
        for i, k in enumerate(HEAD):
            # the members file's version: the lowest any worker applied
            if k == "members_version":
                snap[k] = shared[base + i] if w == 0 else min(snap[k], shared[base + i])
            else:
                snap[k] += shared[base + i]
        at = base + len(HEAD)
        for r in snap["replicas"]:
            for k in REPLICA_KEYS:
                r[k] = min(r[k], shared[at]) if k in _LEAST else r[k] + shared[at]
                at += 1
    return snap


def _supervise(cfg: FrontendConfig) -> int:
    import multiprocessing as mp

    from launcher.ports import in_use_text, port_free

    if not port_free(cfg.host, cfg.port):
        raise SystemExit(f"front end: {in_use_text(cfg.host, cfg.port)}")
    ctx = mp.get_context("spawn")  # gRPC does not survive fork
    n = cfg.slot_count
    shared = ctx.RawArray("q", _width(n) * cfg.processes)
    for w in range(cfg.processes):
        for r in range(n):
            shared[_slot_index(w, r, "up", n)] = 1  # "up" until the worker publishes
    events = [ctx.Event() for _ in range(cfg.processes)]
    workers = [
        ctx.Process(target=_worker_main, args=(cfg, w, shared, events[w]), name=f"frontend-worker{w}", daemon=True)
        for w in range(cfg.processes)
    ]
    for p in workers:
        p.start()

    async def main() -> int:
        metrics = None
        if cfg.metrics_port:
            metrics = await _serve_metrics(cfg.host, cfg.metrics_port, *_metrics_page(cfg, shared))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for s in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(s, stop.set)
        # the drain notice reaches the workers too (one process group): they refuse new requests, this one waits
        loop.add_signal_handler(DRAIN_SIGNAL, lambda: None)
        log(
            f"{cfg.processes} worker processes share {cfg.host}:{cfg.port}"
            + (f"; metrics http://{cfg.host}:{cfg.metrics_port}/metrics" if metrics else "")
        )
        code = 0
        while not stop.is_set():
            dead = [p for p in workers if not p.is_alive()]
            if dead:
                log(f"worker {dead[0].name} exited with status {dead[0].exitcode}: stopping")
                code = 1
                break
            try:
                await asyncio.wait_for(stop.wait(), 0.2)
            except asyncio.TimeoutError:
                pass
        for p in workers:
            if p.is_alive():
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + cfg.drain_timeout_s + 5
        for p in workers:
            await loop.run_in_executor(None, p.join, max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()
        if metrics is not None:
            metrics.close()
        return code

    return asyncio.run(main())


def _metrics_page(cfg: FrontendConfig, shared):
    """The parent's /metrics page and its own counters alone: the workers' counters summed, labelled by the fixed
    replicas or by the members file as the parent reads it."""
    if not cfg.members:

        def own() -> str:
            return metrics_text(_sum_shared(shared, cfg.processes, cfg.slot_count), cfg.addrs, cfg.processes)

        return with_engines(own, cfg.addrs, cfg.replica_metrics), own
    names = cfg.members_file()  # read, never applied: the parent routes nothing

    def labelled() -> str:
        return members_text(_sum_shared(shared, cfg.processes, cfg.slot_count), names.members(), cfg.processes)

    return with_member_engines(labelled, names.members), labelled


def run_frontend(cfg: FrontendConfig) -> int:
    """Serve `cfg` until SIGTERM/SIGINT (then drain running requests): one process, or cfg.processes workers
    sharing the port; returns the exit status."""
    if cfg.processes > 1:
        return _supervise(cfg)
    _run_loop(_serve(cfg, reuse_port=False), cfg.loop)
    return 0
