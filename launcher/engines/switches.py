"""The hf engine's on/off switches that an environment variable can also set (LLMLAUNCH_HF_*: what a benchmark
flips to measure a change against the behaviour it replaced, without a new parameter on every layer in between)."""

from __future__ import annotations

import os


def env_switch(value: bool | None, name: str, on: str, off: str, default: bool = True) -> bool:
    """`value` where given, else the environment variable `name` (1 or 0; unset: `default`), refused with both
    meanings (`on`, `off`) named when it is anything else."""
    if value is not None:
        return bool(value)
    raw = os.environ.get(name, "") or ("1" if default else "0")
    if raw not in ("0", "1"):
        ones, zeros = (", the default", "") if default else ("", ", the default")
        raise ValueError(f"{name}={raw!r}: use 1 ({on}{ones}) or 0 ({off}{zeros})")
    return raw == "1"

