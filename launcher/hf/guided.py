"""Structured output in the hf engine: a request's guide (launcher.contract.GUIDE_KINDS) compiled by xgrammar.

A guided request holds a `xgrammar.GrammarMatcher`.  Before each of its tokens the matcher fills the request's row of
a bitmask over the vocabulary (bit i of word i // 32: token i may come next); the sampler sets every other token's
logit to -inf (launcher.hf.sampling), so greedy and sampled tokens alike keep to the guide.  After the token the
matcher takes it; once the guide is complete only a stop token is allowed, and taking it ends the request ("stop").
The mask needs the request's last token on the host, so the scheduler does not queue a guided row's next step
before its last one's token is known (as for bad words).

Compiling runs on the caller's thread (add_request), not on the engine loop; xgrammar's compiler caches grammars, so
a schema sent again is not compiled again.  Whitespace in JSON is xgrammar's default (any), as vLLM compiles it.
"""

from __future__ import annotations

import os
import threading

from launcher.python_backend.generation import InvalidRequest


class Guides:
    """The engine's grammar compiler (made on the first guided request) and what it makes: one matcher a request."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids):
        """tokenizer: the served model's (a transformers tokenizer); vocab_size: the width of the model's logits (may
        exceed the tokenizer's: those ids are never allowed); stop_ids: the tokens that end a complete output."""
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._stop_ids = sorted(stop_ids)
        self._compiler = None
        self._lock = threading.Lock()

    def _compiler_(self):
        with self._lock:
            if self._compiler is None:
                try:
                    import xgrammar as xgr
                except ImportError as exc:
                    raise InvalidRequest(
                        f"guided_decoding_guide: the hf engine constrains output with xgrammar, which is not installed "
                        f"here ({exc}); install llmlaunch's `engine` extra"
                    ) from None
                info = xgr.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self.vocab_size, stop_token_ids=self._stop_ids or None
                )
                self._compiler = xgr.GrammarCompiler(info)
            return self._compiler

    def matcher(self, kind: str, guide: str, stop_ids=None):
        """A fresh matcher for the guide; InvalidRequest naming the guide when xgrammar cannot compile it.
        stop_ids: the request's own stop tokens (end_id), where it has them."""
        import xgrammar as xgr

        compiler = self._compiler_()
        try:
            if kind in ("json", "json_schema"):  # json: any JSON object, as vLLM's json_object compiles it
                compiled = compiler.compile_json_schema(guide if kind == "json_schema" else '{"type": "object"}')
            elif kind == "regex":
                compiled = compiler.compile_regex(guide)
            else:  # ebnf_grammar (triton_io.check_guide let nothing else through)
                compiled = compiler.compile_grammar(guide)
        except Exception as exc:  # xgrammar raises RuntimeError / ValueError subclasses with the parser's message
            raise InvalidRequest(f"guided_decoding_guide ({kind}) does not compile: {exc}") from None
        return xgr.GrammarMatcher(compiled, override_stop_tokens=sorted(stop_ids) if stop_ids else None)


_batch = None  # xgrammar's thread pool for several rows' masks, made on first use


def masks(matchers, vocab_size: int) -> bytes:
    """The bitmask rows of `matchers` (int32 words, row after row) for their next token.

    Several rows are filled on xgrammar's threads (the GIL released).  A row's mask costs microseconds where
    xgrammar has cached its grammar state but milliseconds inside a schema's strings: with SmolLM2's 49k tokens and
    a 5-field record, 0.3-13 ms a token there, 65 ms an answer, on one core.  At 16 guided rows, filled one after
    another, that was 14 ms a step on this machine's two cores; on two threads 8.8 ms."""
    global _batch
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(len(matchers), vocab_size)
    if len(matchers) == 1:
        matchers[0].fill_next_token_bitmask(bitmask, 0)
    else:
        if _batch is None:
            # half the cores this process may use (the engine loop and tritonserver have the rest), at least two
            _batch = xgr.BatchGrammarMatcher(max_threads=min(8, max(2, len(os.sched_getaffinity(0)) // 2)))
        _batch.batch_fill_next_token_bitmask(matchers, bitmask)
    return bitmask.numpy().tobytes()


def apply_masks(logits, rows: list[int], masks: bytes) -> None:
    """Set to -inf, in place, the logits of `rows` whose bit in their mask row is 0."""
    import torch

    dev, vocab = logits.device, logits.shape[-1]
    words = torch.frombuffer(bytearray(masks), dtype=torch.int32).view(len(rows), -1).to(dev, non_blocking=True)
    bits = (words.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32, device=dev)) & 1
    allowed = bits.view(len(rows), -1)[:, :vocab].bool()
    index = torch.tensor(rows, dtype=torch.long, device=dev)
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))
