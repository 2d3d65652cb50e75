"""The rendezvous: every rank of a job learns every rank's address, and each leader the ports it reserved.

Through MPI (mpi4py over the job's PMIx/PMI2 wire-up, `srun --mpi=pmix`) where the launcher started an MPI world,
else through files in the run dir (local ranks; engines whose server is itself the MPI program). Before MPI starts,
an arrival barrier in the run dir bounds the wait: MPI_Init waits for every rank with no deadline, so a rank that
never starts would hang the others silently; here the ones that arrived fail naming the ones that did not.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Tuple

from launcher.engines.registry import ENGINES
from launcher.ports import free_port, pick_ports
from launcher.rank.topology import Topology, host_address
from launcher.record import gpu_inventory
from launcher.rundir import RunDir


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
    # serve.routing=kv, a leader: where its engine publishes KV-cache events (launcher/kv_events.py); "" = nowhere
    kv_events: str = ""
    # disagg, a prefill replica's leader: host:port its engine serves computed prompts' keys and values on
    # (launcher/hf/kv_transfer.py); "" = none
    kv_transfer: str = ""


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
        super().__init__(
            f"rendezvous: ranks {missing} did not arrive within {timeout_s:.0f}s "
            f"(serve.rendezvous_timeout_s); look at their logs for what held them"
        )


def arrival_barrier(directory: Path, rank: int, world: int, timeout_s: float, poll_s: float = 0.05) -> None:
    """Every rank marks its arrival in the shared run dir and waits for all the others' marks, up to `timeout_s`."""
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
    key = rendezvous_key(topo, attempt)
    timeout_s = float(spec.serve.rendezvous_timeout_s)
    if topo.world_size == 1:
        return FileComm(run_dir, key, 0, 1, timeout_s)
    server_uses_mpi = ENGINES[spec.engine.name].server_uses_mpi
    if spec.cluster.mpi != "none" and topo.launcher in ("slurm", "openmpi") and not server_uses_mpi:
        return MPIComm()
    return FileComm(run_dir, key, topo.rank, topo.world_size, timeout_s)


def bind_address(spec) -> str:
    """Where this job's internal servers bind: loopback when every rank is on this machine, else every interface."""
    return "127.0.0.1" if spec.loopback else "0.0.0.0"


def kv_address(bound: str, addr: str) -> str:
    """host:port a leader's engine bound for the transfer (its `bound`, maybe on every address) as others reach it, at
    `addr`; "" for a leader with none."""
    return f"{addr}:{bound.rpartition(':')[2]}" if bound else ""


def reserve_ports(spec, me) -> Dict[str, object]:
    """The ports a leader offers at the rendezvous: its server's three (any free ones for internal servers, which
    share a node: endpoint.json lists them), and on rank 0 the public ones of its front end (replicas > 1: the
    public gRPC and metrics ports go to launcher/frontend, and rank 0's own server is one more internal replica)
    and of its OpenAI API; plus a port for the engine's distributed init. A worker offers none."""
    out: Dict[str, object] = {
        "ports": {},
        "frontend_ports": {},
        "openai_port": 0,
        "dist_port": 0,
        "kv_events": "",
        "kv_transfer": "",
    }
    if me.role != "leader":
        return out
    bind = bind_address(spec)
    wanted = {k: int(getattr(spec.serve, k)) for k in ("grpc_port", "http_port", "metrics_port")}
    fronted = me.serves == "public" and spec.replicas > 1
    if fronted:
        out["frontend_ports"] = pick_ports(
            bind, {"grpc_port": wanted["grpc_port"], "metrics_port": wanted["metrics_port"]}
        )
    if me.serves != "public" or fronted:
        wanted = {k: 0 for k in wanted}
    taken = list(out["frontend_ports"].values())
    if me.serves == "public":  # the OpenAI API (launcher/openai_api) rank 0 starts once it serves gRPC
        out["openai_port"] = pick_ports(bind, {"openai_port": int(spec.serve.openai_port)}, avoid=taken)["openai_port"]
        taken.append(out["openai_port"])
    out["ports"] = pick_ports(bind, wanted, avoid=taken)  # never the front end's or the API's ports
    out["dist_port"] = free_port(bind)
    if spec.serve.routing == "kv" and spec.replicas > 1:  # the front end subscribes to every leader's engine
        from launcher.kv_events import endpoint_for
        from launcher.python_backend.instances import private_dir

        loop = spec.loopback  # one machine: a unix socket in the user's private directory; else a TCP port
        out["kv_events"] = endpoint_for(loop, 0 if loop else free_port(bind), private_dir() if loop else "")
    if spec.role(me.replica) in ENGINES[spec.engine.name].kv_port_roles:  # disagg: its engine's transfer port
        out["kv_transfer"] = f"{bind}:{free_port(bind)}"
    return out


def rendezvous(spec, topo: Topology, comm) -> Tuple[RankContext, List[dict]]:
    """Every rank publishes its address; leaders publish the ports they could bind. Returns this rank's context and
    every rank's offer (by global rank)."""
    me = spec.ranks[topo.rank]
    addr = "127.0.0.1" if spec.loopback else host_address(topo.hostname)
    token = secrets.token_hex(8) if topo.rank == 0 else ""
    gpus = gpu_inventory() if topo.local_rank == 0 else []  # one rank per node lists the node's GPUs for the run record
    infos = comm.allgather(
        {
            "rank": topo.rank,
            "addr": addr,
            **reserve_ports(spec, me),
            "token": token,
            "host": topo.hostname,
            "gpus": gpus,
        }
    )
    leader = infos[topo.rank - me.group_rank]
    ports = infos[topo.rank]["ports"]
    return RankContext(
        rank=me,
        job_id=topo.job_id,
        leader_addr=leader["addr"],
        dist_port=int(leader["dist_port"]),
        hosts=tuple(i["addr"] for i in infos),
        ports={k: int(v) for k, v in ports.items()},
        token=infos[0]["token"],
        kv_events=str(infos[topo.rank].get("kv_events", "")),
        # as the other replicas reach it: the engine serves (hf) or advertises (vLLM's NIXL) that address
        kv_transfer=kv_address(str(infos[topo.rank].get("kv_transfer", "")), addr),
    ), infos
