"""Composed config -> frozen launch spec. Pure: reads nothing, writes nothing.

`build_spec(cfg)` is the one validation step. It collects every problem it
finds (value, why, fix) and raises them together as a `LaunchError`, so a user
fixes a config in one go. The spec it returns carries the schema's dataclasses
(launcher/schema.py: each default lives there only) and is JSON-able via
`to_json` (launch.json, rebuilt typed by `from_json`); rendering, submission and
the per-rank entry point all read it: one source of truth for who runs what where.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from launcher.errors import LaunchError

if TYPE_CHECKING:  # launcher.schema imports omegaconf; the engine processes import this module's constants only
    from launcher.schema import BenchConfig, ClusterConfig, EngineConfig, LaunchConfig, ModelConfig, ServeConfig

SCHEDULERS = ("local", "slurm")
GPU_REQUESTS = ("gpus-per-node", "gres", "none")
MPI_TYPES = ("pmix", "pmi2", "none")
CONTAINER_RUNTIMES = ("none", "pyxis")
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "bfloat16", "float16")
# serve.* ports rank 0 offers clients, each its own: tritonserver's three, and the OpenAI API's (launcher/openai_api)
PUBLIC_PORTS = ("grpc_port", "http_port", "metrics_port", "openai_port")
CUDNN_ATTENTION = ("graphs", "all", "off")  # hf engine.cudnn_attention (launcher.engines.hf_runner says what each means)


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
class LaunchSpec:
    """Everything needed to render, submit and run one job."""

    job_name: str
    cluster: ClusterConfig
    engine: EngineConfig  # the engine's own dataclass (launcher.schema.ENGINE_SCHEMAS[engine.name])
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

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def group_size(self) -> int:
        return self.tp * self.pp

    def to_json(self) -> str:
        """launch.json: every field as plain JSON (dataclasses.asdict); from_json rebuilds the same typed spec."""
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "LaunchSpec":
        from launcher.schema import ENGINE_SCHEMAS, BenchConfig, ClusterConfig, ModelConfig, ServeConfig, build

        d = json.loads(text)
        parts = {"cluster": ClusterConfig, "engine": ENGINE_SCHEMAS[d["engine"]["name"]], "model": ModelConfig,
                 "serve": ServeConfig, "bench": BenchConfig}
        for key, cls in parts.items():
            d[key], unknown = build(cls, d[key], f"{key}.")
            if unknown:
                raise ValueError(f"launch.json: {', '.join(unknown)} not in launcher/schema.py's {cls.__name__}: "
                                 "written by another llmlaunch version; launch the job again with this one")
        d["ranks"] = tuple(RankSpec(**{**r, "gpus": tuple(r["gpus"]), "models": tuple(r["models"])}) for r in d["ranks"])
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
                (f"tp*pp={group}", f"model copies of {group} GPUs do not tile the {per_node} GPUs used per node", "make tp*pp divide the GPUs per node")
            )
            return None
        nodes_per_group = 1
    else:
        if group % per_node:
            problems.append(
                (f"tp*pp={group}", f"a model copy spanning nodes must use whole nodes' worth ({per_node} GPUs each)", "make tp*pp a multiple of the GPUs used per node")
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
        out.append(RankSpec(r, node, local, replica, group_rank, gpus, "leader" if leader else "worker", serves, models))
    return tuple(out)


def typed_config(c: Mapping[str, Any]) -> Tuple[LaunchConfig, List[Tuple[str, str, str]]]:
    """A composed config as plain data -> the schema's dataclasses (the engine's own, by engine.name), and a
    problem for each key no dataclass has (an unknown engine is reported by build_spec)."""
    from launcher.engines import registry
    from launcher.schema import ENGINE_SCHEMAS, EngineConfig, LaunchConfig, build

    ename = c["engine"].get("name")
    known = ename in registry.ENGINES
    engine, unknown = build(ENGINE_SCHEMAS[ename] if known else EngineConfig, c["engine"], "engine.")
    if not known:
        unknown = []
    launch, more = build(LaunchConfig, {**c, "engine": engine})
    return launch, [(k, "no such key in launcher/schema.py" + (f" for engine={ename}" if k.startswith("engine.") else ""),
                     "check the spelling (`llmlaunch --cfg job` prints every key)") for k in unknown + more]


def check_walltime(problems, cluster, serve, requeue: bool) -> None:
    """The time limit against what must fit in it, and requeue against what the site allows. A job signalled
    serve.walltime_signal_s before its limit has that much less to load in; when that is less than
    serve.ready_timeout_s (how long loading may take) it can be drained before it ever serves."""
    if cluster.scheduler != "slurm":
        if requeue:
            problems.append(("requeue=true", f"cluster={cluster.name} runs on this machine without a scheduler: there is no time limit and no queue to requeue into",
                             "drop requeue, or use a Slurm cluster profile whose cluster.allows_requeue is true"))
        return
    import re

    from launcher.domains import SLURM_TIME

    lead = serve.walltime_signal_s  # its domain (launcher/schema.py) is checked already
    if lead and lead < serve.drain_timeout_s + 10:
        problems.append((f"serve.walltime_signal_s={lead}", f"Slurm kills the job at its limit, and draining takes up to serve.drain_timeout_s={serve.drain_timeout_s:g} "
                         "plus about 10 s for the ranks to end their servers", f"set serve.walltime_signal_s={int(serve.drain_timeout_s) + 10} or more, or lower serve.drain_timeout_s"))
    if re.fullmatch(SLURM_TIME, str(cluster.time)):
        from launcher.render import time_minutes

        limit_s = time_minutes(cluster.time) * 60
        if limit_s - lead < serve.ready_timeout_s:
            need = -(-int(serve.ready_timeout_s + lead) // 60)
            problems.append((f"cluster.time={cluster.time}", f"{limit_s}s minus the drain signal's serve.walltime_signal_s={lead} leaves {limit_s - lead}s, less than "
                             f"serve.ready_timeout_s={serve.ready_timeout_s:g} the model may take to load: the job could be drained before it serves",
                             f"set cluster.time={need // 60:02d}:{need % 60:02d}:00 or more, or lower serve.ready_timeout_s to the model's load time"))
    if requeue and not cluster.allows_requeue:
        problems.append(("requeue=true", f"cluster={cluster.name} does not allow a job to requeue itself (cluster.allows_requeue=false: the site's JobRequeue, "
                         "partition or QOS forbid `scontrol requeue`)", "drop requeue, or set cluster.allows_requeue=true in the profile once the site allows it"))


def build_spec(cfg) -> LaunchSpec:
    """Validate a composed config (OmegaConf or plain dict) and return the frozen spec."""
    from launcher import domains
    from launcher.engines import registry

    c, problems = typed_config(plain(cfg))
    cluster, engine, model, serve = c.cluster, c.engine, c.model, c.serve
    container = cluster.container

    # --- every field against the domain launcher/schema.py declares beside it (launcher/domains.py)
    problems += domains.problems(c)
    ename = engine.name

    # --- rules across fields
    if cluster.scheduler == "slurm" and cluster.mpi == "none":
        problems.append(("cluster.mpi='none'", "ranks rendezvous through MPI (mpi4py); srun must start them with PMIx or PMI2", "set cluster.mpi=pmix (or pmi2)"))
    if container.runtime == "pyxis" and not container.image:
        problems.append(("cluster.container.image=''", "pyxis needs an image", "set cluster.container.image=<registry#image:tag> or cluster.container.runtime=none"))
    tp, pp, nodes, replicas = c.tp, c.pp, c.nodes, c.replicas
    gpn = cluster.gpus_per_node
    if cluster.scheduler == "local" and nodes != 1:
        problems.append((f"nodes={nodes}", "cluster=local runs on this one machine", "use nodes=1, or a Slurm cluster profile (cluster=local_slurm, cluster=slurm)"))
    seen: Dict[int, str] = {}
    for k in PUBLIC_PORTS:
        p = getattr(serve, k)
        if p in seen:
            problems.append((f"serve.{k}={p}", f"the same port as serve.{seen[p]}", f"give serve.{k} its own port"))
        seen.setdefault(p, k)
    check_walltime(problems, cluster, serve, bool(c.requeue))

    edef = registry.ENGINES.get(ename)
    lay = None
    if edef is not None and not any(p[0].startswith(("tp=", "pp=", "nodes=", "replicas=", "cluster.gpus_per_node")) for p in problems):
        lay = layout(edef.layout, tp, pp, replicas, nodes, gpn, problems)
        if lay is not None and lay[3] > 1 and not edef.spans_nodes(engine):
            problems.append(
                (
                    f"engine={ename} with tp*pp={tp * pp} over {lay[3]} nodes",
                    edef.why_single_node(engine),
                    f"keep a model copy on one node: tp*pp <= {lay[2]} GPUs per node (use replicas for more nodes)",
                )
            )
    if edef is not None:
        problems.extend(edef.check(c))
    if problems:
        raise LaunchError(problems)

    tasks_per_node, gpus_per_task, used, _ = lay
    ranks = build_ranks(edef.workers_load(engine), tp, pp, replicas, nodes, tasks_per_node, gpus_per_task)
    host = serve.host or ("0.0.0.0" if cluster.scheduler == "slurm" else "127.0.0.1")
    return LaunchSpec(
        job_name=c.job_name,
        cluster=cluster,
        engine=engine,
        model=model,
        serve=serve,
        bench=c.bench,
        tp=tp,
        pp=pp,
        nodes=nodes,
        replicas=replicas,
        tasks_per_node=tasks_per_node,
        gpus_per_task=gpus_per_task,
        gpus_per_node_used=used,
        model_name=edef.model_name(engine),
        host=host,
        ranks=ranks,
        requeue=bool(c.requeue),
    )


def plain(cfg) -> Dict[str, Any]:
    """A composed config (OmegaConf or already a dict) as plain data, interpolations resolved."""
    if isinstance(cfg, dict):
        return cfg
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)
