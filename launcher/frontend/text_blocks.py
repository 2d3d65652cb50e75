"""A prompt's text cut into blocks and keyed as a chain, what `serve.routing=prefix` indexes (launcher/frontend/
routing.py) and what `kv` remembers tokenized pieces under (launcher/frontend/prompt_tokens.py)."""

from __future__ import annotations

from typing import List

BLOCK_BYTES = 256  # text bytes a block: ~64 tokens of English, a few of the engines' 16-token blocks
MAX_BLOCKS = 256  # blocks of a prompt that are keyed (64 KiB of text); prompts that share them share the rest's fate


def block_keys(text: bytes, block: int = BLOCK_BYTES, limit: int = MAX_BLOCKS) -> List[int]:
    """The chained keys of text's full blocks: key i hashes key i-1 and block i, so equal keys mean equal prefixes.
    Python's own hash: a key only has to mean the same within one process (each worker keeps its own index)."""
    keys: List[int] = []
    key = 0
    for at in range(0, min(len(text) // block, limit) * block, block):
        key = hash((key, text[at : at + block]))
        keys.append(key)
    return keys
