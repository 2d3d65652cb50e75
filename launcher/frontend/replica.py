"""One replica leader's tritonserver as the front end sees it: its backend channel and calls, its up/down state and
health probes, and its load (requests in flight, shared between worker processes) and counters."""

from __future__ import annotations

import time
from typing import Optional, Tuple

from grpc import aio
from tritonclient.grpc import service_pb2

from launcher.frontend.wire import _MAX_MESSAGE, SERVICE, _details, log
from launcher.ports import RECONNECT_SOON

# Backend channels: large messages like tritonclient; reconnect soon after a replica comes back
# (launcher.ports.RECONNECT_SOON). No keepalive pings: tritonserver's default policy
# answers frequent pings with GOAWAY; the health probe finds silent replicas instead.
_BACKEND_OPTIONS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    *RECONNECT_SOON,
]
FORWARDED = ("ServerMetadata", "ModelMetadata", "ModelConfig", "RepositoryIndex")  # answered by one replica


class Replica:
    """One replica leader's tritonserver, as the front end sees it."""

    def __init__(self, index: int, host: str, port: int, name: str = ""):
        """index: its place (a fixed list's position, a members file's slot); name: what a members file calls it."""
        self.index = index
        self.addr = f"{host}:{int(port)}"
        self.rename(name)
        self.up = True  # requests are routed here
        self.reason = ""  # why it is down
        # A members file's replica (launcher/frontend/members.py): draining, no new request goes to it (whether it is
        # up or not); joining, it was never up yet (its first ready probe is no recovery); left, the file dropped it.
        self.draining = False
        self.joining = False
        self.left = False
        self.in_flight = 0
        self.requests = 0  # requests routed here (stream and unary)
        self.responses = 0  # responses passed back from here
        self.errors = 0  # requests that ended in an error (model errors and failures)
        self.failures = 0  # times it was marked down
        self.recoveries = 0  # times it was marked up again after that (its server restarted in place, or answered)
        self.last_response = 0.0  # when this process last had a response from it (Frontend.check_stalls)
        self.held_until = 0.0  # a stalled replica stays out of routing until then, whatever its health probe says
        self.links: set = set()  # this process's open backend streams to it (launcher/frontend/session.py: _Link)
        # The circuit breaker (Frontend.server_error): requests in a row that failed with the server's own errors,
        # times in a row it was taken out for them (its cool-down doubles each time), whether it is back on trial
        # (one more such error takes it out again; a request that succeeds closes the breaker), times taken out.
        self.failing = 0
        self.tripped = 0
        self.on_trial = False
        self.trips = 0
        self.retried = 0  # requests moved to another replica because this one failed before answering them
        self.migrated = 0  # requests moved to another replica mid-stream because this one failed generating them
        self.prompt_blocks = 0  # prompt blocks of the requests prefix routing sent here (launcher/frontend/routing.py)
        self.predicted_blocks = 0  # of those, the leading ones it had sent here before
        self.channel: Optional[aio.Channel] = None
        # Several worker processes: each keeps its in-flight count in shared memory as it changes,
        # so every worker routes by the whole front end's load (see share_load).
        self.shared = None
        self.shared_at = 0
        self.peers_at: Tuple[int, ...] = ()

    def track(self, delta: int) -> None:
        self.in_flight += delta
        if self.shared is not None:
            self.shared[self.shared_at] = self.in_flight

    def streaming(self) -> bool:
        """Requests of this process that had streamed from it run there."""
        return any(p.started for link in self.links for p in link.pending.values())

    def load(self) -> int:
        """Requests in flight on this replica, through every worker process."""
        n = self.in_flight
        if self.shared is not None:
            shared = self.shared
            for at in self.peers_at:
                n += shared[at]
        return n

    def connect(self) -> None:
        ch = self.channel = aio.insecure_channel(self.addr, options=_BACKEND_OPTIONS)
        # No (de)serializers: requests and responses stay the bytes the peers sent.
        self.stream = ch.stream_stream(f"/{SERVICE}/ModelStreamInfer")
        self.raw = {name: ch.unary_unary(f"/{SERVICE}/{name}") for name in ("ModelInfer", "ModelReady", *FORWARDED)}
        self._live = ch.unary_unary(
            f"/{SERVICE}/ServerLive",
            service_pb2.ServerLiveRequest.SerializeToString,
            service_pb2.ServerLiveResponse.FromString,
        )
        self._ready = ch.unary_unary(
            f"/{SERVICE}/ServerReady",
            service_pb2.ServerReadyRequest.SerializeToString,
            service_pb2.ServerReadyResponse.FromString,
        )
        self._model_ready = ch.unary_unary(
            f"/{SERVICE}/ModelReady",
            service_pb2.ModelReadyRequest.SerializeToString,
            service_pb2.ModelReadyResponse.FromString,
        )

    def mark_down(self, reason: str) -> None:
        if self.up:
            self.up, self.reason = False, reason
            self.failures += 1
            log(f"{self.label} DOWN: {reason}")

    def rename(self, name: str) -> None:
        self.name = name
        self.label = f"replica {self.index} ({name} {self.addr})" if name else f"replica {self.index} ({self.addr})"

    def mark_up(self) -> None:
        if self.joining and not self.up and not self.left:
            log(f"{self.label} is ready" + ("" if self.draining else ": routed to"))
            self.up, self.reason, self.joining = True, "", False
        elif not self.up and not self.left and time.monotonic() >= self.held_until:
            log(f"{self.label} UP again" + (" (on trial: its circuit breaker is half open)" if self.tripped else ""))
            self.up, self.reason = True, ""
            self.recoveries += 1
            self.on_trial = self.tripped > 0

    def leave(self, why: str) -> None:
        """Its member left the members file: out of routing for good (no failure: it was let go), its load no longer
        shared with the other worker processes (a replica that takes its slot shares it from 0)."""
        self.up, self.draining, self.left, self.reason = False, True, True, why
        if self.shared is not None:
            self.shared[self.shared_at] = 0
            self.shared = None

    def succeeded(self) -> None:
        """A request of it ended without an error while its breaker counted errors or it was on trial: closed."""
        if self.on_trial:
            log(f"{self.label}: a request succeeded on trial; its circuit breaker is closed")
        self.failing, self.tripped, self.on_trial = 0, 0, False

    async def alive(self, timeout: float = 2.0) -> bool:
        try:
            return (await self._live(service_pb2.ServerLiveRequest(), timeout=timeout)).live
        except aio.AioRpcError:
            return False

    async def check(self, model: str, timeout: float = 5.0) -> Tuple[bool, str]:
        """(ready, why not): ServerReady, and ModelReady(model) when a model is named."""
        try:
            if not (await self._ready(service_pb2.ServerReadyRequest(), timeout=timeout)).ready:
                return False, "ServerReady is false"
            if (
                model
                and not (await self._model_ready(service_pb2.ModelReadyRequest(name=model), timeout=timeout)).ready
            ):
                return False, f"model {model} is not ready"
            return True, ""
        except aio.AioRpcError as e:
            return False, f"health probe failed: {_details(e)}"

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()
