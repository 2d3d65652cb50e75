"""One request inside the hf engine (`Seq`: its tokens, sampling state, slot and KV-cache blocks), and what a
request goes through before it becomes one: validation and tokenization (`prepare_prompt`), bad words as token ids
(`bad_word_ids`)."""

from __future__ import annotations

import os
import random
import time
from typing import Callable

from launcher.hf.detok import StopMatcher
from launcher.python_backend.generation import InvalidRequest, SamplingParams
from launcher.python_backend.logprob_io import LogProbRows


class Seq:
    """One request's state: the scheduler moves it through waiting, prefilling and decoding; output
    processing (launcher.hf.outputs) turns its tokens into outputs."""

    __slots__ = (
        "request_id",
        "prompt_ids",
        "out_ids",
        "params",
        "on_output",
        "slot",
        "num_computed",
        "decoder",
        "stopper",
        "rng",
        "eos",
        "max_tokens",
        "min_tokens",
        "bad",
        "penalties",
        "prefill_started",
        "added",
        "prefill_ids",
        "blocks",
        "keys",
        "decoding",
        "admitted",
        "cached_tokens",
        "prompt_lp",
        "matcher",
        "continued",
        "settled",
        "held_text",
    )

    def __init__(self, request_id, prompt_ids, params: SamplingParams, on_output, decoder, eos, bad, matcher=None):
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        # a request moved here mid-generation (params.continue_ids) goes on after what it generated elsewhere
        self.out_ids: list[int] = list(params.continue_ids)
        self.continued = len(params.continue_ids)  # of out_ids, those generated elsewhere
        self.settled = 0  # of the tokens generated here, those whose text is out (launcher.hf.outputs.Output)
        self.held_text = ""  # text waiting for the tokens after it to settle (launcher.hf.outputs.OutputProcessor)
        self.params = params
        self.on_output = on_output
        self.slot = -1
        self.num_computed = 0  # tokens whose keys/values are in the cache
        self.decoder = decoder
        self.stopper = StopMatcher(params.stop) if params.stop else None
        self.rng = random.Random(params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little"))
        if params.temperature > 0:  # a sampled token takes one draw (launcher.hf.scheduler): skip the continued ones'
            for _ in params.continue_ids:
                self.rng.random()
        self.eos = eos  # frozenset of token ids that end the request (empty with ignore_eos)
        self.max_tokens = params.max_tokens
        self.min_tokens = params.min_tokens
        self.bad = bad  # list of token-id sequences that must not be generated
        self.penalties = (
            params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
        )
        self.prefill_started = False
        self.added = time.monotonic()  # when add_request queued it (EngineStats.queued_s, to_first_token_s)
        # what it prefills: the prompt, and after a preemption or a move what it generated too
        self.prefill_ids = prompt_ids + self.out_ids if self.out_ids else prompt_ids
        self.blocks: list[int] = []  # its KV-cache blocks, in order (its block table)
        self.keys: list[int] = []  # the prefix-cache keys of its full blocks so far (launcher.hf.blocks)
        self.decoding = False  # its prefill is done: it decodes a token a step
        self.admitted = 0  # the order it was admitted in (the last admitted is preempted first)
        self.cached_tokens = 0  # prompt tokens its admission found in the prefix cache
        # its prompt's log probabilities as its prefill computes them, until its first output carries them (then None)
        self.prompt_lp = self.fresh_prompt_lp() if params.prompt_logprobs is not None else None
        self.matcher = matcher  # a guided request's xgrammar matcher (launcher.hf.guided), None for free text

    def fresh_prompt_lp(self) -> LogProbRows:
        """The prompt's first token has no log probability (nothing comes before it): its row is its id and NaN."""
        return LogProbRows([[self.prompt_ids[0]]], [[float("nan")]])

    @property
    def needs_last_token(self) -> bool:
        """Its next token's sampling depends on its last token on the host (bad words, a guide): its next step
        cannot be queued before the last one's token is known."""
        return bool(self.bad) or self.matcher is not None

    def token_at(self, position: int) -> int:
        """The token at `position` of its prompt and what it generated."""
        n = len(self.prompt_ids)
        return self.prompt_ids[position] if position < n else self.out_ids[position - n]


def prepare_prompt(
    encode: Callable[[str], list[int]],
    prompt: str | list[int],
    params: SamplingParams,
    max_model_len: int,
    vocab_size: int,
) -> list[int]:
    """Validate a request and tokenize its prompt (`encode`: text -> ids, a PromptEncoder); raises InvalidRequest
    naming the problem and the fix."""
    params.validate(max_model_len)
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequest("the prompt is empty")
        prompt_ids = encode(prompt)
    else:
        prompt_ids = [int(t) for t in prompt]
        if any(not 0 <= t < vocab_size for t in prompt_ids):
            raise InvalidRequest(f"prompt token ids must be in [0, {vocab_size})")
    n = len(prompt_ids)
    if n == 0:
        raise InvalidRequest("the prompt is empty")
    if n + params.max_tokens > max_model_len:
        raise InvalidRequest(
            f"the prompt ({n} tokens) plus max_tokens ({params.max_tokens}) exceeds the model context of "
            f"{max_model_len} tokens; shorten the prompt or lower max_tokens"
        )
    if any(not 0 <= t < vocab_size for t in params.continue_ids):
        raise InvalidRequest(f"continue_ids must be in [0, {vocab_size})")
    if params.continue_ids and params.prompt_logprobs is not None:
        raise InvalidRequest(
            "return_prompt_log_probs with continue_ids: the prompt's log probabilities came with the request's first "
            "response, before it moved; leave return_prompt_log_probs out"
        )
    if params.end_id is not None and not 0 <= params.end_id < vocab_size:
        raise InvalidRequest(f"end_id {params.end_id} is outside the vocabulary [0, {vocab_size})")
    return prompt_ids


def bad_word_ids(tokenizer, words) -> list[list[int]]:
    """The token-id sequences a request's bad words may appear as (each word alone and after a space)."""
    out = []
    for word in words:
        for variant in (word, " " + word):
            ids = tokenizer(variant, add_special_tokens=False).input_ids
            if ids and ids not in out:
                out.append(ids)
    return out


def eos_token_ids(model_path: str, config, tokenizer) -> frozenset:
    """The ids that end a generation: those the model's generation config, its config and its tokenizer name."""
    from transformers import GenerationConfig

    eos: set[int] = set()
    try:
        gen_eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:
        gen_eos = None
    for value in (gen_eos, config.eos_token_id, tokenizer.eos_token_id):
        if isinstance(value, int):
            eos.add(value)
        elif value:
            eos.update(int(v) for v in value)
    return frozenset(eos)
