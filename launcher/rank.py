"""The per-rank entry point: one of these per Slurm task (or per local rank).

    python -m launcher.rank <run_dir>          # what srun / the local launcher starts
    RankMain(run_dir)()                        # what submitit pickles and runs in each task

Steps, in order: read the topology (one table per launcher), load the launch
spec from the run dir, rendezvous (rank 0 picks ports and a dist port, every
rank learns every rank's address), build this rank's command (tritonserver, or
an engine's own worker command), run it as a supervised child, and exit with
its status. Rank 0 waits for its server to answer a real request and writes
`endpoint.json`; a rank whose child dies writes `failure_rank<N>.json` and
exits non-zero, which `srun --kill-on-bad-exit=1` turns into the whole job
stopping (fail fast). SIGTERM / SIGINT / SIGUSR2 (time limit, preemption) are
forwarded to the child as SIGTERM so Triton drains before it exits; SIGUSR2 (Slurm's time-limit signal)
also tells rank 0's front ends to refuse new requests and records the drain, on which the batch script of a
requeue=true job requeues it (launcher/serving/drain.py).

Replicas (replicas > 1) are the exception, once the job serves: losing one
data-parallel copy loses capacity, not the service, so the ranks of that copy
record `replica_lost<R>.json` and exit 0 while the front end on rank 0 routes
around it; rank 0 keeps the front end up even when its own server is the one
lost. The job still fails (fail fast, as above) when it was not serving yet,
when its last replica is lost, and when the front end dies. `decide_exit` is
the whole rule.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

# Where each launcher puts rank facts. One lookup table per launcher, read in one place
# (submitit's JobEnvironment idea): local emulation is just another table.
ENV_TABLES: Dict[str, Dict[str, str]] = {
    "slurm": {
        "rank": "SLURM_PROCID",
        "world_size": "SLURM_NTASKS",
        "local_rank": "SLURM_LOCALID",
        "node_rank": "SLURM_NODEID",
        "nnodes": "SLURM_NNODES",
        "job_id": "SLURM_JOB_ID",
        "hostname": "SLURMD_NODENAME",
    },
    "openmpi": {
        "rank": "OMPI_COMM_WORLD_RANK",
        "world_size": "OMPI_COMM_WORLD_SIZE",
        "local_rank": "OMPI_COMM_WORLD_LOCAL_RANK",
        "node_rank": "OMPI_COMM_WORLD_NODE_RANK",
        "nnodes": "",
        "job_id": "OMPI_MCA_ess_base_jobid",
        "hostname": "",
    },
    "local": {
        "rank": "LLMLAUNCH_RANK",
        "world_size": "LLMLAUNCH_WORLD_SIZE",
        "local_rank": "LLMLAUNCH_LOCAL_RANK",
        "node_rank": "LLMLAUNCH_NODE_RANK",
        "nnodes": "LLMLAUNCH_NNODES",
        "job_id": "LLMLAUNCH_JOB_ID",
        "hostname": "",
    },
}


@dataclass(frozen=True)
class Topology:
    launcher: str  # which table matched: slurm | openmpi | local
    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    nnodes: int
    job_id: str
    hostname: str


def read_topology(environ: Mapping[str, str]) -> Topology:
    """Slurm first (srun sets it), then Open MPI's mpirun, then our local launcher's variables."""
    for name in ("slurm", "openmpi", "local"):
        t = ENV_TABLES[name]
        if t["rank"] in environ and t["world_size"] in environ:
            get = lambda k, d="0": environ.get(t[k], d) if t[k] else d  # noqa: E731
            return Topology(
                launcher=name,
                rank=int(get("rank")),
                world_size=int(get("world_size", "1")),
                local_rank=int(get("local_rank")),
                node_rank=int(get("node_rank")),
                nnodes=int(get("nnodes", "1")),
                job_id=str(get("job_id", str(os.getpid()))),
                hostname=get("hostname", "") or socket.gethostname(),
            )
    return Topology("single", 0, 1, 0, 0, 1, str(os.getpid()), socket.gethostname())


@dataclass(frozen=True)
class RankContext:
    """What a rank knows after the rendezvous; engines' rank hooks read it."""

    rank: object  # launcher.spec.RankSpec
    job_id: str
    leader_addr: str  # address of this rank's model-copy leader
    dist_port: int  # port the copy's leader reserved for the engine's distributed init
    hosts: Tuple[str, ...]  # every rank's address, by global rank
    ports: Dict[str, int] = field(default_factory=dict)  # this rank's serving ports (leaders)
    # this rendezvous's own (rank 0's random one): the ready files and endpoint.json of this run carry it, so a
    # file an earlier run of the same directory left (a requeued job) is never taken for this run's
    token: str = ""


def host_address(hostname: str) -> str:
    """An address other nodes can reach: the node name's IP when it resolves, else the name."""
    try:
        return socket.gethostbyname(hostname)
    except OSError:
        return hostname


# ----------------------------------------------------------------------------- rendezvous
class MPIComm:
    """mpi4py over the job's PMIx/PMI2 wire-up (srun --mpi=pmix)."""

    def __init__(self):
        from mpi4py import MPI

        self.comm = MPI.COMM_WORLD

    def allgather(self, obj):
        # gather to rank 0, then broadcast: every pair of ranks connects at most once and from one side.  MPI's own
        # allgather (recursive doubling) has both ranks of a pair send to each other at once, and Open MPI 4.1.4's
        # TCP transport, resolving those crossing connects, segfaulted rank 0 of a 4-rank job here (a CI run:
        # "Failing at address: (nil)" as the ranks first spoke; its peer's connect() refused)
        return self.comm.bcast(self.comm.gather(obj, root=0), root=0)

    def barrier(self):
        self.allgather(None)


class RendezvousTimeout(TimeoutError):
    """Some ranks never reached the rendezvous: `missing` names them (the job fails naming them)."""

    def __init__(self, missing: List[int], timeout_s: float):
        self.missing = missing
        super().__init__(f"rendezvous: ranks {missing} did not arrive within {timeout_s:.0f}s "
                         f"(serve.rendezvous_timeout_s); look at their logs for what held them")


def arrival_barrier(directory: Path, rank: int, world: int, timeout_s: float, poll_s: float = 0.05) -> None:
    """Every rank marks its arrival in the shared run dir and waits for all the others' marks, up to `timeout_s`.
    Before MPI starts: MPI_Init itself waits for every rank with no deadline (its PMIx fence), so a rank that never
    starts would hang the others silently; here the ones that arrived fail naming the ones that did not."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"arrived_{rank}").touch()
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [r for r in range(world) if not (directory / f"arrived_{r}").exists()]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise RendezvousTimeout(missing, timeout_s)
        time.sleep(poll_s)


class FileComm:
    """Rendezvous through files in the run dir, for launchers without MPI (local ranks) and for
    engines whose server is itself the MPI program (TensorRT-LLM leader mode), where the
    wrapper must not take the rank's PMIx connection first."""

    def __init__(self, run_dir: Path, job_id: str, rank: int, world: int, timeout_s: float = 600.0):
        from launcher.rundir import RunDir

        self.dir = RunDir(run_dir).rendezvous_dir(job_id)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        self.round = 0

    def allgather(self, obj):
        self.round += 1
        tmp = self.dir / f".r{self.round}_{self.rank}.tmp"
        tmp.write_text(json.dumps(obj))
        tmp.rename(self.dir / f"r{self.round}_{self.rank}.json")
        deadline = time.monotonic() + self.timeout_s
        while True:
            files = [self.dir / f"r{self.round}_{r}.json" for r in range(self.world)]
            if all(f.exists() for f in files):
                return [json.loads(f.read_text()) for f in files]
            if time.monotonic() > deadline:
                raise RendezvousTimeout([r for r, f in enumerate(files) if not f.exists()], self.timeout_s)
            time.sleep(0.05)

    def barrier(self):
        self.allgather(None)


def rendezvous_key(topo: Topology, attempt: str = "") -> str:
    """The rendezvous folder's name: the job's id, and the allocation's number once a job was requeued."""
    return f"{topo.job_id}.{attempt}" if attempt else topo.job_id


def make_comm(spec, topo: Topology, run_dir: Path, attempt: str = ""):
    """MPI where srun/mpirun wired it up, unless the engine's server is the MPI program itself (then files).
    `attempt` tells a requeued job's allocations apart (same job id, files of the earlier one still there)."""
    from launcher.engines.registry import ENGINES

    key = rendezvous_key(topo, attempt)
    timeout_s = float(spec.serve.rendezvous_timeout_s)
    if topo.world_size == 1:
        return FileComm(run_dir, key, 0, 1, timeout_s)
    server_uses_mpi = ENGINES[spec.engine.name].server_uses_mpi
    if spec.cluster.mpi != "none" and topo.launcher in ("slurm", "openmpi") and not server_uses_mpi:
        return MPIComm()
    return FileComm(run_dir, key, topo.rank, topo.world_size, timeout_s)


def rendezvous(spec, topo: Topology, comm) -> RankContext:
    """Every rank publishes its address; leaders publish the ports they could bind."""
    from launcher.scheduler import for_spec
    from launcher.triton import free_port, pick_ports

    me = spec.ranks[topo.rank]
    loopback = for_spec(spec).loopback  # every rank on this machine
    addr = "127.0.0.1" if loopback else host_address(topo.hostname)
    bind = "127.0.0.1" if loopback else "0.0.0.0"
    ports: Dict[str, int] = {}
    frontend_ports: Dict[str, int] = {}
    openai_port = 0
    dist_port = 0
    if me.role == "leader":
        wanted = {k: int(getattr(spec.serve, k)) for k in ("grpc_port", "http_port", "metrics_port")}
        # frontend: with replicas > 1 the public gRPC and metrics ports go to the front end
        # (launcher/frontend, started by launcher/serving/rank0_frontend.py) on rank 0, and rank 0's own
        # server is one more internal replica.
        fronted = me.serves == "public" and spec.replicas > 1
        if fronted:
            frontend_ports = pick_ports(bind, {"grpc_port": wanted["grpc_port"], "metrics_port": wanted["metrics_port"]})
        if me.serves != "public" or fronted:
            # Internal servers take any free port: several share a node; endpoint.json lists them.
            wanted = {k: 0 for k in wanted}
        if me.serves == "public":  # the OpenAI API (launcher/openai_api) rank 0 starts once it serves gRPC
            openai_port = pick_ports(bind, {"openai_port": int(spec.serve.openai_port)}, avoid=frontend_ports.values())["openai_port"]
            frontend_ports_and_api = [*frontend_ports.values(), openai_port]
        else:
            frontend_ports_and_api = list(frontend_ports.values())
        ports = pick_ports(bind, wanted, avoid=frontend_ports_and_api)  # never the front end's or the API's ports
        dist_port = free_port(bind)
    token = secrets.token_hex(8) if topo.rank == 0 else ""
    from launcher.record import gpu_inventory

    gpus = gpu_inventory() if topo.local_rank == 0 else []  # one rank per node lists the node's GPUs for the run record
    infos = comm.allgather({"rank": topo.rank, "addr": addr, "ports": ports, "dist_port": dist_port, "frontend_ports": frontend_ports,
                            "openai_port": openai_port, "token": token, "host": topo.hostname, "gpus": gpus})
    leader = infos[topo.rank - me.group_rank]
    return RankContext(
        rank=me,
        job_id=topo.job_id,
        leader_addr=leader["addr"],
        dist_port=int(leader["dist_port"]),
        hosts=tuple(i["addr"] for i in infos),
        ports={k: int(v) for k, v in ports.items()},
        token=infos[0]["token"],
    ), infos


# ----------------------------------------------------------------------------- the rank's process
def rank_environment(spec, topo: Topology, ctx: RankContext, run_dir: Path, visible: Optional[List[str]]) -> Dict[str, str]:
    me = ctx.rank
    group_ranks = [r for r in spec.ranks if r.replica == me.replica]
    env = {
        "LLMLAUNCH_RANK": str(me.rank),
        "LLMLAUNCH_WORLD_SIZE": str(spec.world_size),
        "LLMLAUNCH_LOCAL_RANK": str(me.local_rank),
        "LLMLAUNCH_NODE_RANK": str(me.node),
        "LLMLAUNCH_NNODES": str(spec.nodes),
        "LLMLAUNCH_REPLICA": str(me.replica),
        "LLMLAUNCH_GROUP_RANK": str(me.group_rank),
        "LLMLAUNCH_GROUP_SIZE": str(len(group_ranks)),
        "LLMLAUNCH_LEADER_ADDR": ctx.leader_addr,
        "LLMLAUNCH_DIST_PORT": str(ctx.dist_port),
        "LLMLAUNCH_JOB_ID": str(ctx.job_id),
        "LLMLAUNCH_RUN_DIR": str(run_dir),
    }
    if me.gpus and visible is not None:
        # Slurm gives the task the node's GPUs (--gpus-per-node); each rank takes its own slice.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible[g] for g in me.gpus if g < len(visible))
    return env


def _visible_devices(environ: Mapping[str, str]) -> Optional[List[str]]:
    v = environ.get("CUDA_VISIBLE_DEVICES") or environ.get("SLURM_STEP_GPUS") or environ.get("SLURM_JOB_GPUS")
    if not v:
        return None
    return [x for x in v.split(",") if x]


# ----------------------------------------------------------------------------- losing a replica
@dataclass(frozen=True)
class Outcome:
    """What a rank does once something it supervises ended unasked (see decide_exit)."""

    replica_lost: bool  # record replica_lost<R>.json for this rank's replica (once per replica)
    failure: bool  # record failure_rank<N>.json and exit non-zero: srun --kill-on-bad-exit ends the job
    exits: bool  # False only for rank 0 keeping the front end up for the replicas left
    status: int  # the rank's exit status (when it exits)
    reason: str


def decide_exit(
    ended: str,
    *,
    replicas: int,
    replica: int,
    serving: bool,
    code: Optional[int],
    lost: Tuple[int, ...] = (),
    frontend: str = "none",
) -> Outcome:
    """The whole fail-fast / lose-a-replica rule, as a pure function.

    ended: "server" (this rank's tritonserver or engine command exited), "replica" (another rank
    of this rank's replica recorded it lost, or, for rank 0 serving only the front end, the
    others were lost too), "frontend" / "api" (rank 0's front end / OpenAI API exited). Only for unasked ends: a
    signal (scancel, time limit) is a normal stop and never comes here.
    serving: the job had reached READY (rank 0 wrote endpoint.json for this run).
    lost: replicas already recorded lost. frontend: "none" (this rank has none), "running" or
    "exited" (rank 0 with replicas > 1 runs the front end).
    """
    status = code if code else 1
    what = {"server": "server", "replica": "replica", "frontend": "front end", "api": "OpenAI API"}[ended]
    if ended in ("frontend", "api") or frontend == "exited":
        # The public endpoint itself is gone: nothing serves, whatever the replicas do.
        return Outcome(False, True, True, status, f"{what if ended == 'api' else 'front end'} exited{f' with status {code}' if ended in ('frontend', 'api') else ''} unasked")
    if replicas <= 1:
        # One copy: it is the service. Fail fast, as always.
        return Outcome(False, True, True, status, f"{what} exited with status {code} unasked")
    if not serving:
        # A job that never fully started should not pretend to serve with part of its replicas.
        return Outcome(False, True, True, status, f"{what} exited with status {code} unasked before the job was serving")
    gone = set(lost) | {replica}
    if len(gone) >= replicas:
        return Outcome(True, True, True, status, f"no replica is left (replicas {sorted(gone)} lost)")
    if frontend == "running":
        # Rank 0: the front end already routes around a failed replica (its own included) and its
        # clients keep the endpoint they know, so it stays up for the replicas left.
        return Outcome(True, False, False, 0, f"replica {replica} lost; the front end serves the {replicas - len(gone)} left")
    # Exit 0: srun --kill-on-bad-exit ends the step only for a non-zero task exit.
    return Outcome(True, False, True, 0, f"replica {replica} lost; {replicas - len(gone)} of {replicas} replicas still serve")


def _signal_text(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return str(code)


def _end_lost_server(server, grace_s: float = 5.0) -> Optional[int]:
    """Another rank of this replica died: the replica cannot finish what it runs (its model-parallel
    group is broken), so no full drain: SIGTERM, SIGKILL after `grace_s`, then the usual cleanup."""
    server.stop(grace_s=grace_s)
    return server.returncode()


def _supervise(server, frontend, stopping, lost, api=None) -> Tuple[str, Optional[int]]:
    """Wait until something this rank supervises ends. Returns ("server", status) when its server exited (asked
    or not), ("frontend", status) / ("api", status) when rank 0's front end / OpenAI API exited unasked,
    ("replica", None) when another rank of this replica recorded it lost (replicas > 1)."""
    checked = 0.0
    while True:
        code = server.returncode()
        if code is not None:
            return "server", code
        if stopping["signal"] is None:
            for name, child in (("frontend", frontend), ("api", api)):
                status = None if child is None else child.poll()
                if status is not None:
                    return name, status
            now = time.monotonic()
            if now - checked >= 1.0:  # a stat on the shared run dir, once a second per rank
                checked = now
                if lost():
                    return "replica", None
        time.sleep(0.2)


def _frontend_only(frontend, stopping, all_lost) -> Tuple[str, Optional[int]]:
    """Rank 0 after its own replica was lost: supervise the front end alone. Returns ("frontend",
    status) when it exits (asked or not), ("replica", None) when no replica is left."""
    checked = 0.0
    while True:
        fe = frontend.poll()
        if fe is not None:
            return "frontend", fe
        now = time.monotonic()
        if stopping["signal"] is None and now - checked >= 1.0:
            checked = now
            if all_lost():
                return "replica", None
        time.sleep(0.2)


def run_rank(run_dir: str, environ: Optional[Mapping[str, str]] = None, log_path: Optional[str] = None) -> int:
    """Run this process's rank to the end; returns the exit status."""
    from launcher.rundir import RunDir

    environ = dict(os.environ if environ is None else environ)
    spec = RunDir(run_dir).read_spec()
    topo = read_topology(environ)

    def say(msg: str) -> None:
        from launcher.triage import log_time

        # the time on every line: llmlaunch-logs orders errors across ranks by it (launcher/triage.py reads it back)
        print(f"[llmlaunch rank {topo.rank} {topo.hostname} {log_time()}] {msg}", flush=True)

    return _run_rank(RunDir(run_dir), spec, topo, environ, log_path, say)


def _run_rank(run, spec, topo: Topology, environ: Dict[str, str], log_path: Optional[str], say) -> int:
    from launcher.engines.registry import ENGINES
    from launcher.render import rank_command, shm_prefix
    from launcher.triton import ServerDied, TritonServer, resolve_tritonserver, server_env

    if topo.world_size != spec.world_size:
        raise SystemExit(f"rank {topo.rank}: the launcher started {topo.world_size} ranks but the plan has {spec.world_size}")
    edef = ENGINES[spec.engine.name]
    log = Path(log_path) if log_path else _own_log(run, topo)

    if topo.rank == 0:
        # Records of an earlier run of this dir (a requeued job) must not stop this run's ranks. Nobody
        # writes one before the job serves, and every rank passes the rendezvous only after rank 0.
        run.clear_lost()
    attempt = environ.get("SLURM_RESTART_COUNT", "")
    try:
        if topo.world_size > 1:  # every rank there before anything waits without a deadline (MPI_Init does)
            arrival_barrier(run.rendezvous_dir(rendezvous_key(topo, attempt)), topo.rank, topo.world_size, float(spec.serve.rendezvous_timeout_s))
        comm = make_comm(spec, topo, run.path, attempt)
        ctx, infos = rendezvous(spec, topo, comm)
    except RendezvousTimeout as e:
        # Fail the job naming who never came (MPI has not started: the arrival barrier comes first)
        log = Path(log_path) if log_path else _own_log(run, topo)
        me = spec.ranks[topo.rank]
        run.write_failure(topo.rank, {"rank": topo.rank, "node": me.node, "host": topo.hostname, "exit_code": 1, "log": str(log),
                                      "log_tail": "", "time": time.time(), "reason": str(e), "missing_ranks": e.missing})
        say(f"FAILED: {e}")
        return 1
    marks = {"ranks_started": time.time()}  # every rank has arrived: the time-to-READY breakdown's mark
    if environ.get("SLURM_JOB_START_TIME"):  # Slurm 23.02+: when the allocation began
        marks["allocated"] = float(environ["SLURM_JOB_START_TIME"])
    me = ctx.rank
    install = resolve_tritonserver(spec.cluster.tritonserver)
    env = server_env(install, {**spec.cluster.env, **rank_environment(spec, topo, ctx, run.path, _visible_devices(environ)), **edef.rank_env(spec, ctx)})
    prefix = shm_prefix(ctx.job_id, me.rank)
    from launcher.scheduler import for_spec

    loopback = for_spec(spec).loopback  # every rank on this machine: servers are reached on 127.0.0.1
    host = "127.0.0.1" if loopback else ctx.hosts[me.rank]

    def make_server():
        argv = edef.rank_command(spec, ctx)
        if argv is None:
            argv = rank_command(
                spec,
                me,
                tritonserver=install.binary,
                repository=str(run.repository),
                job_id=ctx.job_id,
                ports=ctx.ports or None,
                backend_directory=install.backend_directory,
            )
        say(f"{me.role} of replica {me.replica}, gpus {list(me.gpus) or 'none'}, leader {ctx.leader_addr}: {' '.join(argv)}")
        return TritonServer(
            argv,
            env=env,
            log_path=log,
            grpc_url=f"{host}:{ctx.ports.get('grpc_port', 0)}",
            model=spec.model_name,
            ready_timeout_s=float(spec.serve.ready_timeout_s),
            drain_timeout_s=float(spec.serve.drain_timeout_s),
            shm_prefix=prefix,
            progress=say,
            inherit_output=log_path is None,
        )

    server = make_server()
    stopping = {"signal": None}
    frontend = None  # frontend: rank 0's front end process when replicas > 1
    api = None  # rank 0's OpenAI API process (launcher/openai_api), in front of the public gRPC endpoint

    from launcher.serving.drain import DRAIN_SIGNAL, REASON_ENV, walltime_reason

    os.environ[REASON_ENV] = walltime_reason(ctx.job_id, spec.requeue)  # what rank 0's front ends will say

    def on_signal(signum, _frame):
        first = stopping["signal"] is None
        stopping["signal"] = signum
        if signum == DRAIN_SIGNAL:
            # Slurm's time-limit signal: the server finishes what runs (up to serve.drain_timeout_s), the front
            # ends refuse new requests naming why, every rank then exits 0 (launcher/serving/drain.py)
            for child in (frontend, api):  # first: new requests are refused from now on
                if child is not None:
                    child.drain_notice()
            if first and me.rank == 0:
                run.clear_endpoint()  # nothing new is served there; a requeued job's rank 0 writes the next one
                run.write_walltime(attempt, {"attempt": int(attempt or 0), "job_id": ctx.job_id, "time": time.time(), "requeue": spec.requeue,
                                             "drain_timeout_s": float(spec.serve.drain_timeout_s), "host": topo.hostname})
                say(f"draining at the time limit: {os.environ[REASON_ENV]}")
            server.terminate()
            return
        server.terminate()
        if frontend is not None:
            frontend.terminate()
        if api is not None:
            api.terminate()

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(s, on_signal)
    server.start()
    try:
        if me.role == "leader":
            for attempt in range(3):
                try:
                    waited = server.wait_ready()
                    break
                except ServerDied as e:
                    # Something else on this node can take a port between our pick and tritonserver's bind
                    # (another job, or an outgoing connection's ephemeral port: a CI run lost a replica's gRPC
                    # port so). Every leader retries on fresh ports instead of failing the job: its ready file
                    # says which it bound, and rank 0's front end and endpoint.json take them from there.
                    if attempt == 2 or "already in use" not in str(e):
                        raise
                    from launcher.triton import pick_ports

                    bind = "127.0.0.1" if loopback else "0.0.0.0"
                    front = [*infos[me.rank]["frontend_ports"].values(), infos[me.rank]["openai_port"]]  # rank 0's front end's and API's
                    ctx.ports.update(pick_ports(bind, {k: 0 for k in ctx.ports}, avoid=front))
                    say(f"a port was taken while starting; retrying on {ctx.ports}")
                    server.stop()
                    server = make_server()
                    server.start()
            url = server.grpc_url
            say(f"READY in {waited:.1f}s: {spec.model_name} at {url}")
            ready = {"rank": me.rank, "replica": me.replica, "addr": host, "ports": ctx.ports, "ready_s": round(waited, 2), "time": time.time(), "token": ctx.token}
            run.write_ready(me.rank, ready)
            if me.rank == 0:
                leaders = [i for i in infos if spec.ranks[i["rank"]].role == "leader"]
                public = {"url": f"grpc://{host}:{ctx.ports['grpc_port']}", **{k: ctx.ports[k] for k in ("grpc_port", "http_port", "metrics_port")}}
                bound = {0: ctx.ports}  # rank -> the ports its server bound (a retry may have changed them)
                if spec.replicas > 1:
                    # frontend: wait for every replica leader, then serve them all on the public port.
                    from launcher.serving.rank0_frontend import start_for_rank0

                    frontend, public, bound = start_for_rank0(spec, run.path, infos, leaders, host, ctx.ports, ctx.token, alive=lambda: server.returncode() is None, say=say)
                from launcher.openai_api.process import start_api

                api = start_api(spec, public["url"].replace("grpc://", ""), spec.host, infos[0]["openai_port"], say,
                                float(spec.serve.ready_timeout_s))
                from launcher.record import write_startup

                write_startup(run, spec, log_path=log, marks={**marks, **server.marks, "serving": time.time()}, server_url=url,
                              nodes=[i.get("host", i["addr"]) for i in infos],
                              gpus={i["host"]: i["gpus"] for i in infos if i.get("gpus")}, token=ctx.token, server_pid=server.proc.pid)
                run.write_endpoint(
                    {
                        **public,
                        "openai_port": api.cfg.port,
                        "openai_url": f"http://{host}:{api.cfg.port}/v1",
                        "host": host,
                        "model": spec.model_name,
                        "job_id": ctx.job_id,
                        "ranks": [{"rank": i["rank"], "addr": i["addr"]} for i in infos],
                        "replicas": [{"replica": spec.ranks[i["rank"]].replica, "addr": i["addr"], "grpc_port": bound[i["rank"]].get("grpc_port")} for i in leaders],
                        "token": ctx.token,
                        "ready_s": round(waited, 2),
                    },
                )
        if spec.replicas == 1:
            ended, code = _supervise(server, None, stopping, lambda: False, api)
        else:
            ended, code = _supervise(server, frontend, stopping, lambda: run.replica_lost(me.replica), api)
            if ended == "replica":
                code = _end_lost_server(server)
    except BaseException as e:  # died while loading, or timed out
        say(f"FAILED: {e}")
        if api is not None:
            api.stop()
        if frontend is not None:
            frontend.stop()
        server.stop()
        code, ended, started = server.returncode() or 1, "server", False
    else:
        started = True
    from launcher.triton import log_excerpt

    def fail(status: int, what: str) -> int:
        """Nobody asked it to stop: fail the job, and say who failed and why."""
        if api is not None:
            api.stop()
        if frontend is not None:
            frontend.stop()
        run.write_failure(
            me.rank,
            {"rank": me.rank, "node": me.node, "host": topo.hostname, "exit_code": code, "log": str(log), "log_tail": log_excerpt(log, 25), "time": time.time(), "reason": what},
        )
        say(f"{what}: failing the job")
        server.stop()
        return status

    if stopping["signal"] is None and spec.replicas > 1 and started:
        # Data-parallel replicas: a replica lost while the job serves is not the end of the job.
        lost = run.lost_replica_ids(spec.replicas)
        out = decide_exit(ended, replicas=spec.replicas, replica=me.replica, serving=run.serving(ctx.token), code=code, lost=lost,
                          frontend="none" if frontend is None else "running" if frontend.poll() is None else "exited")
        if out.replica_lost:
            if ended == "replica":
                why = f"rank {me.rank} stopped its server (status {_signal_text(code)}): another rank of replica {me.replica} was lost"
            else:
                why = f"the server of rank {me.rank} ({me.role}) exited with status {_signal_text(code)} unasked"
            ranks = [r.rank for r in spec.ranks if r.replica == me.replica]
            wrote = run.record_lost(
                me.replica,
                {"replica": me.replica, "ranks": ranks, "rank": me.rank, "node": me.node, "host": topo.hostname, "exit_code": code, "reason": why,
                 "log": str(log), "log_tail": log_excerpt(log, 25), "time": time.time()},
            )
            say(f"replica {me.replica} LOST: {why}" + ("" if wrote else " (already recorded by another of its ranks)"))
        if not out.exits:
            # Rank 0: its server is gone, the front end goes on for the replicas left (it already
            # marked this one down: its requests in flight got an error naming it).
            server.stop()
            say(f"{out.reason}; rank 0 keeps the front end up")
            ended, fe_code = _frontend_only(frontend, stopping, lambda: len(run.lost_replica_ids(spec.replicas)) >= spec.replicas)
            if stopping["signal"] is not None:
                if api is not None:
                    api.stop()
                fe_code = frontend.stop()
                say(f"stopped (signal {stopping['signal']}), front end status {fe_code}")
                return 0 if fe_code in (0, -signal.SIGTERM) else fe_code
            if ended == "frontend":
                code = fe_code
            out = decide_exit(ended, replicas=spec.replicas, replica=me.replica, serving=True, code=code, lost=run.lost_replica_ids(spec.replicas))
        if out.failure:
            return fail(out.status, out.reason)
        if api is not None:
            api.stop()
        server.stop()
        say(f"{out.reason}: this rank exits 0 so the job goes on")
        return 0
    if api is not None:  # its running requests have drained with the servers (or failed with them)
        api.stop()
    if frontend is not None:  # frontend: it drains with the servers, then goes
        frontend.stop()
    if stopping["signal"] is None or code not in (0, -signal.SIGTERM):
        if stopping["signal"] is None:
            what = {"frontend": "front end", "api": "OpenAI API"}.get(ended, "server")
            return fail(code if code else 1, f"{what} exited with status {code} unasked")
    server.stop()  # the server has exited; this ends stray stubs and removes the rank's shm regions
    say(f"stopped (signal {stopping['signal']}), status {code}")
    return 0 if stopping["signal"] is not None and code in (0, -signal.SIGTERM) else code


def _own_log(run, topo: Topology) -> Path:
    """The file this rank's stdout goes to (submitit's per-task log), for the failure tail."""
    if topo.launcher == "slurm":
        return run.slurm_rank_log(topo.job_id, topo.rank)
    return run.local_rank_log(topo.rank)


class RankMain:
    """The callable submitit pickles: every Slurm task runs it once."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir

    def __call__(self) -> int:
        code = run_rank(self.run_dir)
        if code:
            # A non-zero task exit makes srun (--kill-on-bad-exit) end every rank.
            raise SystemExit(code)
        return code


def main(argv: Optional[List[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m launcher.rank <run_dir>", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(run_rank(argv[0]))


if __name__ == "__main__":
    main()
