"""The cluster's daemons as processes: PID files that hold "pid starttime" (so a recycled PID is never taken for
ours), starting and stopping them, the processes left in the node namespaces, and the checks that say a daemon, the
controller or the nodes are ready."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from launcher.localslurm.conf import (
    CLUSTER_NAME,
    POLL_S,
    READY_STATES,
    STARTUP_TIMEOUT_S,
    STOP_TIMEOUT_S,
    LocalSlurmError,
    Spec,
)
from launcher.localslurm.host import log, run, slurm_env


def _daemon_env(spec: Spec) -> dict[str, str]:
    # Without the caller's SLURM_* (e.g. `up` run inside a job of another cluster).
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**env, "SLURM_CONF": spec.slurm_conf}


# --- processes: PID files hold "pid starttime", so a recycled PID is never taken for ours.

# Popen objects of daemons started by this process, kept so they are reaped, not leaked as zombies.
_CHILDREN: dict[int, subprocess.Popen] = {}


def _start_time(pid: int) -> str | None:
    """The process start time (clock ticks since boot), or None if `pid` is gone or a zombie."""
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        _CHILDREN.pop(pid, None)
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def pid_file(spec: Spec, name: str) -> str:
    return spec.path("run", "pids", f"{name}.pid")


def read_pid(pidfile: str) -> tuple[int, str] | None:
    try:
        pid, start = Path(pidfile).read_text().split()
        return int(pid), start
    except (OSError, ValueError):
        return None


def alive_pid(pidfile: str) -> int | None:
    rec = read_pid(pidfile)
    if rec and _start_time(rec[0]) == rec[1]:
        return rec[0]
    return None


def start_daemon(spec: Spec, name: str, argv: list[str]) -> int:
    out = open(spec.path("log", f"{name}.out"), "ab")
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=spec.state_dir,
            env=_daemon_env(spec),
        )
    except FileNotFoundError as e:
        raise LocalSlurmError(f"cannot start {name}: {e}; run `llmlaunch-localslurm up` (it installs packages)") from e
    finally:
        out.close()
    _CHILDREN[proc.pid] = proc
    start = _start_time(proc.pid)
    if start is None:
        raise LocalSlurmError(f"{name} exited at once; see {spec.path('log', name + '.out')}")
    Path(pid_file(spec, name)).write_text(f"{proc.pid} {start}\n")
    return proc.pid


def stop_pids(pids: dict[str, tuple[int, str]], timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM every process, SIGKILL those still there after `timeout` (all-or-nothing)."""

    def alive():
        return {k: v for k, v in pids.items() if _start_time(v[0]) == v[1]}

    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        left = alive()
        if not left:
            return
        if sig == signal.SIGKILL:
            log(f"SIGKILL to {', '.join(sorted(left))} (no exit {timeout:.0f} s after SIGTERM)")
        for pid, _ in left.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while alive() and time.monotonic() < deadline:
            time.sleep(POLL_S / 2)
    if alive():
        raise LocalSlurmError(f"could not stop {', '.join(sorted(alive()))}")


def stop_daemons(spec: Spec, names: list[str]) -> None:
    recs = {}
    for name in names:
        rec = read_pid(pid_file(spec, name))
        if rec:
            recs[name] = rec
    stop_pids(recs)
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pid_file(spec, name))


def pid_file_names(state_dir: str) -> list[str]:
    with contextlib.suppress(FileNotFoundError):
        return sorted(p[:-4] for p in os.listdir(os.path.join(state_dir, "run", "pids")) if p.endswith(".pid"))
    return []


def pids_in_netns(inodes: set[int]) -> dict[str, tuple[int, str]]:
    """Processes living in our node namespaces (slurmstepd, job tasks): ours by construction, no name needed."""
    found = {}
    wanted = {f"net:[{i}]" for i in inodes}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{entry}/ns/net") in wanted:
                start = _start_time(int(entry))
                if start:
                    found[f"pid {entry}"] = (int(entry), start)
    return found


# --- readiness


def wait_for(what: str, ready, spec: Spec, daemons: list[str], timeout: float = STARTUP_TIMEOUT_S) -> None:
    """Poll `ready()` until true; fail early if one of `daemons` died, or at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        if ready():
            return
        for daemon in daemons:
            if alive_pid(pid_file(spec, daemon)) is None:
                raise LocalSlurmError(f"{daemon} died while waiting for {what}; see {spec.path('log')}/{daemon}*")
        if time.monotonic() > deadline:
            raise LocalSlurmError(f"timed out after {timeout:.0f} s waiting for {what}; see {spec.path('log')}/")
        time.sleep(POLL_S)


def tcp_open(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


def munge_ok(spec: Spec) -> bool:
    cred = run(["munge", "-n", "-S", spec.munge_socket], check=False)
    if cred.returncode != 0:
        return False
    return run(["unmunge", "-S", spec.munge_socket], check=False, input=cred.stdout).returncode == 0


def ctld_ok(spec: Spec) -> bool:
    return " is UP" in run(["scontrol", "ping"], check=False, env=slurm_env(spec), timeout=20).stdout


def node_states(conf: str) -> dict[str, str]:
    out = run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, env=slurm_env(conf), timeout=20)
    if out.returncode != 0:
        return {}
    states = {}
    for line in out.stdout.splitlines():
        name, state = line.split()
        states[name] = state
    return states


def nodes_ready(spec: Spec, resumed: set[str]) -> bool:
    states = node_states(spec.slurm_conf)
    for node, state in states.items():
        # A responding node left DOWN/DRAINED by an earlier crash is put back to work once.
        stuck = state.rstrip("$~#!%@^-") in ("down", "drain", "drng", "fail")
        if node not in resumed and not state.endswith("*") and stuck:
            run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False, env=slurm_env(spec))
            resumed.add(node)
    return set(states) == set(spec.node_names) and all(s in READY_STATES for s in states.values())


def register_cluster(spec: Spec) -> None:
    env = slurm_env(spec)
    listed = run(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"], env=env).stdout.split()
    if CLUSTER_NAME not in listed:
        run(["sacctmgr", "-i", "add", "cluster", CLUSTER_NAME], env=env)
