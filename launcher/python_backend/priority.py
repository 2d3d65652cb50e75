"""Lower the CPU priority of a serving process's threads (the hf model's nice value: launcher.python_backend.responders).

Why: with the engine in its own process, three kinds of process share a node's CPUs: tritonserver (gRPC in and
out), the python stubs (building and sending every streamed response) and the engine process (its loop feeds the
GPU, its reader takes new requests).  Only the engine sets how fast the GPU runs and when a prompt is taken; a
response held back a fraction of a millisecond costs nothing else.  Where those CPUs are all busy (128 closed
streams on 8 vCPUs: the server used 6.7 of them with a load average of 11-14), the engine's
threads wait for a CPU like any other.  A higher nice value on tritonserver and the stubs lets the engine's threads
run first; nobody needs privileges for it, since a process may always lower its own priority, and the engine
process, started before, keeps the nice it started with.

On Linux a nice value belongs to a thread (setpriority(PRIO_PROCESS, tid)), and a new thread takes its creator's,
so every thread listed under /proc/<pid>/task is set, twice over to catch threads started meanwhile.
"""

from __future__ import annotations

import os


def thread_ids(pid: int) -> list[int]:
    """The thread ids of process `pid` ([] once it is gone)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (FileNotFoundError, ProcessLookupError):
        return []


def thread_nice(tid: int) -> int:
    """A thread's nice value, as the kernel reports it (/proc/<tid>/stat field 19)."""
    with open(f"/proc/{tid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])


def thread_nices(pid: int) -> dict[int, int]:
    """Thread id -> nice value, for every thread of process `pid` that is still there when read."""
    nices = {}
    for tid in thread_ids(pid):
        try:
            nices[tid] = thread_nice(tid)
        except (FileNotFoundError, ProcessLookupError):  # it exited meanwhile
            continue
    return nices


def lower_priority(pid: int, nice: int) -> int:
    """Give every thread of `pid` at least nice value `nice` (one already higher is left as it is); -> the number of
    threads changed.  A thread that exits meanwhile is skipped; one this user may not change raises PermissionError."""
    changed = set()
    for _ in range(2):  # a thread started while the first pass ran took its creator's value, maybe the old one
        for tid, now in thread_nices(pid).items():
            if now < nice:
                try:
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
                except ProcessLookupError:
                    continue
                changed.add(tid)
    return len(changed)
