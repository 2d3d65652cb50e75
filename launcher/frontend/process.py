"""The front end as a child process: the command line `python -m launcher.frontend --config FILE` runs (`main`:
FILE is a FrontendConfig as JSON), and the handle that writes that file, starts it, waits until it is ready and stops
it (`FrontendProcess`)."""

from __future__ import annotations

import os
from typing import List, Optional

import grpc
from tritonclient.grpc import service_pb2

from launcher.frontend.server import FrontendConfig
from launcher.frontend.wire import SERVICE
from launcher.frontend.workers import run_frontend
from launcher.ports import RECONNECT_SOON
from launcher.procs.child import ChildService, child_config


def connect_host(host: str) -> str:
    """Where a local client reaches a server bound to `host`."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::", "[::]") else host


class FrontendProcess(ChildService):
    """The front end as a supervised child process of whoever starts it (`python -m launcher.frontend`)."""

    what = "front end"
    module = "launcher.frontend"
    cfg: FrontendConfig  # what the handle writes for the child (ChildService.__init__)

    @property
    def drain_s(self) -> float:
        return self.cfg.drain_timeout_s + 10

    def wait_ready(self, timeout_s: float) -> float:
        """Until ServerReady through the front end is true (every replica ready); raises if it exits.  A front end
        following a members file: until it answers ServerLive (it serves whichever replicas the file names, none at
        first maybe; its ServerReady says whether one serves now)."""
        channel_addr = f"{connect_host(self.cfg.host)}:{self.cfg.port}"
        name, request, response = (
            ("ServerLive", service_pb2.ServerLiveRequest, service_pb2.ServerLiveResponse)
            if self.cfg.members
            else ("ServerReady", service_pb2.ServerReadyRequest, service_pb2.ServerReadyResponse)
        )
        with grpc.insecure_channel(channel_addr, options=RECONNECT_SOON) as ch:
            call = ch.unary_unary(f"/{SERVICE}/{name}", request.SerializeToString, response.FromString)

            def answered(reply) -> bool:
                return reply.live if self.cfg.members else reply.ready

            return self.wait_until(
                lambda: answered(call(request(), timeout=5)) and self.listens(),
                timeout_s,
                channel_addr,
            )

    def listens(self) -> bool:
        """Whether this front end (its process or one of its workers) holds the port: another server that took the
        port first would answer ServerReady too."""
        from launcher.ports import listening_pids

        for pid in listening_pids(self.cfg.port):
            try:
                if os.getpgid(pid) == self.proc.pid:
                    return True
            except ProcessLookupError:
                pass
        return False


def main(argv: Optional[List[str]] = None) -> int:
    cfg = child_config(
        FrontendConfig,
        FrontendProcess.module,
        "One Triton gRPC endpoint in front of several tritonserver replicas, serving the FrontendConfig in FILE.",
        FrontendProcess.what,
        argv,
    )
    return run_frontend(cfg)
