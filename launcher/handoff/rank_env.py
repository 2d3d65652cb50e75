"""`RankEnv`: the environment variables llmlaunch hands from one of its processes to the next, one field each.

    the local launcher -> a rank        where the rank stands (what srun's SLURM_* are on Slurm), die_with_launcher
    a rank -> its server                its place in the job and its model copy (launcher.rank.topology.
                                        rank_environment), the run dir; inherited by the python models, the engine
                                        process and an engine's own worker command
    launcher.triton_install -> server   the interpreter and checkout the models use, the engine's library path
    a rank -> its child services        why the front ends refuse requests while draining (launcher/procs/drain.py)

Each variable's name is declared once, on its field. A field is None when its variable is not set: `to_environ`
writes exactly the fields that are set and `from_environ` reads exactly the variables that are, so each hand-off
writes what it knows and each reader says, where it reads, what an unset variable means to it.

The names carry the private prefix `_LLMLAUNCH_`: they are the launcher's wiring, not settings a user sets.
LLMLAUNCH_RUN_DIR is the one public name (the batch script exports it for a profile's cluster.setup lines too).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Dict, Mapping, Optional, get_args, get_type_hints

from launcher.errors import LaunchError

PRIVATE = "_LLMLAUNCH_"  # the prefix of the variables the launcher passes to ranks and their servers


def _var(name: str):
    """A field carried by the environment variable `name`; None: not set."""
    return field(default=None, metadata={"var": name})


@dataclass(frozen=True)
class RankEnv:
    # ------------------------------------------------------------ where the rank stands (local launcher, rank)
    rank: Optional[int] = _var(PRIVATE + "RANK")  # the rank's global rank; set: the process is (or serves) a rank
    world_size: Optional[int] = _var(PRIVATE + "WORLD_SIZE")  # how many ranks the job has
    local_rank: Optional[int] = _var(PRIVATE + "LOCAL_RANK")  # the rank's index among its node's ranks
    node_rank: Optional[int] = _var(PRIVATE + "NODE_RANK")  # the index of the rank's node in the job
    nnodes: Optional[int] = _var(PRIVATE + "NNODES")  # how many nodes the job has
    job_id: Optional[str] = _var(PRIVATE + "JOB_ID")  # the job's id (locally the launcher's pid)
    # the local launcher's ranks go (drain, stop their servers) when llmlaunch dies, even by SIGKILL; on Slurm
    # slurmstepd ends a step's tasks itself
    die_with_launcher: Optional[bool] = _var(PRIVATE + "DIE_WITH_LAUNCHER")
    # ------------------------------------------------------------ the rank's model copy (rank -> server)
    replica: Optional[int] = _var(PRIVATE + "REPLICA")  # which data-parallel copy of the model the rank serves
    group_rank: Optional[int] = _var(PRIVATE + "GROUP_RANK")  # the rank's index in its copy (0: the leader)
    group_size: Optional[int] = _var(PRIVATE + "GROUP_SIZE")  # how many ranks the copy has (tp x pp)
    leader_addr: Optional[str] = _var(PRIVATE + "LEADER_ADDR")  # the address of the copy's leader
    dist_port: Optional[int] = _var(PRIVATE + "DIST_PORT")  # the port the leader reserved for distributed init
    # serve.routing=kv, a replica leader: the endpoint its engine publishes KV-cache events on (launcher/kv_events.py)
    kv_events: Optional[str] = _var(PRIVATE + "KV_EVENTS")
    # a prefill replica's leader: host:port its engine serves the keys and values of the prompts it computed on
    # (launcher/hf/kv_transfer.py); a decode replica takes them from there
    kv_transfer: Optional[str] = _var(PRIVATE + "KV_TRANSFER")
    run_dir: Optional[str] = _var("LLMLAUNCH_RUN_DIR")  # the job's run directory (launcher/rundir.py)
    # ------------------------------------------------------------ rank -> its child services (front ends)
    drain_reason: Optional[str] = _var(PRIVATE + "DRAIN_REASON")  # what a request refused while draining reads
    # ------------------------------------------------------------ launcher.triton_install -> the server
    python: Optional[str] = _var(PRIVATE + "PYTHON")  # the interpreter the engine process runs (the launcher's)
    root: Optional[str] = _var(PRIVATE + "ROOT")  # the checkout the server's models import llmlaunch from
    # the engine process's LD_LIBRARY_PATH: "" none, "inherit" the stub's (launcher.triton_install says why)
    engine_ld_library_path: Optional[str] = _var(PRIVATE + "ENGINE_LD_LIBRARY_PATH")

    @classmethod
    def var(cls, name: str) -> str:
        """The environment variable of field `name` (e.g. "group_rank" -> "_LLMLAUNCH_GROUP_RANK")."""
        return _VARS[name]

    def to_environ(self) -> Dict[str, str]:
        """The variables of the fields that are set, as text (a flag as "1" or "0")."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[_VARS[f.name]] = str(int(value)) if isinstance(value, bool) else str(value)
        return out

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "RankEnv":
        """The fields whose variables `environ` sets, parsed; the others None. A number that is not one is an
        error naming the variable."""
        return cls(**{name: _parse(name, environ[var]) for name, var in _VARS.items() if var in environ})


_VARS: Dict[str, str] = {f.name: f.metadata["var"] for f in fields(RankEnv)}
_TYPES = {name: get_args(hint)[0] for name, hint in get_type_hints(RankEnv).items()}  # Optional[X] -> X


def _parse(name: str, text: str):
    kind = _TYPES[name]
    if kind is str:
        return text
    if kind is bool:
        return text not in ("", "0")
    try:
        return int(text)
    except ValueError:
        raise LaunchError(
            (
                f"{_VARS[name]}={text!r}",
                "not a whole number; llmlaunch passes this variable to its ranks and servers",
                f"unset {_VARS[name]} (launch through llmlaunch, which sets it)",
            )
        ) from None


def local_launcher_env(rank: int, world_size: int, local_rank: int, job_id: str) -> RankEnv:
    """What llmlaunch's local launcher hands each rank it starts on this machine (srun's SLURM_* on Slurm)."""
    return RankEnv(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        node_rank=0,
        nnodes=1,
        job_id=job_id,
        die_with_launcher=True,
    )
