"""Several choices and log probabilities in OpenAI's shapes, as pure functions over what the engines return.

A request becomes one contract request per choice (`n` samples of each prompt of a list; `best_of` candidates of
which the `n` most likely are answered): every engine serves them, and engines with a prefix cache compute a
prompt's keys and values once.  Log probabilities come from the contract's log_prob outputs (per token: its id and
log probability, then the top k, launcher.python_backend.logprob_io) and are shaped here as /v1/completions
(`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`) and /v1/chat/completions (`content`: token, logprob,
bytes, top_logprobs) answer them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from launcher.python_backend.logprob_io import LogProbRows

# JSON has no -inf (a token the model rules out, an empty top slot): vLLM's server answers this number instead.
FLOOR = -9999.0


def _lp(x: float) -> Optional[float]:
    if math.isnan(x):
        return None
    return max(float(x), FLOOR)


@dataclass
class Answer:
    """One choice as the engine returned it."""

    text: str = ""
    finish_reason: str = ""  # contract finish_reason
    input_tokens: int = 0
    output_tokens: int = 0
    logprobs: Optional[LogProbRows] = None  # the new tokens' (when asked)
    prompt_logprobs: Optional[LogProbRows] = None  # the prompt's (echo with logprobs)
    prompt_text: str = ""  # echo: the prompt as text

    @property
    def cumulative_logprob(self) -> float:
        return sum(r[0] for r in self.logprobs.lps) if self.logprobs is not None and len(self.logprobs) else 0.0


def best(answers: list[Answer], n: int) -> list[Answer]:
    """best_of: the n answers whose tokens are most likely together (sum of log probabilities), most likely first."""
    return sorted(answers, key=lambda a: -a.cumulative_logprob)[:n]


def completion_logprobs(
    text_of,
    rows: Optional[LogProbRows],
    prompt_rows: Optional[LogProbRows] = None,
    start: int = 0,
    context: Optional[list] = None,
) -> dict:
    """/v1/completions' `logprobs`: a list per field, the prompt's tokens first with `echo` (its first token has no
    log probability: null, as vLLM's server answers); `top_logprobs` maps each of the top tokens, and the token
    itself, to its log probability.  `text_of(id, context)`: a token's text after the answer's tokens before it
    (TokenText.in_context); `start`: the text offset of the first token; `context`: the answer's tokens so far, which
    this extends (a stream's chunks keep one list)."""
    context = [] if context is None else context
    tokens, token_lps, tops, offsets = [], [], [], []
    at = start
    for part in (prompt_rows, rows):
        if part is None:
            continue
        for ids, lps in zip(part.ids, part.lps):
            piece = text_of(ids[0], context)
            tokens.append(piece)
            own = _lp(lps[0])
            token_lps.append(own)
            if own is None:
                tops.append(None)
            else:
                top = {text_of(i, context): _lp(v) for i, v in zip(ids[1:], lps[1:])}
                top.setdefault(piece, own)
                tops.append(top)
            offsets.append(at)
            at += len(piece)
            context.append(ids[0])
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def _entry(text_of, token_id: int, lp: float, context: list) -> dict:
    piece = text_of(token_id, context)
    return {"token": piece, "logprob": _lp(lp), "bytes": list(piece.encode("utf-8"))}


def chat_logprobs(text_of, rows: Optional[LogProbRows], context: Optional[list] = None) -> dict:
    """/v1/chat/completions' `logprobs`: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}."""
    context = [] if context is None else context
    content = []
    for ids, lps in zip(rows.ids, rows.lps) if rows is not None else ():
        item = _entry(text_of, ids[0], lps[0], context)
        item["top_logprobs"] = [_entry(text_of, i, v, context) for i, v in zip(ids[1:], lps[1:])]
        content.append(item)
        context.append(ids[0])
    return {"content": content}
