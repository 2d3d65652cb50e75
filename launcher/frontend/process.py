"""The front end as a child process: the command line `python -m launcher.frontend` runs (`main`),
and the handle that starts it, waits until it is ready and stops it (`FrontendProcess`)."""

from __future__ import annotations

import argparse
import sys
from typing import Dict, List, Optional, Tuple

import grpc
from tritonclient.grpc import service_pb2

from launcher.domains import ROUTINGS
from launcher.frontend.server import FrontendConfig
from launcher.frontend.wire import SERVICE
from launcher.frontend.workers import run_frontend
from launcher.rank.child import ChildService, die_with_parent


def connect_host(host: str) -> str:
    """Where a local client reaches a server bound to `host`."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::", "[::]") else host


class FrontendProcess(ChildService):
    """The front end as a supervised child process of whoever starts it (`python -m launcher.frontend`)."""

    what = "front end"

    def __init__(self, cfg: FrontendConfig, env: Optional[Dict[str, str]] = None):
        super().__init__(env)
        self.cfg = cfg

    @property
    def drain_s(self) -> float:
        return self.cfg.drain_timeout_s + 10

    def argv(self) -> List[str]:
        c = self.cfg
        argv = [
            sys.executable,
            "-m",
            "launcher.frontend",
            "--host",
            c.host,
            "--port",
            str(c.port),
            "--metrics-port",
            str(c.metrics_port),
        ]
        for a in c.addrs:
            argv += ["--replica", a]
        for u in c.replica_metrics:
            argv += ["--replica-metrics", u]
        for e in c.kv_events:
            argv += ["--kv-events", e]
        if c.tokenizer:
            argv += ["--tokenizer", c.tokenizer]
        argv += [
            "--model",
            c.model_name,
            "--processes",
            str(c.processes),
            "--drain-timeout",
            str(c.drain_timeout_s),
            "--probe-interval",
            str(c.probe_interval_s),
        ]
        argv += ["--loop", c.loop, "--routing", c.routing, "--die-with-parent"]
        return argv

    def wait_ready(self, timeout_s: float) -> float:
        """Until ServerReady through the front end is true (every replica ready); raises if it exits."""
        channel_addr = f"{connect_host(self.cfg.host)}:{self.cfg.port}"
        with grpc.insecure_channel(channel_addr) as ch:
            ready = ch.unary_unary(
                f"/{SERVICE}/ServerReady",
                service_pb2.ServerReadyRequest.SerializeToString,
                service_pb2.ServerReadyResponse.FromString,
            )
            return self.wait_until(
                lambda: ready(service_pb2.ServerReadyRequest(), timeout=5).ready and self.listens(),
                timeout_s,
                channel_addr,
            )

    def listens(self) -> bool:
        """Whether this front end (its process or one of its workers) holds the port: another server that took the
        port first would answer ServerReady too."""
        import os

        from launcher.ports import listening_pids

        for pid in listening_pids(self.cfg.port):
            try:
                if os.getpgid(pid) == self.proc.pid:
                    return True
            except ProcessLookupError:
                pass
        return False


def _hostport(text: str) -> Tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m launcher.frontend",
        description="One Triton gRPC endpoint in front of several tritonserver replicas.",
    )
    p.add_argument(
        "--replica",
        action="append",
        type=_hostport,
        required=True,
        help="HOST:PORT of a replica's tritonserver gRPC endpoint (repeat)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, required=True, help="public gRPC port")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus metrics HTTP port (0 = none)")
    p.add_argument("--model", default="", help="model the health probe checks (default: ServerReady only)")
    p.add_argument("--processes", type=int, default=1, help="worker processes sharing the port (SO_REUSEPORT)")
    p.add_argument("--probe-interval", type=float, default=2.0, help="seconds between health probes (0 = none)")
    p.add_argument(
        "--drain-timeout", type=float, default=30.0, help="on SIGTERM, seconds running requests may take to finish"
    )
    p.add_argument(
        "--loop", choices=("auto", "asyncio", "uvloop"), default="auto", help="event loop; auto = uvloop when installed"
    )
    p.add_argument(
        "--routing",
        choices=ROUTINGS,
        default="least_outstanding",
        help="which replica a request goes to: least_outstanding (fewest in flight), prefix (where its prompt's "
        "prefix was sent, within a load bound) or kv (where the engines' KV-cache events say its prefix is)",
    )
    p.add_argument(
        "--replica-metrics",
        action="append",
        default=[],
        metavar="URL",
        help="a replica leader's tritonserver metrics URL, once per --replica in the same order: /metrics shows its "
        "engine's prompt and cached prompt tokens beside the front end's counters",
    )
    p.add_argument(
        "--kv-events",
        action="append",
        default=[],
        metavar="ENDPOINT",
        help="--routing kv: a replica leader's engine's KV-cache events endpoint (tcp://HOST:PORT or ipc://PATH), "
        "once per --replica in the same order",
    )
    p.add_argument("--tokenizer", default="", help="--routing kv: the model's tokenizer folder (its tokenizer.json)")
    p.add_argument("--die-with-parent", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.processes < 1:
        p.error("--processes must be >= 1")
    if args.replica_metrics and len(args.replica_metrics) != len(args.replica):
        p.error(f"--replica-metrics given {len(args.replica_metrics)} times for {len(args.replica)} --replica")
    if args.routing == "kv" and (len(args.kv_events) != len(args.replica) or not args.tokenizer):
        p.error(
            f"--routing kv needs --kv-events once per --replica (got {len(args.kv_events)} for {len(args.replica)}; "
            f"'' for a replica that publishes none) and --tokenizer (got {args.tokenizer!r})"
        )
    if args.die_with_parent:
        die_with_parent("front end")
    return run_frontend(
        args.replica,
        args.host,
        args.port,
        args.metrics_port,
        args.model,
        args.processes,
        args.probe_interval,
        args.drain_timeout,
        args.loop,
        args.routing,
        args.replica_metrics,
        args.kv_events,
        args.tokenizer,
    )
