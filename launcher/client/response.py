"""What comes back for a request: its StreamRecord (receive times, raw text payloads, counts, finish reason), and
the readers of a ModelInferResponse's payloads that every client of the contract shares (TritonStream, the OpenAI
server's backend, the benchmarks): where text_output is, a BYTES tensor's content, the final response's counts."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Callable, Optional


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
        return b"".join(bytes_content(c) for c in self.chunks).decode("utf-8", errors="replace")

    @property
    def token_times(self) -> list:
        """Receive times of the responses that carried text (empty final responses excluded)."""
        return [t for t, c in zip(self.times, self.chunks) if len(c) > 4]


def bytes_content(raw: bytes) -> bytes:
    """Concatenated elements of a raw BYTES tensor payload (4-byte little-endian length + bytes each)."""
    out, pos, n_raw = [], 0, len(raw)
    while pos + 4 <= n_raw:
        (n,) = struct.unpack_from("<I", raw, pos)
        out.append(raw[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return b"".join(out)


def _decode_bytes(raw: bytes) -> str:
    return bytes_content(raw).decode("utf-8", errors="replace")


def _int_payload(raw: bytes, dtype: str) -> int:
    fmt = {"INT32": "<i", "INT64": "<q", "UINT32": "<I", "UINT64": "<Q"}.get(dtype, "<i")
    return struct.unpack_from(fmt, raw, 0)[0]


def read_final_counts(rec: StreamRecord, ir) -> None:
    """Parse the final response's counts (once per request, off the hot path)."""
    for out, raw in zip(ir.outputs, ir.raw_output_contents):
        name = out.name
        if name == "output_tokens" and raw:
            rec.output_tokens = _int_payload(raw, out.datatype)
        elif name == "input_tokens" and raw:
            rec.input_tokens = _int_payload(raw, out.datatype)
        elif name == "finish_reason":
            rec.finish_reason = _decode_bytes(raw)


def text_output_index(ir) -> int:
    """Where text_output is among a ModelInferResponse's outputs (-1: not there)."""
    return next((i for i, o in enumerate(ir.outputs) if o.name == "text_output"), -1)


_NUMPY = {"INT32": "<i4", "FP32": "<f4", "INT64": "<i8", "FP16": "<f2"}


def read_log_probs(ir):
    """(new tokens' LogProbRows, prompt's LogProbRows) a ModelInferResponse carries, each None when absent
    (launcher.python_backend.logprob_io)."""
    import numpy as np

    from launcher.python_backend.logprob_io import read

    arrays = {}
    for out, raw in zip(ir.outputs, ir.raw_output_contents):
        if out.name.endswith("log_probs") or out.name.endswith("log_prob_ids"):
            arrays[out.name] = np.frombuffer(raw, dtype=_NUMPY[out.datatype]).reshape(list(out.shape))
    if not arrays:
        return None, None
    return read(arrays), read(arrays, prompt=True)
