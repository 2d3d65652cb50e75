"""One client ModelStreamInfer stream through the front end (Session): its requests spread over the replicas, one
backend stream per replica and model it uses (see Session.dispatch for why per model), the responses passed back as
they arrive, looked up by request id; a replica's failure retries what it had not answered and moves what it was
generating mid-stream (launcher/frontend/migration.py), a client that leaves gets its backend streams cancelled."""

from __future__ import annotations

import asyncio
import collections
import itertools
from array import array
from time import monotonic
from typing import Dict, List, Optional, Protocol, Sequence, Tuple

from grpc import aio
from tritonclient.grpc import service_pb2

from launcher.frontend.disagg import KV_FROM, PREFILL_TIMEOUT_S, has_input, prefill, prefill_request, with_kv_from
from launcher.frontend.migration import (
    ASK_OUTPUT_IDS,
    ASK_TOKEN_IDS,
    asks_token_ids,
    continued_request,
    names_outputs,
    take_ids,
)
from launcher.frontend.replica import Replica
from launcher.frontend.wire import (
    _ASK_EMPTY_FINAL,
    _EMPTY_FINAL,
    _FINAL,
    _details,
    _error_response,
    _request_id_patch,
    _response_id_patch,
    log,
)


class Routes(Protocol):
    """What a session asks of the front end (launcher.frontend.proxy.Frontend): where a request goes, and whether new
    requests are refused."""

    draining: str  # why new requests are refused ("" while they are taken)
    rejected: int  # requests refused so far (the session counts its own)
    max_migrations: int  # times one running request may move to another replica (0: never)
    model_name: str  # the served model: the one whose requests can move (its engine continues them)

    def pick_for(self, request, exclude: Sequence[Replica] = ()) -> Optional[Replica]: ...

    def no_replica_message(self, tried: Sequence[Replica] = ()) -> str: ...

    def server_error(self, rep: Replica, message: str, grpc_code: str = "") -> bool: ...


_OUTBOX_HIGH, _OUTBOX_LOW = 256, 64  # responses queued for one client stream: pumps wait above HIGH until LOW


class ClientGone(Exception):
    """Writing to the client failed: it cancelled or disconnected."""


class _Pending:
    __slots__ = (
        "client_id",
        "wants_empty_final",
        "model",
        "version",
        "renamed",
        "raw",
        "started",
        "retried",
        "ids",
        "migrations",
        "arrived",
    )

    def __init__(
        self,
        client_id: str,
        wants_empty_final: bool,
        model: str,
        version: str,
        renamed: bool,
        raw: bytes = b"",
        retried: bool = False,
        ids: Optional[array] = None,
        migrations: int = 0,
        arrived: float = 0.0,
    ):
        self.client_id = client_id
        self.wants_empty_final = wants_empty_final
        self.model = model
        self.version = version
        self.renamed = renamed
        self.raw = raw  # the client's request as it came, to send it elsewhere if this replica fails
        self.started = False  # a response of it went back to the client
        self.retried = retried  # already sent again whole once (it had no answer when its replica failed)
        self.ids = ids  # a request that can move mid-stream: the ids of the tokens whose text the client has
        self.migrations = migrations  # times it moved mid-stream
        self.arrived = arrived  # monotonic(): when the client's request reached the front end (first-token time)


class _Link:
    """One client stream's backend stream to one replica for one model, and the requests running on it."""

    def __init__(self, session: "Session", rep: Replica, key: Tuple[int, str, str]):
        self.session = session
        self.rep = rep
        self.key = key  # (replica, model, version): its place in session.links
        self.call = rep.stream()
        self.stalled = ""  # why the front end cancelled this stream for its replica (Frontend.check_stalls)
        rep.links.add(self)
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
        rep, pending, send, read, fe = self.rep, self.pending, self.session.send, self.call.read, self.session.fe
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
                rep.last_response = monotonic()
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
                if p.ids is not None and ir.outputs:
                    take_ids(ir, p.ids)
                if final:
                    del pending[wire_id]
                    rep.track(-1)
                    if m.error_message:
                        rep.errors += 1
                        # the model's error (tritonserver's own are the request's fault): one the server failed goes
                        # on elsewhere as if its replica had died (whole, or mid-stream), where it can
                        if flag is not None and fe.server_error(rep, m.error_message):
                            if await self.go_on(p, f"{rep.label} failed it: {m.error_message}", avoid=rep):
                                continue
                    else:
                        if rep.failing or rep.on_trial:
                            rep.succeeded()
                        if not p.wants_empty_final and not ir.outputs:
                            continue  # the empty final response the front end asked for on its own behalf
                if not p.started and not m.error_message:
                    fe.first_tokens.observe(monotonic() - p.arrived)
                p.started = True
                if p.renamed:
                    raw += _response_id_patch(p.client_id)
                await send(raw)
        except aio.AioRpcError as e:
            if self.stalled:
                failure = self.stalled
            elif not self.session.closing:  # not our own cancellation
                failure = _details(e)
        except asyncio.CancelledError:
            if not self.stalled:
                raise
            failure = self.stalled
        except ClientGone:
            # The client left: every backend stream of its session is cancelled, so the models see it.
            self.session.abort()
        finally:
            rep.links.discard(self)
            if self.session.links.get(self.key) is self:
                del self.session.links[self.key]
        if failure:
            rep.mark_down(failure)
            await self.fail(f"{rep.label} failed: {failure}")

    async def fail(self, message: str) -> None:
        """The replica failed: requests it had not answered yet go to another replica whole (once: the client saw
        nothing of them, so nothing is repeated); those it was generating move there mid-stream and go on after the
        tokens the client has (launcher/frontend/migration.py), up to max_migrations times each; the others end
        with `message` and why they could not move."""
        items = list(self.pending.values())
        self.pending.clear()
        self.rep.track(-len(items))
        limit = self.session.fe.max_migrations
        try:
            for p in items:
                if not await self.go_on(p, message):
                    self.rep.errors += 1
                    if p.ids is None:
                        why = (
                            "moving a running request is off (serve.max_migrations=0, or an engine that cannot "
                            "continue a request elsewhere: docs/operations.md)"
                        )
                    elif p.ids and p.ids[0] < 0:  # its model said so: output_ids [-1]
                        why = "its engine cannot continue this request elsewhere (docs/operations.md says which)"
                    else:
                        why = f"it had moved max_migrations={limit} times"
                    text = f"{message}; the request could not move to another replica: {why}"
                    await self.session.send(_error_response(text, p.client_id, p.model, p.version))
        except ClientGone:
            return

    async def go_on(self, p: _Pending, message: str, avoid: Optional[Replica] = None) -> bool:
        """Send request `p`, which this replica failed (`message`), to another one (not `avoid` where another is
        up): whole if the client has nothing of it yet (once), mid-stream if it streamed and can move.  False where
        it can do neither: then it ends in an error."""
        limit = self.session.fe.max_migrations
        if not p.started and not p.retried:
            self.rep.retried += 1
            await self.session.dispatch(p.raw, retried=True, avoid=avoid, arrived=p.arrived)
            return True
        if p.started and p.ids is not None and p.migrations < limit and not (p.ids and p.ids[0] < 0):
            self.rep.migrated += 1
            log(
                f"moving request {p.client_id!r} off {self.rep.label} after {len(p.ids)} tokens (move "
                f"{p.migrations + 1} of at most {limit})"
            )
            await self.session.dispatch(continued_request(p.raw, p.ids), moved=p, failure=message, avoid=avoid)
            return True
        return False

    def stall(self, why: str) -> None:
        """Its replica answers nothing while it has work (Frontend.check_stalls), or left the members file
        (Frontend.remove_replica): cancel the backend stream; its pump then fails (moves) the requests on it with
        `why`, as it fails those of a replica that died."""
        self.stalled = why
        self.call.cancel()

    def cancel(self) -> None:
        """The client is gone: cancel the backend stream (tritonserver cancels its requests)."""
        self.call.cancel()
        for task in (self.task, self.writer):
            if not task.done():
                task.cancel()
        self.rep.track(-len(self.pending))
        self.pending.clear()


class Session:
    """One client ModelStreamInfer stream; its requests spread over the replicas."""

    def __init__(self, fe: Routes, context):
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
        self.prefilling: set = set()  # requests whose prompt a prefill replica computes first (disagg.py)
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
            raise ClientGone(self.gone)
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
        # The client has sent everything: the requests still at their prefill reach their decode replica first,
        # then the backends get the half-close and finish what runs.  Repeat while links appear: a replica failing
        # now moves its unanswered requests onto a fresh link.
        while self.prefilling:
            await asyncio.gather(*list(self.prefilling), return_exceptions=True)
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

    async def dispatch(
        self,
        raw: bytes,
        retried: bool = False,
        moved: Optional[_Pending] = None,
        failure: str = "",
        avoid: Optional[Replica] = None,
        arrived: float = 0.0,
        prefilled: bool = False,
    ) -> None:
        """Send a request to a replica: a client's (to a prefill replica first where there are: `prefilled` after),
        one sent again whole (`retried`, `arrived` when the client sent it), or one `moved` mid-stream (its replica
        failed with `failure`; `raw` is its continued request); not to `avoid` where another is up."""
        req = service_pb2.ModelInferRequest.FromString(raw)
        client_id = req.id
        wants_empty_final = _EMPTY_FINAL in req.parameters and req.parameters[_EMPTY_FINAL].bool_param
        if self.fe.draining and not retried and moved is None and not prefilled:
            self.fe.rejected += 1
            await self.send(_error_response(self.fe.draining, client_id, req.model_name, req.model_version))
            return
        if not (prefilled or retried or moved is not None) and self._prefills(req):
            self._start_prefill(req, raw, arrived or monotonic())
            return
        exclude = (avoid,) if avoid is not None else ()
        rep = self.fe.pick_for(req, exclude) or await self.fe.pick_waiting(req, exclude)
        if rep is None and avoid is not None and avoid.up and not avoid.draining:
            rep = avoid  # the only one up
        if rep is None:
            self.fe.rejected += 1
            text = self.fe.no_replica_message()
            if moved is not None:
                text = f"{failure}; the request could not move to another replica: {text}"
            await self.send(_error_response(text, client_id, req.model_name, req.model_version))
            return
        # One backend stream per replica *and model*: tritonserver 2.51 aborts (gRPC's "ASSERTION FAILED:
        # !byte_buffer->Valid()", SIGABRT in TRITONBACKEND_ResponseSend) when one ModelStreamInfer stream
        # carries a non-decoupled model's request while a decoupled model's responses are being written:
        # the two paths write to the stream unserialized. A client may mix them on its stream (tritonclient
        # does not stop it); here they never share a backend stream, so the replicas survive such clients.
        # tests/integration/test_frontend.py::test_a_stream_mixing_decoupled_and_plain_models_leaves_the_replicas_running
        key = (rep.index, req.model_name, req.model_version)
        link = self.links.get(key)
        # a fresh backend stream where there is none (a link whose stream ended has left self.links), or where the
        # key's link is to the server that held this members-file slot before (its stream is ending)
        if link is None or link.rep is not rep:
            link = self.links[key] = _Link(self, rep, key)
            self.every_link.append(link)
        wire_id, patch = client_id, b""
        if client_id in link.pending:  # two running requests share an id: rename ours on the wire
            while wire_id in link.pending:
                wire_id = f"{client_id}~fe{next(self.renames)}"
            patch = _request_id_patch(wire_id)
        if not wants_empty_final:
            patch += _ASK_EMPTY_FINAL
        if moved is not None:  # the same request, on: the ids so far, how often it moved, the client's request
            ids, migrations, raw_kept = moved.ids, moved.migrations + 1, moved.raw
        else:
            ids, migrations, raw_kept = None, 0, raw
            if self.fe.max_migrations and req.model_name == self.fe.model_name:
                ids = array("i")
                if not asks_token_ids(req):
                    patch += ASK_TOKEN_IDS
                if names_outputs(req):
                    patch += ASK_OUTPUT_IDS
        pending = link.pending[wire_id] = _Pending(
            client_id,
            wants_empty_final,
            req.model_name,
            req.model_version,
            wire_id != client_id,
            raw_kept,
            retried,
            ids,
            migrations,
            arrived or (moved.arrived if moved is not None else monotonic()),
        )
        pending.started = moved is not None
        rep.track(1)
        rep.requests += 1
        link.send(raw + patch if patch else raw)

    def _prefills(self, req) -> bool:
        """A client's request goes to a prefill replica first: there are some, it is of the served model and names
        no kv_from of its own."""
        return bool(self.fe.prefill) and req.model_name == self.fe.model_name and not has_input(req, KV_FROM)

    def _start_prefill(self, req, raw: bytes, arrived: float) -> None:
        task = asyncio.get_running_loop().create_task(self._prefill_first(req, raw, arrived))
        self.prefilling.add(task)
        task.add_done_callback(self.prefilling.discard)

    async def _prefill_first(self, req, raw: bytes, arrived: float) -> None:
        """A prefill replica computes the prompt (one token), then the request goes to a decode replica with
        `kv_from`: the handle the prefill returned; no prefill replica up, a failed prefill or no handle: to a decode
        replica as it came, which computes it whole."""
        rep = self.fe.pick_prefill(req)
        if rep is not None:
            try:
                handle = await prefill(rep, prefill_request(req), PREFILL_TIMEOUT_S)
                if handle:
                    raw = with_kv_from(req, handle)
                else:
                    log(
                        f"the prefill of {req.id!r} on {rep.label} returned no kv_handle: its decode replica computes it"
                    )
            except asyncio.CancelledError:
                raise
            except Exception as e:
                rep.errors += 1
                log(f"the prefill of {req.id!r} on {rep.label} failed ({e}): its decode replica computes the prompt")
        try:
            await self.dispatch(raw, arrived=arrived, prefilled=True)
        except ClientGone:
            self.abort()

    def abort(self) -> None:
        """The client is gone (cancelled, disconnected, deadline) or the stream is over: cancel
        whatever still runs for it. Idempotent."""
        self.closing = True
        self.writer.cancel()
        for task in list(self.prefilling):
            task.cancel()
        for link in self.every_link:
            link.cancel()
        self.links.clear()
