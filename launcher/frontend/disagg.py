"""Disaggregated prefill and decode through the front end: a request of the served model goes first to a prefill
replica (its prompt, one token, `kv_export`), then to a decode replica with `kv_from`: the `kv_handle` the prefill
returned (the hf engine's: the address where its engine serves the prompt's blocks, launcher/hf/kv_transfer.py;
vLLM's: its kv_transfer_params, the blocks read over NIXL), so the decode replica computes only what the prefill did
not.  The client sees one stream: the decode replica's.

Where no prefill replica is up, or the prefill fails (an error, a replica that died mid-request), the request goes to
a decode replica without `kv_from` and is computed there whole: slower, never an error.  A request already carrying
`kv_from`, one sent again after its replica failed, and one moved mid-stream go straight to a decode replica."""

from __future__ import annotations

import struct

from grpc import aio
from tritonclient.grpc import service_pb2

from launcher.frontend.wire import _ASK_EMPTY_FINAL, _FINAL, add_input, without_inputs

KV_FROM = "kv_from"
KV_EXPORT = "kv_export"
KV_HANDLE = "kv_handle"
PREFILL_TIMEOUT_S = 120.0  # a prefill that takes longer is given up on: its decode replica computes the prompt
# inputs a one-token prefill does without: it streams nothing back, and what they ask for comes from the decode
DROPPED = (
    "stream",
    "min_length",
    "return_log_probs",
    "return_prompt_log_probs",
    "top_log_probs",
    "guided_decoding_guide_type",
    "guided_decoding_guide",
    "continue_ids",
    KV_FROM,
    KV_EXPORT,
)


def has_input(req: service_pb2.ModelInferRequest, name: str) -> bool:
    return any(t.name == name for t in req.inputs)


def prefill_request(req: service_pb2.ModelInferRequest) -> bytes:
    """The prefill's request for the client's `req`: its prompt and settings, one token, not streamed (a final
    response comes back, empty where the model sends none), its keys and values kept for a decode (kv_export)."""
    out = without_inputs(req, DROPPED)
    add_input(out, KV_EXPORT, "BOOL", [True], b"\x01")
    out.id = f"{req.id}~prefill"
    for i, t in enumerate(out.inputs):
        if t.name == "max_tokens":
            if out.raw_input_contents:
                out.raw_input_contents[i] = struct.pack("<i", 1)
            else:
                t.contents.ClearField("int_contents")
                t.contents.int_contents.append(1)
    return out.SerializeToString() + _ASK_EMPTY_FINAL


def with_kv_from(req: service_pb2.ModelInferRequest, address: str) -> bytes:
    """The client's request `req` for the decode replica: `kv_from` added, shaped like its other inputs ([1, 1]
    where they have a batch dimension)."""
    out = without_inputs(req, (KV_FROM,))
    data = address.encode()
    add_input(out, KV_FROM, "BYTES", [data], struct.pack("<I", len(data)) + data)
    return out.SerializeToString()


def output_text(resp: service_pb2.ModelInferResponse, name: str) -> str:
    """The one string of BYTES output `name` of `resp` ("" where it has none)."""
    for i, t in enumerate(resp.outputs):
        if t.name != name:
            continue
        if i < len(resp.raw_output_contents):
            raw = resp.raw_output_contents[i]
            (n,) = struct.unpack_from("<I", raw) if len(raw) >= 4 else (0,)
            return raw[4 : 4 + n].decode()
        return t.contents.bytes_contents[0].decode() if t.contents.bytes_contents else ""
    return ""


async def prefill(rep, raw: bytes, timeout_s: float) -> str:
    """Run the prefill request `raw` on replica `rep` (its own backend stream) until its final response; its
    kv_handle ("" where the model returned none: its decode computes the whole prompt).  Raises on the model's error, a failed stream or `timeout_s`."""
    import asyncio

    call = rep.stream()
    parse = service_pb2.ModelStreamInferResponse.FromString
    rep.track(1)
    rep.requests += 1
    try:

        async def answered() -> str:
            handle = ""
            await call.write(raw)
            await call.done_writing()
            while True:
                got = await call.read()
                if got is aio.EOF:
                    raise ConnectionError("the replica closed the stream before its final response")
                m = parse(got)
                rep.responses += 1
                if m.error_message:
                    raise RuntimeError(m.error_message)
                handle = output_text(m.infer_response, KV_HANDLE) or handle
                flag = m.infer_response.parameters.get(_FINAL)
                if flag is not None and flag.bool_param:
                    return handle

        return await asyncio.wait_for(answered(), timeout_s)
    finally:
        rep.track(-1)
        call.cancel()
