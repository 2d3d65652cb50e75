"""The routing core of the front end (one `Frontend` per process): the replicas, routing (serve.routing's policy,
launcher/frontend/routing.py), the health probe, the gRPC handlers of Triton's GRPCInferenceService and the counters.

A client stream is a Session (launcher/frontend/session.py); a replica's channel, state and load are its Replica
(launcher/frontend/replica.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import List, Optional, Sequence, Tuple, Union

import grpc
from grpc import aio
from tritonclient.grpc import service_pb2

from launcher.error_kinds import SERVER, UNAVAILABLE, error_kind
from launcher.frontend.replica import FORWARDED, Replica
from launcher.frontend.routing import Routing, make_routing, routing_keys
from launcher.frontend.session import ClientGone, Session
from launcher.frontend.wire import SERVICE, _details, log


class Frontend:
    """The routing core: replicas, request handlers, health probe, counters (one per process)."""

    def __init__(
        self,
        replicas: Sequence[Tuple[str, int]],
        model_name: str = "",
        probe_interval_s: float = 2.0,
        routing: Union[str, Routing] = "least_outstanding",
        max_migrations: int = 0,
        stall_timeout_s: float = 0.0,
        breaker_errors: int = 0,
        breaker_cooldown_s: float = 30.0,
    ):
        """routing: a policy's name, or the policy (launcher/frontend/routing.py); max_migrations: times a request
        of `model_name` may move to another replica mid-stream (0: never; launcher/frontend/migration.py);
        stall_timeout_s: a replica that answers nothing for this long while it has requests is failed (0: never);
        breaker_errors, breaker_cooldown_s: the circuit breaker (server_error; 0 errors: never)."""
        if not replicas:
            raise ValueError("the front end needs at least one replica")
        self.replicas = [Replica(i, h, p) for i, (h, p) in enumerate(replicas)]
        self.routing = make_routing(routing) if isinstance(routing, str) else routing
        self.model_name = model_name
        self.probe_interval_s = probe_interval_s
        self.max_migrations = max_migrations
        self.stall_timeout_s = stall_timeout_s
        self.breaker_errors = breaker_errors
        self.breaker_cooldown_s = breaker_cooldown_s
        self.streams_active = 0
        self.rejected = 0  # requests refused because no replica was up
        self.draining = ""  # once set (the drain notice, launcher/procs/drain.py): why new requests are refused
        self._probe_task: Optional[asyncio.Task] = None
        self._stall_task: Optional[asyncio.Task] = None

    # -- routing
    def pick(self, exclude: Sequence[Replica] = (), prompt: bytes = b"", session: str = "") -> Optional[Replica]:
        """The replica for a request (serve.routing, launcher/frontend/routing.py), not one of `exclude`; None where
        none is up.  prompt, session: the request's text and session id, read by policies that route by them."""
        return self.routing.pick(self.replicas, exclude, prompt, session)

    def pick_for(self, request, exclude: Sequence[Replica] = ()) -> Optional[Replica]:
        """The replica for a ModelInferRequest, not one of `exclude`: its prompt and session are read only by a
        policy that routes by them (`request` may be None where the policy does not: the request need not be parsed
        then)."""
        if request is not None and self.routing.needs_prompt:
            return self.pick(exclude, *routing_keys(request))
        return self.pick(exclude)

    def no_replica_message(self, tried: Sequence[Replica] = ()) -> str:
        down = "; ".join(
            f"{r.label} failed: {r.reason}" if r.reason else f"{r.label} refused the request"
            for r in self.replicas
            if not r.up or r in tried
        )
        return f"no replica is up ({down})"

    # -- lifetime
    async def start(self) -> None:
        for r in self.replicas:
            r.connect()
        self.routing.start()
        await self.probe_all()  # replicas not ready now start down, so no request goes there
        if self.probe_interval_s > 0:
            self._probe_task = asyncio.get_running_loop().create_task(self._probe_loop())
        if self.stall_timeout_s > 0:
            self._stall_task = asyncio.get_running_loop().create_task(self._stall_loop())

    async def close(self) -> None:
        for task in (self._probe_task, self._stall_task):
            if task is not None:
                task.cancel()
        self.routing.close()
        for r in self.replicas:
            await r.close()

    async def probe_all(self) -> None:
        results = await asyncio.gather(*(r.check(self.model_name) for r in self.replicas))
        for r, (ok, why) in zip(self.replicas, results):
            if ok:
                r.mark_up()
            else:
                r.mark_down(why)

    def check_stalls(self) -> None:
        """A replica streaming requests of this process that has sent none of them a response for stall_timeout_s (a
        hung engine: its server still answers the health probe) is failed like a dead one: marked down, kept out of
        routing for as long again, its streams cancelled so their requests move or end naming the stall.  Only
        requests that streamed before count: one that has not (queued, prefilling, or sent with stream=false) may
        rightly say nothing for long."""
        now = time.monotonic()
        for r in self.replicas:
            # down already (its health probe timed out first) or not: its streams wait on it all the same
            if now - r.last_response > self.stall_timeout_s and r.streaming():
                why = f"stalled: no response for {self.stall_timeout_s:g}s with {r.in_flight} requests running"
                r.mark_down(why)
                r.held_until = now + self.stall_timeout_s
                for link in list(r.links):
                    link.stall(why)

    def server_error(self, rep: Replica, message: str, grpc_code: str = "") -> bool:
        """A request on `rep` ended in an error; True where it is the server's own (launcher/error_kinds.py: a bad
        request, an overload, a cancellation are not).  The circuit breaker counts those in a row (a request that
        succeeds resets the count, Replica.succeeded).  At breaker_errors of them the replica is taken out of
        routing for breaker_cooldown_s (doubled each time in a row, up to 8x); then the health probe must find it
        ready before it returns, on trial: one more server error takes it out again at once.  The last replica up is
        never taken out (its errors still reach the clients, but so do its successes)."""
        if error_kind(message, grpc_code) not in (SERVER, UNAVAILABLE):
            return False
        if not rep.up:  # out of routing already: requests sent before it went out say nothing new
            return True
        rep.failing += 1
        if not self.breaker_errors or (rep.failing < self.breaker_errors and not rep.on_trial):
            return True
        if not any(r.up for r in self.replicas if r is not rep):
            return True  # the last one up stays: out of routing, it would turn every request into an error
        rep.tripped += 1
        rep.trips += 1
        cooldown = self.breaker_cooldown_s * min(2 ** (rep.tripped - 1), 8)
        why = (
            f"circuit breaker: {'a request on trial' if rep.on_trial else f'{rep.failing} requests in a row'} failed "
            f"with server errors (the last: {message[:200]}); out of routing for {cooldown:g}s, then probed"
        )
        rep.failing, rep.on_trial = 0, False
        rep.held_until = time.monotonic() + cooldown
        rep.mark_down(why)
        return True

    async def _stall_loop(self) -> None:
        """check_stalls a few times a stall timeout: on its own, as a probe of a hung replica waits out its deadline."""
        while True:
            await asyncio.sleep(min(1.0, self.stall_timeout_s / 4))
            try:
                self.check_stalls()
            except Exception as e:  # never let the check die
                log(f"stall check error: {_details(e)}")

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.probe_interval_s)
            try:
                await self.probe_all()
            except Exception as e:  # never let the probe die
                log(f"health probe error: {_details(e)}")

    # -- handlers
    def handler(self) -> grpc.GenericRpcHandler:
        pb = service_pb2
        unary = grpc.unary_unary_rpc_method_handler
        methods = {
            "ServerLive": unary(
                self._server_live, pb.ServerLiveRequest.FromString, pb.ServerLiveResponse.SerializeToString
            ),
            "ServerReady": unary(
                self._server_ready, pb.ServerReadyRequest.FromString, pb.ServerReadyResponse.SerializeToString
            ),
            "ModelReady": unary(self._model_ready),
            "ModelInfer": unary(self._infer),
            "ModelStreamInfer": grpc.stream_stream_rpc_method_handler(self._stream_infer),
        }
        for name in FORWARDED:
            methods[name] = unary(self._forwarder(name))
        return grpc.method_handlers_generic_handler(SERVICE, methods)

    async def _server_live(self, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    async def _server_ready(self, request, context):
        results = await asyncio.gather(*(r.check("", timeout=2.0) for r in self.replicas))
        return service_pb2.ServerReadyResponse(ready=all(r.up for r in self.replicas) and all(ok for ok, _ in results))

    async def _model_ready(self, raw: bytes, context):
        async def ask(r):
            try:
                return service_pb2.ModelReadyResponse.FromString(await r.raw["ModelReady"](raw, timeout=5.0)).ready
            except aio.AioRpcError:
                return False

        ready = await asyncio.gather(*(ask(r) for r in self.replicas))
        return service_pb2.ModelReadyResponse(ready=all(ready)).SerializeToString()

    async def _replica_failed(self, rep: Replica, exc: aio.AioRpcError) -> bool:
        """A unary error is the replica's failure only if it no longer answers ServerLive
        (tritonserver answers request errors with these codes too: UNAVAILABLE for a model
        that is not ready, INTERNAL for a model's own error)."""
        if (
            exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
            and not await rep.alive()
        ):
            rep.mark_down(_details(exc))
            return True
        return False

    def _forwarder(self, name: str):
        async def forward(raw: bytes, context):
            tried: List[Replica] = []
            while True:
                rep = self.pick(tried)
                if rep is None:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, self.no_replica_message(tried))
                try:
                    return await rep.raw[name](raw, timeout=context.time_remaining())
                except aio.AioRpcError as e:
                    if await self._replica_failed(rep, e):
                        tried.append(rep)
                        continue
                    await context.abort(e.code(), e.details() or "")

        return forward

    async def _infer(self, raw: bytes, context):
        if self.draining:
            self.rejected += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, self.draining)
        rep = self.pick_for(service_pb2.ModelInferRequest.FromString(raw) if self.routing.needs_prompt else None)
        if rep is None:
            self.rejected += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, self.no_replica_message())
        rep.track(1)
        rep.requests += 1
        call = rep.raw["ModelInfer"](raw, timeout=context.time_remaining())
        try:
            out = await call
            rep.responses += 1
            if rep.failing or rep.on_trial:
                rep.succeeded()
            return out
        except asyncio.CancelledError:  # the client cancelled: so does the replica
            call.cancel()
            raise
        except aio.AioRpcError as e:
            rep.errors += 1
            self.server_error(rep, e.details() or "", e.code().name)
            if await self._replica_failed(rep, e):
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"{rep.label} failed: {_details(e)}")
            await context.abort(e.code(), e.details() or "")
        finally:
            rep.track(-1)

    async def _stream_infer(self, request_iterator, context):
        if self.draining:  # a new stream: refused whole (one already open gets an error per new request)
            self.rejected += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, self.draining)
        session = Session(self, context)
        self.streams_active += 1
        try:
            await session.run()
        except ClientGone:
            pass
        finally:
            # Whatever still runs belongs to a client that left (cancelled, disconnected, deadline).
            session.abort()
            self.streams_active -= 1

    # -- counters
    def snapshot(self) -> dict:
        return {
            "streams_active": self.streams_active,
            "rejected": self.rejected,
            "replicas": [
                {
                    "up": int(r.up),
                    "in_flight": r.in_flight,
                    "requests": r.requests,
                    "responses": r.responses,
                    "errors": r.errors,
                    "failures": r.failures,
                    "recoveries": r.recoveries,
                    "retried": r.retried,
                    "migrated": r.migrated,
                    "trips": r.trips,
                    "prompt_blocks": r.prompt_blocks,
                    "predicted_blocks": r.predicted_blocks,
                }
                for r in self.replicas
            ],
        }
