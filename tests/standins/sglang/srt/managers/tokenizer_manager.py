"""Stand-in: sglang.srt.managers.tokenizer_manager.TokenizerManager (abort_request only)."""

import _standin


class TokenizerManager:
    def __init__(self):
        self.rid_to_state = {}
        self.aborted = set()

    def abort_request(self, rid: str = "", abort_all: bool = False):
        if not abort_all and rid not in self.rid_to_state:
            return
        self.aborted.add(rid)
        _standin.record("sglang", "abort", request_id=rid)
