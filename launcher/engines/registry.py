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
from typing import Any, Callable, Dict, List, Mapping, Tuple

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


@dataclass(frozen=True)
class EngineDef:
    name: str
    default_model_name: str  # Triton model name when engine.model_name is empty
    layout: str  # per_gpu (one tritonserver per GPU) | per_group (one per model copy per node)
    models: Callable[[Any], List[RenderedModel]]  # spec -> the repository's models
    worker_models: Tuple[str, ...] = ()  # models non-leader ranks load (explicit model control)
    spans_nodes: Callable[[Mapping], bool] = lambda engine: True  # can one model copy span nodes?
    why_single_node: Callable[[Mapping], str] = lambda engine: ""
    check: Callable[[Mapping], List[Tuple[str, str, str]]] = _no_problems  # engine-specific problems
    # Per-rank hooks, given (spec, RankContext from launcher.rank): extra environment for the
    # rank's process, and a command replacing tritonserver on that rank (e.g. a Ray worker), or None.
    rank_env: Callable[[Any, Any], Dict[str, str]] = lambda spec, ctx: {}
    rank_command: Callable[[Any, Any], Any] = lambda spec, ctx: None
    summary: str = ""


def model_path(spec) -> str:
    return spec.model.get("path", "")


def tokenizer_path(spec) -> str:
    return spec.model.get("tokenizer") or spec.model.get("path", "")


# ----------------------------------------------------------------------------- hf
def _hf_models(spec) -> List[RenderedModel]:
    from launcher import pbtxt

    e = spec.engine
    params = {
        "model_path": model_path(spec),
        "tokenizer_path": tokenizer_path(spec),
        "device": e["device"],
        "dtype": spec.model.get("dtype", "auto"),
        "max_num_seqs": e["max_num_seqs"],
        "max_model_len": spec.model.get("max_model_len", 0),
        "attn_implementation": e.get("attn_implementation", "sdpa"),
        "prefill_chunk": e.get("prefill_chunk", 512),
        "tp_size": spec.tp,
    }
    cfg = pbtxt.python_model(spec.model_name, e["max_num_seqs"], params)
    return [RenderedModel(spec.model_name, cfg, {"1/model.py": "hf/1/model.py"})]


def _hf_check(c) -> List[Tuple[str, str, str]]:
    m = c["model"]
    if not m.get("path") and m.get("make") != "tiny":
        return [("model.path=''", "the hf engine needs a HF-format model folder", "set model.path=/path/to/hf_model, or model=tiny to make a small random model")]
    if c["pp"] != 1:
        return [(f"pp={c['pp']}", "the hf engine shards layers by tensor parallelism only", "use pp=1 and tp for model parallelism")]
    return []


# ----------------------------------------------------------------------------- vllm / sglang / lmdeploy
def _require_path(c, what="model.path", engine="") -> List[Tuple[str, str, str]]:
    if not c["model"].get("path"):
        return [(f"{what}=''", f"the {engine} engine loads real weights and cannot make a model", f"set {what}=/path/to/hf_model (a HF-format folder on a filesystem the nodes share)")]
    return []


def _python_engine_models(source_dir: str, extra_params: Callable[[Any], Dict[str, object]], extra_text: Callable[[Any], Dict[str, str]] = lambda s: {}):
    def render(spec) -> List[RenderedModel]:
        from launcher import pbtxt

        e = spec.engine
        params = {
            "model_path": model_path(spec),
            "tokenizer_path": tokenizer_path(spec),
            "tp_size": spec.tp,
            "pp_size": spec.pp,
            "nnodes": max(1, spec.tp * spec.pp // spec.gpus_per_node_used) if spec.gpus_per_node_used else 1,
            "max_num_seqs": e["max_num_seqs"],
            "dtype": spec.model.get("dtype", "auto"),
            "max_model_len": spec.model.get("max_model_len", 0),
        }
        params.update(extra_params(spec))
        cfg = pbtxt.python_model(spec.model_name, e["max_num_seqs"], params, kind="KIND_MODEL")
        return [RenderedModel(spec.model_name, cfg, {"1/model.py": f"{source_dir}/1/model.py"}, extra_text(spec))]

    return render


def _vllm_engine_args(spec) -> Dict[str, str]:
    """vLLM's own engine-args file (seed 004's vllm_engine_args.json): ours fill the gaps, the user's win."""
    import json

    e = spec.engine
    args = {
        "model": model_path(spec),
        "tokenizer": tokenizer_path(spec),
        "tensor_parallel_size": spec.tp,
        "pipeline_parallel_size": spec.pp,
        "max_num_seqs": e["max_num_seqs"],
        "gpu_memory_utilization": e.get("gpu_memory_utilization", 0.9),
        "dtype": spec.model.get("dtype", "auto"),
    }
    if spec.model.get("max_model_len"):
        args["max_model_len"] = spec.model["max_model_len"]
    backend = e.get("distributed_executor_backend", "auto")
    group_nodes = max(1, spec.tp * spec.pp // max(1, spec.gpus_per_node_used))
    if backend == "auto":
        backend = "ray" if group_nodes > 1 else "mp"
    args["distributed_executor_backend"] = backend
    args.update(e.get("engine_args") or {})
    return {"1/model.json": json.dumps(args, indent=2, sort_keys=True) + "\n"}


def _sglang_params(spec) -> Dict[str, object]:
    e = spec.engine
    p: Dict[str, object] = {"model_name": model_path(spec)}
    if e.get("mem_fraction_static"):
        p["mem_fraction_static"] = e["mem_fraction_static"]
    if e.get("extra_args"):
        p["extra_args"] = dict(e["extra_args"])
    return p


def _lmdeploy_params(spec) -> Dict[str, object]:
    e = spec.engine
    p: Dict[str, object] = {"model_name": spec.model.get("name", ""), "backend": e.get("backend", "turbomind"), "cache_max_entry_count": e.get("cache_max_entry_count", 0.8)}
    if e.get("session_len"):
        p["session_len"] = e["session_len"]
    if e.get("extra_args"):
        p["extra_args"] = dict(e["extra_args"])
    return p


def _lmdeploy_check(c) -> List[Tuple[str, str, str]]:
    problems = _require_path(c, engine="lmdeploy")
    if c["engine"].get("backend") not in ("turbomind", "pytorch"):
        problems.append((f"engine.backend={c['engine'].get('backend')!r}", "LMDeploy has two backends", "set engine.backend=turbomind or engine.backend=pytorch"))
    return problems


def _vllm_check(c):
    problems = _require_path(c, engine="vllm")
    b = c["engine"].get("distributed_executor_backend")
    if b not in ("auto", "mp", "ray"):
        problems.append((f"engine.distributed_executor_backend={b!r}", "vLLM's executors are mp and ray", "set it to auto, mp or ray"))
    return problems


# ----------------------------------------------------------------------------- trtllm
def _trtllm_models(spec) -> List[RenderedModel]:
    from launcher.engines import trtllm

    return trtllm.render_models(spec)


def _trtllm_check(c):
    from launcher.engines import trtllm

    return trtllm.check(c)


ENGINES: Dict[str, EngineDef] = {
    "hf": EngineDef(
        name="hf",
        default_model_name="hf_model",
        layout="per_gpu",
        models=_hf_models,
        worker_models=("hf_model",),
        check=_hf_check,
        summary="our continuous-batching engine on HF transformers; one tritonserver per GPU, rank 0 leads",
    ),
    "trtllm": EngineDef(
        name="trtllm",
        default_model_name="ensemble",
        layout="per_gpu",
        models=_trtllm_models,
        worker_models=("tensorrt_llm",),
        check=_trtllm_check,
        summary="TensorRT-LLM ensemble; one tritonserver per GPU under MPI (leader mode)",
    ),
    "vllm": EngineDef(
        name="vllm",
        default_model_name="vllm_model",
        layout="per_group",
        models=_python_engine_models("vllm", lambda s: {"engine_args_file": "model.json"}, _vllm_engine_args),
        worker_models=(),
        check=_vllm_check,
        summary="vLLM AsyncLLMEngine; one tritonserver per model copy per node, vLLM owns the GPUs (Ray across nodes)",
    ),
    "sglang": EngineDef(
        name="sglang",
        default_model_name="sglang_model",
        layout="per_group",
        models=_python_engine_models("sglang", _sglang_params),
        worker_models=(),
        check=lambda c: _require_path(c, engine="sglang"),
        summary="SGLang Engine; one tritonserver per model copy per node, nnodes/node_rank from the rendezvous",
    ),
    "lmdeploy": EngineDef(
        name="lmdeploy",
        default_model_name="lmdeploy_model",
        layout="per_group",
        models=_python_engine_models("lmdeploy", _lmdeploy_params),
        worker_models=(),
        spans_nodes=lambda e: e.get("backend") == "pytorch",
        why_single_node=lambda e: "LMDeploy's TurboMind backend runs tensor parallelism inside one node only (its PyTorch backend spans nodes through Ray)",
        check=_lmdeploy_check,
        summary="LMDeploy pipeline (TurboMind or PyTorch backend); one tritonserver per model copy per node",
    ),
}
