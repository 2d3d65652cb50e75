"""The front end's view of Triton's gRPC wire: the service name, the parameters that mark a final
response, and the few protobuf fields it appends to a message it otherwise forwards byte for byte.

The wire format lets a later field override an earlier one (and repeated embedded messages merge),
so renaming a request, restoring its id on the responses and asking for an empty final response
are each a field appended to the serialized message; tensors are never re-encoded.  The requests the front end
makes of a client's (one moved mid-stream, a prefill, a decode with kv_from) are the client's with inputs left out
or added (`without_inputs`, `add_input`), its other tensors' bytes as they came.
"""

from __future__ import annotations

import os
import sys

from grpc import aio
from tritonclient.grpc import service_pb2

SERVICE = "inference.GRPCInferenceService"
_MAX_MESSAGE = 2**31 - 1
_EMPTY_FINAL = "triton_enable_empty_final_response"
_FINAL = "triton_final_response"


def log(msg: str) -> None:
    print(f"[llmlaunch frontend {os.getpid()}] {msg}", file=sys.stderr, flush=True)


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


def without_inputs(req: service_pb2.ModelInferRequest, names) -> service_pb2.ModelInferRequest:
    """A copy of `req` without the inputs named in `names` (raw contents kept in step with the inputs)."""
    out = service_pb2.ModelInferRequest()
    out.CopyFrom(req)
    del out.inputs[:]
    del out.raw_input_contents[:]
    raw = len(req.raw_input_contents) > 0
    for i, t in enumerate(req.inputs):
        if t.name in names:
            continue
        out.inputs.add().CopyFrom(t)
        if raw:
            out.raw_input_contents.append(req.raw_input_contents[i])
    return out


def add_input(req: service_pb2.ModelInferRequest, name: str, datatype: str, values: list, raw: bytes) -> None:
    """Append input `name` (INT32, BOOL or BYTES `values`; `raw`: their little-endian wire bytes) to `req`, shaped like
    its other inputs ([1, n] where max_tokens has a batch dimension, else [n]) and carried as they are (raw contents,
    or typed ones)."""
    batched = any(t.name == "max_tokens" and len(t.shape) == 2 for t in req.inputs)
    n = len(values)
    t = req.inputs.add(name=name, datatype=datatype, shape=[1, n] if batched else [n])
    if req.raw_input_contents:
        req.raw_input_contents.append(raw)
    elif datatype == "BYTES":
        t.contents.bytes_contents.extend(values)
    elif datatype == "BOOL":
        t.contents.bool_contents.extend(values)
    else:
        t.contents.int_contents.extend(values)
