"""Where this rank stands: its place in the job (read from the launcher's environment, one table per launcher, as
submitit's JobEnvironment does), and the environment the rank gives the server it starts.

The variables llmlaunch itself passes (the local launcher's table, and what `rank_environment` gives each server)
carry the private prefix `_LLMLAUNCH_`: they are the launcher's wiring, not settings a user sets.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

PRIVATE = "_LLMLAUNCH_"  # the prefix of the variables the launcher passes to ranks and their servers


def private(name: str) -> str:
    """The variable the launcher passes as `name` (e.g. "GROUP_RANK" -> "_LLMLAUNCH_GROUP_RANK")."""
    return PRIVATE + name


# Where each launcher puts rank facts. One lookup table per launcher, read in one place: local emulation is just
# another table.
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
        "rank": private("RANK"),
        "world_size": private("WORLD_SIZE"),
        "local_rank": private("LOCAL_RANK"),
        "node_rank": private("NODE_RANK"),
        "nnodes": private("NNODES"),
        "job_id": private("JOB_ID"),
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
            get = lambda k, d="0", t=t: environ.get(t[k], d) if t[k] else d  # noqa: E731
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


# Set by the local launcher: the rank goes (drains and stops its servers) when llmlaunch dies, even by SIGKILL.
# On Slurm, slurmstepd ends a step's tasks itself.
DIE_WITH_LAUNCHER = private("DIE_WITH_LAUNCHER")


def local_rank_env(rank: int, world_size: int, local_rank: int, job_id: str) -> Dict[str, str]:
    """The local launcher's table for one rank on this machine (what srun's SLURM_* are on Slurm)."""
    return {
        DIE_WITH_LAUNCHER: "1",
        private("RANK"): str(rank),
        private("WORLD_SIZE"): str(world_size),
        private("LOCAL_RANK"): str(local_rank),
        private("NODE_RANK"): "0",
        private("NNODES"): "1",
        private("JOB_ID"): job_id,
    }


def host_address(hostname: str) -> str:
    """An address other nodes can reach: the node name's IP when it resolves, else the name."""
    try:
        return socket.gethostbyname(hostname)
    except OSError:
        return hostname


def visible_devices(environ: Mapping[str, str]) -> Optional[List[str]]:
    """The GPUs the launcher gave this task (CUDA_VISIBLE_DEVICES, else Slurm's step or job GPUs); None: not said."""
    v = environ.get("CUDA_VISIBLE_DEVICES") or environ.get("SLURM_STEP_GPUS") or environ.get("SLURM_JOB_GPUS")
    if not v:
        return None
    return [x for x in v.split(",") if x]


def rank_environment(spec, ctx, run_dir, visible: Optional[List[str]]) -> Dict[str, str]:
    """What this rank's server (and its models and engine processes) learns of its place: launcher.rank.rendezvous.
    RankContext `ctx` after the rendezvous. LLMLAUNCH_RUN_DIR is the one public name: the batch script exports it for
    a profile's cluster.setup lines too."""
    me = ctx.rank
    group_ranks = [r for r in spec.ranks if r.replica == me.replica]
    env = {
        private("RANK"): str(me.rank),
        private("WORLD_SIZE"): str(spec.world_size),
        private("LOCAL_RANK"): str(me.local_rank),
        private("NODE_RANK"): str(me.node),
        private("NNODES"): str(spec.nodes),
        private("REPLICA"): str(me.replica),
        private("GROUP_RANK"): str(me.group_rank),
        private("GROUP_SIZE"): str(len(group_ranks)),
        private("LEADER_ADDR"): ctx.leader_addr,
        private("DIST_PORT"): str(ctx.dist_port),
        private("JOB_ID"): str(ctx.job_id),
        "LLMLAUNCH_RUN_DIR": str(run_dir),
    }
    if ctx.kv_events:  # a leader whose engine publishes KV-cache events (serve.routing=kv)
        env[private("KV_EVENTS")] = ctx.kv_events
    if me.gpus and visible is not None:
        # Slurm gives the task the node's GPUs (--gpus-per-node); each rank takes its own slice.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible[g] for g in me.gpus if g < len(visible))
    return env
