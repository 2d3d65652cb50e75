"""The hf engine's on/off switches that an environment variable can also set (LLMLAUNCH_HF_*: what a benchmark
flips to measure a change against the code before it, without a new parameter on every layer in between)."""

from __future__ import annotations

import os


def env_switch(value: bool | None, name: str, on: str, off: str) -> bool:
    """`value` where given, else the environment variable `name` (1, the default, or 0), refused with both meanings
    (`on`, `off`) named when it is anything else."""
    if value is not None:
        return bool(value)
    raw = os.environ.get(name, "") or "1"
    if raw not in ("0", "1"):
        raise ValueError(f"{name}={raw!r}: use 1 ({on}, the default) or 0 ({off})")
    return raw == "1"
