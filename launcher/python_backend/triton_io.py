"""Request parsing, validation and response building shared by every llmlaunch python-backend model.

The contract is `launcher.contract` (TensorRT-LLM ensemble inputs/outputs).  This
module turns a Triton request into a plain `GenerationRequest` (prompt + engine-
neutral `SamplingParams`, both in launcher.python_backend.generation) and builds
responses; engine adapters (hf, vLLM, SGLang, LMDeploy) map `SamplingParams` onto
their own types.

Layers, so that the validation is testable without Triton:

* `parse_inputs(arrays, ...)` - pure: numpy arrays by input name -> GenerationRequest,
  raising `InvalidRequest` with a message that names the input and the fix;
* `request_arrays(request)` - reads the contract's tensors from a pb_utils request;
* `response(...)`, `Responder` (streaming: keeps and resends the tensors that repeat), `error_response(...)` -
  build pb_utils responses.

`triton_python_backend_utils` only exists inside the Triton python stub, so it
is imported inside the functions that need it.
"""

from __future__ import annotations

import json
import threading

from launcher.contract import GUIDE_KINDS, INPUT_NAMES, INPUTS, PARAMETERS, REQUIRED_INPUTS
from launcher.python_backend.generation import GenerationRequest, InvalidRequest, SamplingParams

_INPUT_DOC = {t.name: t.doc for t in INPUTS}
_INPUT_DTYPE = {t.name: t.dtype for t in INPUTS}
# Optional inputs an engine must honour or refuse: ignoring them would answer something else than what was asked (a
# text prompt of nothing, a response without the log probabilities the client reads).
MUST_HONOUR = (
    "input_ids",
    "continue_ids",
    "return_log_probs",
    "top_log_probs",
    "return_prompt_log_probs",
    "guided_decoding_guide_type",
    "guided_decoding_guide",
)
FINISH_REASONS = ("length", "stop", "cancelled")


# ---------------------------------------------------------------------------------------------------------
# pure parsing
# ---------------------------------------------------------------------------------------------------------
_KINDS = {"BYTES": "OSU", "INT32": "iu", "UINT64": "iu", "FP32": "f", "BOOL": "b"}


def _check_batch(name: str, arr):
    """Arrays arrive as [1, n] (max_batch_size > 0) or [n] (max_batch_size 0); batches > 1 are rejected."""
    import numpy as np

    arr = np.asarray(arr)
    if arr.ndim >= 2 and arr.shape[0] != 1:
        raise InvalidRequest(
            f"batch size {arr.shape[0]} is not supported (input {name!r} has shape "
            f"{list(arr.shape)}); send one prompt per request and use concurrent requests"
        )
    return arr.reshape(-1)


def _scalar(name: str, arr):
    flat = _check_batch(name, arr)
    if flat.size != 1:
        raise InvalidRequest(f"input {name!r} must hold exactly one value, got {flat.size}")
    kind = _INPUT_DTYPE[name]
    if flat.dtype.kind not in _KINDS[kind]:
        raise InvalidRequest(f"input {name!r} must be {kind} ({_INPUT_DOC[name]}), got numpy dtype {flat.dtype}")
    value = flat[0]
    if kind == "BOOL":
        return bool(value)
    if kind == "FP32":
        return float(value)
    if kind in ("INT32", "UINT64"):
        return int(value)
    return value


def _text(name: str, value) -> str:
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequest(f"input {name!r} is not valid UTF-8: {exc}") from None
    if isinstance(value, str):
        return value
    raise InvalidRequest(f"input {name!r} must be BYTES (UTF-8 text), got {type(value).__name__}")


def _words(name: str, arr) -> tuple[str, ...]:
    flat = _check_batch(name, arr)
    if flat.dtype.kind not in "OSU":
        raise InvalidRequest(f"input {name!r} must be BYTES (a list of UTF-8 strings), got numpy dtype {flat.dtype}")
    words = []
    for item in flat:
        # TensorRT-LLM clients sometimes send one comma-free string per word, sometimes a flat list; empty = none
        text = _text(name, item)
        if text:
            words.append(text)
    return tuple(words)


def _token_ids(arr, name: str = "input_ids") -> list[int]:
    flat = _check_batch(name, arr)
    if flat.dtype.kind not in "iu":
        raise InvalidRequest(f"input {name!r} must be INT32 token ids, got numpy dtype {flat.dtype}")
    if not flat.size:
        raise InvalidRequest(f"{name} is empty; send at least one token id")
    if int(flat.min()) < 0:
        raise InvalidRequest(f"{name} holds a negative token id ({int(flat.min())}); token ids are >= 0")
    return [int(t) for t in flat]


def parse_inputs(
    arrays: dict,
    supported: frozenset[str] | set[str] = frozenset(INPUT_NAMES),
    max_model_len: int | None = None,
    engine: str = "this engine",
) -> GenerationRequest:
    """Numpy arrays by contract input name (absent inputs omitted or None) -> GenerationRequest.

    `supported`: the optional inputs this engine honours; others that are present are listed in
    `GenerationRequest.ignored` (callers log a note), but those of MUST_HONOUR refuse the request naming `engine`.
    Raises InvalidRequest with a clear message.
    """
    arrays = {k: v for k, v in arrays.items() if v is not None}
    _check_names(arrays, supported, engine)
    prompt = _prompt(arrays)
    beam = _scalar("beam_width", arrays["beam_width"]) if "beam_width" in arrays else 1
    if beam != 1:
        raise InvalidRequest(
            f"beam_width {beam} is not supported: streaming engines generate one beam; send beam_width 1 or omit it"
        )
    params = _sampling_params(arrays)
    if "continue_ids" in arrays:
        params.continue_ids = tuple(_token_ids(arrays["continue_ids"], "continue_ids"))
    if "kv_from" in arrays:
        params.kv_from = _text("kv_from", _scalar("kv_from", arrays["kv_from"]))  # the engine reads its handle
        if not params.kv_from:
            raise InvalidRequest("kv_from is empty: send the kv_handle a prefill returned, or leave kv_from out")
    params.kv_export = bool(_opt(arrays, "kv_export", False))
    _guide(arrays, params)
    _logprobs(arrays, params)
    # pad_id / exclude_input_in_output are read for their type only
    for name in ("pad_id", "exclude_input_in_output"):
        if name in arrays:
            _opt(arrays, name, None)
    params.validate(max_model_len)
    ignored = tuple(n for n in INPUT_NAMES if n in arrays and n not in supported and n not in REQUIRED_INPUTS)
    return GenerationRequest(prompt=prompt, params=params, stream=_opt(arrays, "stream", False), ignored=ignored)


def host_port(name: str, text: str) -> str:
    """A host:port input (an IPv6 host in brackets), or InvalidRequest naming it."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidRequest(f"{name} {text!r} is not host:port (e.g. 10.0.0.5:8005)")
    return text


def _opt(arrays: dict, name: str, default):
    """An optional scalar input's value, `default` where it is absent."""
    return _scalar(name, arrays[name]) if name in arrays else default


def _check_names(arrays: dict, supported, engine: str) -> None:
    """Only the contract's inputs, its required ones among them, and none of MUST_HONOUR that `engine` does not
    support (an input_ids, or a non-zero flag or text)."""
    unknown = sorted(set(arrays) - set(INPUT_NAMES))
    if unknown:
        raise InvalidRequest(f"unknown inputs {unknown}; the contract's inputs are {list(INPUT_NAMES)}")
    for name in REQUIRED_INPUTS:
        if name not in arrays:
            raise InvalidRequest(f"missing required input {name!r} ({_INPUT_DOC[name]})")
    for name in MUST_HONOUR:
        if name in arrays and name not in supported and (name == "input_ids" or _check_batch(name, arrays[name]).any()):
            raise InvalidRequest(
                f"{name} is not supported by {engine}; leave it out, or serve the model with an engine that "
                "supports it (docs/openai.md lists which do)"
            )


def _prompt(arrays: dict) -> str | list[int]:
    """The prompt: input_ids' token ids, or text_input's text (one of them, not both)."""
    if "input_ids" in arrays:
        if "text_input" in arrays and _text("text_input", _scalar("text_input", arrays["text_input"])):
            raise InvalidRequest("send the prompt as text_input or as input_ids, not both")
        return _token_ids(arrays["input_ids"])
    if "text_input" in arrays:
        prompt = _text("text_input", _scalar("text_input", arrays["text_input"]))
        if not prompt.strip():
            raise InvalidRequest("text_input is empty; send a non-empty prompt")
        return prompt
    raise InvalidRequest(f"missing required input 'text_input' ({_INPUT_DOC['text_input']})")


def _sampling_params(arrays: dict) -> SamplingParams:
    """The sampling inputs as SamplingParams (random_seed, or its alias seed: both only where they agree)."""
    seed = _opt(arrays, "random_seed", None)
    alias = _opt(arrays, "seed", None)
    if seed is not None and alias is not None and seed != alias:
        raise InvalidRequest(f"random_seed ({seed}) and seed ({alias}) disagree; send one of them")
    return SamplingParams(
        max_tokens=_scalar("max_tokens", arrays["max_tokens"]),
        temperature=_opt(arrays, "temperature", 0.0),
        top_k=_opt(arrays, "top_k", 0),
        top_p=_opt(arrays, "top_p", 1.0),
        repetition_penalty=_opt(arrays, "repetition_penalty", 1.0),
        presence_penalty=_opt(arrays, "presence_penalty", 0.0),
        frequency_penalty=_opt(arrays, "frequency_penalty", 0.0),
        seed=seed if seed is not None else alias,
        stop=_words("stop_words", arrays["stop_words"]) if "stop_words" in arrays else (),
        bad_words=_words("bad_words", arrays["bad_words"]) if "bad_words" in arrays else (),
        min_tokens=_opt(arrays, "min_length", 0),
        ignore_eos=_opt(arrays, "ignore_eos", False),
        end_id=_opt(arrays, "end_id", None),
    )


def _guide(arrays: dict, params: SamplingParams) -> None:
    """params.guide: (kind, guide) of guided decoding, where the request names a kind."""
    kind = _text("guided_decoding_guide_type", _opt(arrays, "guided_decoding_guide_type", b""))
    guide = _text("guided_decoding_guide", _opt(arrays, "guided_decoding_guide", b""))
    if kind:
        params.guide = (kind, guide)
    elif guide:
        raise InvalidRequest(
            f"guided_decoding_guide needs guided_decoding_guide_type, one of {sorted(GUIDE_KINDS)}, to say what it is"
        )


def _logprobs(arrays: dict, params: SamplingParams) -> None:
    """params.logprobs / prompt_logprobs: the top tokens' count, where the output's / the prompt's were asked."""
    top = _opt(arrays, "top_log_probs", None)
    if _opt(arrays, "return_log_probs", False):
        params.logprobs = top or 0
    if _opt(arrays, "return_prompt_log_probs", False):
        params.prompt_logprobs = top or 0
    if top and params.logprobs is None and params.prompt_logprobs is None:
        raise InvalidRequest(
            f"top_log_probs {top} asks for nothing without return_log_probs or return_prompt_log_probs; send one"
        )


# ---------------------------------------------------------------------------------------------------------
# Triton side (pb_utils imported lazily: it only exists inside the python backend stub)
# ---------------------------------------------------------------------------------------------------------
def request_arrays(request) -> dict:
    """The contract's input tensors of a pb_utils request as numpy arrays (absent ones left out).

    One pass over the request's inputs: pb_utils.get_input_tensor_by_name lists them all again on every
    call, and looking up each of the contract's ~20 names that way took reading and checking a request from
    0.13 to 0.22 ms on the H100 host (benchmark/first_response.py, `parse`)."""
    arrays = {}
    for tensor in request.inputs():
        name = tensor.name()
        if name in _INPUT_DTYPE:
            arrays[name] = tensor.as_numpy()
    return arrays


def parse_parameters(raw) -> dict:
    """The contract's request parameters (`contract.PARAMETERS`) from a request's parameters, as pb_utils gives
    them (a JSON object text) or as a dict; absent ones get their defaults, others' keys are not ours and are
    left alone (Triton's own, or another model's).  Raises InvalidRequest for a value of the wrong kind."""
    if isinstance(raw, (str, bytes)):
        try:
            raw = json.loads(raw or "{}")
        except ValueError:
            raise InvalidRequest(f"request parameters are not a JSON object: {raw[:80]!r}") from None
    raw = raw or {}
    if not isinstance(raw, dict):
        raise InvalidRequest(f"request parameters are not a JSON object: {raw!r:.80}")
    values = {}
    for p in PARAMETERS:
        value = raw.get(p.name, p.default)
        if p.kind == "bool":
            # gRPC sends bool_param; the generate endpoint and `--request-param` may send text
            if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
                value = value.lower() in ("true", "1")
            if not isinstance(value, bool):
                raise InvalidRequest(
                    f"request parameter {p.name}={value!r} must be true or false; send true, "
                    f"false, 1 or 0, or leave it out (default {str(p.default).lower()})"
                )
        else:  # a new kind in contract.PARAMETERS needs its check here first
            raise TypeError(f"contract parameter {p.name}: kind {p.kind!r} has no check")
        values[p.name] = value
    return values


def parse_request(
    request, supported=frozenset(INPUT_NAMES), max_model_len: int | None = None, engine: str = "this engine"
) -> GenerationRequest:
    req = parse_inputs(request_arrays(request), supported, max_model_len, engine)
    params = getattr(request, "parameters", None)
    if params is not None:  # (an older python backend without InferenceRequest.parameters(): the defaults)
        values = parse_parameters(params())
        req.final_counts_only = values["final_counts_only"]
        req.return_token_ids = values["return_token_ids"]
    return req


def output_arrays(
    text: str, input_tokens: int, output_tokens: int, finish_reason: str | None, batched: bool = True
) -> dict:
    """Contract outputs as numpy arrays: shape [1, 1] with a batch dimension, [1] without."""
    import numpy as np

    shape = (1, 1) if batched else (1,)
    return {
        "text_output": np.array([text.encode("utf-8")], dtype=np.object_).reshape(shape),
        "input_tokens": np.array([input_tokens], dtype=np.int32).reshape(shape),
        "output_tokens": np.array([output_tokens], dtype=np.int32).reshape(shape),
        "finish_reason": np.array([(finish_reason or "").encode()], dtype=np.object_).reshape(shape),
    }


def response(
    text: str,
    input_tokens: int,
    output_tokens: int,
    finish_reason: str | None = None,
    batched: bool = True,
    counts: bool = True,
    extra: list = (),
):
    """One contract response (see `Responder` for the streaming hot path).  `counts=False`: text_output alone
    (a streamed response before the final one of a request that asked for `final_counts_only`); `extra`: more
    tensors (log probabilities)."""
    import triton_python_backend_utils as pb_utils

    arrays = output_arrays(text, input_tokens, output_tokens, finish_reason, batched)
    if not counts:
        arrays = {"text_output": arrays["text_output"]}
    return pb_utils.InferenceResponse(output_tensors=[*(pb_utils.Tensor(k, v) for k, v in arrays.items()), *extra])


class Responder:
    """Builds the contract's responses for one model, reusing output tensors.

    Streaming sends one response per piece of text per engine step, and one stub
    process sends them all (a few thousand a second at most), so what a response
    costs the stub sets how many streams it keeps up with.  Measured in a stub
    (the emitter fixture, launcher/testing/models/emitter): building a
    pb_utils.Tensor costs 12 us (INT32) to 30 us (BYTES), and its first send
    copies it into shared memory; a tensor sent before is sent again from there.
    So every tensor that can repeat is built once and kept:

    * input_tokens, per request (`input_tokens(n)`), and finish_reason, per value;
    * output_tokens, per count (1, 2, 3, ... repeat in every request) up to `max_counts`;
    * text_output, per piece of text (a model's frequent tokens repeat); at most
      `max_texts` pieces, then the kept ones are dropped and it starts again.

    The kept tensors are per thread (responder threads each build their own
    share of the streams), so no two threads ever send one tensor object at once.
    `cache=False` builds every tensor afresh (what this class did before; kept to
    measure against).
    """

    def __init__(self, batched: bool = True, cache: bool = True, max_texts: int = 8192, max_counts: int = 16384):
        import numpy as np
        import triton_python_backend_utils as pb_utils

        self._pb = pb_utils
        self._np = np
        self._shape = (1, 1) if batched else (1,)
        self._cache = cache
        self._max_texts = max_texts
        self._max_counts = max_counts  # counts above are built afresh (a bound on what a thread keeps)
        self._local = threading.local()

    def _kept(self):
        kept = getattr(self._local, "kept", None)
        if kept is None:  # this thread's tensors: text -> text_output, count -> output_tokens, reason -> finish_reason
            kept = self._local.kept = ({}, {}, {})
        return kept

    def _bytes(self, name: str, text: str):
        return self._pb.Tensor(
            name, self._np.array([text.encode("utf-8")], dtype=self._np.object_).reshape(self._shape)
        )

    def _int(self, name: str, n: int):
        return self._pb.Tensor(name, self._np.array([n], dtype=self._np.int32).reshape(self._shape))

    def text_tensor(self, name: str, text: str):
        """A BYTES output of one string (a kv_export request's kv_handle), never kept."""
        return self._bytes(name, text)

    def input_tokens(self, n: int):
        """The per-request input_tokens tensor (pass it to `build`)."""
        return self._int("input_tokens", n)

    def output_ids(self, ids: list[int]):
        """The output_ids tensor of a response (pass it in `extra`): one id, the streaming case, is kept per id and
        thread like the texts (at most `max_texts` of them)."""
        shape = (1, -1) if len(self._shape) == 2 else (-1,)
        if len(ids) != 1 or not self._cache:
            return self._pb.Tensor("output_ids", self._np.array(ids, dtype=self._np.int32).reshape(shape))
        kept = getattr(self._local, "ids", None)
        if kept is None or len(kept) >= self._max_texts:
            kept = self._local.ids = {}
        t = kept.get(ids[0])
        if t is None:
            t = kept[ids[0]] = self._pb.Tensor("output_ids", self._np.array(ids, dtype=self._np.int32).reshape(shape))
        return t

    def build(
        self,
        text: str,
        input_tokens,
        output_tokens: int,
        finish_reason: str | None = None,
        counts: bool = True,
        extra: list = (),
    ):
        """A response with all four outputs, or with text_output alone when `counts` is false (a streamed
        response before the final one, for a request that asked for `final_counts_only`); `extra`: more tensors
        of this response (its log probabilities, launcher.python_backend.logprob_io), never kept."""
        reason = finish_reason or ""
        extra = list(extra)
        if not self._cache:
            if not counts:
                return self._pb.InferenceResponse(output_tensors=[self._bytes("text_output", text), *extra])
            return self._pb.InferenceResponse(
                output_tensors=[
                    self._bytes("text_output", text),
                    input_tokens,
                    self._int("output_tokens", output_tokens),
                    self._bytes("finish_reason", reason),
                    *extra,
                ]
            )
        texts, kept_counts, reasons = self._kept()
        t = texts.get(text)
        if t is None:
            if len(texts) >= self._max_texts:
                texts.clear()
            t = texts[text] = self._bytes("text_output", text)
        if not counts:
            return self._pb.InferenceResponse(output_tensors=[t, *extra])
        n = kept_counts.get(output_tokens)
        if n is None:
            n = self._int("output_tokens", output_tokens)
            if output_tokens <= self._max_counts:
                kept_counts[output_tokens] = n
        r = reasons.get(reason)
        if r is None:
            r = reasons[reason] = self._bytes("finish_reason", reason)
        return self._pb.InferenceResponse(output_tensors=[t, input_tokens, n, r, *extra])


def error_response(message: str):
    import triton_python_backend_utils as pb_utils

    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))


def model_parameters(model_config: dict) -> dict[str, str]:
    """`parameters { key: "x" value: { string_value: "y" } }` of config.pbtxt -> {"x": "y"} (empty values dropped)."""
    params = {}
    for key, value in (model_config.get("parameters") or {}).items():
        text = value.get("string_value", "") if isinstance(value, dict) else str(value)
        if text != "" and not text.startswith("${"):  # unrendered template placeholders count as absent
            params[key] = text
    return params
