"""One front-end process: its configuration, the gRPC server in front of the replicas, the event loop."""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass, field
from typing import List, Tuple

from grpc import aio

from launcher.domains import ROUTINGS
from launcher.frontend.members import DEFAULT_POLL_S, DEFAULT_SLOTS, MAX_SLOTS, MembersFile
from launcher.frontend.metrics import _serve_metrics, members_text, metrics_text, with_engines, with_member_engines
from launcher.frontend.proxy import Frontend
from launcher.frontend.routing import make_routing
from launcher.frontend.wire import _MAX_MESSAGE, log
from launcher.procs.config import JsonConfig
from launcher.procs.drain import DRAIN_SIGNAL, reason

LOOPS = ("auto", "asyncio", "uvloop")  # FrontendConfig.loop


@dataclass
class FrontendConfig(JsonConfig):
    """Everything one front end serves by: the one place of its defaults.  Rank 0 (launcher/rank/frontend.py) fills
    it in, FrontendProcess writes it as JSON, `python -m launcher.frontend --config FILE` reads it back, and each
    worker process gets the same object."""

    # (host, gRPC port) of each replica's tritonserver; [] (and ignored) where `members` names them
    replicas: List[Tuple[str, int]]
    host: str = "127.0.0.1"  # address the front end binds
    port: int = 8001  # public gRPC port
    metrics_port: int = 0  # Prometheus metrics (HTTP); 0 = none
    model_name: str = ""  # the model the health probe checks; "" = ServerReady only
    processes: int = 1  # worker processes sharing the gRPC port (SO_REUSEPORT)
    probe_interval_s: float = 2.0  # health probe period; 0 = no periodic probe
    drain_timeout_s: float = 30.0  # on SIGTERM, how long running requests may finish
    loop: str = "auto"  # auto (uvloop when installed) | asyncio | uvloop
    # which replica a request goes to: least_outstanding | prefix | kv (launcher/frontend/routing.py)
    routing: str = "least_outstanding"
    # each replica leader's tritonserver metrics URL, in the replicas' order ("" = none): /metrics shows beside the
    # front end's own counters the prompt tokens each replica's engine admitted and served from its prefix cache
    replica_metrics: List[str] = field(default_factory=list)
    # routing kv: each replica leader's KV-cache events endpoint, in the replicas' order (launcher/kv_events.py;
    # "" = its engine publishes none)
    kv_events: List[str] = field(default_factory=list)
    tokenizer: str = ""  # routing kv: the model's tokenizer folder the prompts are cut into token blocks with
    # times one running request of model_name may move to another replica mid-stream when its replica fails
    # (launcher/frontend/migration.py); 0: never (its engine cannot continue a request: Engine.continues_requests)
    max_migrations: int = 0
    # a replica that answers none of its running requests for this long (a hung engine) is failed like a dead one:
    # its streams move (or end naming the stall), it stays out of routing for as long again; 0: never
    stall_timeout_s: float = 0.0
    # the circuit breaker: a replica whose requests fail with the server's own errors this many times in a row (a
    # bad request never counts: launcher/error_kinds.py) is taken out of routing for breaker_cooldown_s (doubled each
    # time in a row, up to 8x), then probed and taken back on trial; 0: never
    breaker_errors: int = 0
    # how long the circuit breaker keeps such a replica out of routing the first time in a row
    breaker_cooldown_s: float = 30.0
    # the members file (launcher/frontend/members.py) a controller writes as replicas join, drain and leave: when
    # set, the replica set follows it while the front end runs (`replicas`, `replica_metrics` and `kv_events` are
    # ignored: the file names each replica with its slot, name, metrics URL); "" = the fixed `replicas`
    members: str = ""
    # with `members`: the most replicas at once, slots 0..slots-1 (the several worker processes' shared counters
    # hold that many); 0 = 16
    slots: int = 0
    members_poll_s: float = DEFAULT_POLL_S  # with `members`: how often each process looks whether the file changed
    # disaggregated prefill and decode (launcher/frontend/disagg.py), in the replicas' order: a prefill replica's
    # transfer endpoint (hf: where its engine serves its prompts' blocks; vLLM: its NIXL side channel), "" for a decode
    # replica; [] = none.  It says which replicas prefill; a request's decode gets the kv_handle its prefill returned
    kv_transfer: List[str] = field(default_factory=list)

    def __post_init__(self):
        self.replicas = [tuple(r) for r in self.replicas]
        n = len(self.replicas)
        if not n and not self.members:
            raise ValueError("FrontendConfig.replicas is empty: give (host, gRPC port) of every replica")
        self._check_members()
        self._check_disagg()
        if self.processes < 1:
            raise ValueError(f"FrontendConfig.processes is {self.processes}: at least 1 process serves; give 1 or more")
        if self.loop not in LOOPS:
            raise ValueError(f"FrontendConfig.loop is {self.loop!r}: give one of {', '.join(LOOPS)}")
        if self.routing not in ROUTINGS:
            raise ValueError(f"FrontendConfig.routing is {self.routing!r}: give one of {', '.join(ROUTINGS)}")
        if self.replica_metrics and len(self.replica_metrics) != n:
            raise ValueError(
                f"FrontendConfig.replica_metrics has {len(self.replica_metrics)} URLs for {n} replicas: give one a "
                f'replica, in their order ("" for one without), or none'
            )
        if self.routing == "kv" and (len(self.kv_events) != n or not self.tokenizer):
            raise ValueError(
                f'FrontendConfig.routing kv needs kv_events once a replica (got {len(self.kv_events)} for {n}; "" '
                f"for a replica that publishes none) and the tokenizer (got {self.tokenizer!r})"
            )

    def _check_disagg(self) -> None:
        if not self.kv_transfer:
            return
        n, prefill = len(self.replicas), sum(1 for a in self.kv_transfer if a)
        if self.members or len(self.kv_transfer) != n or not 0 < prefill < n:
            raise ValueError(
                f"FrontendConfig.kv_transfer has {len(self.kv_transfer)} entries ({prefill} prefill) for {n} fixed "
                'replicas: give one a replica, host:port for a prefill replica and "" for a decode one, at least one '
                "of each, and no members file"
            )

    def _check_members(self) -> None:
        if not self.members:
            if self.slots:
                raise ValueError(
                    f"FrontendConfig.slots is {self.slots} without members: slots bounds a members file's replica "
                    "set; give members (the file's path), or leave slots 0"
                )
            return
        if not 0 <= self.slots <= MAX_SLOTS:
            raise ValueError(
                f"FrontendConfig.slots is {self.slots}: the members file's replicas take slots 0..slots-1, and the "
                f"worker processes' shared counters hold every slot; give 1 to {MAX_SLOTS} (0 = {DEFAULT_SLOTS})"
            )
        if self.members_poll_s <= 0:
            raise ValueError(
                f"FrontendConfig.members_poll_s is {self.members_poll_s}: the front end looks at the members file "
                f"this often; give a positive number of seconds (default {DEFAULT_POLL_S})"
            )
        if self.routing == "kv":
            raise ValueError(
                "FrontendConfig.routing is 'kv' with members: kv routing subscribes to a fixed list of replicas' "
                "KV-cache events as it starts, and a members file's replicas come and go; give routing prefix (the "
                "same prefix routing, by the text sent) or least_outstanding, or a fixed `replicas` list"
            )

    @property
    def slot_count(self) -> int:
        """The replica places counted and shared: a members file's slots, else one a fixed replica."""
        return (self.slots or DEFAULT_SLOTS) if self.members else len(self.replicas)

    def members_file(self) -> MembersFile:
        """A process's follower of the members file (launcher/frontend/members.py)."""
        return MembersFile(self.members, self.slot_count, self.members_poll_s)

    @property
    def addrs(self) -> List[str]:
        """HOST:PORT of each replica, in their order (what logs and the metrics' labels name)."""
        return [f"{h}:{p}" for h, p in self.replicas]


def _server_options(reuse_port: bool) -> list:
    # gRPC turns SO_REUSEPORT on by default, which would let a second server silently share a taken
    # port; one process binds exclusively, several workers share on purpose.
    return [
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        ("grpc.max_send_message_length", _MAX_MESSAGE),
        ("grpc.max_receive_message_length", _MAX_MESSAGE),
    ]


def _frontend(cfg: FrontendConfig) -> Frontend:
    """The routing core `cfg` describes (not started)."""
    return Frontend(
        cfg.replicas,
        cfg.model_name,
        cfg.probe_interval_s,
        make_routing(cfg.routing, cfg.kv_events, cfg.tokenizer),
        cfg.max_migrations,
        cfg.stall_timeout_s,
        cfg.breaker_errors,
        cfg.breaker_cooldown_s,
        cfg.members_file() if cfg.members else None,
        cfg.kv_transfer,
    )


def _metrics_page(cfg: FrontendConfig, fe: Frontend):
    """One process's /metrics page and its own counters alone: by the fixed replicas or by the members it applied."""
    if not cfg.members:

        def own() -> str:
            return metrics_text(fe.snapshot(), cfg.addrs)

        return with_engines(own, cfg.addrs, cfg.replica_metrics), own

    def applied():
        return [fe.members.applied[s] for s in sorted(fe.members.applied)]

    def counters() -> str:
        return members_text(fe.snapshot(), applied())

    return with_member_engines(counters, applied), counters


async def _serve(cfg: FrontendConfig, reuse_port: bool, publish=None, on_bound=None, setup=None) -> None:
    """Run one front-end process until SIGTERM/SIGINT; `publish(snapshot)` is called periodically."""
    fe = _frontend(cfg)
    if setup is not None:
        setup(fe)
    await fe.start()
    server = aio.server(options=_server_options(reuse_port))
    server.add_generic_rpc_handlers((fe.handler(),))
    try:
        server.add_insecure_port(f"{cfg.host}:{cfg.port}")
    except RuntimeError as e:
        from launcher.ports import port_holders

        who = "; ".join(port_holders(cfg.port))
        raise SystemExit(
            f"front end: cannot bind gRPC {cfg.host}:{cfg.port}: {e}" + (f"; held by {who}" if who else "")
        ) from None
    await server.start()
    metrics = None
    if cfg.metrics_port and publish is None:
        try:
            metrics = await _serve_metrics(cfg.host, cfg.metrics_port, *_metrics_page(cfg, fe))
        except OSError as e:
            raise SystemExit(f"front end: cannot bind metrics {cfg.host}:{cfg.metrics_port}: {e}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)

    def drain() -> None:  # the drain notice: refuse new requests, let running ones finish
        if not fe.draining:  # Slurm's signal and the rank's notice both come
            fe.draining = reason()
            log(f"draining: {fe.draining}")

    loop.add_signal_handler(DRAIN_SIGNAL, drain)
    if on_bound is not None:
        on_bound()
    ups = sum(r.up for r in fe.replicas)
    to = f"the members of {cfg.members}" if cfg.members else ", ".join(cfg.addrs)
    log(
        f"serving {cfg.host}:{cfg.port} -> {to} ({ups}/{len(fe.replicas)} up, {type(loop).__module__.split('.')[0]} loop)"
        + (f"; metrics http://{cfg.host}:{cfg.metrics_port}/metrics" if metrics else "")
    )
    publisher = None
    if publish is not None:

        async def publish_loop():
            while True:
                publish(fe.snapshot())
                await asyncio.sleep(0.2)

        publisher = loop.create_task(publish_loop())
    await stop.wait()
    log(f"stopping: draining running requests (up to {cfg.drain_timeout_s:.0f}s)")
    await server.stop(cfg.drain_timeout_s)
    if publisher is not None:
        publisher.cancel()
        publish(fe.snapshot())
    if metrics is not None:
        metrics.close()
    await fe.close()


def _uvloop():
    try:
        import uvloop

        return uvloop
    except ImportError:
        return None


def _run_loop(coro, loop_kind: str) -> None:
    """asyncio's loop, or uvloop's (measured: 20-30% less CPU per forwarded response,
    benchmark/frontend_capacity.py); "auto" takes uvloop when it is installed."""
    uv = _uvloop() if loop_kind in ("auto", "uvloop") else None
    if loop_kind == "uvloop" and uv is None:
        raise SystemExit("front end: loop uvloop, but uvloop is not installed (pip install uvloop, or loop auto)")
    if uv is not None:
        uv.run(coro)
    else:
        asyncio.run(coro)
