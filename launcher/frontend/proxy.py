"""The routing core of the front end: replicas, client streams and the gRPC handlers of Triton's
GRPCInferenceService (one `Frontend` per process).

A client stream gets one backend stream per replica and model it uses (see _Session.dispatch for
why per model); each request goes to the up replica with the fewest requests in flight, and its
responses are passed back as they arrive, looked up by request id.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from typing import Dict, List, Optional, Sequence, Tuple

import grpc
from grpc import aio
from tritonclient.grpc import service_pb2

from launcher.frontend.wire import (
    _ASK_EMPTY_FINAL,
    _EMPTY_FINAL,
    _FINAL,
    _MAX_MESSAGE,
    SERVICE,
    _details,
    _error_response,
    _request_id_patch,
    _response_id_patch,
    log,
)

# Backend channels: large messages like tritonclient; reconnect soon after a replica comes back
# (gRPC's default backoff grows to 2 minutes). No keepalive pings: tritonserver's default policy
# answers frequent pings with GOAWAY; the health probe finds silent replicas instead.
_BACKEND_OPTIONS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]
_FORWARDED = ("ServerMetadata", "ModelMetadata", "ModelConfig", "RepositoryIndex")  # answered by one replica
_OUTBOX_HIGH, _OUTBOX_LOW = 256, 64  # responses queued for one client stream: pumps wait above HIGH until LOW


# ----------------------------------------------------------------------------- replicas
class Replica:
    """One replica leader's tritonserver, as the front end sees it."""

    def __init__(self, index: int, host: str, port: int):
        self.index = index
        self.addr = f"{host}:{int(port)}"
        self.label = f"replica {index} ({self.addr})"
        self.up = True  # requests are routed here
        self.reason = ""  # why it is down
        self.in_flight = 0
        self.requests = 0  # requests routed here (stream and unary)
        self.responses = 0  # responses passed back from here
        self.errors = 0  # requests that ended in an error (model errors and failures)
        self.failures = 0  # times it was marked down
        self.retried = 0  # requests moved to another replica because this one failed before answering them
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
        self.raw = {name: ch.unary_unary(f"/{SERVICE}/{name}") for name in ("ModelInfer", "ModelReady", *_FORWARDED)}
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

    def mark_up(self) -> None:
        if not self.up:
            log(f"{self.label} UP again")
            self.up, self.reason = True, ""

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


class _ClientGone(Exception):
    """Writing to the client failed: it cancelled or disconnected."""


class _Pending:
    __slots__ = ("client_id", "wants_empty_final", "model", "version", "renamed", "raw", "started", "retried")

    def __init__(
        self,
        client_id: str,
        wants_empty_final: bool,
        model: str,
        version: str,
        renamed: bool,
        raw: bytes = b"",
        retried: bool = False,
    ):
        self.client_id = client_id
        self.wants_empty_final = wants_empty_final
        self.model = model
        self.version = version
        self.renamed = renamed
        self.raw = raw  # the client's request as it came, to send it elsewhere if this replica fails first
        self.started = False  # a response of it went back to the client
        self.retried = retried  # already moved once


class _Link:
    """One client stream's backend stream to one replica for one model, and the requests running on it."""

    def __init__(self, session: "_Session", rep: Replica, key: Tuple[int, str, str]):
        self.session = session
        self.rep = rep
        self.key = key  # (replica, model, version): its place in session.links
        self.call = rep.stream()
        self.pending: Dict[str, _Pending] = {}  # by the id the replica sees
        # Requests go out through a writer task, so the client's next request is read while this
        # one is written (a burst of requests costs one loop turn each, not two).
        self.inbox: collections.deque = collections.deque()
        self.wake = asyncio.Event()
        self.half_close = False
        loop = asyncio.get_running_loop()
        self.task = loop.create_task(self._pump())
        self.writer = loop.create_task(self._write_loop())

    def send(self, raw: bytes) -> None:
        self.inbox.append(raw)
        self.wake.set()

    def done_writing(self) -> None:
        self.half_close = True
        self.wake.set()

    async def _write_loop(self) -> None:
        inbox, write, wake = self.inbox, self.call.write, self.wake
        try:
            while True:
                if not inbox:
                    if self.half_close:
                        await self.call.done_writing()
                        return
                    wake.clear()
                    await wake.wait()
                    continue
                await write(inbox.popleft())
        except asyncio.CancelledError:
            raise
        except Exception:  # the backend stream is over: its pump fails the requests on it
            inbox.clear()

    async def _pump(self) -> None:
        """Pass the replica's responses back to the client, as they come."""
        rep, pending, send, read = self.rep, self.pending, self.session.send, self.call.read
        parse = service_pb2.ModelStreamInferResponse.FromString
        eof = aio.EOF
        failure = ""
        try:
            while True:
                raw = await read()
                if raw is eof:
                    if pending:
                        failure = "it closed the stream with requests still running"
                    break
                rep.responses += 1
                m = parse(raw)
                ir = m.infer_response
                wire_id = ir.id
                p = pending.get(wire_id)
                if p is None:  # not a request of ours (cannot happen with a conforming server): pass it on
                    await send(raw)
                    continue
                flag = ir.parameters.get(_FINAL)
                if m.error_message:
                    # errors raised before the model runs (unknown model, bad input) carry no final flag
                    final = flag is None or flag.bool_param
                else:
                    final = flag is not None and flag.bool_param
                if final:
                    del pending[wire_id]
                    rep.track(-1)
                    if m.error_message:
                        rep.errors += 1
                    elif not p.wants_empty_final and not ir.outputs:
                        continue  # the empty final response the front end asked for on its own behalf
                p.started = True
                if p.renamed:
                    raw += _response_id_patch(p.client_id)
                await send(raw)
        except aio.AioRpcError as e:
            if not self.session.closing:  # not our own cancellation
                failure = _details(e)
        except _ClientGone:
            # The client left: every backend stream of its session is cancelled, so the models see it.
            self.session.abort()
        finally:
            if self.session.links.get(self.key) is self:
                del self.session.links[self.key]
        if failure:
            rep.mark_down(failure)
            await self.fail(f"{rep.label} failed: {failure}")

    async def fail(self, message: str) -> None:
        """The replica failed: requests it had not answered yet go to another replica (once: the client saw
        nothing of them, so nothing is repeated); the others end with `message`."""
        items = list(self.pending.values())
        self.pending.clear()
        self.rep.track(-len(items))
        moved = [p for p in items if not p.started and not p.retried]
        self.rep.retried += len(moved)
        self.rep.errors += len(items) - len(moved)
        try:
            for p in items:
                if not p.started and not p.retried:
                    await self.session.dispatch(p.raw, retried=True)
                else:
                    await self.session.send(_error_response(message, p.client_id, p.model, p.version))
        except _ClientGone:
            return

    def cancel(self) -> None:
        """The client is gone: cancel the backend stream (tritonserver cancels its requests)."""
        self.call.cancel()
        for task in (self.task, self.writer):
            if not task.done():
                task.cancel()
        self.rep.track(-len(self.pending))
        self.pending.clear()


class _Session:
    """One client ModelStreamInfer stream; its requests spread over the replicas."""

    def __init__(self, fe: "Frontend", context):
        self.fe = fe
        self.context = context
        self.links: Dict[Tuple[int, str, str], _Link] = {}  # open backend streams, by (replica, model, version)
        self.every_link: List[_Link] = []  # every backend stream this session opened (abort cancels them all)
        self.closing = False
        self.renames = itertools.count(1)
        # Responses to the client go through one writer task: pumps queue them and go on reading, so a
        # backend read and a client write are in flight together. Bounded: a slow client stalls the pumps.
        self.outbox: collections.deque = collections.deque()
        self.wake = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()
        self.finishing = False
        self.gone = ""
        self.writer = asyncio.get_running_loop().create_task(self._write_loop())

    async def _write_loop(self) -> None:
        outbox, write, wake, room = self.outbox, self.context.write, self.wake, self.room
        try:
            while True:
                if not outbox:
                    if self.finishing:
                        return
                    wake.clear()
                    await wake.wait()
                    continue
                await write(outbox.popleft())
                if len(outbox) <= _OUTBOX_LOW and not room.is_set():
                    room.set()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the RPC is over: cancelled, deadline, disconnected
            self.gone = str(e) or e.__class__.__name__
            room.set()

    async def send(self, raw: bytes) -> None:
        if self.gone:
            raise _ClientGone(self.gone)
        self.outbox.append(raw)
        self.wake.set()
        if len(self.outbox) >= _OUTBOX_HIGH:
            self.room.clear()
            await self.room.wait()

    async def run(self) -> None:
        read, eof = self.context.read, aio.EOF
        while True:
            raw = await read()
            if raw is eof:
                break
            await self.dispatch(raw)
        # The client has sent everything: the backends get the half-close and finish what runs.  Repeat
        # while links appear: a replica failing now moves its unanswered requests onto a fresh link.
        while True:
            links = [link for link in self.every_link if not link.task.done()]
            if not links:
                break
            for link in links:
                link.done_writing()
            await asyncio.gather(*(link.task for link in links), return_exceptions=True)
        self.finishing = True  # the writer ends once the last response is written
        self.wake.set()
        await self.writer

    async def dispatch(self, raw: bytes, retried: bool = False) -> None:
        req = service_pb2.ModelInferRequest.FromString(raw)
        client_id = req.id
        flag = req.parameters.get(_EMPTY_FINAL)
        wants_empty_final = flag is not None and flag.bool_param
        if self.fe.draining and not retried:
            self.fe.rejected += 1
            await self.send(_error_response(self.fe.draining, client_id, req.model_name, req.model_version))
            return
        rep = self.fe.pick()
        if rep is None:
            self.fe.rejected += 1
            await self.send(_error_response(self.fe.no_replica_message(), client_id, req.model_name, req.model_version))
            return
        # One backend stream per replica *and model*: tritonserver 2.51 aborts (gRPC's "ASSERTION FAILED:
        # !byte_buffer->Valid()", SIGABRT in TRITONBACKEND_ResponseSend) when one ModelStreamInfer stream
        # carries a non-decoupled model's request while a decoupled model's responses are being written:
        # the two paths write to the stream unserialized. A client may mix them on its stream (tritonclient
        # does not stop it); here they never share a backend stream, so the replicas survive such clients.
        # tests/integration/test_frontend.py::test_a_stream_mixing_decoupled_and_plain_models_leaves_the_replicas_running
        key = (rep.index, req.model_name, req.model_version)
        link = self.links.get(key)
        if link is None:  # (a link whose stream ended has left self.links: this opens a fresh one)
            link = self.links[key] = _Link(self, rep, key)
            self.every_link.append(link)
        wire_id, patch = client_id, b""
        if client_id in link.pending:  # two running requests share an id: rename ours on the wire
            while wire_id in link.pending:
                wire_id = f"{client_id}~fe{next(self.renames)}"
            patch = _request_id_patch(wire_id)
        if not wants_empty_final:
            patch += _ASK_EMPTY_FINAL
        link.pending[wire_id] = _Pending(
            client_id, wants_empty_final, req.model_name, req.model_version, wire_id != client_id, raw, retried
        )
        rep.track(1)
        rep.requests += 1
        link.send(raw + patch if patch else raw)

    def abort(self) -> None:
        """The client is gone (cancelled, disconnected, deadline) or the stream is over: cancel
        whatever still runs for it. Idempotent."""
        self.closing = True
        self.writer.cancel()
        for link in self.every_link:
            link.cancel()
        self.links.clear()


# ----------------------------------------------------------------------------- the front end
class Frontend:
    """The routing core: replicas, request handlers, health probe, counters (one per process)."""

    def __init__(self, replicas: Sequence[Tuple[str, int]], model_name: str = "", probe_interval_s: float = 2.0):
        if not replicas:
            raise ValueError("the front end needs at least one replica")
        self.replicas = [Replica(i, h, p) for i, (h, p) in enumerate(replicas)]
        self.model_name = model_name
        self.probe_interval_s = probe_interval_s
        self.streams_active = 0
        self.rejected = 0  # requests refused because no replica was up
        self.draining = ""  # once set (the drain notice, launcher/rank/drain.py): why new requests are refused
        self._rr = 0
        self._probe_task: Optional[asyncio.Task] = None

    # -- routing
    def pick(self, exclude: Sequence[Replica] = ()) -> Optional[Replica]:
        """The up replica with the fewest requests in flight (in every worker process); ties go round robin."""
        reps = self.replicas
        n = len(reps)
        start = self._rr = (self._rr + 1) % n
        best, best_load = None, 0
        for k in range(n):
            r = reps[(start + k) % n]
            if r.up and r not in exclude:
                load = r.load()
                if best is None or load < best_load:
                    best, best_load = r, load
        return best

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
        await self.probe_all()  # replicas not ready now start down, so no request goes there
        if self.probe_interval_s > 0:
            self._probe_task = asyncio.get_running_loop().create_task(self._probe_loop())

    async def close(self) -> None:
        if self._probe_task is not None:
            self._probe_task.cancel()
        for r in self.replicas:
            await r.close()

    async def probe_all(self) -> None:
        results = await asyncio.gather(*(r.check(self.model_name) for r in self.replicas))
        for r, (ok, why) in zip(self.replicas, results):
            if ok:
                r.mark_up()
            else:
                r.mark_down(why)

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
        for name in _FORWARDED:
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
        rep = self.pick()
        if rep is None:
            self.rejected += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, self.no_replica_message())
        rep.track(1)
        rep.requests += 1
        call = rep.raw["ModelInfer"](raw, timeout=context.time_remaining())
        try:
            out = await call
            rep.responses += 1
            return out
        except asyncio.CancelledError:  # the client cancelled: so does the replica
            call.cancel()
            raise
        except aio.AioRpcError as e:
            rep.errors += 1
            if await self._replica_failed(rep, e):
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"{rep.label} failed: {_details(e)}")
            await context.abort(e.code(), e.details() or "")
        finally:
            rep.track(-1)

    async def _stream_infer(self, request_iterator, context):
        if self.draining:  # a new stream: refused whole (one already open gets an error per new request)
            self.rejected += 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, self.draining)
        session = _Session(self, context)
        self.streams_active += 1
        try:
            await session.run()
        except _ClientGone:
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
                    "retried": r.retried,
                }
                for r in self.replicas
            ],
        }
