"""Stand-in: sglang.srt.managers.tokenizer_manager.TokenizerManager (abort_request, context_len: the context SGLang
resolved, the model's max_position_embeddings unless ServerArgs.context_length is set, and tokenizer: the model's)."""

import re

import _standin


class Tokenizer:
    """The stand-in model's tokenizer: a word with the space before it is one token; the script's " t<i>" (and "t<i>")
    is token 100 + i, as the script numbers what it generates, any other word 1000 + its length."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list:
        words = re.findall(r" ?\S+", text)
        return [100 + int(w.strip()[1:]) if re.fullmatch(r" ?t\d+", w) else 1000 + len(w) for w in words]


class TokenizerManager:
    def __init__(self, context_len: int = 32768):
        self.context_len = context_len
        self.tokenizer = Tokenizer()
        self.rid_to_state = {}
        self.aborted = set()

    def abort_request(self, rid: str = "", abort_all: bool = False):
        if not abort_all and rid not in self.rid_to_state:
            return
        self.aborted.add(rid)
        _standin.record("sglang", "abort", request_id=rid)
