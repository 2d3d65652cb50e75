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
`Spec`; launcher/localslurm/host.py sets the machine up (packages, network namespaces, the state
directory's files, munge key, accounting database, /etc/hosts); launcher/localslurm/daemons.py
starts, stops and checks the daemons; here are `up`, `down` and `status`, which put those steps in
order, and the command line. Every pitfall quoted in a comment (marked "pitfall") was hit on this kind of
machine; README.md, "Slurm", says how to use it.

One cluster per machine: network namespace, interface names, ports and the
/etc/hosts block are global, whatever the state directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import socket
import sys
import time
from pathlib import Path

from launcher.localslurm.conf import (
    DB_PORT,
    DBD_PORT,
    DEFAULT_DIR,
    DIR_ENV,
    MAX_NODES,
    NETNS_PREFIX,
    PARTITION,
    POLL_S,
    READY_STATES,
    DaemonStatus,
    LocalSlurm,
    LocalSlurmError,
    Spec,
    Status,
    render_daemon_argv,
    render_hosts_block,
)
from launcher.localslurm.daemons import (
    alive_pid,
    ctld_ok,
    munge_ok,
    node_states,
    nodes_ready,
    pid_file,
    pid_file_names,
    pids_in_netns,
    read_pid,
    register_cluster,
    start_daemon,
    stop_daemons,
    stop_pids,
    tcp_open,
    wait_for,
)
from launcher.localslurm.host import (
    db_password,
    ensure_etc_hosts,
    ensure_files,
    ensure_network,
    ensure_packages,
    files_differ,
    locked,
    log,
    netns_inode,
    netns_list,
    node_network_ok,
    read_state,
    remove_network,
    require_root,
    run,
    slurm_env,
)


def resolve_dir(state_dir: str | os.PathLike | None) -> str:
    return os.path.abspath(os.fspath(state_dir or os.environ.get(DIR_ENV) or DEFAULT_DIR))


# --- the three operations


def _spec(nodes: int, gpus_per_node: int, state_dir: str) -> Spec:
    return Spec(
        state_dir=state_dir,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        ctl_hostname=socket.gethostname().split(".")[0],
        db_password=db_password(state_dir),
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
        not files_differ(spec)
        and all(alive_pid(pid_file(spec, d)) for d in spec.daemons())
        and set(pid_file_names(spec.state_dir)) == set(spec.daemons())
        and all(node_network_ok(spec, n) for n in spec.node_names)
        and nodes_ready(spec, resumed=set(spec.node_names))  # a check only: resume nothing
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
    require_root()
    state_dir = resolve_dir(state_dir)
    with locked(state_dir):
        spec = _spec(nodes, gpus_per_node, state_dir)
        if _is_up(spec):
            log(f"already up: {nodes} nodes x {gpus_per_node} GPUs, nothing to do")
            return _handle(spec)
        ensure_packages()
        # Changed files (another shape, another hostname) or slurmds of nodes the
        # new shape lacks: start from nothing rather than patch running daemons.
        if files_differ(spec) or set(pid_file_names(state_dir)) - set(spec.daemons()):
            if any(alive_pid(pid_file(spec, d)) for d in pid_file_names(state_dir)):
                log("configuration changed: reconfiguring (down, then up)")
            _down(state_dir)
        ensure_files(spec)
        remade = ensure_network(spec)
        ensure_etc_hosts(render_hosts_block(spec))
        Path(state_dir, "state.json").write_text(json.dumps({"nodes": nodes, "gpus_per_node": gpus_per_node}) + "\n")
        # A slurmd whose namespace was remade lives in a dead network: restart it.
        stale = [f"slurmd.{n}" for n in remade if alive_pid(pid_file(spec, f"slurmd.{n}"))]
        if stale:
            stop_daemons(spec, stale)
        argv = render_daemon_argv(spec)
        ready = {
            "munged": ("munge", lambda: munge_ok(spec)),
            "mariadbd": ("MariaDB", lambda: tcp_open("127.0.0.1", DB_PORT)),
            "slurmdbd": ("slurmdbd", lambda: tcp_open(spec.ctl_addr, DBD_PORT)),
            "slurmctld": ("slurmctld", lambda: ctld_ok(spec)),
        }
        started = []
        for name in spec.daemons():
            if alive_pid(pid_file(spec, name)):
                continue
            log(f"starting {name}")
            start_daemon(spec, name, argv[name])
            started.append(name)
            if name in ready:
                what, check = ready[name]
                wait_for(what, check, spec, [name])
                if name == "slurmdbd":
                    register_cluster(spec)
        resumed: set[str] = set()
        log(f"waiting for {nodes} nodes to be idle")
        wait_for("every node to register (sinfo idle)", lambda: nodes_ready(spec, resumed), spec, list(spec.daemons()))
        dead = [d for d in spec.daemons() if not alive_pid(pid_file(spec, d))]
        if dead:
            raise LocalSlurmError(f"{', '.join(dead)} died during start; see the logs in {spec.path('log')}")
        log(
            f"up: {', '.join(f'{n}={a}' for n, a in spec.node_addrs.items())}, partition {PARTITION}, "
            f"{gpus_per_node} GPUs per node (started {len(started)} daemons)"
        )
        return _handle(spec)


def cancel_all_jobs(conf: str) -> None:
    """Cancel every job, so accounting records CANCELLED rather than a job lost with its node."""
    env = slurm_env(conf)
    live = ["squeue", "-h", "-o", "%A", "-t", "PENDING,RUNNING,SUSPENDED,CONFIGURING,REQUEUED,RESIZING"]
    jobs = run(live, check=False, env=env, timeout=20).stdout.split()
    if not jobs:
        return
    log(f"cancelling {len(jobs)} jobs")
    run(["scancel", *jobs], check=False, env=env)
    # Wait for CANCELLED only, not for COMPLETING: tasks that ignore SIGTERM (submitit's
    # do) would hold us KillWait seconds; the namespace sweep below kills them anyway.
    deadline = time.monotonic() + 10
    while run(live, check=False, env=env, timeout=20).stdout.split() and time.monotonic() < deadline:
        time.sleep(POLL_S)


def _down(state_dir: str) -> None:
    spec = Spec(state_dir=state_dir)
    names = pid_file_names(state_dir)
    if "slurmctld" in names and alive_pid(pid_file(spec, "slurmctld")):
        cancel_all_jobs(spec.slurm_conf)
    nodes = sorted(
        {n.split(".", 1)[1] for n in names if n.startswith("slurmd.")}
        | {ns[len(NETNS_PREFIX) :] for ns in netns_list() if ns.startswith(NETNS_PREFIX + "node")}
    )
    slurmds = [n for n in names if n.startswith("slurmd.")]
    # Job steps (slurmstepd and tasks) outlive slurmd, and slurmd waits for them
    # before it exits; whatever runs in a node namespace is ours by construction.
    # Stop those first, quickly: they belong to jobs just cancelled.
    inodes = {i for i in (netns_inode(Spec.netns(n)) for n in nodes) if i is not None}
    own = {rec[0] for rec in (read_pid(pid_file(spec, n)) for n in slurmds) if rec}
    leftovers = {k: v for k, v in pids_in_netns(inodes).items() if v[0] not in own} if inodes else {}
    if leftovers:
        log(f"stopping {len(leftovers)} job processes in the node namespaces")
        stop_pids(leftovers, timeout=1.0)  # slurmstepd and submitit ignore SIGTERM: SIGKILL soon
    if slurmds:
        log(f"stopping {len(slurmds)} slurmd")
        stop_daemons(spec, slurmds)
    leftovers = pids_in_netns(inodes) if inodes else {}
    if leftovers:
        log(f"stopping {len(leftovers)} leftover processes in the node namespaces")
        stop_pids(leftovers, timeout=2.0)
    for name in ("slurmctld", "slurmdbd", "mariadbd", "munged"):
        if name in names:
            log(f"stopping {name}")
            stop_daemons(spec, [name])
    remove_network(nodes)
    ensure_etc_hosts(None)


def down(state_dir: str | os.PathLike | None = None, purge: bool = False) -> None:
    """Stop every daemon of ours (by PID file), remove the namespaces, bridge and /etc/hosts block.

    Idempotent. `purge` also deletes the state directory (accounting database, job state, munge key).
    """
    require_root()
    state_dir = resolve_dir(state_dir)
    with locked(state_dir):
        _down(state_dir)
    if purge:
        shutil.rmtree(state_dir, ignore_errors=True)
    log("down")


def status(state_dir: str | os.PathLike | None = None) -> Status:
    """What runs: each daemon (pid, alive) and each node's state in sinfo."""
    state_dir = resolve_dir(state_dir)
    st = read_state(state_dir)
    spec = Spec(state_dir=state_dir, nodes=int(st.get("nodes", 0)), gpus_per_node=int(st.get("gpus_per_node", 0)))
    names = list(spec.daemons()) if st else []
    names += [n for n in pid_file_names(state_dir) if n not in names]
    daemons = []
    for name in names:
        rec = read_pid(pid_file(spec, name))
        daemons.append(DaemonStatus(name, rec[0] if rec else None, alive_pid(pid_file(spec, name)) is not None))
    alive = {d.name for d in daemons if d.alive}
    nodes = node_states(spec.slurm_conf) if {"munged", "slurmctld"} <= alive else {}
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
            log(f"ready in {time.monotonic() - t0:.1f} s")
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
