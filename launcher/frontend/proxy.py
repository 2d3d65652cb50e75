"""The routing core of the front end (one `Frontend` per process): the replicas, routing (serve.routing's policy,
launcher/frontend/routing.py), the health probe, the gRPC handlers of Triton's GRPCInferenceService and the counters.

A client stream is a Session (launcher/frontend/session.py); a replica's channel, state and load are its Replica
(launcher/frontend/replica.py).  The replicas are a fixed list, or follow a members file (launcher/frontend/members.py:
add_replica, set_draining, remove_replica).
"""

from __future__ import annotations

import asyncio
import time
from typing import List, Optional, Sequence, Tuple, Union

import grpc
from grpc import aio
from tritonclient.grpc import service_pb2

from launcher.error_kinds import SERVER, UNAVAILABLE, error_kind
from launcher.frontend.first_tokens import FirstTokens
from launcher.frontend.metrics import REPLICA_KEYS
from launcher.frontend.replica import FORWARDED, Replica
from launcher.frontend.routing import Routing, make_routing, routing_keys
from launcher.frontend.session import ClientGone, Session
from launcher.frontend.wire import SERVICE, _details, log

# A replica that left the members file keeps its channel this long at most for its unary calls still running (its
# streams end at once: remove_replica); then the channel closes, cancelling what is left.
LEFT_GRACE_S = 10.0
# A request that finds no replica up while one that joined the members file awaits its first ready probe waits this
# long at most for it (a successor registers once READY, so its probe passes within a poll or two): a handover or a
# replacement that overlaps another replica's failure is a short wait, not an error.
JOIN_WAIT_S = 5.0


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
        members=None,
        kv_transfer: Sequence[str] = (),
    ):
        """routing: a policy's name, or the policy (launcher/frontend/routing.py); max_migrations: times a request
        of `model_name` may move to another replica mid-stream (0: never; launcher/frontend/migration.py);
        stall_timeout_s: a replica that answers nothing for this long while it has requests is failed (0: never);
        breaker_errors, breaker_cooldown_s: the circuit breaker (server_error; 0 errors: never); members: a
        MembersFile (launcher/frontend/members.py) the replica set follows from start() on (`replicas` unused: the
        file names them, by slot), or None: `replicas`, replica i at index i, for good.  kv_transfer: disaggregated
        prefill and decode (launcher/frontend/disagg.py), one entry a replica: a prefill replica's transfer endpoint,
        "" for a decode replica; () = every replica serves whole requests."""
        if not replicas and members is None:
            raise ValueError("the front end needs at least one replica")
        self.members = members
        self.replicas = [] if members is not None else [Replica(i, h, p) for i, (h, p) in enumerate(replicas)]
        self.routed = self.replicas  # those routing picks from: all but the draining ones (a members file's)
        self.kv_transfer = list(kv_transfer)
        self.prefill: List[Replica] = []  # the prefill replicas (kv_transfer): a request's prompt goes there first
        if self.kv_transfer:
            self.prefill = [r for r in self.replicas if self.kv_transfer[r.index]]
            self.routed = [r for r in self.replicas if not self.kv_transfer[r.index]]
        self.attach = None  # called with each replica a members file adds (workers.py: shares its load)
        self._left: set = set()  # replicas that left the members file, their channels still open (LEFT_GRACE_S)
        self._tasks: set = set()  # the members file's probes of joined replicas and closes of left ones
        self.routing = make_routing(routing) if isinstance(routing, str) else routing
        self.model_name = model_name
        self.probe_interval_s = probe_interval_s
        self.max_migrations = max_migrations
        self.stall_timeout_s = stall_timeout_s
        self.breaker_errors = breaker_errors
        self.breaker_cooldown_s = breaker_cooldown_s
        self.streams_active = 0
        self.rejected = 0  # requests refused because no replica was up
        self.first_tokens = FirstTokens()  # streamed requests' time to their first response (Session's pumps)
        self.draining = ""  # once set (the drain notice, launcher/procs/drain.py): why new requests are refused
        self._probe_task: Optional[asyncio.Task] = None
        self._stall_task: Optional[asyncio.Task] = None
        self._members_task: Optional[asyncio.Task] = None

    # -- routing
    def pick(self, exclude: Sequence[Replica] = (), prompt: bytes = b"", session: str = "") -> Optional[Replica]:
        """The replica for a request (serve.routing, launcher/frontend/routing.py), not one of `exclude`; None where
        none is up.  prompt, session: the request's text and session id, read by policies that route by them.  A
        draining replica (a members file's: handed over, scaled down) takes new requests only where no other is up:
        its drain is a preference, and an error is worse (what it then runs moves when it leaves)."""
        rep = self.routing.pick(self.routed, exclude, prompt, session)
        draining = [r for r in self.replicas if r.draining] if rep is None else ()
        if draining:
            rep = self.routing.pick(draining, exclude, prompt, session)
        return rep

    def pick_for(self, request, exclude: Sequence[Replica] = ()) -> Optional[Replica]:
        """The replica for a ModelInferRequest, not one of `exclude`: its prompt and session are read only by a
        policy that routes by them (`request` may be None where the policy does not: the request need not be parsed
        then)."""
        keys = routing_keys(request) if request is not None and self.routing.needs_prompt else ()
        rep = self.pick(exclude, *keys)
        if rep is None and self.prefill:  # no decode replica up: a prefill replica serves the request whole
            rep = self.routing.pick(self.prefill, exclude, *keys)
        return rep

    async def pick_waiting(self, request, exclude: Sequence[Replica] = ()) -> Optional[Replica]:
        """pick_for, waiting up to JOIN_WAIT_S where none is up but a replica that joined awaits its first ready
        probe; None where none is up then."""
        rep = self.pick_for(request, exclude)
        deadline = time.monotonic() + JOIN_WAIT_S
        while rep is None and time.monotonic() < deadline and any(r.joining and not r.left for r in self.replicas):
            await asyncio.sleep(self.members.poll_s if self.members is not None else 0.1)
            rep = self.pick_for(request, exclude)
        return rep

    def pick_prefill(self, request) -> Optional[Replica]:
        """The prefill replica for a ModelInferRequest (serve.routing over the prefill replicas: prefix and kv
        routing find the one that has its prompt cached); None where none is up."""
        keys = routing_keys(request) if self.routing.needs_prompt else ()
        return self.routing.pick(self.prefill, (), *keys)

    def no_replica_message(self, tried: Sequence[Replica] = ()) -> str:
        if not self.replicas and self.members is not None:
            return f"no replica is up (no replica has registered yet: the members file {self.members.path} names none)"
        down = "; ".join(_why_not(r) for r in self.replicas if not r.up or r in tried or r.draining)
        return f"no replica is up ({down})"

    # -- lifetime
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for r in self.replicas:
            r.connect()
        if self.members is not None:
            self.members.follow(self)  # the replicas the file names now
            self._members_task = loop.create_task(self._members_loop())
        self.routing.start()
        await self.probe_all()  # replicas not ready now start down, so no request goes there
        if self.probe_interval_s > 0:
            self._probe_task = loop.create_task(self._probe_loop())
        if self.stall_timeout_s > 0:
            self._stall_task = loop.create_task(self._stall_loop())

    async def close(self) -> None:
        for task in (self._probe_task, self._stall_task, self._members_task, *self._tasks):
            if task is not None:
                task.cancel()
        self.routing.close()
        for r in [*self.replicas, *self._left]:
            await r.close()

    async def probe_all(self) -> None:
        reps = self.replicas  # replaced whole, never changed in place, as a members file changes it
        results = await asyncio.gather(*(r.check(self.model_name) for r in reps))
        for r, (ok, why) in zip(reps, results):
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
        if not any(r.up for r in self.routed if r is not rep):
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

    # -- the replica set of a members file (launcher/frontend/members.py)
    def add_replica(self, slot: int, name: str, host: str, port: int, draining: bool = False) -> Replica:
        """A member joins at `slot`: connected, probed now and every members_poll_s until it is ready, routed to
        from then on (unless it is `draining`)."""
        rep = Replica(slot, host, port, name)
        rep.up, rep.joining, rep.draining = False, True, draining
        rep.reason = "it has not answered a ready probe yet"
        rep.connect()
        if self.attach is not None:
            self.attach(rep)
        self._set_replicas(sorted([*self.replicas, rep], key=lambda r: r.index))
        log(f"{rep.label} joined" + (", draining" if draining else ""))
        self._spawn(self._first_probe(rep))
        return rep

    def set_draining(self, rep: Replica, draining: bool) -> None:
        """No new request goes to `rep` while it drains; those running there go on to their end (not a failure: its
        up state, its counters and the health probe carry on as they were)."""
        rep.draining = draining
        self._set_replicas(self.replicas)
        if draining:
            log(f"{rep.label} draining: no new request goes to it, its {rep.in_flight} running here go on")
        else:
            log(f"{rep.label} serving again")

    def remove_replica(self, rep: Replica, detail: str) -> None:
        """A member left (`detail`: how): out of routing and forgotten by it; its running streams end as a failed
        replica's do (_Link.stall: each request moves to another replica where it can, else ends with the error
        naming it); its channel closes once its unary calls are over (LEFT_GRACE_S at most)."""
        why = f"it left the service ({detail})"
        rep.leave(why)
        self._set_replicas([r for r in self.replicas if r is not rep])
        self.routing.forget(rep.index)
        links = list(rep.links)
        log(
            f"{rep.label} left: {detail}"
            + (f"; its {rep.in_flight} running requests end as if it failed" if links else "")
        )
        for link in links:
            link.stall(why)
        self._left.add(rep)
        self._spawn(self._close_left(rep))

    def _set_replicas(self, reps: List[Replica]) -> None:
        # replaced whole, so a loop over the old list (probe_all across its awaits) is not changed under it
        self.replicas = reps
        self.routed = [r for r in reps if not r.draining]

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _first_probe(self, rep: Replica) -> None:
        said = False
        while rep.joining and not rep.left:
            ok, why = await rep.check(self.model_name)
            if ok:
                rep.mark_up()
                return
            if not rep.left:
                rep.reason = why
                if not said:
                    log(f"{rep.label} is not ready yet ({why}): probed every {self.members.poll_s:g}s until it is")
                    said = True
            await asyncio.sleep(self.members.poll_s)

    async def _close_left(self, rep: Replica) -> None:
        deadline = time.monotonic() + LEFT_GRACE_S
        try:
            while rep.in_flight > 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        finally:
            self._left.discard(rep)
            await rep.close()

    async def _members_loop(self) -> None:
        while True:
            await asyncio.sleep(self.members.poll_s)
            try:
                self.members.follow(self)
            except Exception as e:  # never let the loop die: the set stays as it was
                log(f"members file {self.members.path}: {_details(e)}")

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

    def _serving(self) -> List[Replica]:
        """A members file's replicas that serve requests now (up, not draining)."""
        return [r for r in self.routed if r.up]

    async def _server_ready(self, request, context):
        if self.members is not None:  # replicas come and go: ready while one serves
            results = await asyncio.gather(*(r.check("", timeout=2.0) for r in self._serving()))
            return service_pb2.ServerReadyResponse(ready=any(ok for ok, _ in results))
        results = await asyncio.gather(*(r.check("", timeout=2.0) for r in self.replicas))
        return service_pb2.ServerReadyResponse(ready=all(r.up for r in self.replicas) and all(ok for ok, _ in results))

    async def _model_ready(self, raw: bytes, context):
        async def ask(r):
            try:
                return service_pb2.ModelReadyResponse.FromString(await r.raw["ModelReady"](raw, timeout=5.0)).ready
            except aio.AioRpcError:
                return False

        # a members file's: the model is ready on every replica that serves, and one does
        reps = self.replicas if self.members is None else self._serving()
        ready = await asyncio.gather(*(ask(r) for r in reps))
        return service_pb2.ModelReadyResponse(
            ready=all(ready) and (bool(ready) or self.members is None)
        ).SerializeToString()

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
        req = service_pb2.ModelInferRequest.FromString(raw) if self.routing.needs_prompt else None
        rep = self.pick_for(req) or await self.pick_waiting(req)
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
        """The counters: per replica (REPLICA_KEYS), in the fixed list's order; a members file's, one per slot (a slot
        not in use all 0) and the version applied."""
        own = {"streams_active": self.streams_active, "rejected": self.rejected, **self.first_tokens.snapshot()}
        if self.members is None:
            return {**own, "replicas": _rows(self.replicas)}
        at = {r.index: r for r in self.replicas}
        return {
            **own,
            "replicas": [
                _rows([at[s]])[0] if s in at else dict.fromkeys(REPLICA_KEYS, 0) for s in range(self.members.slots)
            ],
            "members_version": self.members.version,
        }


def _rows(reps: Sequence[Replica]) -> List[dict]:
    """Each replica's counters, by REPLICA_KEYS (its attributes of those names; up and draining as 0/1)."""
    return [{k: int(getattr(r, k)) for k in REPLICA_KEYS} for r in reps]


def _why_not(r: Replica) -> str:
    """Why a request did not go to `r` (no_replica_message)."""
    if r.joining and not r.left:
        return f"{r.label} is not ready yet ({r.reason})"
    if r.reason:
        return f"{r.label} failed: {r.reason}"
    return f"{r.label} is draining" if r.draining else f"{r.label} refused the request"
