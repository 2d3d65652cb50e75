"""Draining at the time limit: what the rank's children are told, and how Slurm's signal spares them.

Slurm sends SIGUSR2 (sbatch --signal, serve.walltime_signal_s ahead of the limit) to every process of the serving
step. The rank turns it into a drain: its server gets SIGTERM (Triton finishes what runs, up to
serve.drain_timeout_s), and rank 0's front ends (the replicas' gRPC front end, the OpenAI API) get SIGUSR2 as a
notice: from then on they refuse new requests, naming the reason (gRPC UNAVAILABLE, HTTP 503), while those in
flight go on. Children are started with SIGUSR2 ignored (an ignored signal stays ignored across exec), so Slurm's
own copy of the signal neither kills tritonserver and its stubs (SIGUSR2's default action) nor anything else; the
front ends install their own handler for the notice.

Both sides agree on it here, below them: the rank (launcher/rank/rank.py) sends the notice and sets the reason, the
children (launcher/triton.py, launcher/frontend, launcher/openai_api) are started by and act on it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from typing import Iterator

from launcher.handoff.rank_env import RankEnv

DRAIN_SIGNAL = (
    signal.SIGUSR2
)  # Slurm's time-limit signal (submitit renders --signal=USR2@N), and the front ends' notice
REASON_ENV = RankEnv.var("drain_reason")  # the reason the front ends give for refusing requests, set by the rank


def walltime_reason(job_id: str, requeue: bool) -> str:
    """What a client refused during the drain reads."""
    then = (
        f"it is requeued and serves again at a new endpoint (llmlaunch-status {job_id} shows it)"
        if requeue
        else "it then ends (launch it again for more time)"
    )
    return f"job {job_id} is draining at its Slurm time limit: requests in flight finish, new ones are refused; {then}"


def reason() -> str:
    return os.environ.get(REASON_ENV) or "the server is draining before it stops: new requests are refused"


@contextlib.contextmanager
def children_ignore_drain_signal() -> Iterator[None]:
    """Processes started inside this block begin with DRAIN_SIGNAL ignored. The caller's own handler is back
    right after (a signal arriving in those microseconds is lost: Slurm sends it a minute ahead, once)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(DRAIN_SIGNAL, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(DRAIN_SIGNAL, old)
