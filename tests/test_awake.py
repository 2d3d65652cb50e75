"""serve.keep_cpus_awake (launcher/awake.py): idle-priority spinners on a rank's CPUs, real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher import awake

ROOT = Path(__file__).resolve().parents[1]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _gone_within(pids, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_spinners_run_pinned_at_idle_priority_and_stop():
    cpus = sorted(os.sched_getaffinity(0))[:2]
    with awake.KeepAwake(cpus) as k:
        pids = [p.pid for p in k.procs]
        assert len(pids) == len(cpus)
        for pid, cpu in zip(pids, cpus):
            assert os.sched_getscheduler(pid) == os.SCHED_IDLE
            assert os.sched_getaffinity(pid) == {cpu}
            assert _alive(pid)
    assert _gone_within(pids, 5), "stop() left spinners running"


def test_spinners_end_when_their_owner_dies():
    """No spinner outlives its rank: killed with SIGKILL (no clean-up runs), the owner's spinners notice they were
    re-parented and exit."""
    code = ("import os, sys, time\n"
            f"sys.path.insert(0, {str(ROOT)!r})\n"
            "from launcher.awake import KeepAwake\n"
            "k = KeepAwake(sorted(os.sched_getaffinity(0))[:2]).start()\n"
            "print(' '.join(str(p.pid) for p in k.procs), flush=True)\n"
            "time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in owner.stdout.readline().split()]
        assert pids and all(_alive(p) for p in pids)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert _gone_within(pids, 10), "spinners outlived their owner"


def test_a_spinner_that_cannot_start_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"the spinner for CPU 100000 did not start: .*serve.keep_cpus_awake=false"):
        awake.KeepAwake([100000]).start()


def test_which_cpus_a_rank_keeps_awake():
    assert awake.cpus_to_keep({0, 1, 2, 3}, 4, 0) == [0, 1, 2, 3]  # the node's first rank: all it may use
    assert awake.cpus_to_keep({0, 1, 2, 3}, 4, 1) == []  # unbound later ranks: the first covers them
    assert awake.cpus_to_keep({6, 4, 5}, 8, 3) == [4, 5, 6]  # bound (Slurm's --cpu-bind): its own
    assert awake._ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_off_starts_nothing():
    assert awake.for_rank(False, 0) is None
