"""Where this rank stands: its place in the job (read from the launcher's environment, one table per launcher, as
submitit's JobEnvironment does), and the environment the rank gives the server it starts.

The variables llmlaunch itself passes (the local launcher's, and what `rank_environment` gives each server) are
launcher.handoff.rank_env.RankEnv's fields.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional

from launcher.handoff.rank_env import RankEnv

# Where each external launcher puts rank facts. One lookup table per launcher, read in one place; llmlaunch's own
# local launcher passes them as RankEnv.
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
    """Our local launcher's RankEnv first (it hands each rank its place explicitly; a Slurm task's variables may be
    those of an allocation `llmlaunch cluster=local` itself runs in), then Slurm (srun sets it), then Open MPI."""
    env = RankEnv.from_environ(environ)
    if env.rank is not None and env.world_size is not None:
        return Topology(
            launcher="local",
            rank=env.rank,
            world_size=env.world_size,
            local_rank=env.local_rank or 0,
            node_rank=env.node_rank or 0,
            nnodes=env.nnodes or 1,
            job_id=env.job_id or str(os.getpid()),
            hostname=socket.gethostname(),
        )
    for name in ("slurm", "openmpi"):
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
    RankContext `ctx` after the rendezvous, as RankEnv's variables, and the GPUs it may use."""
    me = ctx.rank
    env = RankEnv(
        rank=me.rank,
        world_size=spec.world_size,
        local_rank=me.local_rank,
        node_rank=me.node,
        nnodes=spec.nodes,
        replica=me.replica,
        group_rank=me.group_rank,
        group_size=sum(1 for r in spec.ranks if r.replica == me.replica),
        leader_addr=ctx.leader_addr,
        dist_port=ctx.dist_port,
        job_id=str(ctx.job_id),
        run_dir=str(run_dir),
        kv_events=ctx.kv_events or None,  # a leader whose engine publishes KV-cache events (serve.routing=kv)
        kv_transfer=ctx.kv_transfer or None,  # a prefill replica's leader (disagg)
    ).to_environ()
    if me.gpus and visible is not None:
        # Slurm gives the task the node's GPUs (--gpus-per-node); each rank takes its own slice.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible[g] for g in me.gpus if g < len(visible))
    return env
