"""Stand-in: sglang.srt.managers.tokenizer_manager.TokenizerManager (abort_request, and context_len: the context SGLang
resolved, the model's max_position_embeddings unless ServerArgs.context_length is set)."""

import _standin


class TokenizerManager:
    def __init__(self, context_len: int = 32768):
        self.context_len = context_len
        self.rid_to_state = {}
        self.aborted = set()

    def abort_request(self, rid: str = "", abort_all: bool = False):
        if not abort_all and rid not in self.rid_to_state:
            return
        self.aborted.add(rid)
        _standin.record("sglang", "abort", request_id=rid)
