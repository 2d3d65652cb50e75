"""SIGTERM handling for a benchmark's process: the first SIGTERM unwinds like Ctrl-C.

signal.signal(signal.SIGTERM, stop_on_sigterm)
"""

from __future__ import annotations

import os
import signal
import time

SIGTERM_GRACE_S = 2.0  # later SIGTERMs within this long of the first are the same stop (see stop_on_sigterm)
_first_sigterm = [0.0]


def stop_on_sigterm(signum, frame) -> None:
    """SIGTERM (timeout(1), a machine's time limit) unwinds like Ctrl-C instead of killing the process outright:
    the caller's `finally` blocks stop its servers and what it has measured so far is still printed.  timeout(1)
    signals its command and then the command's whole process group, this process again among them, so a second
    SIGTERM within SIGTERM_GRACE_S is that same stop and is ignored (dying there would lose the results); a later
    one kills as usual."""
    _first_sigterm[0] = time.monotonic()
    signal.signal(signal.SIGTERM, _later_sigterm)
    raise KeyboardInterrupt(signum)


def _later_sigterm(signum, frame) -> None:
    if time.monotonic() - _first_sigterm[0] < SIGTERM_GRACE_S:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
