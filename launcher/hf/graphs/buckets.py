"""The sizes the hf engine's CUDA graphs are captured at, and the runner's settings that bound them.

Their own module: plain arithmetic on token counts, with nothing of torch in it, shared by the prompt, wave and mixed
families and by the runner (which offers the buckets as HFModelRunner.prefill_buckets / mixed_buckets).
"""

from __future__ import annotations


def token_limit(value, name: str, default: int, meaning: str) -> int:
    """A runner's token-count setting: `value`, else `default`; a negative one is refused naming the setting and
    what it means."""
    if value is None:
        value = default
    if int(value) < 0:
        raise ValueError(f"{name}={value} is negative: {meaning}")
    return int(value)


def prefill_buckets(limit: int) -> list[int]:
    """Padded prompt lengths up to `limit`: 16, 24, 32, 48, 64, 96, ... (each <= 1.5x the one before), and
    `limit` itself last, so a prompt pads by less than half its length."""
    out, n = [], 16
    while n < limit:
        out.append(n)
        n = n * 3 // 2 if (n & (n - 1)) == 0 else n * 4 // 3  # 16 -> 24 -> 32 -> 48 -> 64 ...
    if limit > 0:
        out.append(limit)
    return out


def mixed_buckets(limit: int) -> list[int]:
    """Packed prompt sizes of the mixed graphs for a limit of `limit` tokens: 32, 64, ... and `limit` last."""
    out, n = [], 32
    while n < limit:
        out.append(n)
        n *= 2
    if limit > 0:
        out.append(limit)
    return out
