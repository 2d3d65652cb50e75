"""What every engine is: the `Engine` base class each engine package subclasses, the model folders it renders
(`RenderedModel`), and the helpers several engines share.

An engine is one package, launcher/engines/<name>/: `Engine` (its facts and hooks, in __init__.py), its `Config`
dataclass (config.py: every setting a user chooses, with its domain and default) and the code Triton runs for it
(model.py and what it imports); launcher/engines/registry.py names the packages, and conf/engine/<name>.yaml makes
it a choice of `engine=`. Nothing outside an engine's package branches on its name or asks its config what it can do
with getattr: the launcher asks the `Engine`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Type

from launcher import pbtxt
from launcher.engines.config import EngineConfig
from launcher.readiness import reported_phases

Problem = Tuple[str, str, str]  # (value, why, fix), as launcher.errors.LaunchError takes them
HostPath = Tuple[str, str, str]  # (key, path, kind): a folder launcher/hostcheck.py looks for on the launch host


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


class Engine:
    """One engine llmlaunch serves. A subclass states the engine's facts as class attributes and answers the
    questions that depend on a launch as methods: those taking `engine` get its config (an instance of `Config`),
    `spec` the validated launch (launcher.spec.LaunchSpec), `c` the typed config before it is a spec
    (launcher.schema.LaunchConfig), `ctx` a rank's place after the rendezvous (launcher.rank.rendezvous.RankContext).
    The defaults below are what most engines do; a subclass overrides what its engine does differently."""

    name: ClassVar[str] = ""  # engine=<name>, the registry key
    Config: ClassVar[Type[EngineConfig]] = EngineConfig  # its settings: conf/engine/<name>.yaml fills one
    # per_gpu: one tritonserver per GPU | per_group: one per model copy per node (the engine owns the copy's GPUs)
    layout: ClassVar[str] = "per_gpu"
    # Does tp have to be a power of two? Engines that shard heads themselves (vLLM, the hf engine) take any tp that
    # divides the model's heads; the others keep to the powers of two their kernels and all-reduces are built for.
    tp_any_divisor: ClassVar[bool] = False
    # With tp above the model's KV heads, does the engine replicate them (tp a multiple of the KV heads)? Otherwise tp
    # must divide the KV heads as it divides the attention heads (launcher/hostcheck.py checks both before launch).
    kv_heads_replicate: ClassVar[bool] = False
    # The server is itself the job's MPI program (TensorRT-LLM leader mode): the ranks then rendezvous through
    # files, so the rank's wrapper does not take the task's PMIx connection before the server does.
    server_uses_mpi: ClassVar[bool] = False
    # The served model reports the first-token split (queue, prefill, first response) in its Triton metrics
    # (launcher/python_backend/timings.py), which the bench reads from the serving tritonserver.
    first_token_split: ClassVar[bool] = False
    # Its served model continues a request that moved from another replica mid-stream (the contract's continue_ids
    # and output_ids), so the front end of replicas > 1 moves its streams when a replica fails
    # (launcher/frontend/migration.py).
    continues_requests: ClassVar[bool] = False
    # A copy of several ranks (tp or pp over ranks) starts again as a whole when one of its servers dies: every rank
    # of it restarts its server and the new servers form the copy's group again (launcher/rank/restart.py).  An
    # engine whose ranks meet elsewhere (a Ray cluster, SGLang's nodes) loses such a copy for the job instead.
    copy_restarts: ClassVar[bool] = False
    # It publishes its prefix cache's changes as KV-cache events (launcher/kv_events.py) where launcher/rank asks, so
    # serve.routing=kv may route by them.
    kv_events: ClassVar[bool] = False
    # Its served model reports the share of its KV cache that running requests hold, as the gauge
    # llmlaunch_engine_kv_cache_usage on its tritonserver's metrics (launcher/python_backend/timings.py ENGINE_GAUGES),
    # so a service may scale by it (serve.autoscale.signal=kv_cache, launcher/service/signals.py).
    kv_usage: ClassVar[bool] = False
    # How its served model moves a prompt's keys and values between replicas, as the dry run says it ("": it cannot):
    # a prefill replica's engine keeps them for a request with the contract input kv_export, a decode replica's takes
    # them for kv_from, so a launch may split prefill and decode (launcher/frontend/disagg.py).
    kv_transfer: ClassVar[str] = ""
    # The roles (prefill, decode) whose leaders get a port of their own for the transfer (RankEnv.kv_transfer, host:port
    # as the other replicas reach it): the hf engine's prefill serves its blocks there; every vLLM instance runs NIXL's
    # side channel there.
    kv_port_roles: ClassVar[Tuple[str, ...]] = ("prefill",)
    # Models the non-leader ranks' tritonservers load (explicit model control).
    worker_models: ClassVar[Tuple[str, ...]] = ()
    # A model copy over several nodes runs its other nodes as workers of a per-copy Ray cluster where the engine
    # config says so: launcher.engines.ray.RayHooks (rank_env and rank_command then delegate to it). None: never.
    ray: ClassVar[Optional[Any]] = None

    # ------------------------------------------------------------------------------------------ the repository
    def models(self, spec) -> List[RenderedModel]:
        """The Triton repository's models for this launch."""
        raise NotImplementedError(f"engine={self.name} renders no models")

    def model_name(self, engine) -> str:
        """The Triton model name clients address: engine.model_name, else the default `Config` declares for it."""
        return engine.model_name or field_default(self.Config, "model_name")

    def workers_load(self, engine) -> Tuple[str, ...]:
        """Models the non-leader ranks' tritonservers load, for this engine config."""
        return tuple(self.worker_models)

    # ------------------------------------------------------------------------------------------ what it takes
    def check(self, c, scheduler) -> List[Problem]:
        """Rules across fields, for this engine (each field's own domain is declared beside it in `Config`);
        `scheduler` is the class of cluster.scheduler (launcher/schedulers/base.py), whose facts some rules read."""
        return []

    def spans_nodes(self, engine) -> bool:
        """Can one model copy span nodes with this engine config?"""
        return True

    def why_single_node(self, engine) -> str:
        """Why a copy cannot span nodes, where spans_nodes says so."""
        return ""

    def needs_gpu(self, engine) -> bool:
        """Does this engine config need a GPU? A local launch without one visible is refused (launcher/hostcheck.py)."""
        return engine.device == "cuda"

    def host_paths(self, c) -> List[HostPath]:
        """The folders the engine loads, which launcher/hostcheck.py looks for on the launch host before anything
        starts (an empty path is skipped): by default model.path (config, weights and, without model.tokenizer, the
        tokenizer) and model.tokenizer."""
        m = c.model
        return [
            ("model.path", m.path, "hf_weights" if m.tokenizer else "hf_model"),
            ("model.tokenizer", m.tokenizer, "tokenizer"),
        ]

    def tokenizer_folders(self, spec) -> List[str]:
        """Where the served model's tokenizer may be, first choice first (clients count tokens with it)."""
        return [spec.model.tokenizer, spec.model.path]

    def prefix_cache_switch(self, engine) -> str:
        """Where this config turns the engine's prefix cache off, the override that turns it on ("" where it keeps
        one): serve.routing=kv routes to what the caches hold."""
        return ""

    def response_processes(self, engine) -> int:
        """Model instances (stub processes) sending one engine's responses, which the front end's process count
        follows (launcher/python_backend/responders.py)."""
        return 1

    # ------------------------------------------------------------------------------------------ per rank
    def rank_env(self, spec, ctx) -> Dict[str, str]:
        """More environment for a rank's process."""
        return self.ray.rank_env(spec, ctx) if self.ray is not None else {}

    def rank_command(self, spec, ctx) -> Optional[List[str]]:
        """A command replacing tritonserver on this rank (e.g. a Ray worker), or None."""
        return self.ray.rank_command(spec, ctx) if self.ray is not None else None

    def rank_argv(self, spec, rank, argv: List[str]) -> List[str]:
        """Pure, so the plan shows it too: given the rank's tritonserver argv, the command the rank runs (e.g. the
        server behind an MPI launcher)."""
        return argv

    def runs_server(self, spec, rank) -> bool:
        """Is the command of this rank (launcher.spec.RankSpec) a tritonserver at all?"""
        return True

    def load_phases(self, log_text: str) -> Dict[str, float]:
        """rank 0's log text -> the engine's load phases (name -> seconds: weights, compile, graph capture) for the
        time-to-READY breakdown; by default the `llmlaunch-phase:` lines an engine reports (launcher/readiness.py)."""
        return reported_phases(log_text)


def field_default(config: Type[Any], name: str) -> Any:
    """The default of a config dataclass's field (the one place it is declared)."""
    f = next(f for f in dataclasses.fields(config) if f.name == name)
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


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


def python_engine_model(
    spec,
    source_dir: str,
    params: Dict[str, object],
    extra_text: Optional[Dict[str, str]] = None,
    instances: int = 1,
    continues: bool = False,
) -> RenderedModel:
    """The one python model of an engine served that way (vLLM, SGLang, LMDeploy): model_repository/<source_dir>/
    1/model.py, its config's parameters the launch's common ones, then `params`; `continues`: Engine.continues_requests
    (its config says it honours return_token_ids)."""
    e = spec.engine
    common: Dict[str, object] = {
        "model_path": model_path(spec),
        "tokenizer_path": tokenizer_path(spec),
        "tp_size": spec.tp,
        "pp_size": spec.pp,
        "nnodes": copy_nodes(spec),
        "max_num_seqs": e.max_num_seqs,
        "dtype": spec.model.dtype,
        "max_model_len": spec.model.max_model_len,
    }
    common.update(params)
    cfg = pbtxt.python_model(
        spec.model_name, e.max_num_seqs, common, kind="KIND_MODEL", instances=instances, continues=continues
    )
    return RenderedModel(spec.model_name, cfg, {"1/model.py": f"{source_dir}/1/model.py"}, extra_text or {})


def triton_entry(module: str) -> str:
    """The text of a checked-in model_repository/<...>/1/model.py: what Triton's python backend loads, which takes the
    model from `module` of an engine package. The stub runs it by path with its own sys.path, which does not read
    PYTHONPATH (Triton 2.51), so it adds PYTHONPATH's entries after its own first: `launcher` and the engines'
    packages then resolve as they do for the rank that started the server."""
    return (
        f'"""What Triton loads: the TritonPythonModel of {module}."""\n'
        "\n"
        "import os\n"
        "import sys\n"
        "\n"
        'sys.path += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]\n'
        "\n"
        f"from {module} import TritonPythonModel  # noqa: E402,F401\n"
    )
