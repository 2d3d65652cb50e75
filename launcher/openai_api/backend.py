"""The OpenAI server's way to the engines: one gRPC ModelStreamInfer call per request to the endpoint rank 0 serves
(its tritonserver, or the replicas front end), on one grpc.aio channel.

A call per request, not one shared stream: cancelling it (the HTTP client went away) cancels exactly that request
on the server, as the front end and tritonserver do for a cancelled stream.  Requests are built by
launcher.client.request.build_request (the contract's encoding, one place); responses are read as the client reads
them (launcher/client/response.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Optional

from grpc import aio
from tritonclient.grpc import service_pb2

from launcher.client.connection import CHANNEL_OPTIONS, parse_url
from launcher.client.request import build_request
from launcher.client.response import (
    StreamRecord,
    bytes_content,
    read_final_counts,
    read_log_probs,
    text_output_index,
)
from launcher.contract import SESSION_PARAMETER
from launcher.frontend.wire import SERVICE
from launcher.python_backend.logprob_io import LogProbRows


class BackendError(Exception):
    """The gRPC side failed a request: its message and gRPC status name ('' for an in-band model error)."""

    def __init__(self, message: str, code: str = ""):
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass
class LogProbs:
    """The log probabilities one response carried (a request that asked), yielded before its text."""

    rows: Optional[LogProbRows] = None  # the new tokens'
    prompt: Optional[LogProbRows] = None  # the prompt's (on the first response)


@dataclass
class Final:
    """What the last response of a request said."""

    finish_reason: str = ""  # contract finish_reason
    input_tokens: Optional[int] = None
    output_tokens: Optional[int] = None


class GrpcBackend:
    """Streams contract requests to `url` (host:port of a Triton gRPC endpoint) for `model`."""

    def __init__(self, url: str, model: str, parameters: Optional[dict] = None):
        self.url = parse_url(url)
        self.model = model
        self.parameters = dict(parameters or {})  # request parameters every request carries (final_counts_only)
        self._channel: Optional[aio.Channel] = None
        self._ids = 0

    def _connect(self) -> None:
        if self._channel is None:  # made on the serving loop: a grpc.aio channel belongs to its event loop
            self._channel = aio.insecure_channel(self.url, options=CHANNEL_OPTIONS)
            self._stream = self._channel.stream_stream(
                f"/{SERVICE}/ModelStreamInfer",
                request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
            )
            self._ready = self._channel.unary_unary(
                f"/{SERVICE}/ModelReady",
                request_serializer=service_pb2.ModelReadyRequest.SerializeToString,
                response_deserializer=service_pb2.ModelReadyResponse.FromString,
            )

    async def ready(self, timeout: float = 5.0) -> bool:
        """The model answers ModelReady through the endpoint."""
        self._connect()
        try:
            return (await self._ready(service_pb2.ModelReadyRequest(name=self.model), timeout=timeout)).ready
        except aio.AioRpcError:
            return False

    async def generate(self, gen, session: str = "") -> AsyncIterator:
        """Yields each response's text delta (str), then one Final.  Raises BackendError.  Closing the iterator
        early (the HTTP client went away) cancels the request on the server.  session: the client's session id,
        sent as the request parameter the front end routes by (launcher.contract.SESSION_PARAMETER)."""
        self._connect()
        self._ids += 1
        params = {**self.parameters, SESSION_PARAMETER: session} if session else self.parameters
        request = build_request(self.model, gen, str(self._ids), params)
        wants = gen.logprobs is not None or gen.prompt_logprobs is not None
        call = self._stream()
        rec = StreamRecord(str(self._ids))
        done = False
        try:
            await call.write(request)
            await call.done_writing()
            at = None
            prev = None
            while True:
                resp = await call.read()
                if resp is aio.EOF:
                    raise BackendError("the server closed the stream before the request ended", "UNAVAILABLE")
                if resp.error_message:
                    raise BackendError(resp.error_message)
                ir = resp.infer_response
                raw = ir.raw_output_contents
                final = ir.parameters["triton_final_response"].bool_param
                if raw and wants:
                    lp, plp = read_log_probs(ir)
                    if lp is not None or plp is not None:
                        yield LogProbs(lp, plp)
                if raw:
                    if at is None or (
                        final and not (0 <= at < len(ir.outputs) and ir.outputs[at].name == "text_output")
                    ):
                        at = text_output_index(ir)  # final_counts_only: the last response has all outputs
                    piece = bytes_content(raw[at]) if 0 <= at < len(raw) else b""
                    if piece:
                        yield piece
                if final:
                    # an empty final: counts are in the one before
                    read_final_counts(rec, ir if raw or prev is None else prev)
                    done = True
                    yield Final(rec.finish_reason, rec.input_tokens, rec.output_tokens)
                    return
                prev = ir
        except aio.AioRpcError as e:
            code = e.code()
            raise BackendError(e.details() or str(code), code.name if code else "") from None
        finally:
            if not done:
                call.cancel()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None


class Utf8Pieces:
    """Bytes deltas -> text deltas that never split a multi-byte character (an engine may send a token's bytes
    that end inside one)."""

    def __init__(self):
        import codecs

        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, piece: bytes) -> str:
        return self._dec.decode(piece)

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)
