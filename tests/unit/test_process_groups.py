"""Ending what is left of a tritonserver's process group (launcher.procs.group.end_group), with real processes.

The hazard: a group is named by its leader's pid, and once the leader is reaped and no member is left
that number is free; after the pid counter wraps, a new group leader (another rank's tritonserver) can
hold it. Killing the group by number long after the leader exited must then do nothing."""

import os
import signal
import subprocess
import sys
import time
import types

import pytest

from launcher.procs.group import end_group


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_stray_member_of_an_exited_leaders_group_is_killed():
    """A stub left behind by a server that exited (same group, re-parented) is what end_group is for."""
    leader = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; print(subprocess.Popen(['sleep', '60']).pid, flush=True)"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    stray = int(leader.stdout.readline())
    assert leader.wait(timeout=30) == 0
    assert _alive(stray) and os.getpgid(stray) == leader.pid  # the leader's number is still held by its group
    end_group(leader)
    assert _gone_within(stray, 10), "the stray member was left running"


def test_a_number_that_names_a_live_process_now_is_left_alone():
    """Pid reuse, made directly: an exited leader whose number a running group leader holds now."""
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)  # leads its own group, like a tritonserver
    try:
        reaped = types.SimpleNamespace(pid=other.pid, returncode=0)  # what a reaped Popen looks like after the wrap
        end_group(reaped)
        time.sleep(0.2)
        assert other.poll() is None, "end_group killed a group that was not the exited server's"
    finally:
        os.killpg(other.pid, signal.SIGKILL)
        other.wait()


def test_a_leader_not_yet_reaped_is_refused():
    running = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        with pytest.raises(ValueError, match="stop_group"):
            end_group(running)
    finally:
        os.killpg(running.pid, signal.SIGKILL)
        running.wait()
