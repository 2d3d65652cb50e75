"""Which generated tokens' text an engine has released, for a request the front end may move mid-stream
(launcher/frontend/migration.py): the runtime sends their ids as `output_ids` with the response that carries their
text, so a moved request goes on after exactly the tokens whose text its client has.

vLLM's detokenizer (and tokenizers' DecodeStream, which it runs) releases the text of new tokens once the decoded
text does not end in U+FFFD, the mark of a character whose bytes have not all come: a token that is the first bytes
of a character waits for the token that completes it.  `Settle` applies the same rule to the ids, so the ids it
settles are those whose text is out.  A token that decodes whole on its own (nearly all of them: its answer is
kept per id) settles at once where none is waiting; otherwise the waiting ones are decoded together."""

from __future__ import annotations

from typing import Dict, List, Sequence

REPLACEMENT = "\ufffd"


class Settle:
    """One request's waiting ids; `whole` (id -> it decodes whole on its own) is shared by a model's requests."""

    __slots__ = ("tokenizer", "whole", "waiting")

    def __init__(self, tokenizer, whole: Dict[int, bool]):
        self.tokenizer = tokenizer
        self.whole = whole
        self.waiting: List[int] = []

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def feed(self, ids: Sequence[int]) -> List[int]:
        """The engine made `ids` (in order): those of them, and of the ones waiting, whose text is out now."""
        out: List[int] = []
        whole, waiting = self.whole, self.waiting
        for i in ids:
            if not waiting:
                ok = whole.get(i)
                if ok is None:
                    ok = whole[i] = not self._decode((i,)).endswith(REPLACEMENT)
                if ok:
                    out.append(i)
                    continue
            waiting.append(i)
            if not self._decode(waiting).endswith(REPLACEMENT):
                out += waiting
                waiting.clear()
        return out
