"""OpenAI's request and response bodies <-> llmlaunch's request contract (launcher/contract.py), as pure functions.

`completion_generation` and `chat_generation` turn a /v1/completions or /v1/chat/completions body into a
launcher.client.request.Generation (the contract's inputs) or raise ApiError naming the field; the `*_chunk` and
`*_body` functions build what goes back.  No I/O here: launcher/openai_api/app.py serves these, and tests/unit checks
them without a server.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace
from typing import Callable, Optional

from launcher.client.request import Generation
from launcher.contract import MAX_TOP_LOG_PROBS
from launcher.error_kinds import OVERLOAD, REQUEST, UNAVAILABLE, error_kind
from launcher.openai_api.errors import ApiError, bad
from launcher.openai_api.structured import guide_of

# /v1/completions without max_tokens: OpenAI's documented default for that endpoint.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
# /v1/chat/completions without max_tokens/max_completion_tokens: OpenAI generates to the context's end; the contract
# needs a number, and an answer of this many tokens fits every model llmlaunch serves.
CHAT_DEFAULT_MAX_TOKENS = 512


# ----------------------------------------------------------------------------- reading fields
def _number(body: dict, name: str, lo: float, hi: float, lo_open: bool = False) -> Optional[float]:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(name, f"must be a number, got {v!r}")
    if v < lo or v > hi or (lo_open and v == lo):
        raise bad(name, f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v!r}")
    return float(v)


def _integer(body: dict, name: str, lo: int, hi: int = 2**63 - 1) -> Optional[int]:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(name, f"must be a whole number, got {v!r}")
    if not lo <= v <= hi:
        raise bad(name, f"must be in [{lo}, {hi}], got {v!r}")
    return v


def _flag(body: dict, name: str) -> Optional[bool]:
    v = body.get(name)
    if v is not None and not isinstance(v, bool):
        raise bad(name, f"must be true or false, got {v!r}")
    return v


def _refuse(body: dict, name: str, allowed: Callable[[object], bool], why: str) -> None:
    v = body.get(name)
    if v is not None and not allowed(v):
        raise ApiError(400, f"{name}={v!r} is not supported: {why}", param=name, code="unsupported_value")


@dataclass(frozen=True)
class Options:
    """What a request asks of the response, beside the generation itself."""

    model: str  # the model name the request used (echoed back)
    stream: bool  # SSE chunks, else one JSON body
    include_usage: bool  # streaming: a last chunk carrying `usage`
    n: int = 1  # choices per prompt
    best_of: int = 1  # completions: candidates per prompt, of which the n most likely are answered
    echo: bool = False  # completions: the prompt before each choice's text (and its log probabilities)
    logprobs: Optional[int] = None  # log probabilities of the answer's tokens, with this many top tokens each
    prompts: tuple = ()  # completions: every prompt (text, or a tuple of token ids); choice i*n+j answers prompt i

    @property
    def plain(self) -> bool:
        """One choice of one prompt, nothing but text: the stream's fast path (launcher/openai_api/app.py)."""
        return self.n == 1 and self.best_of == 1 and len(self.prompts) <= 1 and not self.echo and self.logprobs is None


# The most choices one request may ask for (prompts x best_of): each is a request to the engine.
MAX_CHOICES = 256


def check_model(body: dict, served: tuple) -> str:
    """The request's `model`: one of `served` (the names this server answers to), else 404."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", f"must name the served model ({served[0]!r}; GET /v1/models lists it)")
    if model not in served:
        raise ApiError(
            404,
            f"The model {model!r} does not exist: this server serves {served[0]!r}",
            param="model",
            code="model_not_found",
        )
    return model


def _common(body: dict, served: tuple, prompt: str, default_max: int, chat: bool) -> tuple:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_body")
    model = check_model(body, served)
    stream = bool(_flag(body, "stream"))
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise bad("stream_options", f'must be an object like {{"include_usage": true}}, got {so!r}')
    include_usage = bool((so or {}).get("include_usage")) and stream
    n = _integer(body, "n", 1, MAX_CHOICES) or 1
    best_of = n
    echo = False
    if chat:
        _refuse(body, "best_of", lambda v: v == 1, "best_of is a /v1/completions field; send n")
        logprobs = _flag(body, "logprobs")
        top = _integer(body, "top_logprobs", 0, MAX_TOP_LOG_PROBS)
        if top is not None and not logprobs:
            raise bad("top_logprobs", "needs logprobs: true")
        logprobs = (top or 0) if logprobs else None
    else:
        best_of = _integer(body, "best_of", 1, MAX_CHOICES) or n
        if best_of < n:
            raise bad("best_of", f"must be >= n ({n}), got {best_of}")
        if best_of > n and stream:
            raise bad("best_of", "cannot stream: the best candidates are known only when all have ended")
        echo = bool(_flag(body, "echo"))
        logprobs = _integer(body, "logprobs", 0, MAX_TOP_LOG_PROBS)
    _refuse(body, "suffix", lambda v: v == "", "insertion (suffix) is not served")
    _refuse(body, "logit_bias", lambda v: v == {}, "the engines take no per-token bias")
    _refuse(body, "use_beam_search", lambda v: v is False, "beam search is not served")
    if chat:
        _refuse(body, "tools", lambda v: v == [], "tool calls are not served")
    mt = _integer(body, "max_completion_tokens", 1) if chat else None
    if mt is None:
        mt = _integer(body, "max_tokens", 1)
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,) if stop else ()
    elif isinstance(stop, list) and all(isinstance(s, str) and s for s in stop):
        stop = tuple(stop)
    else:
        raise bad("stop", f"must be a string or a list of non-empty strings, got {stop!r}")
    top_k = _integer(body, "top_k", -1)
    gen = Generation(
        prompt=prompt,
        max_tokens=mt if mt is not None else default_max,
        stream=True,  # the server streams from the engine either way; non-streaming requests are joined here
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 0.0, 1.0, lo_open=True),
        top_k=None if top_k is None else max(top_k, 0),  # vLLM's -1 (off) is the contract's 0
        seed=_integer(body, "seed", 0, 2**64 - 1),
        stop=stop,
        min_tokens=_integer(body, "min_tokens", 0),
        ignore_eos=_flag(body, "ignore_eos"),
        repetition_penalty=_number(body, "repetition_penalty", 0.0, 2.0**31, lo_open=True),
        presence_penalty=_number(body, "presence_penalty", -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0),
    )
    gen.guide = guide_of(body)
    if best_of > n and logprobs is None:
        gen.logprobs = 0  # the candidates are ranked by their tokens' log probabilities
    elif logprobs is not None:
        gen.logprobs = logprobs
    if echo and logprobs is not None:
        gen.prompt_logprobs = logprobs
    return gen, Options(model, stream, include_usage, n, best_of, echo, logprobs)


def _prompts(prompt) -> tuple:
    """/v1/completions' prompt: a string, a list of strings, token ids, or a list of token-id lists."""
    if isinstance(prompt, str):
        return (prompt,)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return (tuple(prompt),)
        if all(isinstance(p, str) for p in prompt):
            return tuple(prompt)
        if all(isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p) for p in prompt):
            return tuple(tuple(p) for p in prompt)
    raise bad("prompt", "must be a string, a list of strings, a list of token ids, or a list of token-id lists")


def completion_generation(body: dict, served: tuple) -> tuple:
    """A /v1/completions body -> (Generation of its first prompt, Options with every prompt); ApiError naming the
    field otherwise.  `choice_generations` makes the request of every choice."""
    prompts = _prompts(body.get("prompt") if isinstance(body, dict) else None)
    for p in prompts:
        if not p:
            raise bad("prompt", "must not be empty")
        if not isinstance(p, str) and min(p) < 0:
            raise bad("prompt", f"token ids are >= 0, got {min(p)}")
    first = prompts[0] if isinstance(prompts[0], str) else list(prompts[0])
    gen, opts = _common(body, served, first, COMPLETIONS_DEFAULT_MAX_TOKENS, chat=False)
    if len(prompts) * opts.best_of > MAX_CHOICES:
        raise bad(
            "prompt", f"{len(prompts)} prompts x best_of/n {opts.best_of} exceeds {MAX_CHOICES} choices a request"
        )
    return gen, replace(opts, prompts=prompts)


def choice_generations(gen: Generation, opts: Options) -> list:
    """The contract request of every candidate, prompt by prompt (best_of of each, n where best_of is not asked).  A
    seeded request's candidates take seed, seed + 1, ...: the same seed would sample the same answer best_of times."""
    out = []
    for prompt in opts.prompts or (gen.prompt,):
        for j in range(opts.best_of):
            seed = None if gen.seed is None else (gen.seed + j) % 2**64
            p = prompt if isinstance(prompt, str) else list(prompt)
            out.append(replace(gen, prompt=p, seed=seed))
    return out


def chat_messages(body: dict) -> list:
    """The request's messages as [{"role", "content": str}] (text parts joined), checked."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages:
        raise bad("messages", 'must be a non-empty list of {"role", "content"} objects')
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(where, 'must be an object with a string "role"')
        content = m.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            parts = []
            for j, p in enumerate(content):
                if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                    raise ApiError(
                        400,
                        f'{where}.content[{j}]: only text parts ({{"type": "text", "text": ...}}) are served',
                        param=f"{where}.content",
                        code="unsupported_value",
                    )
                parts.append(p["text"])
            content = "".join(parts)
        elif not isinstance(content, str):
            raise bad(f"{where}.content", f"must be a string or a list of text parts, got {content!r}")
        out.append({"role": m["role"], "content": content})
    return out


def chat_generation(body: dict, served: tuple, render_prompt: Callable[[list], str]) -> tuple:
    """A /v1/chat/completions body -> (Generation, Options).  `render_prompt(messages)` applies the model's chat
    template (it raises ApiError when the model has none)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_body")
    check_model(body, served)
    messages = chat_messages(body)
    return _common(body, served, render_prompt(messages), CHAT_DEFAULT_MAX_TOKENS, chat=True)


# ----------------------------------------------------------------------------- responses
def finish_reason(contract_reason: str) -> str:
    """The contract's finish_reason ('length', 'stop', 'cancelled', '') in OpenAI's terms."""
    return "length" if contract_reason == "length" else "stop"


def usage(prompt_tokens: Optional[int], completion_tokens: Optional[int]) -> dict:
    p, c = int(prompt_tokens or 0), int(completion_tokens or 0)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def completion_chunk(rid: str, created: int, model: str, text: str, reason: Optional[str], with_usage: bool) -> dict:
    out = {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}],
    }
    if with_usage:
        out["usage"] = None
    return out


def chat_chunk(rid: str, created: int, model: str, delta: dict, reason: Optional[str], with_usage: bool) -> dict:
    out = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}],
    }
    if with_usage:
        out["usage"] = None
    return out


def usage_chunk(rid: str, created: int, model: str, chat: bool, counts: dict) -> dict:
    """The last chunk of a stream with stream_options.include_usage: no choices, the usage."""
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [],
        "usage": counts,
    }


def completion_body(rid: str, model: str, text: str, reason: str, counts: dict) -> dict:
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}],
        "usage": counts,
    }


def chat_body(rid: str, model: str, text: str, reason: str, counts: dict) -> dict:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": reason}
        ],
        "usage": counts,
    }


def models_body(served: str, created: int) -> dict:
    return {"object": "list", "data": [{"id": served, "object": "model", "created": created, "owned_by": "llmlaunch"}]}


# ----------------------------------------------------------------------------- engine errors
def engine_error(message: str, grpc_code: str = "") -> ApiError:
    """An error from the gRPC side as the API answers it (launcher/error_kinds.py): the request's fault 400, overload
    429, the backend not reachable or not ready 503, anything else 500."""
    kind = error_kind(message, grpc_code)
    if kind == OVERLOAD:
        return ApiError(429, f"the server is overloaded, retry later: {message}", code="overloaded")
    if kind == UNAVAILABLE:
        return ApiError(503, f"the model server is not reachable or not ready: {message}", code="unavailable")
    if kind == REQUEST:
        return ApiError(400, message, code="invalid_value")
    return ApiError(500, f"the engine failed this request: {message}", code="engine_error")


# ----------------------------------------------------------------------------- the other way (clients)
# Generation fields sent as OpenAI fields (same name on both sides but for seed/min_tokens, which vLLM names so too).
_BODY_FIELDS = (
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("top_k", "top_k"),
    ("seed", "seed"),
    ("min_tokens", "min_tokens"),
    ("ignore_eos", "ignore_eos"),
    ("repetition_penalty", "repetition_penalty"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
)


def request_body(gen: Generation, model: str, chat: bool) -> dict:
    """A Generation as an OpenAI request body (what llmlaunch-bench's OpenAI backends send): the inverse of
    completion_generation / chat_generation.  Streaming asks for the usage chunk, so token counts are the server's."""
    body = {"model": model, "max_tokens": gen.max_tokens, "stream": bool(gen.stream)}
    if chat:
        body["messages"] = [{"role": "user", "content": gen.prompt}]
    else:
        body["prompt"] = gen.prompt
    if gen.stream:
        body["stream_options"] = {"include_usage": True}
    for attr, key in _BODY_FIELDS:
        value = getattr(gen, attr)
        if value is not None:
            body[key] = value
    if gen.stop:
        body["stop"] = list(gen.stop)
    return body
