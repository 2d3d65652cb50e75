"""Keep idle CPUs from sleeping while a server runs (`serve.keep_cpus_awake`, opt-in).

Why: a streamed first token crosses a dozen threads (client, gRPC, tritonserver, the python stub, the engine
process), and while the engine computes it most of them sleep.  On a virtual machine a vCPU with nothing to run
halts and the host deschedules it, so waking a thread on it takes tens of microseconds more than on a busy one.
Measured on the H100 host (a KVM guest, 16 vCPUs; benchmark/RESULTS.md, eighteenth session): a request answered
through the python backend and a child process after 3 ms of sleep took 1.39-1.59 ms p50 end to end, and
1.01-1.15 ms with every idle vCPU kept busy (`benchmark/first_response.py --awake both`); the hf engine's served
first token at one stream, 2.47 ms p50 more than in-process, 2.01 ms more with both kept awake
(`benchmark/overhead.py`, paths direct_awake / served_awake).  Under load nothing is gained: at 128 streams the
served tokens/s fell 2% (the spinners share cores with the stub's threads through hyperthreads).

How: one process per CPU of `cpus`, pinned there, at SCHED_IDLE (the kernel runs it only when nothing else wants
that CPU, and a woken thread preempts it at once), looping on getppid(): the loop keeps the CPU from halting and
is also how a spinner notices that its owner died (it is re-parented) and exits, so none outlives its rank.

Cost: every CPU of the set shows 100% busy for the server's lifetime (power, and a hyperthread sibling of a busy
thread shares its core with a spinner), so it is off by default; the CPU time a job is charged may count it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from typing import Iterable, List, Optional

# The spinner: pin, drop to SCHED_IDLE, say so (one line), spin until the owner (argv[2]) is no longer the parent.
SPINNER = (
    "import os, sys\n"
    "os.sched_setaffinity(0, {int(sys.argv[1])})\n"
    "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
    "sys.stdout.write('idle\\n')\n"
    "sys.stdout.close()\n"
    "owner = int(sys.argv[2])\n"
    "while os.getppid() == owner:\n"
    "    pass\n"
)


def spinner_argv(cpu: int, owner: int, python: str = sys.executable) -> List[str]:
    """The command of the spinner for one CPU, owned by process `owner` (its parent)."""
    return [python, "-c", SPINNER, str(int(cpu)), str(int(owner))]


def cpus_to_keep(affinity: Iterable[int], cpu_count: int, local_rank: int) -> List[int]:
    """The CPUs a rank keeps awake: its own (its affinity), unless it may run on every CPU of the node and is not
    the node's first rank (then the first rank keeps them all, and the others would only add spinners)."""
    mine = sorted(affinity)
    if local_rank and len(mine) >= cpu_count:
        return []
    return mine


class KeepAwake:
    """Spinners on `cpus` from `start()` to `stop()` (also a context manager).  They end on their own when this
    process exits."""

    def __init__(self, cpus: Iterable[int]):
        self.cpus = sorted(set(int(c) for c in cpus))
        self.procs: List[subprocess.Popen] = []

    def start(self) -> "KeepAwake":
        """Start the spinners; returns once each runs at idle priority (until then it competes as any process)."""
        if not hasattr(os, "SCHED_IDLE"):
            raise RuntimeError("serve.keep_cpus_awake needs Linux (SCHED_IDLE); set serve.keep_cpus_awake=false")
        me = os.getpid()
        for cpu in self.cpus:
            self.procs.append(subprocess.Popen(spinner_argv(cpu, me), stdin=subprocess.DEVNULL,
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, close_fds=True))
        for cpu, p in zip(self.cpus, self.procs):
            line = p.stdout.readline()
            p.stdout.close()
            if line.strip() != b"idle":
                err = p.stderr.read().decode(errors="replace").strip().splitlines()
                self.stop()
                raise RuntimeError(f"keep_cpus_awake: the spinner for CPU {cpu} did not start: "
                                   f"{err[-1] if err else 'no reason given'}; set serve.keep_cpus_awake=false")
            p.stderr.close()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []

    def __enter__(self) -> "KeepAwake":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@contextlib.contextmanager
def kept(enabled: bool, local_rank: int, say=None):
    """`for_rank`'s spinners for the length of a with-block (a rank serving), stopped after it."""
    spinners = for_rank(enabled, local_rank, say)
    try:
        yield spinners
    finally:
        if spinners is not None:
            spinners.stop()


def for_rank(enabled: bool, local_rank: int, say=None) -> Optional[KeepAwake]:
    """The rank's KeepAwake (started), or None when off or when another rank of the node covers its CPUs."""
    if not enabled:
        return None
    cpus = cpus_to_keep(os.sched_getaffinity(0), os.cpu_count() or 1, local_rank)
    if not cpus:
        if say:
            say("keep_cpus_awake: local rank 0 keeps this node's CPUs awake")
        return None
    awake = KeepAwake(cpus).start()
    if say:
        say(f"keep_cpus_awake: {len(cpus)} idle-priority spinners on CPUs {_ranges(cpus)} "
            f"(pids {' '.join(str(p.pid) for p in awake.procs)})")
    return awake


def _ranges(cpus: List[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    out, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            out.append(str(start) if start == c else f"{start}-{c}")
            start = None
    return ",".join(out)
