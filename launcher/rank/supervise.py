"""What a rank does when something it supervises ends: the fail-fast / lose-a-replica rule (`decide_exit`, pure) and
the waits that notice the end (its server, rank 0's front end and OpenAI API, a replica recorded lost).

Replicas (replicas > 1) are the exception, once the job serves: losing one data-parallel copy loses capacity, not
the service, so the ranks of that copy record `replica_lost<R>.json` and exit 0 while the front end on rank 0
routes around it; rank 0 keeps the front end up even when its own server is the one lost. The job still fails
(fail fast) when it was not serving yet, when its last replica is lost, and when the front end dies.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import Callable, Optional, Tuple


@dataclass(frozen=True)
class Outcome:
    """What a rank does once something it supervises ended unasked (see decide_exit)."""

    replica_lost: bool  # record replica_lost<R>.json for this rank's replica (once per replica)
    failure: bool  # record failure_rank<N>.json and exit non-zero: srun --kill-on-bad-exit ends the job
    exits: bool  # False only for rank 0 keeping the front end up for the replicas left
    status: int  # the rank's exit status (when it exits)
    reason: str


def decide_exit(
    ended: str,
    *,
    replicas: int,
    replica: int,
    serving: bool,
    code: Optional[int],
    lost: Tuple[int, ...] = (),
    frontend: str = "none",
) -> Outcome:
    """The whole fail-fast / lose-a-replica rule, as a pure function.

    ended: "server" (this rank's tritonserver or engine command exited), "replica" (another rank
    of this rank's replica recorded it lost, or, for rank 0 serving only the front end, the
    others were lost too), "frontend" / "api" (rank 0's front end / OpenAI API exited). Only for unasked ends: a
    signal (scancel, time limit) is a normal stop and never comes here.
    serving: the job had reached READY (rank 0 wrote endpoint.json for this run).
    lost: replicas already recorded lost. frontend: "none" (this rank has none), "running" or
    "exited" (rank 0 with replicas > 1 runs the front end).
    """
    status = code if code else 1
    what = {"server": "server", "replica": "replica", "frontend": "front end", "api": "OpenAI API"}[ended]
    if ended in ("frontend", "api") or frontend == "exited":
        # The public endpoint itself is gone: nothing serves, whatever the replicas do.
        return Outcome(
            False,
            True,
            True,
            status,
            f"{what if ended == 'api' else 'front end'} exited{f' with status {code}' if ended in ('frontend', 'api') else ''} unasked",
        )
    if replicas <= 1:
        # One copy: it is the service. Fail fast, as always.
        return Outcome(False, True, True, status, f"{what} exited with status {code} unasked")
    if not serving:
        # A job that never fully started should not pretend to serve with part of its replicas.
        return Outcome(
            False, True, True, status, f"{what} exited with status {code} unasked before the job was serving"
        )
    gone = set(lost) | {replica}
    if len(gone) >= replicas:
        return Outcome(True, True, True, status, f"no replica is left (replicas {sorted(gone)} lost)")
    if frontend == "running":
        # Rank 0: the front end already routes around a failed replica (its own included) and its
        # clients keep the endpoint they know, so it stays up for the replicas left.
        return Outcome(
            True, False, False, 0, f"replica {replica} lost; the front end serves the {replicas - len(gone)} left"
        )
    # Exit 0: srun --kill-on-bad-exit ends the step only for a non-zero task exit.
    return Outcome(
        True, False, True, 0, f"replica {replica} lost; {replicas - len(gone)} of {replicas} replicas still serve"
    )


def signal_text(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return str(code)


def end_lost_server(server, grace_s: float = 5.0) -> Optional[int]:
    """Another rank of this replica died: the replica cannot finish what it runs (its model-parallel
    group is broken), so no full drain: SIGTERM, SIGKILL after `grace_s`, then the usual cleanup."""
    server.stop(grace_s=grace_s)
    return server.returncode()


def supervise(
    server, frontend, stopped: Callable[[], bool], lost: Callable[[], bool], api=None
) -> Tuple[str, Optional[int]]:
    """Wait until something this rank supervises ends. Returns ("server", status) when its server exited (asked
    or not), ("frontend", status) / ("api", status) when rank 0's front end / OpenAI API exited unasked,
    ("replica", None) when another rank of this replica recorded it lost (replicas > 1)."""
    checked = 0.0
    while True:
        code = server.returncode()
        if code is not None:
            return "server", code
        if not stopped():
            for name, child in (("frontend", frontend), ("api", api)):
                status = None if child is None else child.poll()
                if status is not None:
                    return name, status
            now = time.monotonic()
            if now - checked >= 1.0:  # a stat on the shared run dir, once a second per rank
                checked = now
                if lost():
                    return "replica", None
        time.sleep(0.2)


def frontend_only(frontend, stopped: Callable[[], bool], all_lost: Callable[[], bool]) -> Tuple[str, Optional[int]]:
    """Rank 0 after its own replica was lost: supervise the front end alone. Returns ("frontend",
    status) when it exits (asked or not), ("replica", None) when no replica is left."""
    checked = 0.0
    while True:
        fe = frontend.poll()
        if fe is not None:
            return "frontend", fe
        now = time.monotonic()
        if not stopped() and now - checked >= 1.0:
            checked = now
            if all_lost():
                return "replica", None
        time.sleep(0.2)
