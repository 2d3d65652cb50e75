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

ROOT = Path(__file__).resolve().parents[2]


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


def _cpu_over(spinners: awake.KeepAwake, seconds: float) -> float:
    c0 = spinners.cpu_seconds()
    time.sleep(seconds)
    return spinners.cpu_seconds() - c0


def test_spinners_pause_while_an_engine_posts_a_load_at_or_above_pause_at(tmp_path):
    """serve.awake_pause_at: a spinner sleeps while any slot of the board holds pause_at or more (an engine that
    busy keeps its threads awake itself), and spins again once the load falls below it."""
    path = str(tmp_path / "board")
    awake.open_board(path)[:4] = b"\x07\x07\x07\x07"  # an earlier run's counts: start() clears them
    cpu = sorted(os.sched_getaffinity(0))[-1]
    with awake.KeepAwake([cpu], board=path, pause_at=2) as k:
        assert awake.open_board(path)[:] == bytes(awake.SLOTS)
        assert _cpu_over(k, 1.0) > 0.3  # spinning (at idle priority: whatever the CPU has to spare)
        poster = awake.LoadPoster(path, slot=5)
        poster.post(2)
        time.sleep(0.05)
        assert _cpu_over(k, 1.0) < 0.1  # paused
        poster.post(1)
        time.sleep(0.05)
        assert _cpu_over(k, 1.0) > 0.3  # spinning again
        poster.post(300)  # capped at one byte
        assert awake.open_board(path)[5] == 255


def test_without_a_board_or_with_pause_at_0_spinners_never_pause(tmp_path):
    assert awake.spinner_argv(1, 2, "py")[-2:] == ["1", "2"]
    assert awake.spinner_argv(1, 2, "py", board="/b", pause_at=0)[-2:] == ["1", "2"]
    assert awake.spinner_argv(1, 2, "py", board="/b", pause_at=2)[-2:] == ["/b", "2"]
    k = awake.KeepAwake([0], board=str(tmp_path / "b"), pause_at=0)
    assert (k.board, k.pause_at) == ("", 0)


def test_the_board_is_named_by_the_run_and_reached_through_the_environment(tmp_path, monkeypatch):
    a, b = awake.board_path(str(tmp_path / "run1")), awake.board_path(str(tmp_path / "run2"))
    assert a != b and a == awake.board_path(str(tmp_path / "run1" / ".." / "run1"))
    monkeypatch.delenv(awake.BOARD_ENV, raising=False)
    assert awake.LoadPoster.from_env({}) is None
    path = str(tmp_path / "board")
    poster = awake.LoadPoster.from_env({awake.BOARD_ENV: path, "LLMLAUNCH_LOCAL_RANK": "2"})
    assert (poster.path, poster.slot) == (path, 2)
    # a board that cannot be opened: no posts (the spinners then never pause), not a failed engine
    assert awake.LoadPoster.from_env({awake.BOARD_ENV: str(tmp_path / "no" / "such" / "dir")}) is None


def test_kept_names_the_board_while_serving_and_the_first_rank_removes_it(tmp_path, monkeypatch):
    monkeypatch.delenv(awake.BOARD_ENV, raising=False)
    path = str(tmp_path / "board")
    said = []
    cpus = sorted(os.sched_getaffinity(0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(cpus[:1]))  # one spinner is enough here
    with awake.kept(True, 0, said.append, path, 2) as k:
        assert os.environ[awake.BOARD_ENV] == path and Path(path).exists()
        assert k.pause_at == 2 and k.board == path
    assert awake.BOARD_ENV not in os.environ and not Path(path).exists()
    assert f"they pause while an hf engine of this node holds 2 requests or more (board {path})" in said[0]
    # a later rank of the node, unbound: no spinners of its own, but its engine posts on the first rank's board
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(os.cpu_count() or 1)))
    awake.open_board(path)
    with awake.kept(True, 1, said.append, path, 2) as k:
        assert k is None and os.environ[awake.BOARD_ENV] == path
    assert Path(path).exists()  # the first rank's to remove
    with awake.kept(False, 0, None, path, 2):  # off: nothing named
        assert awake.BOARD_ENV not in os.environ
