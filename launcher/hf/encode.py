"""Prompt text -> token ids for the hf engine: what `tokenizer(text).input_ids` gives, with less Python around it.

A transformers fast tokenizer's call goes through the `tokenizers` backend's `encode_batch`, even for one text,
inside ~0.1 ms of Python (argument checks, truncation and padding set-up, a BatchEncoding) that holds the GIL.  In
the engine process the thread that reads requests shares the GIL with the engine loop, whose host work per step
(scheduling, launching, collecting and sending outputs) runs in Python, and the first tokens wait for that loop.
`encode_batch` gives the GIL up while it encodes, so the loop runs meanwhile; the Python around it does not.  So
prompts go straight to the backend's `encode_batch`: the same release, without the wrapper's Python.

Not `encode`: it keeps the GIL while it encodes (0.16 ms a 128-token prompt on an H100 host, 0.45 ms beside a
busy thread), and with it the first token at 8 and 32 closed streams came 2-4 ms later than through the call.

Used only where the result is the same: a fast tokenizer whose backend has no truncation or padding set, the
special-token splitting the call would set, and the same ids as the call on probe texts (checked once, at start).
Otherwise every prompt goes through the tokenizer's call.
"""

from __future__ import annotations

# Texts the backend's ids must match the tokenizer call's on before it is used: spaces at either end, new lines,
# digits, punctuation, accents, CJK, an emoji and (added at start) the tokenizer's own special tokens inside text.
PROBES = (
    "Hello, world!",
    " leading space",
    "trailing space ",
    "two\nlines\n\n  indented",
    "12345 67.89",
    "Ünïcödé àccents, 中文字符, and an emoji 🙂",
    "a",
    "   ",
)


class PromptEncoder:
    """`encoder(text)` -> ids and `encoder.many(texts)` -> ids per text, equal to the tokenizer's call."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        # the backend, or None and why prompts go through the tokenizer's call
        self.backend, self.why_not = _checked_backend(tokenizer)

    def _usable(self):
        """The backend, if nothing set on it since the check makes the call differ (another caller's truncation)."""
        b = self.backend
        if (
            b is None
            or b.truncation is not None
            or b.padding is not None
            or b.encode_special_tokens != bool(getattr(self.tokenizer, "split_special_tokens", False))
        ):
            return None
        return b

    def __call__(self, text: str) -> list[int]:
        b = self._usable()
        if b is None:
            return self.tokenizer(text, verbose=False).input_ids  # verbose=False: the engine checks the length
        return b.encode_batch([text])[0].ids  # not encode(text): that keeps the GIL (see the module's doc)

    def many(self, texts: list[str]) -> list[list[int]]:
        b = self._usable()
        if b is None:
            return self.tokenizer(texts, verbose=False).input_ids
        return [e.ids for e in b.encode_batch(texts)]  # on several cores, the GIL given up


def _checked_backend(tokenizer):
    """(the tokenizers backend, '') when its `encode_batch` gives the tokenizer call's ids, else (None, why not)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not all(hasattr(backend, a) for a in ("encode_batch", "encode_special_tokens")):
        return None, f"{type(tokenizer).__name__} is not a fast tokenizer"
    specials = [t for t in getattr(tokenizer, "all_special_tokens", []) or [] if isinstance(t, str) and t]
    probes = list(PROBES) + [f"before {t} after" for t in specials[:8]]
    try:
        called = tokenizer(
            probes, verbose=False
        ).input_ids  # also sets the backend's truncation / padding as a call does
        if backend.truncation is not None or backend.padding is not None:
            return None, "the tokenizer truncates or pads"
        for text, ids, enc in zip(probes, called, backend.encode_batch(probes)):
            if enc.ids != list(ids):
                return None, f"the backend's ids differ from the tokenizer's call on {text!r}"
    except Exception as exc:  # noqa: BLE001 - any failure means: keep the call
        return None, f"the backend's check failed ({type(exc).__name__}: {exc})"
    return backend, ""
