"""An engine-neutral generation request: the settings every engine adapter maps onto its own types
(`SamplingParams`, with the checks that name the bad value), the prompt beside them (`GenerationRequest`), and the
error a request is refused with (`InvalidRequest`).  Pure Python: the hf engine's process and the API's tests import
it without Triton or numpy; launcher/python_backend/triton_io.py builds these from a Triton request.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from launcher.contract import GUIDE_KINDS, MAX_TOP_LOG_PROBS


class InvalidRequest(ValueError):
    """A request the model rejects; the message goes back to the client as is."""


@dataclass
class SamplingParams:
    """Engine-neutral generation settings (the contract's optional inputs, with their 'off' defaults)."""

    max_tokens: int = 16  # tokens to generate (>= 1)
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    repetition_penalty: float = 1.0  # 1.0 = off; over prompt and output tokens (HF/vLLM semantics)
    presence_penalty: float = 0.0  # 0.0 = off; over output tokens (OpenAI semantics)
    frequency_penalty: float = 0.0  # 0.0 = off; over output tokens (OpenAI semantics)
    seed: int | None = None  # per-request sampling seed; None = nondeterministic
    stop: tuple[str, ...] = ()  # stop strings: generation ends after one, which is not returned
    bad_words: tuple[str, ...] = ()  # words that must not be generated
    min_tokens: int = 0  # EOS / stop strings cannot end the request before this many tokens
    ignore_eos: bool = False  # generate exactly max_tokens
    end_id: int | None = None  # token that ends generation (default: the model's EOS tokens)
    logprobs: int | None = None  # None = off; k: each new token's log probability and the k most likely tokens'
    prompt_logprobs: int | None = None  # None = off; k: each prompt token's log probability and the top k
    guide: tuple[str, str] | None = None  # None = off; (kind of GUIDE_KINDS, guide text): the output follows it
    # tokens generated for this request on another server before it moved here (contract input continue_ids): they
    # count as generated (max_tokens, min_tokens, output_tokens), and a seeded request's draws skip past them
    continue_ids: tuple[int, ...] = ()
    # the handle of this prompt's keys and values a prefill engine computed (contract input kv_from; the hf engine's:
    # host:port of that engine, vLLM's: kv_transfer_params JSON): the engine takes them and computes only the rest;
    # where they cannot be had: the whole prompt
    kv_from: str = ""
    # the prefill of a request another engine decodes (contract input kv_export): keep the prompt's keys and values
    kv_export: bool = False

    def validate(self, max_model_len: int | None = None) -> None:
        """Raise InvalidRequest naming the first bad value."""
        _int("max_tokens", self.max_tokens)
        if self.max_tokens < 1:
            raise InvalidRequest(f"max_tokens must be >= 1, got {self.max_tokens}")
        if max_model_len is not None and self.max_tokens > max_model_len:
            raise InvalidRequest(
                f"max_tokens {self.max_tokens} exceeds the model limit of {max_model_len} tokens "
                f"(max_model_len); ask for fewer tokens"
            )
        _num("temperature", self.temperature)
        if self.temperature < 0:
            raise InvalidRequest(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        _int("top_k", self.top_k)
        if self.top_k < 0:
            raise InvalidRequest(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        _num("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequest(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")
        _num("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise InvalidRequest(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}")
        _num("presence_penalty", self.presence_penalty)
        _num("frequency_penalty", self.frequency_penalty)
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise InvalidRequest(f"{name} must be in [-2, 2] (0 = off), got {getattr(self, name)}")
        if self.seed is not None:
            _int("random_seed", self.seed)
            if self.seed < 0:
                raise InvalidRequest(f"random_seed must be >= 0, got {self.seed}")
        _int("min_length", self.min_tokens)
        if self.min_tokens < 0:
            raise InvalidRequest(f"min_length must be >= 0, got {self.min_tokens}")
        if self.end_id is not None:
            _int("end_id", self.end_id)
        for name, words in (("stop_words", self.stop), ("bad_words", self.bad_words)):
            if not all(isinstance(w, str) for w in words):
                raise InvalidRequest(f"{name} must be strings")
        for k in (self.logprobs, self.prompt_logprobs):
            if k is not None:
                _int("top_log_probs", k)
                if not 0 <= k <= MAX_TOP_LOG_PROBS:
                    raise InvalidRequest(f"top_log_probs must be in [0, {MAX_TOP_LOG_PROBS}], got {k}")
        if self.guide is not None:
            check_guide(*self.guide)
        if len(self.continue_ids) >= self.max_tokens:
            raise InvalidRequest(
                f"continue_ids holds {len(self.continue_ids)} tokens, max_tokens is {self.max_tokens}: the request "
                "has nothing left to generate; send fewer continue_ids or a larger max_tokens"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def check_guide(kind: str, guide: str) -> None:
    """Raise InvalidRequest unless (kind, guide) is a guide an engine can compile: a kind of GUIDE_KINDS, a guide
    where the kind needs one, and a JSON schema that is JSON.  Whether a regex or grammar compiles, the engine says."""
    if kind not in GUIDE_KINDS:
        raise InvalidRequest(
            f"guided_decoding_guide_type {kind!r} is not one of {sorted(GUIDE_KINDS)} "
            f"({'; '.join(f'{k}: {v}' for k, v in GUIDE_KINDS.items())})"
        )
    if kind == "json":
        if guide:
            raise InvalidRequest("guided_decoding_guide_type 'json' takes no guide; for a schema send 'json_schema'")
        return
    if not guide:
        raise InvalidRequest(f"guided_decoding_guide_type {kind!r} needs guided_decoding_guide ({GUIDE_KINDS[kind]})")
    if kind == "json_schema":
        try:
            schema = json.loads(guide)
        except ValueError as exc:
            raise InvalidRequest(f"guided_decoding_guide is not a JSON schema: it is not JSON ({exc})") from None
        if not isinstance(schema, (dict, bool)):
            raise InvalidRequest(f"guided_decoding_guide is not a JSON schema: a schema is an object, got {schema!r}")


@dataclass
class GenerationRequest:
    prompt: str | list[int]  # the decoded text_input, or input_ids
    params: SamplingParams
    stream: bool = False  # one response per new piece of text, else one response with the whole completion
    ignored: tuple[str, ...] = field(default_factory=tuple)  # optional inputs that were sent but are not honoured
    final_counts_only: bool = False  # request parameter: counts and finish_reason on the final response only
    return_token_ids: bool = False  # request parameter: output_ids on each response (the front end's migration)


def _int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an integer, got {value!r}")


def _num(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(f"{name} must be a finite number, got {value!r}")
