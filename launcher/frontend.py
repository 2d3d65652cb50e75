"""One endpoint for data-parallel replicas: a front end that speaks Triton's own gRPC protocol.

    python -m launcher.frontend --replica 127.0.0.1:9001 --replica 127.0.0.1:9002 \\
        --port 8001 --metrics-port 8002 --model hf_model [--processes 2]
    run_frontend([("127.0.0.1", 9001), ("127.0.0.1", 9002)], "127.0.0.1", 8001, 8002, "hf_model")

With `replicas=N`, every replica leader runs its own tritonserver on an
internal port; global rank 0 runs this front end on the public port
(launcher/rank.py). Clients (tritonclient, launcher.client, launcher.bench)
talk to it exactly as to one tritonserver: it serves Triton's
GRPCInferenceService (ServerLive, ServerReady, ModelReady, ServerMetadata,
ModelMetadata, ModelConfig, RepositoryIndex, ModelInfer, ModelStreamInfer).

What it does:
* routes each request, including each request inside one ModelStreamInfer
  stream, to the replica with the fewest requests in flight (ties: round
  robin). A client stream gets one backend stream per replica and model it
  uses (see _Session.dispatch for why per model); responses are passed back as
  they arrive, looked up by request id.
* forwards the client's serialized messages byte for byte. Only when it must
  does it append a protobuf field (the wire format lets a later field override
  an earlier one, and repeated embedded messages merge): a new request id when
  two running requests of one stream share an id, the id restored on their
  responses, and `triton_enable_empty_final_response` so every request ends
  with a final flag it can count (the empty final response is dropped again
  when the client did not ask for it). Tensors are never re-encoded.
* propagates cancellation: a client that cancels its stream or disconnects
  gets its backend streams cancelled, so the python model's
  `request.is_cancelled()` turns true.
* tracks replica health: a backend stream that fails, or a unary call that
  fails while the replica no longer answers ServerLive, marks the replica down;
  its requests that already streamed something end with the error
  `replica N (<addr>) failed: ...`, those it had not answered yet go to another
  replica (once; the client saw nothing of them), and no more requests go there. A ServerReady (+ ModelReady) probe every
  `probe_interval_s` brings it back, or marks a silent one down.
* ServerReady is true only when every replica is up and ready; ServerLive
  while the front end runs; ModelReady when the model is ready on every replica.
* serves Prometheus counters over HTTP on the metrics port (GET /metrics):
  requests, responses, errors, in flight and up/down per replica.

Cost and scale (benchmark/frontend_capacity.py, frontend_overhead.py): every
forwarded response is one grpc.aio read and one write, about 50 us of the
event-loop thread plus gRPC's own I/O threads. On a 16-core Xeon one process
passed 21,000 streamed responses/s with asyncio's loop and 29,000 with uvloop
(used when installed); `processes=N` starts N worker processes that share the
gRPC port through SO_REUSEPORT (the kernel spreads client connections over
them, so one client connection stays on one worker): 2 processes 40,000/s,
4 processes 51,000/s against 57,000/s straight to the replicas. Workers route
by the in-flight counts of all workers (shared memory); the parent serves the
metrics, summing the workers' counters, and fails if a worker dies.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import grpc
from grpc import aio
from tritonclient.grpc import service_pb2

SERVICE = "inference.GRPCInferenceService"
_MAX_MESSAGE = 2**31 - 1
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
_EMPTY_FINAL = "triton_enable_empty_final_response"
_FINAL = "triton_final_response"
_OUTBOX_HIGH, _OUTBOX_LOW = 256, 64  # responses queued for one client stream: pumps wait above HIGH until LOW


def log(msg: str) -> None:
    print(f"[llmlaunch frontend {os.getpid()}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- protobuf wire patches
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (strings, bytes, embedded messages, map entries)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


# ModelInferRequest.parameters (field 4) gets the map entry {triton_enable_empty_final_response: bool_param true};
# a later map entry with the same key wins.
_ASK_EMPTY_FINAL = _field(4, _field(1, _EMPTY_FINAL.encode()) + _field(2, b"\x08\x01"))


def _request_id_patch(wire_id: str) -> bytes:
    """Appended to a serialized ModelInferRequest: id (field 3) becomes `wire_id`."""
    return _field(3, wire_id.encode())


def _response_id_patch(client_id: str) -> bytes:
    """Appended to a serialized ModelStreamInferResponse: infer_response (field 2) merges with {id: client_id}."""
    return _field(2, _field(3, client_id.encode()))


def _error_response(message: str, request_id: str, model_name: str, model_version: str) -> bytes:
    """An in-band stream error that ends one request (what tritonserver sends for a failed request)."""
    m = service_pb2.ModelStreamInferResponse(error_message=message)
    ir = m.infer_response
    ir.id, ir.model_name, ir.model_version = request_id, model_name, model_version
    ir.parameters[_FINAL].bool_param = True
    return m.SerializeToString()


def _details(exc: BaseException) -> str:
    if isinstance(exc, aio.AioRpcError):
        return f"{exc.details() or 'no details'} ({exc.code().name})"
    return f"{exc.__class__.__name__}: {exc}"


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
        self._live = ch.unary_unary(f"/{SERVICE}/ServerLive", service_pb2.ServerLiveRequest.SerializeToString, service_pb2.ServerLiveResponse.FromString)
        self._ready = ch.unary_unary(f"/{SERVICE}/ServerReady", service_pb2.ServerReadyRequest.SerializeToString, service_pb2.ServerReadyResponse.FromString)
        self._model_ready = ch.unary_unary(f"/{SERVICE}/ModelReady", service_pb2.ModelReadyRequest.SerializeToString, service_pb2.ModelReadyResponse.FromString)

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
            if model and not (await self._model_ready(service_pb2.ModelReadyRequest(name=model), timeout=timeout)).ready:
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

    def __init__(self, client_id: str, wants_empty_final: bool, model: str, version: str, renamed: bool,
                 raw: bytes = b"", retried: bool = False):
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
        # tests/test_frontend.py::test_a_stream_mixing_decoupled_and_plain_models_leaves_the_replicas_running
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
        link.pending[wire_id] = _Pending(client_id, wants_empty_final, req.model_name, req.model_version,
                                         wire_id != client_id, raw, retried)
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
        down = "; ".join(f"{r.label} failed: {r.reason}" if r.reason else f"{r.label} refused the request" for r in self.replicas if not r.up or r in tried)
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
            "ServerLive": unary(self._server_live, pb.ServerLiveRequest.FromString, pb.ServerLiveResponse.SerializeToString),
            "ServerReady": unary(self._server_ready, pb.ServerReadyRequest.FromString, pb.ServerReadyResponse.SerializeToString),
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
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN) and not await rep.alive():
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
                {"up": int(r.up), "in_flight": r.in_flight, "requests": r.requests, "responses": r.responses, "errors": r.errors, "failures": r.failures,
                 "retried": r.retried}
                for r in self.replicas
            ],
        }


# ----------------------------------------------------------------------------- Prometheus text
_METRICS = (
    # (key, name, type, help)
    ("up", "llmlaunch_frontend_replica_up", "gauge", "1 when the front end routes requests to the replica"),
    ("in_flight", "llmlaunch_frontend_in_flight", "gauge", "requests running on the replica"),
    ("requests", "llmlaunch_frontend_requests_total", "counter", "requests routed to the replica"),
    ("responses", "llmlaunch_frontend_responses_total", "counter", "responses passed back from the replica"),
    ("errors", "llmlaunch_frontend_errors_total", "counter", "requests on the replica that ended in an error"),
    ("failures", "llmlaunch_frontend_replica_failures_total", "counter", "times the replica was marked down"),
    ("retried", "llmlaunch_frontend_retried_total", "counter", "requests moved to another replica after this one failed before answering them"),
)
_PER_REPLICA = len(_METRICS)


def metrics_text(snap: dict, addrs: Sequence[str], processes: int = 1) -> str:
    lines = []
    for key, name, kind, help_ in _METRICS:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        for i, (addr, r) in enumerate(zip(addrs, snap["replicas"])):
            lines.append(f'{name}{{replica="{i}",addr="{addr}"}} {r[key]}')
    lines += [
        "# HELP llmlaunch_frontend_streams_active client ModelStreamInfer streams open",
        "# TYPE llmlaunch_frontend_streams_active gauge",
        f"llmlaunch_frontend_streams_active {snap['streams_active']}",
        "# HELP llmlaunch_frontend_rejected_total requests refused because no replica was up",
        "# TYPE llmlaunch_frontend_rejected_total counter",
        f"llmlaunch_frontend_rejected_total {snap['rejected']}",
        "# HELP llmlaunch_frontend_processes front-end worker processes sharing the gRPC port",
        "# TYPE llmlaunch_frontend_processes gauge",
        f"llmlaunch_frontend_processes {processes}",
    ]
    return "\n".join(lines) + "\n"


async def _serve_metrics(host: str, port: int, text):
    """A minimal HTTP/1.1 responder: GET /metrics (or /) -> the Prometheus text, anything else 404."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            while True:  # skip the headers
                h = await asyncio.wait_for(reader.readline(), 10)
                if h in (b"\r\n", b"\n", b""):
                    break
            parts = line.split()
            path = parts[1].split(b"?")[0] if len(parts) >= 2 else b""
            if parts[:1] in ([b"GET"], [b"HEAD"]) and path in (b"/metrics", b"/"):
                status, body = "200 OK", text().encode()
            else:
                status, body = "404 Not Found", b"try GET /metrics\n"
            head = f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            writer.write(head.encode() + (body if parts[:1] != [b"HEAD"] else b""))
            await writer.drain()
        except (asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port, reuse_address=True)


# ----------------------------------------------------------------------------- serving
@dataclass
class FrontendConfig:
    replicas: List[Tuple[str, int]]  # (host, gRPC port) of each replica's tritonserver
    host: str = "127.0.0.1"  # address the front end binds
    port: int = 8001  # public gRPC port
    metrics_port: int = 0  # Prometheus metrics (HTTP); 0 = none
    model_name: str = ""  # the model the health probe checks; "" = ServerReady only
    processes: int = 1  # worker processes sharing the gRPC port (SO_REUSEPORT)
    probe_interval_s: float = 2.0  # health probe period; 0 = no periodic probe
    drain_timeout_s: float = 30.0  # on SIGTERM, how long running requests may finish
    loop: str = "auto"  # auto (uvloop when installed) | asyncio | uvloop
    addrs: List[str] = field(default_factory=list)

    def __post_init__(self):
        self.replicas = [(str(h), int(p)) for h, p in self.replicas]
        self.addrs = [f"{h}:{p}" for h, p in self.replicas]


def _server_options(reuse_port: bool) -> list:
    # gRPC turns SO_REUSEPORT on by default, which would let a second server silently share a taken
    # port; one process binds exclusively, several workers share on purpose.
    return [
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        ("grpc.max_send_message_length", _MAX_MESSAGE),
        ("grpc.max_receive_message_length", _MAX_MESSAGE),
    ]


async def _serve(cfg: FrontendConfig, reuse_port: bool, publish=None, on_bound=None, setup=None) -> None:
    """Run one front-end process until SIGTERM/SIGINT; `publish(snapshot)` is called periodically."""
    fe = Frontend(cfg.replicas, cfg.model_name, cfg.probe_interval_s)
    if setup is not None:
        setup(fe)
    await fe.start()
    server = aio.server(options=_server_options(reuse_port))
    server.add_generic_rpc_handlers((fe.handler(),))
    try:
        server.add_insecure_port(f"{cfg.host}:{cfg.port}")
    except RuntimeError as e:
        raise SystemExit(f"front end: cannot bind gRPC {cfg.host}:{cfg.port}: {e}") from None
    await server.start()
    metrics = None
    if cfg.metrics_port and publish is None:
        try:
            metrics = await _serve_metrics(cfg.host, cfg.metrics_port, lambda: metrics_text(fe.snapshot(), cfg.addrs))
        except OSError as e:
            raise SystemExit(f"front end: cannot bind metrics {cfg.host}:{cfg.metrics_port}: {e}") from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    if on_bound is not None:
        on_bound()
    ups = sum(r.up for r in fe.replicas)
    log(f"serving {cfg.host}:{cfg.port} -> {', '.join(cfg.addrs)} ({ups}/{len(fe.replicas)} up, {type(loop).__module__.split('.')[0]} loop)" + (f"; metrics http://{cfg.host}:{cfg.metrics_port}/metrics" if metrics else ""))
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
        raise SystemExit("front end: --loop uvloop, but uvloop is not installed (pip install uvloop)")
    if uv is not None:
        uv.run(coro)
    else:
        asyncio.run(coro)


# -- several processes: workers share the gRPC port, the parent serves metrics from shared memory
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

    from launcher.triton import port_free

    if not port_free(cfg.host, cfg.port):
        raise SystemExit(f"front end: port {cfg.port} on {cfg.host} is already in use")
    ctx = mp.get_context("spawn")  # gRPC does not survive fork
    width = 2 + _PER_REPLICA * len(cfg.replicas)
    shared = ctx.RawArray("q", width * cfg.processes)
    for w in range(cfg.processes):
        for r in range(len(cfg.replicas)):
            shared[_slot_index(w, r, "up", len(cfg.replicas))] = 1  # "up" until the worker publishes
    events = [ctx.Event() for _ in range(cfg.processes)]
    workers = [ctx.Process(target=_worker_main, args=(cfg, w, shared, events[w]), name=f"frontend-worker{w}", daemon=True) for w in range(cfg.processes)]
    for p in workers:
        p.start()

    async def main() -> int:
        metrics = None
        if cfg.metrics_port:
            metrics = await _serve_metrics(cfg.host, cfg.metrics_port, lambda: metrics_text(_sum_shared(shared, cfg.processes, len(cfg.replicas)), cfg.addrs, cfg.processes))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for s in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(s, stop.set)
        log(f"{cfg.processes} worker processes share {cfg.host}:{cfg.port}" + (f"; metrics http://{cfg.host}:{cfg.metrics_port}/metrics" if metrics else ""))
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


def run_frontend(
    replicas: Sequence[Tuple[str, int]],
    host: str,
    port: int,
    metrics_port: int,
    model_name: str,
    processes: int = 1,
    probe_interval_s: float = 2.0,
    drain_timeout_s: float = 30.0,
    loop: str = "auto",
) -> int:
    """Serve until SIGTERM/SIGINT (then drain running requests); returns the exit status."""
    cfg = FrontendConfig(list(replicas), host, port, metrics_port, model_name, processes, probe_interval_s, drain_timeout_s, loop)
    if processes > 1:
        return _supervise(cfg)
    _run_loop(_serve(cfg, reuse_port=False), loop)
    return 0


# ----------------------------------------------------------------------------- rank 0's side
def connect_host(host: str) -> str:
    """Where a local client reaches a server bound to `host`."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::", "[::]") else host


class FrontendProcess:
    """The front end as a supervised child process of rank 0 (launcher/rank.py)."""

    def __init__(self, cfg: FrontendConfig, env: Optional[Dict[str, str]] = None):
        self.cfg = cfg
        self.env = env
        self.proc = None

    def argv(self) -> List[str]:
        c = self.cfg
        argv = [sys.executable, "-m", "launcher.frontend", "--host", c.host, "--port", str(c.port), "--metrics-port", str(c.metrics_port)]
        for a in c.addrs:
            argv += ["--replica", a]
        argv += ["--model", c.model_name, "--processes", str(c.processes), "--drain-timeout", str(c.drain_timeout_s), "--probe-interval", str(c.probe_interval_s)]
        argv += ["--loop", c.loop, "--die-with-parent"]
        return argv

    def start(self) -> "FrontendProcess":
        import subprocess

        sys.stdout.flush()
        # Own session: a terminal's Ctrl-C reaches rank 0, which decides how the front end stops.
        self.proc = subprocess.Popen(self.argv(), env=self.env, start_new_session=True)
        return self

    def poll(self) -> Optional[int]:
        return None if self.proc is None else self.proc.poll()

    def wait_ready(self, timeout_s: float) -> float:
        """Until ServerReady through the front end is true (every replica ready); raises if it exits."""
        channel_addr = f"{connect_host(self.cfg.host)}:{self.cfg.port}"
        t0 = time.monotonic()
        with grpc.insecure_channel(channel_addr) as ch:
            ready = ch.unary_unary(f"/{SERVICE}/ServerReady", service_pb2.ServerReadyRequest.SerializeToString, service_pb2.ServerReadyResponse.FromString)
            while True:
                if self.poll() is not None:
                    raise RuntimeError(f"front end exited with status {self.poll()} before it was ready")
                try:
                    if ready(service_pb2.ServerReadyRequest(), timeout=5).ready:
                        return time.monotonic() - t0
                except grpc.RpcError:
                    pass
                if time.monotonic() - t0 > timeout_s:
                    raise TimeoutError(f"front end on {channel_addr} not ready after {timeout_s:.0f}s")
                time.sleep(0.1)

    def terminate(self) -> None:
        if self.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self) -> Optional[int]:
        """SIGTERM (drain), SIGKILL after the drain deadline."""
        from launcher.triton import stop_group

        if self.proc is None:
            return None
        if self.proc.poll() is None:
            stop_group(self.proc, self.cfg.drain_timeout_s + 10)
        return self.proc.returncode


def wait_leaders_ready(run_dir, ranks, token: str, deadline_s: float, alive=lambda: True, progress=None):
    """Rank 0: wait until every replica leader of `ranks` wrote ready_rank<N>.json (it answered a real request)
    carrying this rendezvous's `token` (no stale file from an earlier run); (seconds waited, {rank: the ports its
    server bound}: a leader whose port was taken meanwhile retried on others). Raises when a rank wrote a failure
    file, when `alive()` turns false, or at the deadline."""
    import json
    from pathlib import Path

    run = Path(run_dir)
    t0 = time.monotonic()
    last = 0.0
    while True:
        missing, bound = [], {}
        for rank in ranks:
            try:
                ready = json.loads((run / f"ready_rank{rank}.json").read_text())
            except (OSError, ValueError):
                ready = {}
            if token and ready.get("token") == token:
                bound[rank] = ready["ports"]
            else:
                missing.append(rank)
        if not missing:
            return time.monotonic() - t0, bound
        fails = sorted(run.glob("failure_rank*.json"))
        if fails:
            raise RuntimeError(f"{fails[0].stem.replace('failure_', '')} failed before every replica was ready ({fails[0]})")
        if not alive():
            raise RuntimeError("this rank's own server exited while waiting for the other replicas")
        elapsed = time.monotonic() - t0
        if elapsed > deadline_s:
            raise TimeoutError(f"replica leaders (ranks {missing}) not ready after {deadline_s:.0f}s; raise serve.ready_timeout_s if loading is slow")
        if progress and elapsed - last >= 5:
            last = elapsed
            progress(f"waiting for replica leaders {missing} ({elapsed:.0f}s)")
        time.sleep(0.2)


def processes_for(setting: int, replicas: int, response_processes: int, cpus: int) -> int:
    """Front-end processes for a job: `serve.frontend_processes` when positive; 0 (the default) gives one
    per process that sends responses, replicas x engine.response_processes, at most half of rank 0's CPUs
    (its own tritonserver and engine run there too) and at least 1. Why: every streamed response passes
    through a front-end event loop, and one process is the limit once the replicas' stubs send more than
    ~21-29k responses/s. Two H100 replicas at 128 streams with two response processes each got 32,598 tok/s
    through one front-end process, 37,579 through two and 39,573 through four; with one response process
    each, 39,225 through one and 39,039 through two."""
    if setting > 0:
        return setting
    return max(1, min(replicas * response_processes, cpus // 2))


def start_for_rank0(spec, run_dir, infos: List[dict], leaders: List[dict], host: str, own_ports: Dict[str, int],
                    token: str, alive=lambda: True, say=log):
    """What global rank 0 does when replicas > 1, once its own server (on `own_ports`) is ready: wait for every
    other replica leader, start the front end on the public ports rank 0 reserved at the rendezvous, wait until it
    answers ServerReady. Returns (FrontendProcess, the endpoint.json fields it serves, {rank: the ports each
    leader's server bound})."""
    from pathlib import Path

    deadline_s = float(spec.serve["ready_timeout_s"])
    t0 = time.monotonic()
    waited, bound = wait_leaders_ready(run_dir, [i["rank"] for i in leaders if i["rank"] != 0], token, deadline_s,
                                       alive, say)
    bound[0] = dict(own_ports)
    ports = infos[0]["frontend_ports"]
    setting = int(spec.serve.get("frontend_processes") or os.environ.get("LLMLAUNCH_FRONTEND_PROCESSES") or 0)
    # engines other than hf have no response_processes: one instance each; the CPUs are those this rank may use
    processes = processes_for(setting, len(leaders), int(spec.engine.get("response_processes", 1)), len(os.sched_getaffinity(0)))
    how = "serve.frontend_processes" if setting else "auto: replicas x engine.response_processes, at most half this rank's CPUs"
    say(f"all {len(leaders)} replica leaders ready ({waited:.1f}s); starting the front end, {processes} process(es) ({how})")
    cfg = FrontendConfig(
        [(i["addr"], bound[i["rank"]]["grpc_port"]) for i in leaders],
        host=spec.host,
        port=int(ports["grpc_port"]),
        metrics_port=int(ports["metrics_port"]),
        model_name=spec.model_name,
        processes=processes,
        drain_timeout_s=float(spec.serve["drain_timeout_s"]),
    )
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])  # `python -m launcher.frontend` from this checkout
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = FrontendProcess(cfg, env=env).start()
    try:
        proc.wait_ready(max(30.0, deadline_s - (time.monotonic() - t0)))
    except BaseException:
        proc.stop()
        raise
    say(f"front end READY on {host}:{cfg.port} for {len(leaders)} replicas; metrics http://{host}:{cfg.metrics_port}/metrics")
    return proc, {
        "url": f"grpc://{host}:{cfg.port}",
        "grpc_port": cfg.port,
        "http_port": None,  # the front end speaks gRPC only
        "metrics_port": cfg.metrics_port,
        "metrics_url": f"http://{host}:{cfg.metrics_port}/metrics",
        "frontend": {"pid": proc.proc.pid, "processes": processes},
    }, bound


# ----------------------------------------------------------------------------- command line
def _die_with_parent() -> None:
    """SIGTERM when rank 0 dies (even by SIGKILL): no front end outlives its job."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    if os.getppid() == 1:
        raise SystemExit("front end: the parent is already gone")


def _hostport(text: str) -> Tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launcher.frontend", description="One Triton gRPC endpoint in front of several tritonserver replicas.")
    p.add_argument("--replica", action="append", type=_hostport, required=True, help="HOST:PORT of a replica's tritonserver gRPC endpoint (repeat)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, required=True, help="public gRPC port")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus metrics HTTP port (0 = none)")
    p.add_argument("--model", default="", help="model the health probe checks (default: ServerReady only)")
    p.add_argument("--processes", type=int, default=1, help="worker processes sharing the port (SO_REUSEPORT)")
    p.add_argument("--probe-interval", type=float, default=2.0, help="seconds between health probes (0 = none)")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="on SIGTERM, seconds running requests may take to finish")
    p.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto", help="event loop; auto = uvloop when installed")
    p.add_argument("--die-with-parent", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.processes < 1:
        p.error("--processes must be >= 1")
    if args.die_with_parent:
        _die_with_parent()
    return run_frontend(args.replica, args.host, args.port, args.metrics_port, args.model, args.processes, args.probe_interval, args.drain_timeout, args.loop)


if __name__ == "__main__":
    # Through the package module, so worker processes (spawn) find launcher.frontend's functions by name.
    from launcher.frontend import main as _main

    sys.exit(_main())
