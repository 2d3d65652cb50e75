"""The launch spec: who runs what where, as frozen data. Pure: reads nothing, writes nothing.

`LaunchSpec` carries the schema's dataclasses (launcher/schema.py: each default lives there only) and is JSON-able via
`to_json` (launch.json, rebuilt typed by `from_json`); rendering, submission and the per-rank entry point all read it:
one source of truth. `layout` and `build_ranks` place the ranks; launcher/validate.py's `build_spec` makes a spec
from a composed config.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

if TYPE_CHECKING:  # launcher.schema imports omegaconf and every engine; processes that only read a spec need neither
    from launcher.schema import BenchConfig, ClusterConfig, EngineConfig, ModelConfig, ServeConfig


@dataclass(frozen=True)
class RankSpec:
    """What one Slurm task (one tritonserver) is."""

    rank: int  # global rank (SLURM_PROCID)
    node: int  # node index in the job (SLURM_NODEID)
    local_rank: int  # rank on its node (SLURM_LOCALID)
    replica: int  # which data-parallel copy it belongs to
    group_rank: int  # rank inside its copy's model-parallel group (0 = that copy's leader)
    gpus: Tuple[int, ...]  # GPU indices on its node it owns (empty on CPU-only)
    role: str  # leader (receives requests, schedules) | worker (runs the leader's steps)
    serves: str  # public (the job's endpoint) | internal (replica leader behind the front end) | none
    models: Tuple[str, ...]  # models its tritonserver loads; empty = every model in the repository


@dataclass(frozen=True)
class ServiceLink:
    """What a replica job of a service (serve.router=host|job, launcher/service/) needs to join it: its rank 0 registers
    at `url` with the token in `token_file` (readable only by the user) as `name`, and deregisters when it drains."""

    url: str  # the router's control API, http://HOST:PORT
    token_file: str  # the service's token: a replica job that does not present it is refused
    name: str  # the replica job's name in the service (r<K>), with its Slurm job id what the router knows it by


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to render, submit and run one job."""

    job_name: str
    cluster: ClusterConfig
    engine: EngineConfig  # the engine's own dataclass (its Engine's Config, launcher/engines/registry.py)
    model: ModelConfig
    serve: ServeConfig
    bench: BenchConfig
    tp: int
    pp: int
    nodes: int
    replicas: int
    tasks_per_node: int  # Slurm tasks (tritonservers) per node
    gpus_per_task: int  # GPUs each task owns
    gpus_per_node_used: int  # GPUs the job asks for on each node
    model_name: str  # Triton model name clients address
    host: str  # address rank 0 binds
    ranks: Tuple[RankSpec, ...] = field(default_factory=tuple)
    requeue: bool = False  # at the time limit, drain and requeue into a new allocation (schema.LaunchConfig.requeue)
    # every rank runs on this machine (the scheduler's on_this_machine): internal servers bind and are reached on 127.0.0.1
    loopback: bool = False
    # serve.router=host|job: the replica jobs the service starts with (this spec is one replica job's); 0 = one job
    service_replicas: int = 0
    # a replica job of a service: where its rank 0 registers once it serves (set by the router as it submits the job)
    service: Optional["ServiceLink"] = None
    # disagg.prefill: replicas 0..prefill_replicas-1 compute prompts only, the others decode; 0 = aggregated
    prefill_replicas: int = 0

    def role(self, replica: int) -> str:
        """What replica `replica` serves: prefill | decode (disagg), or whole requests ("")."""
        if not self.prefill_replicas:
            return ""
        return "prefill" if replica < self.prefill_replicas else "decode"

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def group_size(self) -> int:
        return self.tp * self.pp

    @property
    def python(self) -> str:
        """The interpreter the ranks run with: cluster.python, else the one running llmlaunch."""
        return self.cluster.python or sys.executable

    def to_json(self) -> str:
        """launch.json: every field as plain JSON (dataclasses.asdict); from_json rebuilds the same typed spec."""
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "LaunchSpec":
        from launcher.engines.registry import ENGINES
        from launcher.schema import BenchConfig, ClusterConfig, ModelConfig, ServeConfig, build

        d = json.loads(text)
        parts = {
            "cluster": ClusterConfig,
            "engine": ENGINES[d["engine"]["name"]].Config,
            "model": ModelConfig,
            "serve": ServeConfig,
            "bench": BenchConfig,
        }
        for key, cls in parts.items():
            d[key], unknown = build(cls, d[key], f"{key}.")
            if unknown:
                raise ValueError(
                    f"launch.json: {', '.join(unknown)} not in launcher/schema.py's {cls.__name__}: "
                    "written by another llmlaunch version; launch the job again with this one"
                )
        if d.get("service"):
            d["service"] = ServiceLink(**d["service"])
        d["ranks"] = tuple(
            RankSpec(**{**r, "gpus": tuple(r["gpus"]), "models": tuple(r["models"])}) for r in d["ranks"]
        )
        return LaunchSpec(**d)


def layout(engine_layout: str, tp: int, pp: int, replicas: int, nodes: int, gpus_per_node: int, problems: list):
    """Return (tasks_per_node, gpus_per_task, gpus_per_node_used, nodes_per_group) or None after adding problems.

    per_gpu: one tritonserver per GPU (TensorRT-LLM leader mode, our hf engine).
    per_group: one tritonserver per model copy per node; the engine inside owns
    that copy's GPUs on the node (vLLM, SGLang, LMDeploy).
    """
    group = tp * pp
    total = group * replicas
    capacity = nodes * gpus_per_node
    if total > capacity:
        need_nodes = -(-total // gpus_per_node)
        problems.append(
            (
                f"tp*pp*replicas={tp}*{pp}*{replicas}={total}",
                f"needs {total} GPUs but nodes={nodes} x cluster.gpus_per_node={gpus_per_node} gives {capacity}",
                f"set nodes={need_nodes}, or lower tp, pp or replicas",
            )
        )
        return None
    if total % nodes:
        problems.append(
            (
                f"nodes={nodes}",
                f"the job's {total} GPUs (tp*pp*replicas) cannot be spread evenly over {nodes} nodes",
                f"use a node count dividing {total}, e.g. nodes={max(d for d in range(1, nodes + 1) if total % d == 0)}",
            )
        )
        return None
    per_node = total // nodes
    if group <= per_node:
        if per_node % group:
            problems.append(
                (
                    f"tp*pp={group}",
                    f"model copies of {group} GPUs do not tile the {per_node} GPUs used per node",
                    "make tp*pp divide the GPUs per node",
                )
            )
            return None
        nodes_per_group = 1
    else:
        if group % per_node:
            problems.append(
                (
                    f"tp*pp={group}",
                    f"a model copy spanning nodes must use whole nodes' worth ({per_node} GPUs each)",
                    "make tp*pp a multiple of the GPUs used per node",
                )
            )
            return None
        nodes_per_group = group // per_node
    if engine_layout == "per_gpu":
        return per_node, 1, per_node, nodes_per_group
    # per_group: one task per copy on each node it touches
    gpus_per_task = min(group, per_node)
    return per_node // gpus_per_task, gpus_per_task, per_node, nodes_per_group


def build_ranks(worker_models, tp, pp, replicas, nodes, tasks_per_node, gpus_per_task) -> Tuple[RankSpec, ...]:
    """Assign ranks in Slurm's block order (ranks 0..k-1 on node 0, ...); non-leaders load `worker_models`."""
    world = nodes * tasks_per_node
    ranks_per_group = world // replicas
    out = []
    for r in range(world):
        node, local = divmod(r, tasks_per_node)
        replica, group_rank = divmod(r, ranks_per_group)
        leader = group_rank == 0
        if r == 0:
            serves = "public"
        elif leader:
            serves = "internal"
        else:
            serves = "none"
        gpus = tuple(range(local * gpus_per_task, (local + 1) * gpus_per_task))
        models = () if leader else tuple(worker_models)
        out.append(
            RankSpec(r, node, local, replica, group_rank, gpus, "leader" if leader else "worker", serves, models)
        )
    return tuple(out)


def plain(cfg) -> Dict[str, Any]:
    """A composed config (OmegaConf or already a dict) as plain data, interpolations resolved."""
    if isinstance(cfg, dict):
        return cfg
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)
