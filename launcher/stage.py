"""Progress from inside a starting server, shown by the launcher while it waits for READY.

A model that takes long to become ready (loading weights, compiling, capturing CUDA graphs) prints
`llmlaunch-stage: <what>` lines to stderr, which tritonserver writes to its log; `launcher.triton.wait_ready`
shows the latest one beside the time waited, so a two-minute compile reads as a compile, not a hang.
"""

from __future__ import annotations

import sys

PREFIX = "llmlaunch-stage: "


def announce(what: str) -> None:
    print(PREFIX + what, file=sys.stderr, flush=True)


def latest(log_text: str) -> str:
    """The last stage announced in `log_text`, or ''."""
    i = log_text.rfind(PREFIX)
    if i < 0:
        return ""
    return (log_text[i + len(PREFIX) :].splitlines() or [""])[0].strip()
