"""The machine's side of the local Slurm cluster: running commands, root and the state directory's lock, the
packages, the bridge and one network namespace per node, and the state directory's files (configuration, munge key,
fake GPU devices, the accounting database) and the host's /etc/hosts block.  Every file and argv comes from the pure
renderers of launcher/localslurm/conf.py."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shlex
import subprocess
import sys
from pathlib import Path

from launcher.localslurm.conf import (
    BRIDGE,
    PACKAGES,
    LocalSlurmError,
    Spec,
    gpu_files,
    render_files,
    render_network,
    with_hosts_block,
    without_hosts_block,
)


def log(msg: str) -> None:
    print(f"llmlaunch-localslurm: {msg}", file=sys.stderr, flush=True)


def run(
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


def slurm_env(spec_or_conf) -> dict[str, str]:
    conf = spec_or_conf.slurm_conf if isinstance(spec_or_conf, Spec) else spec_or_conf
    return {**os.environ, "SLURM_CONF": conf}


def require_root() -> None:
    if os.geteuid() != 0:
        raise LocalSlurmError(
            "llmlaunch-localslurm needs root (network namespaces, mknod, daemons as root).\n"
            "  1. run it as root: sudo llmlaunch-localslurm ...\n"
            "  2. or skip what needs it: pytest -m 'not slurm'"
        )


@contextlib.contextmanager
def locked(state_dir: str):
    """One `up`/`down` at a time per state dir (e.g. several pytest workers)."""
    os.makedirs(state_dir, mode=0o755, exist_ok=True)
    with open(os.path.join(state_dir, "lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_packages() -> None:
    fmt = "${Package} ${Status}\n"
    out = run(["dpkg-query", "-W", f"-f={fmt}", *PACKAGES], check=False).stdout
    installed = {line.split()[0] for line in out.splitlines() if line.endswith(" installed")}
    missing = [p for p in PACKAGES if p not in installed]
    if not missing:
        return
    log(f"installing {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    if subprocess.run(install, env=env, stdout=sys.stderr).returncode != 0:
        log("apt-get install failed; running apt-get update and retrying")
        subprocess.run(["apt-get", "update"], env=env, stdout=sys.stderr)
        if subprocess.run(install, env=env, stdout=sys.stderr).returncode != 0:
            raise LocalSlurmError(f"could not install {' '.join(missing)}; fix apt (see the output above) and rerun")


# --- network


def netns_list() -> list[str]:
    out = run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_inode(ns: str) -> int | None:
    with contextlib.suppress(OSError):
        return os.stat(f"/run/netns/{ns}").st_ino
    return None


def _link_exists(name: str) -> bool:
    return run(["ip", "link", "show", name], check=False).returncode == 0


def node_network_ok(spec: Spec, node: str) -> bool:
    ns = spec.netns(node)
    if netns_inode(ns) is None or not _link_exists(spec.veth(node)):
        return False
    addr = run(["ip", "-n", ns, "-o", "addr", "show", "dev", "eth0"], check=False).stdout
    links = run(["ip", "-n", ns, "-o", "link", "show"], check=False).stdout  # eth0 and lo
    veth = run(["ip", "-o", "link", "show", "dev", spec.veth(node)], check=False).stdout
    up = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if ",UP" in line}
    return (
        f" {spec.node_addr(node)}/24 " in addr and {"eth0", "lo"} <= up and f"master {BRIDGE}" in veth and ",UP" in veth
    )


def _remove_node_network(node: str) -> None:
    run(["ip", "link", "del", Spec.veth(node)], check=False)
    run(["ip", "netns", "del", Spec.netns(node)], check=False)


def ensure_network(spec: Spec) -> set[str]:
    """Bridge plus one namespace per node; returns the nodes whose namespace was (re)made."""
    if not _link_exists(BRIDGE):
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    if f" {spec.ctl_addr}/24 " not in run(["ip", "-o", "addr", "show", "dev", BRIDGE]).stdout:
        run(["ip", "addr", "add", f"{spec.ctl_addr}/24", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])
    remade = set()
    for node in spec.node_names:
        if node_network_ok(spec, node):
            continue
        log(f"network namespace {spec.netns(node)} ({spec.node_addr(node)})")
        _remove_node_network(node)
        for argv in render_network(spec, node):
            run(argv)
        remade.add(node)
    # Not handled: on a host whose iptables FORWARD policy is DROP with
    # bridge-nf-call-iptables=1 (Docker hosts), node-to-node traffic would need an
    # ACCEPT rule for the bridge. Here (and in CI VMs) bridged traffic just flows.
    return remade


def remove_network(nodes: list[str]) -> None:
    for node in nodes:
        _remove_node_network(node)
    if _link_exists(BRIDGE):
        run(["ip", "link", "del", BRIDGE], check=False)


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


def files_differ(spec: Spec) -> bool:
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


def ensure_files(spec: Spec) -> None:
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
            run(["mknod", "-m", "666", f, "c", "1", "3"])
    if not os.path.isdir(spec.path("mariadb", "mysql")):
        log("initialising the accounting database")
        run(
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


def ensure_etc_hosts(block: str | None) -> None:
    """Add (block given) or remove (None) our marked block in the host's /etc/hosts."""
    with contextlib.suppress(FileNotFoundError):
        text = Path("/etc/hosts").read_text()
        new = with_hosts_block(text, block) if block else without_hosts_block(text)
        if new != text:
            # In place, not rename: in containers /etc/hosts is often a bind mount.
            with open("/etc/hosts", "w") as f:
                f.write(new)


def db_password(state_dir: str) -> str:
    path = os.path.join(state_dir, "etc", "db.password")
    with contextlib.suppress(FileNotFoundError):
        return Path(path).read_text().strip()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pw = secrets.token_hex(16)
    _write_if_changed(path, pw + "\n", 0o600)
    return pw


def read_state(state_dir: str) -> dict:
    with contextlib.suppress(OSError, ValueError):
        return json.loads(Path(state_dir, "state.json").read_text())
    return {}
