"""launcher.python_backend.priority: the response path's nice value, set on every thread of a real process."""

import os
import subprocess
import sys
import time

import pytest

from launcher.python_backend.priority import lower_priority, thread_ids, thread_nices

# A child with three threads besides its main one, each told apart by its name; one of them has raised its own nice
# to 15 before the test lowers the process to 5 (a higher value stays: lower_priority never raises a priority).
CHILD = """
import os, threading, time
def run(nice):
    if nice:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    time.sleep(60)
for i, nice in enumerate((0, 0, 15)):
    threading.Thread(target=run, args=(nice,), name=f"t{i}", daemon=True).start()
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def child():
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while sorted(thread_nices(proc.pid).values()) != [0, 0, 0, 15] and time.monotonic() < deadline:
            time.sleep(0.05)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_every_thread_is_lowered_and_a_lower_priority_kept(child):
    assert sorted(thread_nices(child).values()) == [0, 0, 0, 15]
    assert lower_priority(child, 5) == 3
    assert sorted(thread_nices(child).values()) == [5, 5, 5, 15]
    assert lower_priority(child, 5) == 0  # already there: nothing changed
    assert os.getpriority(os.PRIO_PROCESS, 0) == 0, "this process is untouched"


def test_a_process_that_is_gone_has_no_threads():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert thread_ids(proc.pid) == [] and lower_priority(proc.pid, 5) == 0


def test_a_refusal_reaches_the_caller(child, monkeypatch):
    """Where the system refuses (a container's seccomp policy, say), the caller hears it: the hf model then logs it
    and serves with its priority unchanged."""

    def refuse(*_):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)
    with pytest.raises(PermissionError):
        lower_priority(child, 5)
    assert sorted(thread_nices(child).values()) == [0, 0, 0, 15]
