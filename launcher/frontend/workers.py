"""Several front-end processes: workers share the gRPC port (SO_REUSEPORT), each routes by the
in-flight counts of all of them (shared memory), and the parent serves the metrics, summing the
workers' counters, and fails if a worker dies. `run_frontend` picks one process or several."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from launcher.frontend.metrics import _METRICS, _PER_REPLICA, _serve_metrics, metrics_text, with_engines
from launcher.frontend.proxy import Frontend
from launcher.frontend.server import FrontendConfig, _run_loop, _serve
from launcher.frontend.wire import log
from launcher.procs.drain import DRAIN_SIGNAL


def _slot_index(slot: int, replica: int, key: str, n_replicas: int) -> int:
    """Where worker `slot` keeps counter `key` of `replica` in the shared array."""
    keys = [k for k, *_ in _METRICS]
    return slot * (2 + _PER_REPLICA * n_replicas) + 2 + replica * _PER_REPLICA + keys.index(key)


def _worker_main(cfg: FrontendConfig, slot: int, shared, bound) -> None:
    base = slot * (2 + _PER_REPLICA * len(cfg.replicas))
    keys = [k for k, *_ in _METRICS]
    n = len(cfg.replicas)

    def share_load(fe: Frontend) -> None:
        for r in fe.replicas:
            r.shared = shared
            r.shared_at = _slot_index(slot, r.index, "in_flight", n)
            r.peers_at = tuple(_slot_index(w, r.index, "in_flight", n) for w in range(cfg.processes) if w != slot)

    def publish(snap: dict) -> None:
        shared[base] = snap["streams_active"]
        shared[base + 1] = snap["rejected"]
        at = base + 2
        for r in snap["replicas"]:
            for k in keys:
                shared[at] = r[k]
                at += 1

    _run_loop(_serve(cfg, reuse_port=True, publish=publish, on_bound=bound.set, setup=share_load), cfg.loop)


def _sum_shared(shared, processes: int, n_replicas: int) -> dict:
    width = 2 + _PER_REPLICA * n_replicas
    keys = [k for k, *_ in _METRICS]
    snap = {"streams_active": 0, "rejected": 0, "replicas": [dict.fromkeys(keys, 0) for _ in range(n_replicas)]}
    for r in snap["replicas"]:
        r["up"] = 1
    for w in range(processes):
        base = w * width
        snap["streams_active"] += shared[base]
        snap["rejected"] += shared[base + 1]
        at = base + 2
        for r in snap["replicas"]:
            for k in keys:
                # up: the replica is up only if every worker routes to it
                r[k] = min(r[k], shared[at]) if k == "up" else r[k] + shared[at]
                at += 1
    return snap


def _supervise(cfg: FrontendConfig) -> int:
    import multiprocessing as mp

    from launcher.ports import in_use_text, port_free

    if not port_free(cfg.host, cfg.port):
        raise SystemExit(f"front end: {in_use_text(cfg.host, cfg.port)}")
    ctx = mp.get_context("spawn")  # gRPC does not survive fork
    width = 2 + _PER_REPLICA * len(cfg.replicas)
    shared = ctx.RawArray("q", width * cfg.processes)
    for w in range(cfg.processes):
        for r in range(len(cfg.replicas)):
            shared[_slot_index(w, r, "up", len(cfg.replicas))] = 1  # "up" until the worker publishes
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

            def own() -> str:
                return metrics_text(_sum_shared(shared, cfg.processes, len(cfg.replicas)), cfg.addrs, cfg.processes)

            metrics = await _serve_metrics(
                cfg.host, cfg.metrics_port, with_engines(own, cfg.addrs, cfg.replica_metrics)
            )
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


def run_frontend(cfg: FrontendConfig) -> int:
    """Serve `cfg` until SIGTERM/SIGINT (then drain running requests): one process, or cfg.processes workers
    sharing the port; returns the exit status."""
    if cfg.processes > 1:
        return _supervise(cfg)
    _run_loop(_serve(cfg, reuse_port=False), cfg.loop)
    return 0
