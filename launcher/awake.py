"""Keep idle CPUs from sleeping while a server runs (`serve.keep_cpus_awake`, opt-in).

Why: a streamed first token crosses a dozen threads (client, gRPC, tritonserver, the python stub, the engine
process), and while the engine computes it most of them sleep.  On a virtual machine a vCPU with nothing to run
halts and the host deschedules it, so waking a thread on it takes tens of microseconds more than on a busy one.
Measured on the H100 host (a KVM guest, 16 vCPUs): a request answered
through the python backend and a child process after 3 ms of sleep took 1.39-1.59 ms p50 end to end, and
1.01-1.15 ms with every idle vCPU kept busy (`benchmark/first_response.py --awake both`); the hf engine's served
first token at one stream, 2.47 ms p50 more than in-process, 2.01 ms more with both kept awake
(`benchmark/overhead.py`, paths direct_awake / served_awake).  Under load nothing is gained: at 128 streams the
served tokens/s fell 2% (the spinners share cores with the stub's threads through hyperthreads).

How: one process per CPU of `cpus`, pinned there, at SCHED_IDLE (the kernel runs it only when nothing else wants
that CPU, and a woken thread preempts it at once), looping on getppid(): the loop keeps the CPU from halting and
is also how a spinner notices that its owner died (it is re-parented) and exits, so none outlives its rank.

Under load the spinners pause (`serve.awake_pause_at`): the hf engine posts how many requests it holds on a board
(a page of shared memory named in LLMLAUNCH_AWAKE_BOARD, one byte per local rank), and a spinner sleeps while any
engine of its node holds that many or more.  Then the server's threads are busy and seldom sleep, so waking is not
what they wait for, while a spinner on an idle hyperthread slows its busy sibling: at 8 streams served tokens/s fell
from 0.988-0.990 to 0.973-0.974 of in-process with spinners that never paused.  Engines that post
nothing (every engine but hf) leave the board at 0, and the spinners never pause.

Cost: every CPU of the set shows 100% busy while the server is idle or lightly loaded (power, and a hyperthread
sibling of a busy thread shares its core with a spinner), so it is off by default; the CPU time a job is charged may
count it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mmap
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterable, List, Optional

log = logging.getLogger(__name__)

BOARD_ENV = "LLMLAUNCH_AWAKE_BOARD"  # the load board's path, for the engines a rank's server starts
SLOTS = 64  # one byte per local rank: the requests its engine holds (waiting or running), at most 255
PAUSE_S = 0.005  # how long a paused spinner sleeps before it reads the board again

# The spinner: pin, drop to SCHED_IDLE, open the board (argv[3], if any), say so (one line), spin until the owner
# (argv[2]) is no longer the parent; with a board, sleep while an engine holds argv[4] requests or more.
SPINNER = (
    "import os, sys, time\n"
    "os.sched_setaffinity(0, {int(sys.argv[1])})\n"
    "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
    "owner, board = int(sys.argv[2]), None\n"
    "if len(sys.argv) > 4:\n"
    "    import mmap\n"
    "    with open(sys.argv[3], 'rb') as f:\n"
    f"        board = mmap.mmap(f.fileno(), {SLOTS}, access=mmap.ACCESS_READ)\n"
    "    pause_at = int(sys.argv[4])\n"
    "sys.stdout.write('idle\\n')\n"
    "sys.stdout.close()\n"
    "if board is None:\n"
    "    while os.getppid() == owner:\n"
    "        pass\n"
    "else:\n"
    "    while os.getppid() == owner:\n"
    "        if max(board[:]) >= pause_at:\n"
    f"            time.sleep({PAUSE_S})\n"
)


def spinner_argv(cpu: int, owner: int, python: str = sys.executable, board: str = "", pause_at: int = 0) -> List[str]:
    """The command of the spinner for one CPU, owned by process `owner` (its parent); with a board and pause_at >
    0 it pauses while an engine posts pause_at requests or more there."""
    extra = [str(board), str(int(pause_at))] if board and pause_at > 0 else []
    return [python, "-c", SPINNER, str(int(cpu)), str(int(owner)), *extra]


def board_path(run_dir: str) -> str:
    """The load board of a run's ranks on one node: the same name for every rank of the run (node-local, in
    /dev/shm), another for any other run."""
    digest = hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]
    base = "/dev/shm" if os.path.isdir("/dev/shm") else "/tmp"
    return f"{base}/llmlaunch-awake-{digest}"


def open_board(path: str, zero: bool = False) -> mmap.mmap:
    """The board at `path`, made if missing (SLOTS bytes); `zero` clears what an earlier run of the path left."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size < SLOTS:
            os.ftruncate(fd, SLOTS)
        board = mmap.mmap(fd, SLOTS)
    finally:
        os.close(fd)
    if zero:
        board[:] = bytes(SLOTS)
    return board


class LoadPoster:
    """An engine's side of the board: `post(n)` writes n (capped at 255) to its slot, only when it changed."""

    def __init__(self, path: str, slot: int = 0):
        self.path, self.slot = path, int(slot) % SLOTS
        self._board = open_board(path)
        self._last = -1

    @classmethod
    def from_env(cls, environ=None) -> Optional["LoadPoster"]:
        """The poster of the board a server's environment names (BOARD_ENV; slot: LLMLAUNCH_LOCAL_RANK), or None."""
        environ = os.environ if environ is None else environ
        path = environ.get(BOARD_ENV, "")
        if not path:
            return None
        slot = environ.get("LLMLAUNCH_LOCAL_RANK", "0")
        try:
            return cls(path, int(slot) if slot.isdigit() else 0)
        except OSError as exc:  # the spinners then never pause: slower under load, not wrong
            log.warning("keep_cpus_awake: cannot open the load board %s (%s); its spinners will not pause", path, exc)
            return None

    def post(self, n: int) -> None:
        n = min(int(n), 255)
        if n != self._last:
            self._board[self.slot] = n
            self._last = n


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

    def __init__(self, cpus: Iterable[int], board: str = "", pause_at: int = 0):
        """board, pause_at: the spinners sleep while an engine posts pause_at requests or more on the board at that
        path (made and cleared here); pause_at 0, or no board: they never pause."""
        self.cpus = sorted(set(int(c) for c in cpus))
        self.board, self.pause_at = (str(board), int(pause_at)) if board and pause_at > 0 else ("", 0)
        self.procs: List[subprocess.Popen] = []

    def start(self) -> "KeepAwake":
        """Start the spinners; returns once each runs at idle priority (until then it competes as any process)."""
        if not hasattr(os, "SCHED_IDLE"):
            raise RuntimeError("serve.keep_cpus_awake needs Linux (SCHED_IDLE); set serve.keep_cpus_awake=false")
        me = os.getpid()
        if self.board:
            open_board(self.board, zero=True).close()  # before any engine posts: a requeued run's old counts go
        for cpu in self.cpus:
            argv = spinner_argv(cpu, me, board=self.board, pause_at=self.pause_at)
            self.procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL,
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

    def cpu_seconds(self) -> float:
        """CPU time the running spinners have used (user + system): how much of their CPUs they kept."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for p in self.procs:
            try:
                fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / tick
        return total

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
def kept(enabled: bool, local_rank: int, say=None, board: str = "", pause_at: int = 0):
    """`for_rank`'s spinners for the length of a with-block (a rank serving), stopped after it.  With a board and
    pause_at > 0, BOARD_ENV names the board meanwhile (every rank of the node: the server a rank starts inherits it,
    and its engine posts there), and the node's first rank removes it after."""
    board = board if enabled and pause_at > 0 else ""
    before = os.environ.get(BOARD_ENV)
    if board:
        os.environ[BOARD_ENV] = board
    try:
        spinners = for_rank(enabled, local_rank, say, board, pause_at)
        try:
            yield spinners
        finally:
            if spinners is not None:
                spinners.stop()
    finally:
        if board:
            if before is None:
                os.environ.pop(BOARD_ENV, None)
            else:
                os.environ[BOARD_ENV] = before
            if local_rank == 0:
                with contextlib.suppress(OSError):
                    os.unlink(board)


def kept_for(serve, local_rank: int, run_dir: str, say=None):
    """`kept` as a run's serve config (LaunchSpec.serve) asks: keep_cpus_awake, and awake_pause_at on the run's board."""
    return kept(bool(serve.keep_cpus_awake), local_rank, say, board_path(run_dir), int(serve.awake_pause_at))


def for_rank(enabled: bool, local_rank: int, say=None, board: str = "", pause_at: int = 0) -> Optional[KeepAwake]:
    """The rank's KeepAwake (started), or None when off or when another rank of the node covers its CPUs."""
    if not enabled:
        return None
    cpus = cpus_to_keep(os.sched_getaffinity(0), os.cpu_count() or 1, local_rank)
    if not cpus:
        if say:
            say("keep_cpus_awake: local rank 0 keeps this node's CPUs awake")
        return None
    awake = KeepAwake(cpus, board, pause_at).start()
    if say:
        paused = (f"; they pause while an hf engine of this node holds {awake.pause_at} requests or more (board "
                  f"{awake.board})" if awake.board else "; they never pause")
        say(f"keep_cpus_awake: {len(cpus)} idle-priority spinners on CPUs {_ranges(cpus)} "
            f"(pids {' '.join(str(p.pid) for p in awake.procs)}){paused}")
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
