"""The local Slurm cluster's configuration: its constants, the `Spec` every file depends on, and the pure
`render_*` functions that build every file and argv from it (no I/O). `llmlaunch-localslurm`
(launcher/localslurm/cluster.py) writes what these return (launcher/localslurm/host.py) and runs the daemons
(launcher/localslurm/daemons.py); tests/unit/test_localslurm_render.py checks them without root.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass

DEFAULT_DIR = "/var/lib/llmlaunch-localslurm"
DIR_ENV = "LLMLAUNCH_LOCALSLURM_DIR"
CLUSTER_NAME = "llmlaunch"  # ClusterName, also the cluster registered in accounting
PARTITION = "local"  # the only partition; Default=YES, all nodes
SUBNET = "10.213.7"  # private /24: .1 = bridge = controller, node i = .(10+i)
NODE_ADDR_OFFSET = 10
MAX_NODES = 200  # keeps every node address inside the /24
BRIDGE = "llmls-br0"  # interface names are at most 15 characters
NETNS_PREFIX = "llmls-"  # netns "llmls-node1"; host side of its veth "llmls-v1"
CTLD_PORT = 16817  # not Slurm's defaults (6817-6819): a system Slurm may own those
SLURMD_PORT = 16818  # every node has its own namespace, so one port serves all
DBD_PORT = 16819
DB_PORT = 16306  # MariaDB, bound to 127.0.0.1 only
NODE_CPUS = 8  # declared, not real: SlurmdParameters=config_overrides allows it
NODE_MEMORY_MB = 4096  # declared per node (RealMemory)
HOSTS_BEGIN = "# llmlaunch-localslurm begin"
HOSTS_END = "# llmlaunch-localslurm end"
# libpmix-dev is required (pitfall): without it `srun --mpi=list` still lists
# pmix, but every pmix step fails with "pmi/pmix: can not load PMIx library"
# because the plugin opens the unversioned libpmix.so.
PACKAGES = (
    "slurmctld",
    "slurmd",
    "slurm-client",
    "slurmdbd",
    "mariadb-server",
    "munge",
    "libpmix2",
    "libpmix-dev",
    "openmpi-bin",
    "libopenmpi-dev",
    "iproute2",
    "util-linux",
)
# Node states (sinfo %t) that mean "registered and usable".
READY_STATES = frozenset({"idle", "mix", "alloc", "comp"})
STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
POLL_S = 0.1


class LocalSlurmError(RuntimeError):
    """A failure with the remedy in its message; the CLI prints it and exits 2."""


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Spec:
    """Everything the rendered files depend on. Pure data: no I/O."""

    state_dir: str  # absolute; every file of the cluster lives below it
    nodes: int = 4  # number of slurmd "nodes", named node1..nodeN
    gpus_per_node: int = 4  # fake GPUs per node (gres gpu)
    ctl_hostname: str = "localhost"  # short hostname of this machine: slurmctld and slurmdbd refuse other names
    db_password: str = ""  # MariaDB password of the `slurm` user (random, kept in etc/db.password)

    def path(self, *parts: str) -> str:
        return os.path.join(self.state_dir, *parts)

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(f"node{i}" for i in range(1, self.nodes + 1))

    @property
    def ctl_addr(self) -> str:
        return f"{SUBNET}.1"

    def node_addr(self, node: str) -> str:
        return f"{SUBNET}.{NODE_ADDR_OFFSET + int(node[len('node') :])}"

    @property
    def node_addrs(self) -> dict[str, str]:
        return {n: self.node_addr(n) for n in self.node_names}

    @staticmethod
    def netns(node: str) -> str:
        return f"{NETNS_PREFIX}{node}"

    @staticmethod
    def veth(node: str) -> str:
        return f"{NETNS_PREFIX}v{node[len('node') :]}"

    @property
    def slurm_conf(self) -> str:
        return self.path("etc", "slurm.conf")

    @property
    def munge_socket(self) -> str:
        return self.path("run", "munge", "munge.socket")

    def daemons(self) -> tuple[str, ...]:
        """Daemon names in start order (stop order is the reverse)."""
        return ("munged", "mariadbd", "slurmdbd", "slurmctld") + tuple(f"slurmd.{n}" for n in self.node_names)


@dataclass(frozen=True)
class LocalSlurm:
    """A running local cluster, as other code needs it."""

    state_dir: str  # where its files live
    slurm_conf: str  # clients set SLURM_CONF to this
    nodes: tuple[str, ...]  # node names, node1..nodeN; they resolve from the host and from every node
    node_addrs: dict  # node name -> IP address on the private /24
    gpus_per_node: int  # fake GPUs per node: --gpus-per-node / --gres=gpu:N work up to this
    partition: str = PARTITION  # the only (and default) partition

    def env(self) -> dict[str, str]:
        """Environment that points Slurm clients (srun, sbatch, sacct, submitit) at this cluster."""
        return {"SLURM_CONF": self.slurm_conf}


@dataclass(frozen=True)
class DaemonStatus:
    name: str  # munged, mariadbd, slurmdbd, slurmctld, slurmd.nodeN
    pid: int | None  # from our PID file; None when there is none
    alive: bool  # the PID is running and is the process we started (start time matches)


@dataclass(frozen=True)
class Status:
    up: bool  # every daemon alive and every node registered (idle/mix/alloc)
    daemons: tuple[DaemonStatus, ...]
    nodes: dict  # node name -> sinfo state (compact, e.g. "idle", "down*"); empty when slurmctld is down
    slurm_conf: str

    def render(self) -> str:
        lines = [f"cluster: {'up' if self.up else 'not up'}  (SLURM_CONF={self.slurm_conf})", "daemons:"]
        for d in self.daemons:
            lines.append(f"  {d.name:<16} pid={d.pid if d.pid else '-':<8} {'alive' if d.alive else 'dead'}")
        lines.append("nodes:" if self.nodes else "nodes: (sinfo unavailable)")
        for name, state in self.nodes.items():
            lines.append(f"  {name:<8} {state}")
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------- rendering


def _header(spec: Spec, what: str) -> str:
    return (
        f"# {what}: generated by llmlaunch-localslurm (launcher/localslurm/cluster.py); "
        "`llmlaunch-localslurm up` rewrites it.\n"
        f"# Use with: export SLURM_CONF={spec.slurm_conf}\n"
    )


def render_slurm_conf(spec: Spec) -> str:
    d = spec.path
    nodes = ",".join(spec.node_names)
    gres = f" Gres=gpu:{spec.gpus_per_node}" if spec.gpus_per_node else ""
    node_lines = "".join(
        f"NodeName={n} NodeHostname={n} NodeAddr={spec.node_addr(n)} CPUs={NODE_CPUS} Sockets=1 "
        f"CoresPerSocket={NODE_CPUS} ThreadsPerCore=1 RealMemory={NODE_MEMORY_MB}{gres} State=UNKNOWN\n"
        for n in spec.node_names
    )
    return f"""{_header(spec, "slurm.conf")}ClusterName={CLUSTER_NAME}
SlurmctldHost={spec.ctl_hostname}({spec.ctl_addr})
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
# Private munge socket: no system munged is needed or touched. cred_expire (a step credential's lifetime) is also
# how long a requeued job waits before it may start again, 120 s by default: 20 s brings a requeued job back soon on
# this one-machine cluster and still gives a step launched on two busy cores the time to present its credential.
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={spec.munge_socket},cred_expire=20
StateSaveLocation={d("spool", "ctld")}
# The nodes share one filesystem, so every per-node path carries %n.
SlurmdSpoolDir={d("spool", "%n")}
SlurmctldPidFile={d("run", "slurmctld.pid")}
SlurmdPidFile={d("run", "slurmd.%n.pid")}
SlurmctldLogFile={d("log", "slurmctld.log")}
SlurmdLogFile={d("log", "slurmd.%n.log")}
# Pitfall: the nodes share /tmp; with one TmpFS 2-node pmix steps fail with
# 'Cannot create directory "/tmp/spmix_appdir_...": File exists'.
TmpFS={d("tmp", "%n")}
# No cgroups: the nodes share one kernel, and a container may not offer them.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# The nodes share one process table, so per-node memory sampling means nothing.
JobAcctGatherType=jobacct_gather/none
# Pitfall kept on purpose: a launcher that forgets --mpi=pmix fails at MPI init.
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Nodes declare more CPUs and memory than the machine has.
SlurmdParameters=config_overrides
# A node restarted by `up` (repair) comes back by itself instead of staying DOWN.
ReturnToService=2
# Short waits keep scancel and teardown quick (defaults are 30 s and more).
KillWait=5
InactiveLimit=0
MinJobAge=300
# Accounting, so `sacct` works: without it a cancelled submitit job makes
# job.result() hang. Pitfall: slurmctld reaches slurmdbd through the private
# munge socket only if AccountingStoragePass names it (AuthInfo is not enough).
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost={spec.ctl_addr}
AccountingStoragePort={DBD_PORT}
AccountingStoragePass={spec.munge_socket}
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none
# No mail on this cluster (the default program does not exist and slurmctld logs an error).
MailProg=/bin/true
# Fake GPUs: character devices listed in gres.conf (AutoDetect=off).
GresTypes=gpu
{node_lines}PartitionName={PARTITION} Nodes={nodes} Default=YES MaxTime=INFINITE State=UP
"""


def render_gres_conf(spec: Spec) -> str:
    # Pitfall: plain files or a repeated /dev/null do not work as gres files;
    # distinct character devices (mknod c 1 3) do, and give
    # CUDA_VISIBLE_DEVICES=0,1,2 for --gpus-per-node=3.
    text = _header(spec, "gres.conf") + "AutoDetect=off\n"
    if spec.gpus_per_node:
        text += f"NodeName={','.join(spec.node_names)} Name=gpu File={gpu_files_expr(spec)}\n"
    return text


def gpu_files_expr(spec: Spec) -> str:
    """The gres.conf File= value: <dir>/dev/nvidia[0-G-1] (a Slurm host-range expression)."""
    g = spec.gpus_per_node
    return spec.path("dev", "nvidia0" if g == 1 else f"nvidia[0-{g - 1}]")


def gpu_files(spec: Spec) -> tuple[str, ...]:
    return tuple(spec.path("dev", f"nvidia{i}") for i in range(spec.gpus_per_node))


def render_slurmdbd_conf(spec: Spec) -> str:
    return f"""{_header(spec, "slurmdbd.conf")}AuthType=auth/munge
AuthInfo=socket={spec.munge_socket}
# slurmdbd refuses to start unless DbdHost is this machine's short hostname.
DbdHost={spec.ctl_hostname}
DbdAddr={spec.ctl_addr}
DbdPort={DBD_PORT}
SlurmUser=root
PidFile={spec.path("run", "slurmdbd.pid")}
LogFile={spec.path("log", "slurmdbd.log")}
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={DB_PORT}
StorageUser=slurm
StoragePass={spec.db_password}
StorageLoc=slurm_acct_db
"""


def render_mariadb_init(spec: Spec) -> str:
    # Run by mariadbd at every start (--init-file), so it must be idempotent.
    pw = spec.db_password.replace("\\", "\\\\").replace("'", "\\'")
    return (
        f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{pw}';\n"
        f"ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{pw}';\n"
        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';\n"
    )


def render_hosts(spec: Spec) -> str:
    """/etc/hosts inside every node (bind-mounted there): node names and the controller resolve."""
    lines = [
        "# /etc/hosts of the llmlaunch-localslurm nodes: generated by launcher/localslurm/cluster.py",
        "127.0.0.1 localhost",
        "::1 localhost ip6-localhost ip6-loopback",
        f"{spec.ctl_addr} {spec.ctl_hostname}",
    ]
    lines += [f"{addr} {name}" for name, addr in spec.node_addrs.items()]
    return "\n".join(lines) + "\n"


def render_hosts_block(spec: Spec) -> str:
    """The block added to the host's /etc/hosts, so grpc://node1:PORT works from the login side."""
    body = "".join(f"{addr} {name}\n" for name, addr in spec.node_addrs.items())
    return f"{HOSTS_BEGIN} (llmlaunch-localslurm down removes this block)\n{body}{HOSTS_END}\n"


def without_hosts_block(text: str) -> str:
    """`text` (an /etc/hosts) with our marked block removed; unchanged when there is none."""
    out, inside = [], False
    for line in text.splitlines(keepends=True):
        if line.startswith(HOSTS_BEGIN):
            inside = True
        elif inside and line.startswith(HOSTS_END):
            inside = False
        elif not inside:
            out.append(line)
    return "".join(out)


def with_hosts_block(text: str, block: str) -> str:
    """`text` (an /etc/hosts) with our block replaced by, or appended as, `block`."""
    base = without_hosts_block(text)
    if base and not base.endswith("\n"):
        base += "\n"
    return base + block


def render_files(spec: Spec) -> dict[str, tuple[str, int]]:
    """Relative path under the state dir -> (text, file mode)."""
    return {
        "etc/slurm.conf": (render_slurm_conf(spec), 0o644),
        "etc/gres.conf": (render_gres_conf(spec), 0o644),
        # slurmdbd refuses a slurmdbd.conf readable by others (it holds the DB password).
        "etc/slurmdbd.conf": (render_slurmdbd_conf(spec), 0o600),
        "etc/mariadb-init.sql": (render_mariadb_init(spec), 0o600),
        "etc/hosts": (render_hosts(spec), 0o644),
        # Not read by anything: a record of how each daemon is started, so that a
        # changed command line also counts as a changed configuration (restart).
        "etc/daemons.json": (json.dumps(render_daemon_argv(spec), indent=1) + "\n", 0o644),
    }


def render_network(spec: Spec, node: str) -> list[list[str]]:
    """`ip` commands that give `node` its namespace, veth pair on the bridge, address and loopback."""
    ns, veth, addr = spec.netns(node), spec.veth(node), spec.node_addr(node)
    return [
        ["ip", "netns", "add", ns],
        ["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns],
        ["ip", "link", "set", veth, "master", BRIDGE],
        ["ip", "link", "set", veth, "up"],
        ["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0"],
        ["ip", "-n", ns, "link", "set", "eth0", "up"],
        # Each node has its own loopback; servers bound to 127.0.0.1 need it up.
        ["ip", "-n", ns, "link", "set", "lo", "up"],
    ]


def render_daemon_argv(spec: Spec) -> dict[str, list[str]]:
    """Daemon name -> argv. Every daemon runs in the foreground, so the PID we record is the daemon."""
    p = spec.path
    argv = {
        # Pitfall: the socket's directory must be mode 755 (made in _make_dirs).
        "munged": [
            "munged",
            "-F",
            f"--socket={spec.munge_socket}",
            f"--key-file={p('munge', 'munge.key')}",
            f"--pid-file={p('run', 'munged.pid')}",
            f"--log-file={p('log', 'munged.log')}",
            f"--seed-file={p('munge', 'munged.seed')}",
        ],
        # --no-defaults must come first: never read /etc/mysql (a system MariaDB may run).
        "mariadbd": [
            "mariadbd",
            "--no-defaults",
            f"--datadir={p('mariadb')}",
            f"--socket={p('run', 'mariadb.sock')}",
            f"--port={DB_PORT}",
            "--bind-address=127.0.0.1",
            f"--pid-file={p('run', 'mariadb.pid')}",
            "--user=root",
            "--skip-name-resolve",
            f"--init-file={p('etc', 'mariadb-init.sql')}",
            f"--log-error={p('log', 'mariadb.log')}",
            # What slurmdbd asks for (else it logs "Database settings not recommended values").
            "--innodb-buffer-pool-size=128M",
            "--innodb-lock-wait-timeout=900",
        ],
        # slurmdbd finds slurmdbd.conf beside $SLURM_CONF.
        "slurmdbd": ["slurmdbd", "-D"],
        "slurmctld": ["slurmctld", "-D", "-f", spec.slurm_conf],
    }
    for node in spec.node_names:
        # Pitfall: `ip netns exec` remounts /sys and slurmd dies ("No filesystem
        # mounted on /sys/fs/cgroup"); nsenter --net keeps the mounts. unshare gives
        # the node its own hostname and a private mount of its /etc/hosts.
        script = (
            f"hostname {node} && mount --bind {shlex.quote(p('etc', 'hosts'))} /etc/hosts"
            f" && exec slurmd -D -N {node} -f {shlex.quote(spec.slurm_conf)}"
        )
        argv[f"slurmd.{node}"] = [
            "nsenter",
            f"--net=/run/netns/{spec.netns(node)}",
            "unshare",
            "--uts",
            "--mount",
            "sh",
            "-c",
            script,
        ]
    return argv
