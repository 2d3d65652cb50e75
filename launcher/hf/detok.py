"""Incremental detokenization and stop strings for the `hf` engine.

Decoding the whole sequence after every token costs O(n) per token; both
decoders here do O(1) work per token and produce exactly the text of
`tokenizer.decode(all_new_ids, skip_special_tokens=True)` (for byte-level BPE;
see `WindowDecoder` for the others) when their pieces are concatenated.

* `ByteLevelDecoder` (GPT-2 / Llama 3 / Qwen style tokenizers): each token id maps
  to a fixed byte string; bytes go through an incremental UTF-8 decoder, which
  holds back an incomplete multi-byte character until its last byte arrives and
  replaces invalid bytes exactly as a whole-string lossy decode would.
* `WindowDecoder` (any other tokenizer, e.g. SentencePiece with byte fallback):
  decodes a small window of recent tokens twice and emits the difference, as
  vLLM and TGI do; text ending in U+FFFD (an incomplete character) is held back.
"""

from __future__ import annotations

import codecs


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used by ByteLevel pre-tokenizers."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _decoder_types(tokenizer) -> list[str]:
    import json

    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is None or backend.decoder is None:
        return []
    spec = json.loads(backend.to_str()).get("decoder") or {}
    if spec.get("type") == "Sequence":
        return [d.get("type") for d in spec.get("decoders", [])]
    return [spec.get("type")]


class TokenTable:
    """Per-tokenizer data shared by all requests (built once by the engine)."""

    def __init__(self, tokenizer, force_window: bool = False):
        self.tokenizer = tokenizer
        self.special_ids = frozenset(tokenizer.all_special_ids)
        self.byte_table: list[bytes] | None = None
        if not force_window and _decoder_types(tokenizer) == ["ByteLevel"]:
            self.byte_table = self._build_byte_table(tokenizer)

    def _build_byte_table(self, tokenizer) -> list[bytes] | None:
        inverse = {c: b for b, c in bytes_to_unicode().items()}
        vocab = tokenizer.get_vocab()
        size = max(max(vocab.values()) + 1, len(tokenizer))
        table = [b""] * size
        added = {
            t.content if hasattr(t, "content") else str(t)
            for t in getattr(tokenizer, "added_tokens_decoder", {}).values()
        }
        for piece, idx in vocab.items():
            if idx in self.special_ids:
                continue  # skip_special_tokens=True
            if piece in added:
                table[idx] = piece.encode("utf-8")  # added tokens decode to their content
                continue
            try:
                table[idx] = bytes(inverse[ch] for ch in piece)
            except KeyError:
                return None  # not a pure byte-level vocabulary: use the window decoder
        return table

    def decoder(self, prompt_ids: list[int]):
        if self.byte_table is not None:
            return ByteLevelDecoder(self.byte_table)
        return WindowDecoder(self.tokenizer, prompt_ids, self.special_ids)


class ByteLevelDecoder:
    __slots__ = ("_table", "_utf8")

    def __init__(self, table: list[bytes]):
        self._table = table
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def push(self, token_id: int) -> str:
        table = self._table
        return self._utf8.decode(table[token_id] if 0 <= token_id < len(table) else b"")

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)

    @property
    def holds(self) -> bool:
        """Bytes of a character not complete yet are held back."""
        return bool(self._utf8.getstate()[0])


class WindowDecoder:
    """vLLM-style: keep `prefix_offset`/`read_offset` into the id list and decode only the tail window."""

    __slots__ = ("_tok", "_ids", "_prefix", "_read", "_special")

    def __init__(self, tokenizer, prompt_ids: list[int], special_ids=frozenset(), context: int = 5):
        self._tok = tokenizer
        # a few prompt tokens give the decoder context (leading-space handling of SentencePiece)
        ctx = [t for t in prompt_ids[-context:] if t not in special_ids]
        self._ids = list(ctx)
        self._prefix = 0
        self._read = len(ctx)
        self._special = special_ids

    def push(self, token_id: int) -> str:
        if token_id in self._special:
            return ""
        self._ids.append(token_id)
        decode = self._tok.decode
        prefix_text = decode(
            self._ids[self._prefix : self._read], skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        new_text = decode(self._ids[self._prefix :], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text) :]
            self._prefix = self._read
            self._read = len(self._ids)
            return delta
        return ""

    def flush(self) -> str:
        if self._read >= len(self._ids):
            return ""
        decode = self._tok.decode
        prefix_text = decode(
            self._ids[self._prefix : self._read], skip_special_tokens=True, clean_up_tokenization_spaces=False
        )
        new_text = decode(self._ids[self._prefix :], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        self._read = len(self._ids)
        return new_text[len(prefix_text) :]

    @property
    def holds(self) -> bool:
        """Tokens whose text is not sent yet (an incomplete character) are held back."""
        return self._read < len(self._ids)


class StopMatcher:
    """Finds stop strings in streamed text; holds back text that may be the start of one.

    `push(text)` returns (text safe to emit, matched) where on a match the text is
    everything before the stop string.  Any suffix of the emitted-so-far text that
    is a prefix of a stop string is kept pending, so a stop string split across
    tokens is never partly emitted and a match can only start in the pending text.
    """

    __slots__ = ("stops", "_pending", "_max")

    def __init__(self, stops):
        self.stops = tuple(s for s in stops if s)
        self._pending = ""
        self._max = max((len(s) for s in self.stops), default=0)

    def push(self, text: str, can_stop: bool = True) -> tuple[str, bool]:
        buf = self._pending + text
        if not buf:
            return "", False
        if can_stop:
            cut = -1
            for s in self.stops:
                i = buf.find(s)
                if i >= 0 and (cut < 0 or i < cut):
                    cut = i
            if cut >= 0:
                self._pending = ""
                return buf[:cut], True
        else:
            self._pending = ""
            return buf, False
        hold = 0
        for k in range(min(len(buf), self._max - 1), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self.stops):
                hold = k
                break
        self._pending = buf[-hold:] if hold else ""
        return (buf[:-hold] if hold else buf), False

    def flush(self) -> str:
        text, self._pending = self._pending, ""
        return text

    @property
    def holds(self) -> bool:
        """Text that may start a stop string is held back."""
        return bool(self._pending)
