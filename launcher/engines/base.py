"""What every engine definition is made of: `EngineDef` (an engine as data plus small functions), the model
folders it renders (`RenderedModel`), and the helpers several engines share.

One module per engine (launcher/engines/hf.py, vllm.py, sglang.py, lmdeploy.py, trtllm/) builds its `EngineDef`
from these; launcher/engines/registry.py lists them. Nothing outside an engine's module and the registry
branches on an engine's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from launcher import pbtxt
from launcher.readiness import reported_phases

Problem = Tuple[str, str, str]  # (value, why, fix), as launcher.errors.LaunchError takes them


@dataclass(frozen=True)
class RenderedModel:
    """One model folder of a Triton repository: its config and the files beside it."""

    name: str
    config: Any  # model_config_pb2.ModelConfig
    files: Dict[str, str] = field(
        default_factory=dict
    )  # path inside the model folder -> source path under model_repository/
    extra_text: Dict[str, str] = field(
        default_factory=dict
    )  # path inside the model folder -> generated text (engine JSON files)


def model_host_paths(c) -> List[Tuple[str, str, str]]:
    """(key, path, kind) of what an engine loading a Hugging Face folder reads (launcher/hostcheck.py's kinds):
    model.path (config, weights and, without model.tokenizer, the tokenizer) and model.tokenizer."""
    m = c.model
    return [
        ("model.path", m.path, "hf_weights" if m.tokenizer else "hf_model"),
        ("model.tokenizer", m.tokenizer, "tokenizer"),
    ]


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
    # Does tp have to be a power of two? Engines that shard heads themselves (vLLM, the hf engine) take any tp that
    # divides the model's heads; the others keep to the powers of two their kernels and all-reduces are built for.
    tp_any_divisor: bool = False
    # With tp above the model's KV heads, does the engine replicate them (tp a multiple of the KV heads)? Otherwise tp
    # must divide the KV heads as it divides the attention heads (launcher/hostcheck.py checks both before launch).
    kv_heads_replicate: bool = False
    # The server is itself the job's MPI program (TensorRT-LLM leader mode): the ranks then rendezvous through
    # files, so the rank's wrapper does not take the task's PMIx connection before the server does.
    server_uses_mpi: bool = False
    # The served model reports the first-token split (queue, prefill, first response) in its Triton metrics
    # (launcher/python_backend/timings.py), which the bench reads from the serving tritonserver.
    first_token_split: bool = False
    # publishes its prefix cache's changes as KV-cache events (launcher/kv_events.py) where launcher/rank asks, so
    # serve.routing=kv may route by them
    kv_events: bool = False
    # (launcher.schema.LaunchConfig, the scheduler class of cluster.scheduler) -> engine-specific problems
    check: Callable[[Any, Any], List[Problem]] = lambda c, scheduler: []
    # launcher.schema.LaunchConfig -> (key, path, kind) of the folders the engine loads, which launcher/hostcheck.py
    # looks for on the launch host before anything starts (an empty path is skipped)
    host_paths: Callable[[Any], List[Tuple[str, str, str]]] = model_host_paths
    # Does this engine config need a GPU? A local launch without one visible is refused (launcher/hostcheck.py).
    needs_gpu: Callable[[Any], bool] = lambda engine: engine.device == "cuda"
    # A model copy over several nodes runs its other nodes as workers of a per-copy Ray cluster (its leader's model
    # starts the head) where the engine config says so: launcher.engines.ray.RayHooks, which rank_env and rank_command
    # below then are. None: never on Ray.
    ray: Any = None
    # Per-rank hooks, given (spec, RankContext from launcher.rank.rendezvous): extra environment for the
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
    load_phases: Callable[[str], Dict[str, float]] = reported_phases
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


def copy_nodes(spec) -> int:
    """Nodes one model copy spans (1 when a copy fits in a node)."""
    return max(1, spec.tp * spec.pp // spec.gpus_per_node_used) if spec.gpus_per_node_used else 1


def require_path(c, engine: str, what: str = "model.path") -> List[Problem]:
    if not c.model.path:
        return [
            (
                f"{what}=''",
                f"the {engine} engine loads real weights and cannot make a model",
                f"set {what}=/path/to/hf_model (a HF-format folder on a filesystem the nodes share)",
            )
        ]
    return []


def python_engine_models(
    source_dir: str,
    extra_params: Callable[[Any], Dict[str, object]],
    extra_text: Callable[[Any], Dict[str, str]] = lambda s: {},
    instances: Callable[[Any], int] = lambda s: 1,
):
    """The repository of an engine served by one python model (vLLM, SGLang, LMDeploy): model_repository/<source_dir>/
    1/model.py, its config's parameters the launch's common ones plus `extra_params(spec)`."""

    def render(spec) -> List[RenderedModel]:
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
