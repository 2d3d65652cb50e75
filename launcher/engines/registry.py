"""Engines as data plus small functions.

Each `EngineDef` says how an engine lays out ranks, which models its
repository holds (as protobuf configs plus source files to copy), what the
non-leader ranks load, and what it requires from the config. Adding an engine
is adding one entry here and one folder under `model_repository/`; nothing
else branches on the engine's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple


REPO_SOURCES = Path(__file__).resolve().parents[2] / "model_repository"


@dataclass(frozen=True)
class RenderedModel:
    """One model folder of a Triton repository: its config and the files beside it."""

    name: str
    config: Any  # model_config_pb2.ModelConfig
    files: Dict[str, str] = field(default_factory=dict)  # path inside the model folder -> source path under model_repository/
    extra_text: Dict[str, str] = field(default_factory=dict)  # path inside the model folder -> generated text (engine JSON files)


def _no_problems(cfg) -> List[Tuple[str, str, str]]:
    return []


def model_host_paths(c) -> List[Tuple[str, str, str]]:
    """(key, path, kind) of what an engine loading a Hugging Face folder reads (launcher/hostcheck.py's kinds):
    model.path (config, weights and, without model.tokenizer, the tokenizer) and model.tokenizer."""
    m = c.model
    return [("model.path", m.path, "hf_weights" if m.tokenizer else "hf_model"), ("model.tokenizer", m.tokenizer, "tokenizer")]


def _reported_phases(log_text: str) -> Dict[str, float]:
    from launcher.readiness import reported_phases

    return reported_phases(log_text)


# What vLLM's start is made of, as its own log lines say: its load phases for the time-to-READY breakdown.
VLLM_LOAD_PHASES = {
    "weights_s": r"Loading weights took ([0-9.]+) seconds",
    "model_load_s": r"Model loading took .*? and ([0-9.]+) seconds",
    "dynamo_s": r"Dynamo bytecode transform time: ([0-9.]+) s",
    "compile_s": r"torch\.compile took ([0-9.]+) s in total",
    "cuda_graphs_s": r"Graph capturing finished in ([0-9.]+) secs",
    "engine_init_s": r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+)",
}


def _vllm_load_phases(log_text: str) -> Dict[str, float]:
    from launcher.readiness import phases_from_patterns, reported_phases

    return {**reported_phases(log_text), **phases_from_patterns(VLLM_LOAD_PHASES, log_text)}


@dataclass(frozen=True)
class EngineDef:
    name: str
    default_model_name: str  # Triton model name when engine.model_name is empty
    layout: str  # per_gpu (one tritonserver per GPU) | per_group (one per model copy per node)
    models: Callable[[Any], List[RenderedModel]]  # spec -> the repository's models
    worker_models: Tuple[str, ...] = ()  # models non-leader ranks load (explicit model control)
    # The facts below that depend on settings take the engine's config (its launcher.schema dataclass).
    spans_nodes: Callable[[Any], bool] = lambda engine: True  # can one model copy span nodes?
    why_single_node: Callable[[Any], str] = lambda engine: ""
    # A model copy over several nodes: does the engine run the other nodes as workers of a per-copy Ray
    # cluster (its leader's model starts the head)? Then those ranks run `ray start`, not tritonserver.
    ray_across_nodes: Callable[[Any], bool] = lambda engine: False
    ray_env: Tuple[Tuple[str, str], ...] = ()  # more environment for the ranks of a copy on Ray (engine's own switches)
    # The server is itself the job's MPI program (TensorRT-LLM leader mode): the ranks then rendezvous through
    # files, so the rank's wrapper does not take the task's PMIx connection before the server does.
    server_uses_mpi: bool = False
    # The served model reports the first-token split (queue, prefill, first response) in its Triton metrics
    # (launcher/serving/timings.py), which the bench reads from the serving tritonserver.
    first_token_split: bool = False
    check: Callable[[Any], List[Tuple[str, str, str]]] = _no_problems  # launcher.schema.LaunchConfig -> engine-specific problems
    # launcher.schema.LaunchConfig -> (key, path, kind) of the folders the engine loads, which launcher/hostcheck.py
    # looks for on the launch host before anything starts (an empty path is skipped)
    host_paths: Callable[[Any], List[Tuple[str, str, str]]] = model_host_paths
    # Does this engine config need a GPU? A local launch without one visible is refused (launcher/hostcheck.py).
    needs_gpu: Callable[[Any], bool] = lambda engine: engine.device == "cuda"
    # Per-rank hooks, given (spec, RankContext from launcher.rank): extra environment for the
    # rank's process, and a command replacing tritonserver on that rank (e.g. a Ray worker), or None.
    rank_env: Callable[[Any, Any], Dict[str, str]] = lambda spec, ctx: {}
    rank_command: Callable[[Any, Any], Any] = lambda spec, ctx: None
    # Pure, so the plan shows it too: given (spec, RankSpec, the rank's tritonserver argv), the command the rank
    # runs (e.g. the server behind an MPI launcher); and whether that command is a tritonserver at all.
    rank_argv: Callable[[Any, Any, List[str]], List[str]] = lambda spec, rank, argv: argv
    runs_server: Callable[[Any, Any], bool] = lambda spec, rank: True
    # An engine with several repository layouts (trtllm's engine.layout): the default model name and what
    # non-leader ranks load for its config, when they differ from default_model_name / worker_models.
    default_model_name_of: Callable[[Any], str] = lambda engine: ""
    worker_models_of: Callable[[Any], Optional[Tuple[str, ...]]] = lambda engine: None
    # rank 0's log text -> the engine's load phases (name -> seconds: weights, compile, graph capture) for the
    # time-to-READY breakdown; by default the `llmlaunch-phase:` lines an engine reports (launcher/readiness.py)
    load_phases: Callable[[str], Dict[str, float]] = _reported_phases
    summary: str = ""

    def model_name(self, engine) -> str:
        """The Triton model name clients address: engine.model_name, else this engine's default for its config."""
        return engine.model_name or self.default_model_name_of(engine) or self.default_model_name

    def workers_load(self, engine) -> Tuple[str, ...]:
        """Models the non-leader ranks' tritonservers load, for this engine config."""
        models = self.worker_models_of(engine)
        return tuple(self.worker_models if models is None else models)


def model_path(spec) -> str:
    return spec.model.path


def tokenizer_path(spec) -> str:
    return spec.model.tokenizer or spec.model.path


# ----------------------------------------------------------------------------- hf
def hf_engine_args(spec):
    """The hf engine's arguments for this launch (HFEngineArgs): the engine config's fields of the same names, the
    model's dtype and max_model_len, its paths and tp; a setting the config leaves out keeps its default."""
    import dataclasses

    from launcher.engines.hf_args import HFEngineArgs

    names = {f.name for f in dataclasses.fields(HFEngineArgs)}
    given = {k: v for k, v in dataclasses.asdict(spec.engine).items() if k in names}
    given.update(dtype=spec.model.dtype, max_model_len=spec.model.max_model_len)
    given.update(model_path=model_path(spec), tokenizer_path=tokenizer_path(spec), tp_size=spec.tp)
    return HFEngineArgs.from_dict(given, source="engine config")


def _hf_models(spec) -> List[RenderedModel]:
    from launcher import pbtxt
    from launcher.engines.hf_args import ARGS_FILE

    args = hf_engine_args(spec)
    # config.pbtxt holds what Triton reads (batch size, instances) and the arguments file's name; the engine's
    # arguments are in 1/model.json. Several instances share one engine process (each sends its own streams'
    # responses): hf model.py
    params = {"engine_args_file": ARGS_FILE}
    if args.tokenizer_path or args.model_path:  # for clients: llmlaunch-bench counts prompts in the served tokens
        params["tokenizer_path"] = args.tokenizer_path or args.model_path
    cfg = pbtxt.python_model(spec.model_name, args.max_num_seqs, params,
                             instances=spec.engine.response_processes)
    return [RenderedModel(spec.model_name, cfg, {"1/model.py": "hf/1/model.py"}, {f"1/{ARGS_FILE}": args.to_json()})]


def _hf_check(c) -> List[Tuple[str, str, str]]:
    """Rules across fields; each field's own domain is declared in launcher/schema.py."""
    m, e = c.model, c.engine
    if not m.path and not m.make:
        return [("model.path=''", "the hf engine needs a HF-format model folder", "set model.path=/path/to/hf_model, or model=smollm2 (a real small model) or model=tiny (random weights) for one llmlaunch makes")]
    if c.pp != 1:
        return [(f"pp={c.pp}", "the hf engine has no pipeline parallelism", "use pp=1; scale out with replicas")]
    n = e.response_processes  # its domain (launcher/schema.py) is checked with every field's
    if isinstance(n, int) and n > 1 and c.tp != 1:
        return [(f"engine.response_processes={n}", f"with tp={c.tp} each rank runs one model instance (the "
                 "tensor-parallel leader's engine process is not shared)", "set engine.response_processes=1")]
    # tp > 1: one tritonserver per rank, rank 0 leads (launcher/engines/hf_tp.py); whether tp divides the
    # model's heads and kv heads is checked when the ranks load it (a clear error, the job fails).
    return []


# ----------------------------------------------------------------------------- vllm / sglang / lmdeploy
def _require_path(c, what="model.path", engine="") -> List[Tuple[str, str, str]]:
    if not c.model.path:
        return [(f"{what}=''", f"the {engine} engine loads real weights and cannot make a model", f"set {what}=/path/to/hf_model (a HF-format folder on a filesystem the nodes share)")]
    return []


def copy_nodes(spec) -> int:
    """Nodes one model copy spans (1 when a copy fits in a node)."""
    return max(1, spec.tp * spec.pp // spec.gpus_per_node_used) if spec.gpus_per_node_used else 1


def _python_engine_models(source_dir: str, extra_params: Callable[[Any], Dict[str, object]], extra_text: Callable[[Any], Dict[str, str]] = lambda s: {},
                          instances: Callable[[Any], int] = lambda s: 1):
    def render(spec) -> List[RenderedModel]:
        from launcher import pbtxt

        e = spec.engine
        params = {
            "model_path": model_path(spec),
            "tokenizer_path": tokenizer_path(spec),
            "tp_size": spec.tp,
            "pp_size": spec.pp,
            "nnodes": copy_nodes(spec),
            "max_num_seqs": e.max_num_seqs,
            "dtype": spec.model.dtype,
            "max_model_len": spec.model.max_model_len,
        }
        params.update(extra_params(spec))
        cfg = pbtxt.python_model(spec.model_name, e.max_num_seqs, params, kind="KIND_MODEL", instances=instances(spec))
        return [RenderedModel(spec.model_name, cfg, {"1/model.py": f"{source_dir}/1/model.py"}, extra_text(spec))]

    return render


def _vllm_engine_args(spec) -> Dict[str, str]:
    """vLLM's own engine-args file (model.json): ours fill the gaps, the user's win."""
    import json

    e = spec.engine
    args = {
        "model": model_path(spec),
        "tokenizer": tokenizer_path(spec),
        "tensor_parallel_size": spec.tp,
        "pipeline_parallel_size": spec.pp,
        "max_num_seqs": e.max_num_seqs,
        "gpu_memory_utilization": e.gpu_memory_utilization,
        "dtype": spec.model.dtype,
    }
    if spec.model.max_model_len:
        args["max_model_len"] = spec.model.max_model_len
    args["distributed_executor_backend"] = _vllm_backend(spec)
    args.update(e.engine_args)
    return {"1/model.json": json.dumps(args, indent=2, sort_keys=True) + "\n"}


def _vllm_backend(spec) -> str:
    """vLLM's distributed executor: `auto` is mp inside a node and ray across nodes."""
    backend = spec.engine.distributed_executor_backend
    return ("ray" if copy_nodes(spec) > 1 else "mp") if backend == "auto" else backend


def _sglang_params(spec) -> Dict[str, object]:
    e = spec.engine
    p: Dict[str, object] = {"model_name": model_path(spec)}  # informational; sglang_model reads model_path
    if e.mem_fraction_static:
        p["mem_fraction_static"] = e.mem_fraction_static
    if e.extra_args:
        p["extra_args"] = dict(e.extra_args)
    return p


def _lmdeploy_params(spec) -> Dict[str, object]:
    e = spec.engine
    p: Dict[str, object] = {"model_name": spec.model.name, "backend": e.backend, "cache_max_entry_count": e.cache_max_entry_count}
    if e.session_len:
        p["session_len"] = e.session_len
    if e.extra_args:
        p["extra_args"] = dict(e.extra_args)
    return p


def _lmdeploy_check(c) -> List[Tuple[str, str, str]]:
    return _require_path(c, engine="lmdeploy")


def _vllm_check(c):
    problems = _require_path(c, engine="vllm")
    b = c.engine.distributed_executor_backend
    gpn = c.cluster.gpus_per_node
    if b == "mp" and isinstance(gpn, int) and gpn > 0 and c.tp * c.pp > gpn:
        problems.append(
            (
                f"engine.distributed_executor_backend='mp' with tp*pp={c.tp * c.pp}",
                f"a model copy larger than a node ({gpn} GPUs) spans nodes, and vLLM spans nodes only with its Ray executor",
                "set engine.distributed_executor_backend=auto (or ray)",
            )
        )
    return problems


# ----------------------------------------------------------------------------- per-rank hooks (vllm / sglang / lmdeploy / trtllm)
# `ctx` is launcher.rank.RankContext: rank (RankSpec), job_id, leader_addr, dist_port, hosts.
# For the per_group engines a copy that spans nodes has one rank per node; group_rank is its node
# index inside the copy, and group_rank 0 (the copy's leader) is the one that serves.
def _own_addr(ctx) -> str:
    return ctx.hosts[ctx.rank.rank] if ctx.hosts else ""


def _ray_address(ctx) -> str:
    return f"{ctx.leader_addr}:{ctx.dist_port}"


def uses_ray(spec) -> bool:
    """Does a model copy of this job run its workers on a per-copy Ray cluster?"""
    return copy_nodes(spec) > 1 and ENGINES[spec.engine.name].ray_across_nodes(spec.engine)


def _ray_rank_env(spec, ctx) -> Dict[str, str]:
    """vLLM / LMDeploy-PyTorch copies over several nodes: the address Ray and vLLM advertise for this node."""
    if not uses_ray(spec):
        return {}
    env = {"RAY_USAGE_STATS_ENABLED": "0"}
    if _own_addr(ctx):
        env["VLLM_HOST_IP"] = _own_addr(ctx)  # vLLM's workers bind/advertise this address (multi-NIC nodes)
    env.update(ENGINES[spec.engine.name].ray_env)
    return env


def _ray_rank_command(spec, ctx):
    """The copy's leader runs tritonserver (its model starts the Ray head); the other nodes join the
    head with `ray start --block` instead of running a tritonserver."""
    if not uses_ray(spec) or ctx.rank.group_rank == 0:
        return None
    from launcher.engines.vllm_ray import worker_command
    from launcher.render import python_for

    return worker_command(python_for(spec), _ray_address(ctx), _own_addr(ctx), float(spec.serve.ready_timeout_s))


def _sglang_rank_env(spec, ctx) -> Dict[str, str]:
    """Every node of a copy runs tritonserver + sglang_model; nodes > 0 only host the engine's share:
    SGLang's Engine() must return there instead of blocking (SGLANG_BLOCK_NONZERO_RANK_CHILDREN=0).
    nnodes / node_rank / dist_init_addr reach the model through LLMLAUNCH_GROUP_SIZE / _GROUP_RANK /
    _LEADER_ADDR / _DIST_PORT."""
    if copy_nodes(spec) <= 1 or ctx.rank.group_rank == 0:
        return {}
    return {"SGLANG_BLOCK_NONZERO_RANK_CHILDREN": "0"}


def _trtllm_rank_env(spec, ctx) -> Dict[str, str]:
    """Leader mode: each rank is one MPI process and TensorRT-LLM picks its GPU by MPI rank among the
    node's visible GPUs; with one GPU per rank it falls back to device 0 and warns that the custom
    all-reduce (peer-to-peer between the node's GPUs) is slower. So every rank keeps all the GPUs the
    job holds on its node visible (read from the task's environment, as Slurm set it). Only for one
    model copy per job (replicas=1); separate copies keep one GPU per rank."""
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES") or os.environ.get("SLURM_STEP_GPUS") or os.environ.get("SLURM_JOB_GPUS")
    if not visible or spec.tp * spec.pp == 1 or spec.replicas != 1:
        return {}
    ids = [x for x in visible.split(",") if x]
    return {"CUDA_VISIBLE_DEVICES": ",".join(ids[: spec.gpus_per_node_used or len(ids)])}


# ----------------------------------------------------------------------------- trtllm
def _trtllm_models(spec) -> List[RenderedModel]:
    from launcher.engines import trtllm

    return trtllm.render_models(spec)


def _trtllm_check(c):
    from launcher.engines import trtllm

    return trtllm.check(c)


def _trtllm_host_paths(c):
    from launcher.engines import trtllm

    return trtllm.host_paths(c)


def _llmapi(spec) -> bool:
    return spec.engine.layout == "llmapi"


def _trtllm_rank_argv(spec, rank, argv):
    from launcher.engines import trtllm_llmapi

    return trtllm_llmapi.rank_argv(spec, rank, argv) if _llmapi(spec) else argv


def _trtllm_runs_server(spec, rank) -> bool:
    from launcher.engines import trtllm_llmapi

    return trtllm_llmapi.runs_server(spec, rank) if _llmapi(spec) else True


ENGINES: Dict[str, EngineDef] = {
    "hf": EngineDef(
        name="hf",
        default_model_name="hf_model",
        layout="per_gpu",
        models=_hf_models,
        worker_models=("hf_model",),
        check=_hf_check,
        first_token_split=True,
        summary="our continuous-batching engine on HF transformers; one tritonserver per GPU, rank 0 leads",
    ),
    "trtllm": EngineDef(
        name="trtllm",
        default_model_name="ensemble",
        # one task per GPU either way: llmapi's MPI world under trtllm-llmapi-launch (launcher/engines/
        # trtllm_llmapi.py), or the ensemble's tritonserver per GPU in leader mode
        layout="per_gpu",
        models=_trtllm_models,
        worker_models=("tensorrt_llm",),
        check=_trtllm_check,
        host_paths=_trtllm_host_paths,
        needs_gpu=lambda e: True,  # TensorRT-LLM engines run on GPUs only
        rank_env=_trtllm_rank_env,
        server_uses_mpi=True,
        rank_argv=_trtllm_rank_argv,
        runs_server=_trtllm_runs_server,
        default_model_name_of=lambda e: "tensorrt_llm" if e.layout == "llmapi" else "",
        worker_models_of=lambda e: () if e.layout == "llmapi" else None,  # llmapi workers run TensorRT-LLM's MPI worker
        summary="TensorRT-LLM: its LLM API in our python model (llmapi, default; one MPI world under trtllm-llmapi-launch "
                "for several GPUs), or the C++ backend's ensemble (one tritonserver per GPU, leader mode)",
    ),
    "vllm": EngineDef(
        name="vllm",
        default_model_name="vllm_model",
        layout="per_group",
        # engine.frontends instances: the front ends of one engine core (vllm model.py)
        models=_python_engine_models("vllm", lambda s: {"engine_args_file": "model.json"}, _vllm_engine_args,
                                     instances=lambda s: s.engine.frontends),
        worker_models=(),
        check=_vllm_check,
        needs_gpu=lambda e: e.device != "cpu",  # cpu: a CPU build of vLLM
        # auto is ray across nodes; mp cannot span nodes (_vllm_check)
        ray_across_nodes=lambda e: e.distributed_executor_backend in ("auto", "ray"),
        rank_env=_ray_rank_env,
        rank_command=_ray_rank_command,
        load_phases=_vllm_load_phases,
        summary="vLLM AsyncLLMEngine; one tritonserver per model copy per node, vLLM owns the GPUs (Ray across nodes)",
    ),
    "sglang": EngineDef(
        name="sglang",
        default_model_name="sglang_model",
        layout="per_group",
        models=_python_engine_models("sglang", _sglang_params),
        worker_models=(),
        check=lambda c: _require_path(c, engine="sglang"),
        needs_gpu=lambda e: True,  # SGLang serves on GPUs
        rank_env=_sglang_rank_env,
        summary="SGLang Engine; one tritonserver per model copy per node, nnodes/node_rank from the rendezvous",
    ),
    "lmdeploy": EngineDef(
        name="lmdeploy",
        default_model_name="lmdeploy_model",
        layout="per_group",
        models=_python_engine_models("lmdeploy", _lmdeploy_params),
        worker_models=(),
        spans_nodes=lambda e: e.backend == "pytorch",
        why_single_node=lambda e: "LMDeploy's TurboMind backend runs tensor parallelism inside one node only (its PyTorch backend spans nodes through Ray)",
        check=_lmdeploy_check,
        # an HF folder or a TurboMind workspace (lmdeploy convert)
        host_paths=lambda c: [(k, p, "hf_or_turbomind" if kind == "hf_model" else kind) for k, p, kind in model_host_paths(c)],
        needs_gpu=lambda e: True,  # TurboMind and LMDeploy's PyTorch backend serve on GPUs
        ray_across_nodes=lambda e: e.backend == "pytorch",
        ray_env=(("LMDEPLOY_EXECUTOR_BACKEND", "ray"),),
        rank_env=_ray_rank_env,
        rank_command=_ray_rank_command,
        summary="LMDeploy pipeline (TurboMind or PyTorch backend); one tritonserver per model copy per node",
    ),
}
