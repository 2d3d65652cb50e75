"""gRPC client for any llmlaunch model (the launcher/contract.py interface).

Command line (`python -m launcher.client`):

    # stream one answer to stdout, token by token
    python -m launcher.client --url grpc://localhost:8001 --prompt "I am going to" --max-tokens 64
    # a file of prompts, sent concurrently, answers written in prompt order
    python -m launcher.client --prompts-file prompts.txt --output results.txt --concurrency 8

`--model` defaults to the model the server serves (asked through the
repository index: the only ready model that takes text_input/max_tokens, else
`ensemble`, else the first). Sampling flags map onto contract inputs:
--temperature, --top-p, --top-k, --seed (random_seed), --stop (stop_words,
repeatable), --min-tokens (min_length), --ignore-eos. Server errors are
printed on stderr and the exit status is 1.

Library (used by launcher.bench):

    gen = Generation(prompt="Hi", max_tokens=16, temperature=0.7)
    build_inputs(gen)                    # list of tritonclient.grpc.InferInput
    build_request(model, gen, "id-1")    # the ModelInferRequest protobuf itself
    with TritonStream(url) as stream:    # one gRPC bidirectional stream
        rec = stream.submit(build_request(model, gen, "id-1"))
        stream.wait(rec)
    rec.times                            # perf_counter() at every response
    rec.text, rec.input_tokens, rec.output_tokens, rec.finish_reason, rec.error

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

import argparse
import os
import queue
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

# Same limits tritonclient.grpc uses.
_MAX_MESSAGE = 2**31 - 1
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
]


class ClientError(RuntimeError):
    """A server or connection problem, with a message fit for the user."""


def parse_url(url: str) -> str:
    """'grpc://HOST:PORT', 'HOST:PORT' or 'HOST' -> 'HOST:PORT' (port 8001 by default)."""
    url = url.strip()
    if "://" in url:
        scheme, url = url.split("://", 1)
        if scheme not in ("grpc", "dns"):
            raise ValueError(f"unsupported URL scheme {scheme!r} in --url: use grpc://HOST:PORT or HOST:PORT")
    url = url.rstrip("/")
    if not url:
        raise ValueError("empty --url: use grpc://HOST:PORT or HOST:PORT")
    host, sep, port = url.rpartition(":")
    if not sep or "]" in port:  # no port (IPv6 literals end with ']')
        return f"{url}:8001"
    if not port.isdigit():
        raise ValueError(f"bad port {port!r} in --url {url!r}")
    return url


# --------------------------------------------------------------------------- requests


@dataclass
class Generation:
    """One generation request in contract terms; None / empty = not sent (server default)."""

    prompt: str  # text_input
    max_tokens: int = 128  # max_tokens
    stream: bool = True  # stream: one response per new piece of text
    temperature: Optional[float] = None  # temperature; 0 = greedy
    top_p: Optional[float] = None  # top_p
    top_k: Optional[int] = None  # top_k
    seed: Optional[int] = None  # random_seed
    stop: tuple = ()  # stop_words
    bad_words: tuple = ()  # bad_words
    min_tokens: Optional[int] = None  # min_length
    ignore_eos: Optional[bool] = None  # ignore_eos
    repetition_penalty: Optional[float] = None  # repetition_penalty
    presence_penalty: Optional[float] = None  # presence_penalty
    frequency_penalty: Optional[float] = None  # frequency_penalty
    end_id: Optional[int] = None  # end_id


# (contract input, Triton dtype, struct format) for the scalar fields of Generation.
_SCALARS = (
    ("max_tokens", "max_tokens", "INT32", "<i"),
    ("stream", "stream", "BOOL", "?"),
    ("temperature", "temperature", "FP32", "<f"),
    ("top_p", "top_p", "FP32", "<f"),
    ("top_k", "top_k", "INT32", "<i"),
    ("seed", "random_seed", "UINT64", "<Q"),
    ("min_tokens", "min_length", "INT32", "<i"),
    ("ignore_eos", "ignore_eos", "BOOL", "?"),
    ("repetition_penalty", "repetition_penalty", "FP32", "<f"),
    ("presence_penalty", "presence_penalty", "FP32", "<f"),
    ("frequency_penalty", "frequency_penalty", "FP32", "<f"),
    ("end_id", "end_id", "INT32", "<i"),
)


def _bytes_payload(items) -> bytes:
    """Triton's BYTES wire format: 4-byte little-endian length, then the bytes, per element."""
    out = bytearray()
    for item in items:
        b = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        out += struct.pack("<I", len(b)) + b
    return bytes(out)


def encode_inputs(gen: Generation) -> list[tuple[str, str, list[int], bytes]]:
    """(name, datatype, shape, raw little-endian payload) for every input to send.

    Shapes carry the batch dimension (models use max_batch_size > 0): [1, 1]
    for scalars, [1, n] for stop_words / bad_words."""
    if gen.max_tokens is None or gen.max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {gen.max_tokens}")
    tensors = [("text_input", "BYTES", [1, 1], _bytes_payload([gen.prompt]))]
    for attr, name, dtype, fmt in _SCALARS:
        value = getattr(gen, attr)
        if value is not None:
            tensors.append((name, dtype, [1, 1], struct.pack(fmt, value)))
    for attr, name in (("stop", "stop_words"), ("bad_words", "bad_words")):
        words = list(getattr(gen, attr) or ())
        if words:
            tensors.append((name, "BYTES", [1, len(words)], _bytes_payload(words)))
    return tensors


def build_inputs(gen: Generation) -> list:
    """The request as tritonclient.grpc.InferInput objects (for tritonclient's own APIs)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    np_types = {"INT32": np.int32, "FP32": np.float32, "UINT64": np.uint64, "BOOL": np.bool_}
    inputs = []
    for name, dtype, shape, raw in encode_inputs(gen):
        inp = grpcclient.InferInput(name, shape, dtype)
        if dtype == "BYTES":
            values, pos = [], 0
            while pos < len(raw):
                (n,) = struct.unpack_from("<I", raw, pos)
                values.append(raw[pos + 4 : pos + 4 + n])
                pos += 4 + n
            inp.set_data_from_numpy(np.array(values, dtype=np.object_).reshape(shape))
        else:
            inp.set_data_from_numpy(np.frombuffer(raw, dtype=np_types[dtype]).reshape(shape))
        inputs.append(inp)
    return inputs


def build_request(model: str, gen: Generation, request_id: str, parameters: Optional[dict] = None):
    """The ModelInferRequest protobuf for `gen`, ready for TritonStream.submit.

    `parameters` are Triton request parameters passed to the model (str, bool,
    int or float values)."""
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for name, dtype, shape, raw in encode_inputs(gen):
        t = req.inputs.add()
        t.name, t.datatype = name, dtype
        t.shape.extend(shape)
        req.raw_input_contents.append(raw)
    # Make decoupled models that send the final flag without a response still
    # end the request on the client (an empty response carrying the flag).
    req.parameters["triton_enable_empty_final_response"].bool_param = True
    for key, value in (parameters or {}).items():
        p = req.parameters[key]
        if isinstance(value, bool):
            p.bool_param = value
        elif isinstance(value, int):
            p.int64_param = value
        elif isinstance(value, float):
            p.double_param = value
        else:
            p.string_param = str(value)
    return req


# --------------------------------------------------------------------------- responses


@dataclass(eq=False)
class StreamRecord:
    """What came back for one request. Times are time.perf_counter() seconds
    (CLOCK_MONOTONIC: comparable across processes of one machine)."""

    request_id: str  # the request's id on the stream
    sent: float = 0.0  # when gRPC's sending thread took the request, just before it went out (TTFT counts from here)
    queued: float = 0.0  # when submit() queued it for that thread (sent - queued: the client's own hand-off)
    times: list = field(default_factory=list)  # receive time of every response
    chunks: list = field(default_factory=list)  # raw text_output payload of every response (b"" when absent)
    input_tokens: Optional[int] = None  # from the final response's input_tokens, if the model sent it
    output_tokens: Optional[int] = None  # from the final response's output_tokens (cumulative), if sent
    finish_reason: str = ""  # from the final response
    error: str = ""  # server or stream error; empty on success
    done: bool = False  # the final response (or an error) arrived
    client: int = 0  # the load generator's client process that sent it (launcher.bench.runner, several processes)
    on_response: Optional[Callable] = None  # called as f(record, index) after each response (CLI printing)
    _text_at: Optional[int] = field(default=None, repr=False)  # index of text_output in this request's responses
    _prev: object = field(default=None, repr=False)  # the previous response (counts for an empty final one)

    def piece(self, i: int) -> str:
        """The text delta carried by response i."""
        return _decode_bytes(self.chunks[i])

    @property
    def text(self) -> str:
        # Join the bytes first: a streamed chunk may end inside a multi-byte character
        # (TensorRT-LLM's postprocessing sends each token's exact bytes).
        return b"".join(_raw_bytes(c) for c in self.chunks).decode("utf-8", errors="replace")

    @property
    def token_times(self) -> list:
        """Receive times of the responses that carried text (empty final responses excluded)."""
        return [t for t, c in zip(self.times, self.chunks) if len(c) > 4]


def _raw_bytes(raw: bytes) -> bytes:
    """Concatenated elements of a raw BYTES tensor payload (4-byte little-endian length + bytes each)."""
    out, pos, n_raw = [], 0, len(raw)
    while pos + 4 <= n_raw:
        (n,) = struct.unpack_from("<I", raw, pos)
        out.append(raw[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return b"".join(out)


def _decode_bytes(raw: bytes) -> str:
    return _raw_bytes(raw).decode("utf-8", errors="replace")


def _int_payload(raw: bytes, dtype: str) -> int:
    fmt = {"INT32": "<i", "INT64": "<q", "UINT32": "<I", "UINT64": "<Q"}.get(dtype, "<i")
    return struct.unpack_from(fmt, raw, 0)[0]


def _finish(rec: StreamRecord, ir) -> None:
    """Parse the final response's counts (once per request, off the hot path)."""
    for out, raw in zip(ir.outputs, ir.raw_output_contents):
        name = out.name
        if name == "output_tokens" and raw:
            rec.output_tokens = _int_payload(raw, out.datatype)
        elif name == "input_tokens" and raw:
            rec.input_tokens = _int_payload(raw, out.datatype)
        elif name == "finish_reason":
            rec.finish_reason = _decode_bytes(raw)


def _text_index(ir) -> int:
    """Where text_output is among a ModelInferResponse's outputs (-1: not there)."""
    return next((i for i, o in enumerate(ir.outputs) if o.name == "text_output"), -1)


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
        self._channel = grpc.insecure_channel(self.url, options=_CHANNEL_OPTIONS)
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
                        at = rec._text_at = _text_index(ir)
                    elif final and not (0 <= at < len(ir.outputs) and ir.outputs[at].name == "text_output"):
                        # a request with final_counts_only: its earlier responses held text_output alone, this
                        # one has all four outputs, in an order of the server's (llmlaunch's models put text first)
                        at = _text_index(ir)
                    rec.chunks.append(raw[at] if 0 <= at < len(raw) else b"")
                else:
                    rec.chunks.append(b"")
                if rec.on_response is not None:
                    rec.on_response(rec, len(rec.times) - 1)
                if final:
                    # an empty final response (flag sent on its own): the counts are in the one before
                    _finish(rec, ir if raw or rec._prev is None else rec._prev)
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


# --------------------------------------------------------------------------- control plane


def list_models(url: str, timeout: float = 10.0) -> list[dict]:
    """The server's repository index: [{'name', 'version', 'state', 'reason'}]."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(parse_url(url))
    try:
        index = client.get_model_repository_index(as_json=True, client_timeout=timeout)
    except InferenceServerException as exc:
        raise ClientError(f"cannot list models at {parse_url(url)}: {exc.message()}") from None
    finally:
        client.close()
    return [dict(m) for m in index.get("models", [])]


def honoured_parameters(url: str, model: str, timeout: float = 10.0) -> frozenset:
    """The request parameters of launcher.contract.PARAMETERS that `model` says it honours: its config's
    `llmlaunch_request_parameters` (contract.HONOURED_PARAMETERS_KEY, comma-separated; launcher.pbtxt writes it for
    llmlaunch's models).  Empty for a model without it (the TensorRT-LLM ensemble, a Triton model made elsewhere) and
    where the config cannot be read: a parameter is sent only to a model known to take it, since some fail a request
    on one they do not know (Triton's vLLM backend)."""
    import tritonclient.grpc as grpcclient

    from launcher.contract import HONOURED_PARAMETERS_KEY, PARAMETERS

    client = grpcclient.InferenceServerClient(parse_url(url))
    try:
        config = client.get_model_config(model, as_json=True, client_timeout=timeout).get("config", {})
    except Exception:
        return frozenset()
    finally:
        client.close()
    listed = config.get("parameters", {}).get(HONOURED_PARAMETERS_KEY, {}).get("string_value", "")
    return frozenset({n.strip() for n in listed.split(",")} & {p.name for p in PARAMETERS})


def served_tokenizer(url: str, model: str, timeout: float = 10.0) -> str:
    """The tokenizer folder the served `model` names in its config (contract.TOKENIZER_KEYS), when that folder is
    readable here; "" otherwise (a model made elsewhere, a path only the cluster's nodes see, no server)."""
    import tritonclient.grpc as grpcclient

    from launcher.contract import TOKENIZER_KEYS

    client = grpcclient.InferenceServerClient(parse_url(url))
    try:
        params = (
            client.get_model_config(model, as_json=True, client_timeout=timeout).get("config", {}).get("parameters", {})
        )
    except Exception:
        return ""
    finally:
        client.close()
    for key in TOKENIZER_KEYS:
        path = params.get(key, {}).get("string_value", "")
        if path and os.path.isdir(path):
            return path
    return ""


def default_model(url: str) -> str:
    """The model to talk to when --model is not given: the only ready model that
    takes text_input and max_tokens; among several, `ensemble`, else the first."""
    import tritonclient.grpc as grpcclient

    ready = [m["name"] for m in list_models(url) if m.get("state") == "READY"]
    if not ready:
        raise ClientError(f"no model is READY at {parse_url(url)}")
    client = grpcclient.InferenceServerClient(parse_url(url))
    try:
        speaking = []
        for name in ready:
            try:
                meta = client.get_model_metadata(name, as_json=True)
            except Exception:
                continue
            names = {i["name"] for i in meta.get("inputs", [])}
            if {"text_input", "max_tokens"} <= names:
                speaking.append(name)
    finally:
        client.close()
    candidates = speaking or ready
    choice = "ensemble" if "ensemble" in candidates else candidates[0]
    if len(candidates) > 1:
        print(
            f"note: several models are ready ({', '.join(candidates)}); using {choice!r} (pass --model)",
            file=sys.stderr,
        )
    return choice


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


# --------------------------------------------------------------------------- CLI


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    """Sampling flags shared by the client and the benchmark."""
    g = parser.add_argument_group("sampling (contract inputs; unset = server default)")
    g.add_argument("--temperature", type=float, help="temperature (0 = greedy)")
    g.add_argument("--top-p", type=float, help="top_p")
    g.add_argument("--top-k", type=int, help="top_k")
    g.add_argument("--seed", type=int, help="random_seed for sampling")
    g.add_argument("--stop", action="append", default=[], metavar="WORD", help="stop word (repeatable)")
    g.add_argument("--min-tokens", type=int, help="min_length: tokens before EOS/stop may end the request")
    g.add_argument("--ignore-eos", action="store_true", default=None, help="generate exactly --max-tokens")


def generation_from_args(args, prompt: str, max_tokens: int, stream: bool = True) -> Generation:
    return Generation(
        prompt=prompt,
        max_tokens=max_tokens,
        stream=stream,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=tuple(args.stop or ()),
        min_tokens=args.min_tokens,
        ignore_eos=args.ignore_eos,
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m launcher.client",
        description="Send prompts to an llmlaunch model over Triton gRPC and print the answers.",
    )
    p.add_argument(
        "--url", "-u", default="localhost:8001", help="grpc://HOST:PORT or HOST:PORT (default localhost:8001)"
    )
    p.add_argument("--model", "-m", help="model name (default: the one the server serves)")
    p.add_argument("--prompt", "-p", help="prompt text (default: 'I am going to' unless --prompts-file)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens to generate (default 128)")
    p.add_argument("--no-stream", action="store_true", help="ask for one response with the whole answer")
    p.add_argument("--prompts-file", help="file with one prompt per line")
    p.add_argument(
        "--output", "-o", default="results.txt", help="where --prompts-file answers go (default results.txt)"
    )
    p.add_argument(
        "--concurrency", "-c", type=int, default=8, help="requests in flight with --prompts-file (default 8)"
    )
    p.add_argument("--iterations", type=int, default=1, help="send the prompts file this many times")
    p.add_argument("--verbose", "-v", action="store_true", help="print timing details on stderr")
    add_sampling_args(p)
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        url = parse_url(args.url)
        model = args.model or default_model(url)
        if args.prompts_file:
            return _run_file(args, url, model)
        return _run_one(args, url, model)
    except (ClientError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _run_one(args, url: str, model: str) -> int:
    gen = generation_from_args(args, args.prompt or "I am going to", args.max_tokens, stream=not args.no_stream)

    def show(rec, i):
        sys.stdout.write(rec.piece(i))
        sys.stdout.flush()

    rec = generate(url, model, gen, on_response=show)
    sys.stdout.write("\n")
    sys.stdout.flush()
    if args.verbose and rec.times:
        print(
            f"[{model}] first response {1000 * (rec.times[0] - rec.sent):.1f} ms, {len(rec.times)} responses, "
            f"tokens in/out {rec.input_tokens}/{rec.output_tokens}, finish_reason {rec.finish_reason!r}, "
            f"total {1000 * (rec.times[-1] - rec.sent):.1f} ms",
            file=sys.stderr,
        )
    if rec.error:
        print(f"error: model {model!r} at {url}: {rec.error}", file=sys.stderr)
        return 1
    return 0


def _run_file(args, url: str, model: str) -> int:
    print(f"Loading inputs from `{args.prompts_file}`...", file=sys.stderr)
    with open(args.prompts_file, encoding="utf-8") as f:
        prompts = [line.rstrip("\n") for line in f if line.strip()]
    prompts = prompts * max(1, args.iterations)
    gens = [generation_from_args(args, p, args.max_tokens, stream=not args.no_stream) for p in prompts]
    start = time.perf_counter()
    records = generate_many(url, model, gens, args.concurrency)
    elapsed = time.perf_counter() - start
    print(f"Storing results into `{args.output}`...", file=sys.stderr)
    with open(args.output, "w", encoding="utf-8") as f:
        for prompt, rec in zip(prompts, records):
            f.write(prompt + (f"\n[error: {rec.error}]" if rec.error else rec.text))
            f.write("\n\n=========\n\n")
    failed = [r for r in records if r.error]
    if args.verbose:
        tokens = sum(r.output_tokens or 0 for r in records)
        print(f"{len(records)} requests in {elapsed:.2f} s, {tokens / elapsed:.1f} output tokens/s", file=sys.stderr)
    if failed:
        print(f"error: {len(failed)} of {len(records)} requests failed; first: {failed[0].error}", file=sys.stderr)
        return 1
    print(f"PASS: {len(records)} prompts answered by {model!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
