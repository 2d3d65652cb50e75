"""A tritonserver's process tree read from /proc (Linux): its hf engine processes, its python-backend stubs, and
the CPU time each role has used.

    server_cpu_by_role(server.proc.pid)   # {"tritonserver": s, "stubs": s, "engine": s, "other": s}
"""

from __future__ import annotations

import os


def descendants(pid: int, stats: dict | None = None) -> list[int]:
    """A process and all its descendants."""
    stats = _proc_stats() if stats is None else stats
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(c for c, (ppid, _) in stats.items() if ppid == p)
    return out


def _proc_stats() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds used so far, user + system), for every process (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return stats


def _descendants_running(server_pid: int, matches, stats: dict | None = None) -> list[int]:
    """The processes under `server_pid` whose argv (a list of bytes) `matches` (`stats`: _proc_stats, if read)."""
    pids = []
    for p in descendants(server_pid, stats):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if matches(f.read().split(b"\0")):
                    pids.append(p)
        except OSError:
            continue
    return pids


def engine_pids(server_pid: int, stats: dict | None = None) -> list[int]:
    """The hf engine processes under a tritonserver (python -m launcher.hf.multiplexer)."""
    return _descendants_running(server_pid, lambda argv: b"launcher.hf.multiplexer" in argv, stats)


def stub_pids(server_pid: int, stats: dict | None = None) -> list[int]:
    """The python-backend stubs under a tritonserver (where the hf engine runs with engine_process=false)."""
    return _descendants_running(
        server_pid, lambda argv: os.path.basename(argv[0]) == b"triton_python_backend_stub", stats
    )


SERVER_ROLES = ("tritonserver", "stubs", "engine", "other")


def server_cpu_by_role(server_pid: int) -> dict[str, float]:
    """CPU seconds (user + system) used so far by a tritonserver and all its descendants, by role: the server itself
    (gRPC, the python backend's side of every request and response), its python stubs (parsing requests, building
    and sending responses; the engine too with engine_process=false), the hf engine processes, and anything else.
    Which of them a CPU-poor server runs out of decides what to make cheaper (128 streams on 8 vCPUs used 6.5-6.7 of
    them).  A process that exited meanwhile is not counted."""
    stats = _proc_stats()
    stubs, engines = set(stub_pids(server_pid, stats)), set(engine_pids(server_pid, stats))  # one read of /proc
    out = dict.fromkeys(SERVER_ROLES, 0.0)
    for p in descendants(server_pid, stats):
        if p in stats:
            role = (
                "tritonserver" if p == server_pid else "stubs" if p in stubs else "engine" if p in engines else "other"
            )
            out[role] += stats[p][1]
    return out
