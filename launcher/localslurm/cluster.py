"""`llmlaunch-localslurm up|down|status`: a real multi-node Slurm cluster on one machine.

Each "node" is a slurmd in its own network namespace (own IP on a private /24,
own hostname, own loopback and ports), so multi-node code paths - `srun
--mpi=pmix` across nodes, rank 0 on node1 reaching a server on node2 by name,
GPU binding through gres, submitit and its `sacct` polling - run for real
without a real cluster. The controller (slurmctld), accounting (slurmdbd +
MariaDB) and munge run in the host namespace, on the bridge address.

Use it from the shell::

    llmlaunch-localslurm up --nodes 4 --gpus-per-node 4
    export SLURM_CONF=/var/lib/llmlaunch-localslurm/etc/slurm.conf
    srun -N2 -n4 --mpi=pmix hostname
    llmlaunch-localslurm down

or from Python (tests use `tests/slurm_fixture.py`)::

    cluster = up(nodes=2, gpus_per_node=4)
    subprocess.run(["sinfo"], env={**os.environ, **cluster.env()})

Layout: the pure `render_*` functions (launcher/localslurm/conf.py) build every file and argv from a
`Spec`; here, `up`, `down` and `status` are the only functions with side effects. Every
pitfall quoted in a comment (marked "pitfall") was hit on this kind of machine;
README.md, "Slurm", says how to use it.

One cluster per machine: network namespace, interface names, ports and the
/etc/hosts block are global, whatever the state directory.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from launcher.localslurm.conf import (
    BRIDGE,
    CLUSTER_NAME,
    DB_PORT,
    DBD_PORT,
    DEFAULT_DIR,
    DIR_ENV,
    MAX_NODES,
    NETNS_PREFIX,
    PACKAGES,
    PARTITION,
    POLL_S,
    READY_STATES,
    STARTUP_TIMEOUT_S,
    STOP_TIMEOUT_S,
    DaemonStatus,
    LocalSlurm,
    LocalSlurmError,
    Spec,
    Status,
    gpu_files,
    render_daemon_argv,
    render_files,
    render_hosts_block,
    render_network,
    with_hosts_block,
    without_hosts_block,
)

# ------------------------------------------------------------------ side effects


def _log(msg: str) -> None:
    print(f"llmlaunch-localslurm: {msg}", file=sys.stderr, flush=True)


def resolve_dir(state_dir: str | os.PathLike | None) -> str:
    return os.path.abspath(os.fspath(state_dir or os.environ.get(DIR_ENV) or DEFAULT_DIR))


def _run(
    argv: list[str], check: bool = True, env: dict | None = None, timeout: float = 60.0, input: str | None = None
) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, input=input)
    except subprocess.TimeoutExpired:
        # A Slurm client hangs while munged or slurmctld is unreachable: a failure, not a crash.
        proc = subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout:.0f} s")
    if check and proc.returncode != 0:
        why = proc.stderr.strip() or proc.stdout.strip()
        raise LocalSlurmError(f"`{shlex.join(argv)}` failed (exit {proc.returncode}): {why}")
    return proc


def _slurm_env(spec_or_conf) -> dict[str, str]:
    conf = spec_or_conf.slurm_conf if isinstance(spec_or_conf, Spec) else spec_or_conf
    return {**os.environ, "SLURM_CONF": conf}


def _daemon_env(spec: Spec) -> dict[str, str]:
    # Without the caller's SLURM_* (e.g. `up` run inside a job of another cluster).
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**env, "SLURM_CONF": spec.slurm_conf}


def _require_root() -> None:
    if os.geteuid() != 0:
        raise LocalSlurmError(
            "llmlaunch-localslurm needs root (network namespaces, mknod, daemons as root).\n"
            "  1. run it as root: sudo llmlaunch-localslurm ...\n"
            "  2. or skip what needs it: pytest -m 'not slurm'"
        )


@contextlib.contextmanager
def _locked(state_dir: str):
    """One `up`/`down` at a time per state dir (e.g. several pytest workers)."""
    os.makedirs(state_dir, mode=0o755, exist_ok=True)
    with open(os.path.join(state_dir, "lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _ensure_packages() -> None:
    fmt = "${Package} ${Status}\n"
    out = _run(["dpkg-query", "-W", f"-f={fmt}", *PACKAGES], check=False).stdout
    installed = {line.split()[0] for line in out.splitlines() if line.endswith(" installed")}
    missing = [p for p in PACKAGES if p not in installed]
    if not missing:
        return
    _log(f"installing {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    if subprocess.run(install, env=env, stdout=sys.stderr).returncode != 0:
        _log("apt-get install failed; running apt-get update and retrying")
        subprocess.run(["apt-get", "update"], env=env, stdout=sys.stderr)
        if subprocess.run(install, env=env, stdout=sys.stderr).returncode != 0:
            raise LocalSlurmError(f"could not install {' '.join(missing)}; fix apt (see the output above) and rerun")


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


def _pidfile(spec: Spec, name: str) -> str:
    return spec.path("run", "pids", f"{name}.pid")


def _read_pid(pidfile: str) -> tuple[int, str] | None:
    try:
        pid, start = Path(pidfile).read_text().split()
        return int(pid), start
    except (OSError, ValueError):
        return None


def _alive_pid(pidfile: str) -> int | None:
    rec = _read_pid(pidfile)
    if rec and _start_time(rec[0]) == rec[1]:
        return rec[0]
    return None


def _start(spec: Spec, name: str, argv: list[str]) -> int:
    log = open(spec.path("log", f"{name}.out"), "ab")
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=spec.state_dir,
            env=_daemon_env(spec),
        )
    except FileNotFoundError as e:
        raise LocalSlurmError(f"cannot start {name}: {e}; run `llmlaunch-localslurm up` (it installs packages)") from e
    finally:
        log.close()
    _CHILDREN[proc.pid] = proc
    start = _start_time(proc.pid)
    if start is None:
        raise LocalSlurmError(f"{name} exited at once; see {spec.path('log', name + '.out')}")
    Path(_pidfile(spec, name)).write_text(f"{proc.pid} {start}\n")
    return proc.pid


def _stop_pids(pids: dict[str, tuple[int, str]], timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM every process, SIGKILL those still there after `timeout` (all-or-nothing)."""

    def alive():
        return {k: v for k, v in pids.items() if _start_time(v[0]) == v[1]}

    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        left = alive()
        if not left:
            return
        if sig == signal.SIGKILL:
            _log(f"SIGKILL to {', '.join(sorted(left))} (no exit {timeout:.0f} s after SIGTERM)")
        for pid, _ in left.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while alive() and time.monotonic() < deadline:
            time.sleep(POLL_S / 2)
    if alive():
        raise LocalSlurmError(f"could not stop {', '.join(sorted(alive()))}")


def _stop_daemons(spec: Spec, names: list[str]) -> None:
    recs = {}
    for name in names:
        rec = _read_pid(_pidfile(spec, name))
        if rec:
            recs[name] = rec
    _stop_pids(recs)
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_pidfile(spec, name))


def _pidfile_names(state_dir: str) -> list[str]:
    with contextlib.suppress(FileNotFoundError):
        return sorted(p[:-4] for p in os.listdir(os.path.join(state_dir, "run", "pids")) if p.endswith(".pid"))
    return []


# --- network


def _netns_list() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _netns_inode(ns: str) -> int | None:
    with contextlib.suppress(OSError):
        return os.stat(f"/run/netns/{ns}").st_ino
    return None


def _pids_in_netns(inodes: set[int]) -> dict[str, tuple[int, str]]:
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


def _link_exists(name: str) -> bool:
    return _run(["ip", "link", "show", name], check=False).returncode == 0


def _node_network_ok(spec: Spec, node: str) -> bool:
    ns = spec.netns(node)
    if _netns_inode(ns) is None or not _link_exists(spec.veth(node)):
        return False
    addr = _run(["ip", "-n", ns, "-o", "addr", "show", "dev", "eth0"], check=False).stdout
    links = _run(["ip", "-n", ns, "-o", "link", "show"], check=False).stdout  # eth0 and lo
    veth = _run(["ip", "-o", "link", "show", "dev", spec.veth(node)], check=False).stdout
    up = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if ",UP" in line}
    return (
        f" {spec.node_addr(node)}/24 " in addr and {"eth0", "lo"} <= up and f"master {BRIDGE}" in veth and ",UP" in veth
    )


def _remove_node_network(node: str) -> None:
    _run(["ip", "link", "del", Spec.veth(node)], check=False)
    _run(["ip", "netns", "del", Spec.netns(node)], check=False)


def _ensure_network(spec: Spec) -> set[str]:
    """Bridge plus one namespace per node; returns the nodes whose namespace was (re)made."""
    if not _link_exists(BRIDGE):
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    if f" {spec.ctl_addr}/24 " not in _run(["ip", "-o", "addr", "show", "dev", BRIDGE]).stdout:
        _run(["ip", "addr", "add", f"{spec.ctl_addr}/24", "dev", BRIDGE])
    _run(["ip", "link", "set", BRIDGE, "up"])
    remade = set()
    for node in spec.node_names:
        if _node_network_ok(spec, node):
            continue
        _log(f"network namespace {spec.netns(node)} ({spec.node_addr(node)})")
        _remove_node_network(node)
        for argv in render_network(spec, node):
            _run(argv)
        remade.add(node)
    # Not handled: on a host whose iptables FORWARD policy is DROP with
    # bridge-nf-call-iptables=1 (Docker hosts), node-to-node traffic would need an
    # ACCEPT rule for the bridge. Here (and in CI VMs) bridged traffic just flows.
    return remade


def _remove_network(nodes: list[str]) -> None:
    for node in nodes:
        _remove_node_network(node)
    if _link_exists(BRIDGE):
        _run(["ip", "link", "del", BRIDGE], check=False)


# --- files


def _write_if_changed(path: str, text: str | bytes, mode: int) -> bool:
    """Write in place (keeps the inode: /etc/hosts of the nodes is a bind mount of it)."""
    data = text.encode() if isinstance(text, str) else text
    with contextlib.suppress(FileNotFoundError):
        if Path(path).read_bytes() == data:
            os.chmod(path, mode)
            return False
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)
    return True


def _files_differ(spec: Spec) -> bool:
    for rel, (text, _mode) in render_files(spec).items():
        try:
            if Path(spec.path(rel)).read_text() != text:
                return True
        except OSError:
            return True
    return False


def _make_dirs(spec: Spec) -> None:
    dirs = ["etc", "run", "run/pids", "run/munge", "log", "munge", "spool/ctld", "dev", "mariadb"]
    dirs += [f"spool/{n}" for n in spec.node_names] + [f"tmp/{n}" for n in spec.node_names]
    os.chmod(spec.state_dir, 0o755)
    for d in dirs:
        os.makedirs(spec.path(d), exist_ok=True)
        # munged refuses group/other-writable directories; the socket's directory must be 755 (pitfall).
        os.chmod(spec.path(d), 0o700 if d in ("munge", "mariadb") else 0o755)


def _ensure_files(spec: Spec) -> None:
    _make_dirs(spec)
    for rel, (text, mode) in render_files(spec).items():
        _write_if_changed(spec.path(rel), text, mode)
    key = spec.path("munge", "munge.key")
    if not os.path.exists(key):
        _write_if_changed(key, secrets.token_bytes(1024), 0o400)
    wanted = set(gpu_files(spec))
    for f in Path(spec.path("dev")).iterdir():
        if str(f) not in wanted:
            f.unlink()
    for f in wanted:
        if not (os.path.exists(f) and os.stat(f).st_rdev == os.makedev(1, 3)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f)
            # Pitfall: plain files or /dev/null repeated do not work; distinct char devices do.
            _run(["mknod", "-m", "666", f, "c", "1", "3"])
    if not os.path.isdir(spec.path("mariadb", "mysql")):
        _log("initialising the accounting database")
        _run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={spec.path('mariadb')}",
                "--user=root",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ],
            timeout=120,
        )


def _ensure_etc_hosts(block: str | None) -> None:
    """Add (block given) or remove (None) our marked block in the host's /etc/hosts."""
    with contextlib.suppress(FileNotFoundError):
        text = Path("/etc/hosts").read_text()
        new = with_hosts_block(text, block) if block else without_hosts_block(text)
        if new != text:
            # In place, not rename: in containers /etc/hosts is often a bind mount.
            with open("/etc/hosts", "w") as f:
                f.write(new)


def _db_password(state_dir: str) -> str:
    path = os.path.join(state_dir, "etc", "db.password")
    with contextlib.suppress(FileNotFoundError):
        return Path(path).read_text().strip()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pw = secrets.token_hex(16)
    _write_if_changed(path, pw + "\n", 0o600)
    return pw


def _read_state(state_dir: str) -> dict:
    with contextlib.suppress(OSError, ValueError):
        return json.loads(Path(state_dir, "state.json").read_text())
    return {}


# --- readiness


def _wait(what: str, ready, spec: Spec, daemons: list[str], timeout: float = STARTUP_TIMEOUT_S) -> None:
    """Poll `ready()` until true; fail early if one of `daemons` died, or at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        if ready():
            return
        for daemon in daemons:
            if _alive_pid(_pidfile(spec, daemon)) is None:
                raise LocalSlurmError(f"{daemon} died while waiting for {what}; see {spec.path('log')}/{daemon}*")
        if time.monotonic() > deadline:
            raise LocalSlurmError(f"timed out after {timeout:.0f} s waiting for {what}; see {spec.path('log')}/")
        time.sleep(POLL_S)


def _tcp_open(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


def _munge_ok(spec: Spec) -> bool:
    cred = _run(["munge", "-n", "-S", spec.munge_socket], check=False)
    if cred.returncode != 0:
        return False
    return _run(["unmunge", "-S", spec.munge_socket], check=False, input=cred.stdout).returncode == 0


def _ctld_ok(spec: Spec) -> bool:
    return " is UP" in _run(["scontrol", "ping"], check=False, env=_slurm_env(spec), timeout=20).stdout


def _node_states(conf: str) -> dict[str, str]:
    out = _run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, env=_slurm_env(conf), timeout=20)
    if out.returncode != 0:
        return {}
    states = {}
    for line in out.stdout.splitlines():
        name, state = line.split()
        states[name] = state
    return states


def _nodes_ready(spec: Spec, resumed: set[str]) -> bool:
    states = _node_states(spec.slurm_conf)
    for node, state in states.items():
        # A responding node left DOWN/DRAINED by an earlier crash is put back to work once.
        stuck = state.rstrip("$~#!%@^-") in ("down", "drain", "drng", "fail")
        if node not in resumed and not state.endswith("*") and stuck:
            _run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False, env=_slurm_env(spec))
            resumed.add(node)
    return set(states) == set(spec.node_names) and all(s in READY_STATES for s in states.values())


def _register_cluster(spec: Spec) -> None:
    env = _slurm_env(spec)
    listed = _run(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"], env=env).stdout.split()
    if CLUSTER_NAME not in listed:
        _run(["sacctmgr", "-i", "add", "cluster", CLUSTER_NAME], env=env)


# --- the three operations


def _spec(nodes: int, gpus_per_node: int, state_dir: str) -> Spec:
    return Spec(
        state_dir=state_dir,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        ctl_hostname=socket.gethostname().split(".")[0],
        db_password=_db_password(state_dir),
    )


def _handle(spec: Spec) -> LocalSlurm:
    return LocalSlurm(
        state_dir=spec.state_dir,
        slurm_conf=spec.slurm_conf,
        nodes=spec.node_names,
        node_addrs=spec.node_addrs,
        gpus_per_node=spec.gpus_per_node,
    )


def _is_up(spec: Spec) -> bool:
    return (
        not _files_differ(spec)
        and all(_alive_pid(_pidfile(spec, d)) for d in spec.daemons())
        and set(_pidfile_names(spec.state_dir)) == set(spec.daemons())
        and all(_node_network_ok(spec, n) for n in spec.node_names)
        and _nodes_ready(spec, resumed=set(spec.node_names))  # a check only: resume nothing
    )


def up(nodes: int = 4, gpus_per_node: int = 4, state_dir: str | os.PathLike | None = None) -> LocalSlurm:
    """Bring the cluster up (or repair it, or reconfigure it) and return it once every node is idle.

    Idempotent: when it is already up with this shape, it does nothing. A different
    `nodes`/`gpus_per_node` than the running cluster means down, then up. Needs root;
    raises LocalSlurmError (with the remedy) on failure.
    """
    if not 1 <= nodes <= MAX_NODES:
        raise LocalSlurmError(f"--nodes {nodes}: give 1 to {MAX_NODES}")
    if not 0 <= gpus_per_node <= 64:
        raise LocalSlurmError(f"--gpus-per-node {gpus_per_node}: give 0 to 64")
    _require_root()
    state_dir = resolve_dir(state_dir)
    with _locked(state_dir):
        spec = _spec(nodes, gpus_per_node, state_dir)
        if _is_up(spec):
            _log(f"already up: {nodes} nodes x {gpus_per_node} GPUs, nothing to do")
            return _handle(spec)
        _ensure_packages()
        # Changed files (another shape, another hostname) or slurmds of nodes the
        # new shape lacks: start from nothing rather than patch running daemons.
        if _files_differ(spec) or set(_pidfile_names(state_dir)) - set(spec.daemons()):
            if any(_alive_pid(_pidfile(spec, d)) for d in _pidfile_names(state_dir)):
                _log("configuration changed: reconfiguring (down, then up)")
            _down(state_dir)
        _ensure_files(spec)
        remade = _ensure_network(spec)
        _ensure_etc_hosts(render_hosts_block(spec))
        Path(state_dir, "state.json").write_text(json.dumps({"nodes": nodes, "gpus_per_node": gpus_per_node}) + "\n")
        # A slurmd whose namespace was remade lives in a dead network: restart it.
        stale = [f"slurmd.{n}" for n in remade if _alive_pid(_pidfile(spec, f"slurmd.{n}"))]
        if stale:
            _stop_daemons(spec, stale)
        argv = render_daemon_argv(spec)
        ready = {
            "munged": ("munge", lambda: _munge_ok(spec)),
            "mariadbd": ("MariaDB", lambda: _tcp_open("127.0.0.1", DB_PORT)),
            "slurmdbd": ("slurmdbd", lambda: _tcp_open(spec.ctl_addr, DBD_PORT)),
            "slurmctld": ("slurmctld", lambda: _ctld_ok(spec)),
        }
        started = []
        for name in spec.daemons():
            if _alive_pid(_pidfile(spec, name)):
                continue
            _log(f"starting {name}")
            _start(spec, name, argv[name])
            started.append(name)
            if name in ready:
                what, check = ready[name]
                _wait(what, check, spec, [name])
                if name == "slurmdbd":
                    _register_cluster(spec)
        resumed: set[str] = set()
        _log(f"waiting for {nodes} nodes to be idle")
        _wait("every node to register (sinfo idle)", lambda: _nodes_ready(spec, resumed), spec, list(spec.daemons()))
        dead = [d for d in spec.daemons() if not _alive_pid(_pidfile(spec, d))]
        if dead:
            raise LocalSlurmError(f"{', '.join(dead)} died during start; see the logs in {spec.path('log')}")
        _log(
            f"up: {', '.join(f'{n}={a}' for n, a in spec.node_addrs.items())}, partition {PARTITION}, "
            f"{gpus_per_node} GPUs per node (started {len(started)} daemons)"
        )
        return _handle(spec)


def _cancel_all_jobs(conf: str) -> None:
    """Cancel every job, so accounting records CANCELLED rather than a job lost with its node."""
    env = _slurm_env(conf)
    live = ["squeue", "-h", "-o", "%A", "-t", "PENDING,RUNNING,SUSPENDED,CONFIGURING,REQUEUED,RESIZING"]
    jobs = _run(live, check=False, env=env, timeout=20).stdout.split()
    if not jobs:
        return
    _log(f"cancelling {len(jobs)} jobs")
    _run(["scancel", *jobs], check=False, env=env)
    # Wait for CANCELLED only, not for COMPLETING: tasks that ignore SIGTERM (submitit's
    # do) would hold us KillWait seconds; the namespace sweep below kills them anyway.
    deadline = time.monotonic() + 10
    while _run(live, check=False, env=env, timeout=20).stdout.split() and time.monotonic() < deadline:
        time.sleep(POLL_S)


def _down(state_dir: str) -> None:
    spec = Spec(state_dir=state_dir)
    names = _pidfile_names(state_dir)
    if "slurmctld" in names and _alive_pid(_pidfile(spec, "slurmctld")):
        _cancel_all_jobs(spec.slurm_conf)
    nodes = sorted(
        {n.split(".", 1)[1] for n in names if n.startswith("slurmd.")}
        | {ns[len(NETNS_PREFIX) :] for ns in _netns_list() if ns.startswith(NETNS_PREFIX + "node")}
    )
    slurmds = [n for n in names if n.startswith("slurmd.")]
    # Job steps (slurmstepd and tasks) outlive slurmd, and slurmd waits for them
    # before it exits; whatever runs in a node namespace is ours by construction.
    # Stop those first, quickly: they belong to jobs just cancelled.
    inodes = {i for i in (_netns_inode(Spec.netns(n)) for n in nodes) if i is not None}
    own = {rec[0] for rec in (_read_pid(_pidfile(spec, n)) for n in slurmds) if rec}
    leftovers = {k: v for k, v in _pids_in_netns(inodes).items() if v[0] not in own} if inodes else {}
    if leftovers:
        _log(f"stopping {len(leftovers)} job processes in the node namespaces")
        _stop_pids(leftovers, timeout=1.0)  # slurmstepd and submitit ignore SIGTERM: SIGKILL soon
    if slurmds:
        _log(f"stopping {len(slurmds)} slurmd")
        _stop_daemons(spec, slurmds)
    leftovers = _pids_in_netns(inodes) if inodes else {}
    if leftovers:
        _log(f"stopping {len(leftovers)} leftover processes in the node namespaces")
        _stop_pids(leftovers, timeout=2.0)
    for name in ("slurmctld", "slurmdbd", "mariadbd", "munged"):
        if name in names:
            _log(f"stopping {name}")
            _stop_daemons(spec, [name])
    _remove_network(nodes)
    _ensure_etc_hosts(None)


def down(state_dir: str | os.PathLike | None = None, purge: bool = False) -> None:
    """Stop every daemon of ours (by PID file), remove the namespaces, bridge and /etc/hosts block.

    Idempotent. `purge` also deletes the state directory (accounting database, job state, munge key).
    """
    _require_root()
    state_dir = resolve_dir(state_dir)
    with _locked(state_dir):
        _down(state_dir)
    if purge:
        shutil.rmtree(state_dir, ignore_errors=True)
    _log("down")


def status(state_dir: str | os.PathLike | None = None) -> Status:
    """What runs: each daemon (pid, alive) and each node's state in sinfo."""
    state_dir = resolve_dir(state_dir)
    st = _read_state(state_dir)
    spec = Spec(state_dir=state_dir, nodes=int(st.get("nodes", 0)), gpus_per_node=int(st.get("gpus_per_node", 0)))
    names = list(spec.daemons()) if st else []
    names += [n for n in _pidfile_names(state_dir) if n not in names]
    daemons = []
    for name in names:
        rec = _read_pid(_pidfile(spec, name))
        daemons.append(DaemonStatus(name, rec[0] if rec else None, _alive_pid(_pidfile(spec, name)) is not None))
    alive = {d.name for d in daemons if d.alive}
    nodes = _node_states(spec.slurm_conf) if {"munged", "slurmctld"} <= alive else {}
    is_up = (
        bool(st)
        and all(d.alive for d in daemons)
        and set(nodes) == set(spec.node_names)
        and all(s in READY_STATES for s in nodes.values())
    )
    return Status(up=is_up, daemons=tuple(daemons), nodes=nodes, slurm_conf=spec.slurm_conf)


# --------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmlaunch-localslurm", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    dir_help = f"state directory (default: ${DIR_ENV} or {DEFAULT_DIR})"
    u = sub.add_parser("up", help="start (or repair, or reconfigure) the cluster")
    u.add_argument("--nodes", type=int, default=4, help="number of nodes, node1..nodeN (default 4)")
    u.add_argument("--gpus-per-node", type=int, default=4, help="fake GPUs per node (default 4)")
    u.add_argument("--dir", default=None, help=dir_help)
    d = sub.add_parser("down", help="stop everything it started and remove its network and /etc/hosts block")
    d.add_argument("--dir", default=None, help=dir_help)
    d.add_argument("--purge", action="store_true", help="also delete the state directory")
    s = sub.add_parser("status", help="daemons and node states; exit 0 if up, 1 if not")
    s.add_argument("--dir", default=None, help=dir_help)
    s.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "up":
            t0 = time.monotonic()
            cluster = up(args.nodes, args.gpus_per_node, args.dir)
            _log(f"ready in {time.monotonic() - t0:.1f} s")
            print(f"export SLURM_CONF={shlex.quote(cluster.slurm_conf)}")
            return 0
        if args.cmd == "down":
            down(args.dir, purge=args.purge)
            return 0
        st = status(args.dir)
        if args.json:
            print(
                json.dumps(
                    {
                        "up": st.up,
                        "slurm_conf": st.slurm_conf,
                        "nodes": st.nodes,
                        "daemons": [d.__dict__ for d in st.daemons],
                    },
                    indent=2,
                )
            )
        else:
            sys.stdout.write(st.render())
        return 0 if st.up else 1
    except LocalSlurmError as e:
        print(f"llmlaunch-localslurm: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
