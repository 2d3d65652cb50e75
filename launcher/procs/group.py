"""Process groups: what every supervised child of the launcher (tritonserver, the front end, the OpenAI API) is
started and stopped with.  A child leads its own process group (its stubs and workers are in it), asks the kernel
for SIGTERM when the process that started it dies, and is stopped as a group: SIGTERM, SIGKILL after a grace time,
then whatever is left of the group once its leader is gone."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Callable, Optional


def _term_with_parent() -> Optional[Callable[[], None]]:
    """A function that asks the kernel for SIGTERM when the calling process's parent dies, even by SIGKILL (Linux
    PR_SET_PDEATHSIG), or None where there is no prctl.  Resolved once, here: as a Popen preexec_fn the forked child
    then calls one C function and imports nothing.  The signal follows the thread that started the child: every
    caller starts its children from its main thread."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# preexec_fn of a child that must not outlive the process that starts it (a tritonserver holds ports, GPU memory and
# shm); None where the kernel has no such request
term_with_parent = _term_with_parent()


def stop_group(proc: subprocess.Popen, grace_s: float) -> int:
    """SIGTERM a child started in its own process group, SIGKILL the group after `grace_s`; its status."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return proc.wait(timeout=grace_s if sig == signal.SIGTERM else None)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def end_group(proc: subprocess.Popen) -> None:
    """SIGKILL what is left of the process group that `proc` led, once `proc` has exited and been
    reaped (stray python-backend stubs), and nothing else.

    The group is named by the leader's pid. The kernel keeps that number allocated while any member
    of the group is left, so it cannot name a new process then. Once no member is left it is free,
    and after the pid counter wraps (32,768 on many machines, threads included: minutes on a busy
    node) a new process can get it and lead a group of its own under it, e.g. another rank's
    tritonserver, which starts in its own session. So: a live process holding the number means the
    group is gone and the number is someone else's; leave it alone. (Killing the group blindly in a
    `stop()` long after the server exited is how an unrelated server can be killed.)"""
    if proc.returncode is None:
        raise ValueError("end_group is for a leader that has exited (use stop_group)")
    if os.path.exists(f"/proc/{proc.pid}"):
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
