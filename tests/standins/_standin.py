"""What the stand-in engine packages (vllm, sglang, lmdeploy beside this file) share.

They are not engines: each exposes the import paths, class and method names and async
generator shapes of the real package's public API that llmlaunch's model.py uses, and
"generates" a deterministic script so tests can check streaming order, cancellation,
errors and shutdown through a real tritonserver.

The script for a prompt of W words: token i (0-based) has id 100+i and text " t<i>";
after W tokens the model "samples" EOS (id 2) unless ignore_eos is set or fewer than
min_tokens were generated; a stop string ends the request before it (not returned);
max_tokens ends it with "length". A prompt containing FAIL_AT_<k> raises
RuntimeError("stand-in engine failure at token k") when token k would be produced.  A prompt of token ids that ends
in 100, 101, ..., 100+k-1 (tokens of its own script, generated elsewhere) is a request that goes on after them: its
words are the ids before those, and it makes token k next.
Each token takes $LLMLAUNCH_STANDIN_DELAY_S seconds (default 0.01).

Every call the tests care about is appended as one JSON line to the file named by
$LLMLAUNCH_STANDIN_LOG: {"engine": ..., "event": "init" | "generate" | "abort" |
"shutdown" | ..., ...}.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from typing import AsyncIterator, Iterable, Optional, Tuple

EOS_ID = 2


def record(engine: str, event: str, **data) -> None:
    path = os.environ.get("LLMLAUNCH_STANDIN_LOG")
    if not path:
        return
    line = json.dumps(
        {"engine": engine, "event": event, "pid": os.getpid(), "time": time.time(), **data}, default=str, sort_keys=True
    )
    with open(path, "a") as f:
        f.write(line + "\n")


def delay() -> float:
    return float(os.environ.get("LLMLAUNCH_STANDIN_DELAY_S", "0.01"))


def prompt_ids(prompt):
    if isinstance(prompt, dict):
        return list(prompt["prompt_token_ids"])
    return [10 + i for i, _ in enumerate(prompt.split())]


def continued(prompt) -> Tuple[str, int]:
    """(the prompt as words, the script's tokens it already holds): a prompt of token ids ending in 100, 101, ...,
    100+k-1 goes on after those k."""
    if not isinstance(prompt, dict):
        return prompt, 0
    ids = list(prompt["prompt_token_ids"])
    k = next(k for k in range(len(ids), -1, -1) if ids[len(ids) - k :] == list(range(100, 100 + k)))
    return " ".join(f"w{i}" for i in ids[: len(ids) - k]), k


CACHE_BLOCK = 4  # words (the stand-ins' tokens) a block of the stand-in's prefix cache
# the prompts this process's stand-in engine prefilled, as the chained keys of their whole blocks (its cache: never
# evicted); keys, not a list of prompts, so a lookup costs one prompt's blocks however many came before
_prefilled: set = set()


def _block_keys(words: list, blocks: int) -> list:
    """The keys of the first `blocks` whole blocks of `words`, each naming its block and every block before it."""
    keys, key = [], None
    for b in range(blocks):
        key = hash((key, tuple(words[b * CACHE_BLOCK : (b + 1) * CACHE_BLOCK])))
        keys.append(key)
    return keys


def cached_tokens(prompt: str) -> int:
    """The prompt tokens a prefix cache serves: the leading words it shares with a prompt prefilled before, in whole
    blocks of CACHE_BLOCK, as the engines cache whole blocks; at least the last token is computed again."""
    words = prompt.split()
    keys = _block_keys(words, len(words) // CACHE_BLOCK)
    usable = max(0, len(words) - 1) // CACHE_BLOCK  # blocks that leave the last token to compute
    hit = 0
    while hit < usable and keys[hit] in _prefilled:
        hit += 1
    _prefilled.update(keys)
    return hit * CACHE_BLOCK


async def script(
    prompt: str,
    max_tokens: int,
    min_tokens: int = 0,
    ignore_eos: bool = False,
    stop: Iterable[str] = (),
    cancelled=lambda: False,
    start: int = 0,
) -> AsyncIterator[Tuple[str, int, Optional[str]]]:
    """Yield (new text, new token id or None, finish reason or None), one token at a time, from token `start` on (a
    request that holds the first `start` already: max_tokens and min_tokens count only those made here)."""
    words = max(1, len(prompt.split()))
    fail = re.search(r"FAIL_AT_(\d+)", prompt)
    stops = [s for s in stop if s]
    text = ""
    for i in range(start, start + max_tokens):
        await asyncio.sleep(delay())
        if cancelled():
            return
        if fail and i == int(fail.group(1)):
            raise RuntimeError(f"stand-in engine failure at token {i}")
        if i >= words and not ignore_eos and i - start >= min_tokens:
            yield "", None, "stop"  # EOS: not part of the text
            return
        piece = f" t{i}"
        new_text = text + piece
        hit = min((new_text.find(s) for s in stops if s in new_text), default=-1)
        if hit >= 0:
            yield new_text[len(text) : hit] if hit > len(text) else "", 100 + i, "stop"
            return
        text = new_text
        last = i == start + max_tokens - 1
        yield piece, 100 + i, "length" if last else None
