"""A prompt's token blocks for `serve.routing=kv`, cut as the engines cut them, at a fraction of tokenizing it whole.

The engines key their prefix caches by token blocks, so the front end tokenizes each prompt with the model's tokenizer
(tokenizer.json through the `tokenizers` library, special tokens added as the engines add them to a text prompt).
Whole, that costs ~0.16 us a byte on a 2-core machine (1.3 ms for 8 KiB: benchmark/routing.py), on every request.
But the prompts worth routing by prefix share most of their text with earlier ones (a system prompt, a conversation's
history), so the tokens of their shared text are remembered: the text is cut into pieces at places where tokenizing
the pieces apart gives the tokens of the whole (a space between an ASCII letter or digit and an ASCII letter:
GPT-2's, Llama 3's and their kin's pre-tokenizers always start a new word there, and no token spans two words), one
piece ending in each 256-byte block of text, and each piece's tokens are remembered under the chained key of its block
(launcher.frontend.text_blocks, the `prefix` policy's keys).  A prompt then takes the remembered pieces of its
longest remembered run of blocks and tokenizes only the rest.  A tokenizer for which the pieces do not add up to the
whole (one that normalizes each text as a whole, like Llama 2's, which puts "▁" before it) is checked once as it
loads and then always tokenizes whole.  Pieces are tokenized one call each: `encode_batch` would hand them to the
tokenizer's thread pool, whose threads compete with the engines' for the host's cores.
"""

from __future__ import annotations

import os
from array import array
from collections import OrderedDict
from typing import List, Tuple

from launcher.frontend.text_blocks import BLOCK_BYTES, MAX_BLOCKS, block_keys
from launcher.kv_events import chain_keys

# the prefix routed by, as `prefix` keys it (64 KiB of text, ~16 K tokens): a new prompt that long costs ~10 ms of the
# front end's loop on a 2-core machine to tokenize; prompts that share it share the rest's fate
MAX_PROMPT_BYTES = MAX_BLOCKS * BLOCK_BYTES
# pieces remembered, least recently used out first: 16 MiB of text's tokens as 4-byte ints (English has ~4 bytes a
# token: ~16 MiB, and as much again for the memo's entries, in each front-end process)
MEMO_PIECES = 1 << 16
_CHECK = "The cat sat on the mat; then it ran 42 laps, humming a tune. Emile's cafe, 3.14!\n\nNew  line:\tend. "


def cuts(text: bytes, blocks: int, block: int = BLOCK_BYTES, first: int = 0, last: int = 0) -> List[int]:
    """For blocks `first` to `blocks`-1 of `text` (UTF-8; `last`: where block first-1's piece ended), where each
    one's piece ends: the last space in the block between an ASCII letter or digit and an ASCII letter (the piece
    before it ends there), else where the block before's ended.  A space is one byte of its own in UTF-8, so every
    piece decodes by itself."""
    out = []
    for k in range(first, blocks):
        hi = (k + 1) * block - 1  # the letter after the space is inside the block too
        at = text.rfind(b" ", last + 1, hi)
        while at > last and not (text[at - 1 : at].isalnum() and text[at + 1 : at + 2].isalpha()):
            at = text.rfind(b" ", last + 1, at)
        last = at if at > last else last
        out.append(last)
    return out


class PromptTokens:
    """The model's tokenizer with the pieces of text it tokenized before remembered."""

    def __init__(self, tokenizer_dir: str, memo_pieces: int = MEMO_PIECES):
        from tokenizers import Tokenizer

        path = os.path.join(tokenizer_dir, "tokenizer.json")
        try:
            self.tokenizer = Tokenizer.from_file(path)
        except Exception as e:
            raise SystemExit(
                f"front end: serve.routing=kv tokenizes prompts with {path}, which did not load: {e}"
            ) from None
        self.memo: "OrderedDict[int, Tuple[int, array]]" = OrderedDict()  # block key -> (its cut, piece tokens)
        self.memo_pieces = memo_pieces
        # the pieces add up for this tokenizer: a text, then a longer one that starts with it (its pieces remembered)
        first, longer = _CHECK * 6, _CHECK * 6 + "And more words follow here, " * 12
        self.pieces_add_up = all(self._remembered(t.encode()) == self.whole(t.encode()) for t in (first, longer))
        self.memo.clear()

    def whole(self, text: bytes) -> List[int]:
        return self.tokenizer.encode(text.decode("utf-8", "ignore")).ids

    def ids(self, prompt: bytes) -> List[int]:
        """The prompt's tokens; of a prompt over MAX_PROMPT_BYTES, those of its text up to the last place before
        then where a piece may end (so the tokens are the whole prompt's), else of its first MAX_PROMPT_BYTES less the
        last token, which may be a piece of one the whole text tokenizes otherwise."""
        cut = len(prompt) > MAX_PROMPT_BYTES
        if cut:
            (end,) = cuts(prompt, 1, MAX_PROMPT_BYTES + 1)
            prompt, cut = (prompt[:end], False) if end else (prompt[:MAX_PROMPT_BYTES], True)
        ids = self._remembered(prompt) if self.pieces_add_up else self.whole(prompt)
        return ids[:-1] if cut else ids

    def _remembered(self, prompt: bytes) -> List[int]:
        keys = block_keys(prompt, limit=len(prompt) // BLOCK_BYTES)
        memo, ids, start = self.memo, [], 0
        depth = 0
        for key in keys:
            hit = memo.get(key)
            if hit is None:
                break
            memo.move_to_end(key)
            start, piece = hit
            ids += piece
            depth += 1
        ends = cuts(prompt, len(keys), first=depth, last=start)
        bounds = [start, *ends, len(prompt)]
        # each piece starts at a space (one byte of its own in UTF-8): only the prompt's end may cut a character
        parts = [prompt[a:b].decode("utf-8", "ignore") for a, b in zip(bounds, bounds[1:])]
        encode = self.tokenizer.encode
        # the prompt's first piece carries the special tokens the tokenizer adds (BOS)
        encs = [
            encode(parts[0], add_special_tokens=depth == 0),
            *(encode(p, add_special_tokens=False) for p in parts[1:]),
        ]
        for key, end, enc in zip(keys[depth:], ends, encs):
            memo[key] = (end, array("i", enc.ids))
            ids += enc.ids
        ids += encs[-1].ids
        while len(memo) > self.memo_pieces:
            memo.popitem(last=False)
        return ids

    def keys(self, prompt: bytes, block_size: int) -> List[int]:
        """The chained keys of the prompt's token blocks before its last token: the engines compute a prompt's last
        token whatever they hold (its logits make the first new token), so only the blocks before it can be hits."""
        if not block_size or not prompt:
            return []
        ids = self.ids(prompt)
        return chain_keys(ids[: len(ids) - 1], block_size)
