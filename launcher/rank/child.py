"""A supervised child service of a rank (the replicas front end, the OpenAI API): started in its own session,
waited for until a probe says it is ready, stopped with SIGTERM and then SIGKILL after its drain deadline.  The
child side, `die_with_parent`, makes it go when the process that started it dies."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Callable, Dict, List, Optional


class ChildService:
    """What a service's handle shares; subclasses give argv(), what (for messages) and drain_s (SIGTERM's grace)."""

    what = "service"

    def __init__(self, env: Optional[Dict[str, str]] = None):
        self.env = env
        self.proc = None

    def argv(self) -> List[str]:
        raise NotImplementedError

    @property
    def drain_s(self) -> float:
        raise NotImplementedError

    def start(self):
        import subprocess

        sys.stdout.flush()
        # Own session: a terminal's Ctrl-C reaches the parent, which decides how the service stops.
        from launcher.rank.drain import children_ignore_drain_signal

        with children_ignore_drain_signal():  # it installs its own handler: a notice to drain, not death
            self.proc = subprocess.Popen(self.argv(), env=self.env, start_new_session=True)
        return self

    def drain_notice(self) -> None:
        """Refuse new requests from now on, naming the reason (launcher/rank/drain.py); running ones go on."""
        from launcher.rank.drain import DRAIN_SIGNAL

        if self.poll() is None:
            try:
                os.killpg(self.proc.pid, DRAIN_SIGNAL)
            except ProcessLookupError:
                pass

    def poll(self) -> Optional[int]:
        return None if self.proc is None else self.proc.poll()

    def wait_until(self, ready: Callable[[], bool], timeout_s: float, where: str) -> float:
        """Seconds until `ready()` is true (it may raise OSError or a gRPC error meanwhile); raises if the child
        exits first or `timeout_s` passes."""
        t0 = time.monotonic()
        while True:
            if self.poll() is not None:
                raise RuntimeError(f"the {self.what} exited with status {self.poll()} before it was ready")
            try:
                if ready():
                    return time.monotonic() - t0
            except Exception:  # noqa: BLE001 - not answering yet
                pass
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"the {self.what} on {where} not ready after {timeout_s:.0f}s")
            time.sleep(0.1)

    def terminate(self) -> None:
        if self.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self) -> Optional[int]:
        """SIGTERM (the service drains), SIGKILL after the drain deadline."""
        from launcher.triton import stop_group

        if self.proc is None:
            return None
        if self.proc.poll() is None:
            stop_group(self.proc, self.drain_s)
        return self.proc.returncode


def die_with_parent(what: str) -> None:
    """In the child: SIGTERM when the parent dies (even by SIGKILL), so no service outlives the process that
    started it."""
    from launcher.triton import term_with_parent

    if term_with_parent is not None:
        term_with_parent()
    if os.getppid() == 1:
        raise SystemExit(f"{what}: the parent is already gone")
