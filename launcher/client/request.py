"""A generation request in the contract's terms (launcher/contract.py) and its encoding on Triton's wire: the
inputs' raw payloads, tritonclient InferInputs, or the ModelInferRequest protobuf a stream sends."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Optional

from launcher.contract import SESSION_PARAMETER


@dataclass
class Generation:
    """One generation request in contract terms; None / empty = not sent (server default)."""

    prompt: str | list[int]  # text_input, or token ids of the served model (input_ids)
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
    session: Optional[str] = None  # not a model input: the session_id request parameter the front end routes by
    logprobs: Optional[int] = None  # return_log_probs, top_log_probs: each new token's log prob and the top k
    prompt_logprobs: Optional[int] = None  # return_prompt_log_probs, top_log_probs (one k for both: the larger)
    guide: Optional[tuple] = None  # (guided_decoding_guide_type, guided_decoding_guide): structured output
    kv_from: Optional[str] = None  # kv_from: host:port of the prefill engine whose keys and values of the prompt to use


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
    if isinstance(gen.prompt, str):
        tensors = [("text_input", "BYTES", [1, 1], _bytes_payload([gen.prompt]))]
    else:
        ids = [int(t) for t in gen.prompt]
        tensors = [("input_ids", "INT32", [1, len(ids)], struct.pack(f"<{len(ids)}i", *ids))]
    for attr, name, dtype, fmt in _SCALARS:
        value = getattr(gen, attr)
        if value is not None:
            tensors.append((name, dtype, [1, 1], struct.pack(fmt, value)))
    asked = [k for k in (gen.logprobs, gen.prompt_logprobs) if k is not None]
    if asked:
        for flag, k in (("return_log_probs", gen.logprobs), ("return_prompt_log_probs", gen.prompt_logprobs)):
            if k is not None:
                tensors.append((flag, "BOOL", [1, 1], struct.pack("?", True)))
        if max(asked):
            tensors.append(("top_log_probs", "INT32", [1, 1], struct.pack("<i", max(asked))))
    if gen.guide is not None:
        kind, guide = gen.guide
        tensors.append(("guided_decoding_guide_type", "BYTES", [1, 1], _bytes_payload([kind])))
        if guide:
            tensors.append(("guided_decoding_guide", "BYTES", [1, 1], _bytes_payload([guide])))
    if gen.kv_from:
        tensors.append(("kv_from", "BYTES", [1, 1], _bytes_payload([gen.kv_from])))
    for attr, name in (("stop", "stop_words"), ("bad_words", "bad_words")):
        words = list(getattr(gen, attr) or ())
        if words:
            tensors.append((name, "BYTES", [1, len(words)], _bytes_payload(words)))
    return tensors


def input_arrays(gen: Generation) -> list:
    """(name, datatype, numpy array) for every input to send: what a model's request holds once the server has
    read `encode_inputs`' payloads."""
    import numpy as np

    np_types = {"INT32": np.int32, "FP32": np.float32, "UINT64": np.uint64, "BOOL": np.bool_}
    out = []
    for name, dtype, shape, raw in encode_inputs(gen):
        if dtype == "BYTES":
            values, pos = [], 0
            while pos < len(raw):
                (n,) = struct.unpack_from("<I", raw, pos)
                values.append(raw[pos + 4 : pos + 4 + n])
                pos += 4 + n
            out.append((name, dtype, np.array(values, dtype=np.object_).reshape(shape)))
        else:
            out.append((name, dtype, np.frombuffer(raw, dtype=np_types[dtype]).reshape(shape)))
    return out


def build_inputs(gen: Generation) -> list:
    """The request as tritonclient.grpc.InferInput objects (for tritonclient's own APIs)."""
    import tritonclient.grpc as grpcclient

    inputs = []
    for name, dtype, array in input_arrays(gen):
        inp = grpcclient.InferInput(name, list(array.shape), dtype)
        inp.set_data_from_numpy(array)
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
    if gen.session:
        parameters = {**(parameters or {}), SESSION_PARAMETER: gen.session}
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
