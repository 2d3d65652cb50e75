"""TritonStream: one gRPC bidirectional ModelStreamInfer stream that carries many requests at once; and the
one-call helpers built on it (generate, generate_many, stream_text).

Why not tritonclient's start_stream/async_stream_infer: its callback
receives an error without the request id, so a stream that multiplexes many
requests cannot tell which one failed, and it wraps every response in an
InferResult. TritonStream drives the same generated gRPC stub
(tritonclient.grpc.service_pb2_grpc) from its own receive thread, whose
per-response work is: take the time, look the request up by id, append the
time and the raw text payload, check the final flag. Everything else
(decoding text, token counts) happens once, on the final response or later.
Measured (benchmark/client_capacity.py): about 3 us of Python per response on
top of gRPC's own receive path; one process consumes 12-18 thousand
responses/s; the benchmark's --processes N adds more.

Needs a Triton whose streaming responses carry the `triton_final_response`
parameter (23.x and later; the nvidia-pytriton wheel ships 2.51).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterator, Optional

from launcher.client.connection import CHANNEL_OPTIONS, ClientError, parse_url
from launcher.client.request import Generation, build_request
from launcher.client.response import StreamRecord, read_final_counts, text_output_index


class TritonStream:
    """One gRPC bidirectional ModelStreamInfer stream that carries many
    requests at once, told apart by request id.

    `submit` queues a prebuilt request; a receive thread records every
    response into the request's StreamRecord and calls `on_done(record)` (from
    that thread) when the request ends: final response, error, or stream
    failure. Keep `on_done` cheap; it runs on the receive path.
    """

    def __init__(self, url: str, on_done: Optional[Callable] = None, connect_timeout: float = 30.0):
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        self.url = parse_url(url)
        self._channel = grpc.insecure_channel(self.url, options=CHANNEL_OPTIONS)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        try:  # fail fast (no wait-for-ready) when nothing listens there
            self._stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=connect_timeout)
        except grpc.RpcError as exc:
            self._channel.close()
            raise ClientError(
                f"cannot connect to {self.url}: {_rpc_message(exc)}; is tritonserver running there?"
            ) from None
        self._on_done = on_done
        self._pending: dict = {}
        self._outbox: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._dead: str = ""
        self._responses = self._stub.ModelStreamInfer(self._requests())
        self._thread = threading.Thread(target=self._receive, name="triton-stream-rx", daemon=True)
        self._thread.start()

    # -- sending
    def _requests(self):
        # Runs on gRPC's own sending thread (its sync API sends what this iterator yields, from a thread of its own).
        # A request is stamped `sent` here, as it goes out, not in submit(): waking this thread is the client's
        # hand-off, 0.03-0.1 ms a request p50 (benchmark/first_response.py, the hand-off column; a
        # grpc.aio client, which sends from the caller's thread, has none), and a server's first token should not
        # carry it.  `queued` keeps submit()'s time.
        get, perf = self._outbox.get, time.perf_counter
        while True:
            item = get()
            if item is None:
                return
            request, rec = item
            rec.sent = perf()
            yield request

    def submit(self, request, record: Optional[StreamRecord] = None) -> StreamRecord:
        """Queue a ModelInferRequest (see build_request); returns its record."""
        if self._dead:
            raise ClientError(self._dead)
        rec = record if record is not None else StreamRecord(request.id)
        rec.request_id = request.id
        self._pending[request.id] = rec
        rec.queued = rec.sent = time.perf_counter()  # `sent` again when it goes out (_requests)
        self._outbox.put((request, rec))
        return rec

    # -- receiving (the measured path: keep it short)
    def _receive(self) -> None:
        perf = time.perf_counter
        pending = self._pending
        try:
            for resp in self._responses:
                t = perf()
                ir = resp.infer_response
                rec = pending.get(ir.id)
                if rec is None:
                    continue
                rec.times.append(t)
                if resp.error_message:
                    rec.chunks.append(b"")
                    rec.error = resp.error_message
                    # errors raised before the model (unknown model, bad input) carry no final flag
                    final = ir.parameters.get("triton_final_response")
                    if final is None or final.bool_param:
                        self._complete(ir.id, rec)
                    continue
                raw = ir.raw_output_contents
                final = ir.parameters["triton_final_response"].bool_param
                if raw:
                    at = rec._text_at
                    if at is None:  # once per request: where text_output is among the outputs
                        at = rec._text_at = text_output_index(ir)
                    elif final and not (0 <= at < len(ir.outputs) and ir.outputs[at].name == "text_output"):
                        # a request with final_counts_only: its earlier responses held text_output alone, this
                        # one has all four outputs, in an order of the server's (llmlaunch's models put text first)
                        at = text_output_index(ir)
                    rec.chunks.append(raw[at] if 0 <= at < len(raw) else b"")
                else:
                    rec.chunks.append(b"")
                if rec.on_response is not None:
                    rec.on_response(rec, len(rec.times) - 1)
                if final:
                    # an empty final response (flag sent on its own): the counts are in the one before
                    read_final_counts(rec, ir if raw or rec._prev is None else rec._prev)
                    self._complete(ir.id, rec)
                else:
                    rec._prev = ir
            self._fail_all("the server closed the stream with requests still running")
        except Exception as exc:  # grpc.RpcError: server gone, stream cancelled
            self._fail_all(_rpc_message(exc))

    def _complete(self, rid, rec) -> None:
        del self._pending[rid]
        rec._prev = None
        rec.done = True
        if self._on_done is not None:
            self._on_done(rec)
        with self._cond:
            self._cond.notify_all()

    def _fail_all(self, message: str) -> None:
        self._dead = self._dead or f"stream to {self.url} failed: {message}"
        self._outbox.put(None)  # let gRPC's request-iterator thread end
        for rid, rec in list(self._pending.items()):
            rec.error = rec.error or self._dead
            self._complete(rid, rec)

    # -- waiting and closing
    def wait(self, record: StreamRecord, timeout: Optional[float] = None) -> StreamRecord:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not record.done:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"request {record.request_id} did not finish within {timeout} s")
                self._cond.wait(left if left is not None else 1.0)
        return record

    def cancel(self, reason: str) -> None:
        """Give up on every running request: each ends with `reason` as its error."""
        self._dead = reason
        self._responses.cancel()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def close(self, cancel: bool = False, timeout: Optional[float] = None) -> None:
        """Half-close the stream and wait for running requests (or cancel them)."""
        if cancel:
            self._responses.cancel()
        self._outbox.put(None)
        self._thread.join(timeout)
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(cancel=exc_type is not None)


def _rpc_message(exc: Exception) -> str:
    details = getattr(exc, "details", None)
    if callable(details):
        try:
            code = exc.code()
            return f"{details()} ({code.name if code else 'grpc error'})"
        except Exception:
            pass
    return str(exc) or exc.__class__.__name__


def generate(
    url: str,
    model: str,
    gen: Generation,
    on_response: Optional[Callable] = None,
    parameters: Optional[dict] = None,
    timeout: Optional[float] = None,
) -> StreamRecord:
    """Send one request and wait for it; the record has per-response receive times."""
    with TritonStream(url) as stream:
        rec = StreamRecord("0", on_response=on_response)
        stream.submit(build_request(model, gen, "0", parameters), rec)
        stream.wait(rec, timeout)
    return rec


def generate_many(
    url: str, model: str, gens: list, concurrency: int = 8, parameters: Optional[dict] = None
) -> list[StreamRecord]:
    """Send every generation over one stream, at most `concurrency` at a time; records in order."""
    slots = threading.Semaphore(max(1, concurrency))
    records = [StreamRecord(str(i)) for i in range(len(gens))]
    with TritonStream(url, on_done=lambda rec: slots.release()) as stream:
        for i, gen in enumerate(gens):
            slots.acquire()
            stream.submit(build_request(model, gen, str(i), parameters), records[i])
        for rec in records:
            stream.wait(rec)
    return records


def stream_text(url: str, model: str, gen: Generation) -> Iterator[str]:
    """Yield text deltas as they arrive; raises ClientError on a server error."""
    pieces: queue.Queue = queue.Queue()

    def on_response(rec, i):
        pieces.put(rec.piece(i))

    def run():
        try:
            rec = generate(url, model, gen, on_response=on_response)
            pieces.put(ClientError(rec.error) if rec.error else None)
        except Exception as exc:
            pieces.put(exc)

    threading.Thread(target=run, daemon=True).start()
    while True:
        item = pieces.get()
        if item is None:
            return
        if isinstance(item, Exception):
            raise item
        yield item
