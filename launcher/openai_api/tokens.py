"""Token ids as text in the API process: the strings OpenAI's `logprobs` objects key tokens by, and the text of a
token-id prompt that `echo` returns.  From the served model's tokenizer folder, through `tokenizers` where the folder
has a tokenizer.json (no torch in the API process, see launcher/openai_api/chat.py), else transformers."""

from __future__ import annotations

import os
import threading

REPLACEMENT = "\ufffd"  # what decoding bytes that are not whole UTF-8 gives


class TokenText:
    """`piece(id)`: one token as text (what vLLM's server shows for it: its bytes decoded, special tokens kept);
    `decode(ids)`: a sequence of ids as text.  The tokenizer is loaded on first use."""

    def __init__(self, folder: str):
        self.folder = folder
        self._tok = None
        self._decode_many = None
        self._pieces: dict[int, str] = {}
        self._lock = threading.Lock()

    def _load(self):
        with self._lock:
            if self._tok is not None:
                return
            if not self.folder:
                raise ValueError("the API was started without the model's tokenizer folder (--tokenizer)")
            path = os.path.join(self.folder, "tokenizer.json")
            if os.path.exists(path):
                from tokenizers import Tokenizer

                tok = Tokenizer.from_file(path)
                self._decode_many = lambda ids: tok.decode(ids, skip_special_tokens=False)
            else:
                from transformers import AutoTokenizer

                tok = AutoTokenizer.from_pretrained(self.folder)
                self._decode_many = lambda ids: tok.decode(ids, skip_special_tokens=False)
            self._tok = tok

    def piece(self, token_id: int) -> str:
        text = self._pieces.get(token_id)
        if text is None:
            if self._tok is None:
                self._load()
            if len(self._pieces) > 200_000:  # a bound on what the cache holds (vocabularies reach 256k)
                self._pieces.clear()
            text = self._pieces[token_id] = self._decode_many([token_id])
        return text

    def in_context(self, token_id: int, context: list[int]) -> str:
        """The token's text after the tokens before it (`context`, the answer's own tokens, oldest first), as vLLM's
        server shows it: a token that is not whole UTF-8 alone (a byte of a character split over tokens) shows as ""
        until the token that completes the character, which shows the whole character."""
        text = self.piece(token_id)
        if not text.endswith(REPLACEMENT):
            return text
        for k in range(1, min(len(context), 4) + 1):
            ctx = list(context[-k:])
            whole = self.decode(ctx + [token_id])
            if whole.endswith(REPLACEMENT):
                continue
            clean = len(ctx)  # the context tokens before those that are pieces of the same character
            while clean > 0 and self.piece(ctx[clean - 1]).endswith(REPLACEMENT):
                clean -= 1
            prefix = self.decode(ctx[:clean]) if clean else ""
            if whole.startswith(prefix):
                return whole[len(prefix) :]
            common = 0
            while common < min(len(prefix), len(whole)) and prefix[common] == whole[common]:
                common += 1
            return whole[common:]
        return ""

    def decode(self, ids: list[int]) -> str:
        if self._tok is None:
            self._load()
        return self._decode_many(list(ids))
