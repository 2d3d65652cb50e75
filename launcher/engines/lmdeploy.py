"""`engine=lmdeploy`: an LMDeploy pipeline in a python model (model_repository/lmdeploy), TurboMind or its PyTorch
backend, one tritonserver per model copy per node; the PyTorch backend spans nodes through a per-copy Ray cluster."""

from __future__ import annotations

from typing import Dict

from launcher.engines.base import EngineDef, model_host_paths, python_engine_models, require_path
from launcher.engines.ray import RayHooks


def _params(spec) -> Dict[str, object]:
    e = spec.engine
    p: Dict[str, object] = {
        "model_name": spec.model.name,
        "backend": e.backend,
        "cache_max_entry_count": e.cache_max_entry_count,
    }
    if e.session_len:
        p["session_len"] = e.session_len
    if e.extra_args:
        p["extra_args"] = dict(e.extra_args)
    return p


RAY = RayHooks(lambda e: e.backend == "pytorch", env=(("LMDEPLOY_EXECUTOR_BACKEND", "ray"),))

ENGINE = EngineDef(
    name="lmdeploy",
    default_model_name="lmdeploy_model",
    layout="per_group",
    models=python_engine_models("lmdeploy", _params),
    worker_models=(),
    spans_nodes=lambda e: e.backend == "pytorch",
    why_single_node=lambda e: (
        "LMDeploy's TurboMind backend runs tensor parallelism inside one node only (its PyTorch backend spans nodes through Ray)"
    ),
    check=lambda c, scheduler: require_path(c, engine="lmdeploy"),
    # an HF folder or a TurboMind workspace (lmdeploy convert)
    host_paths=lambda c: [
        (k, p, "hf_or_turbomind" if kind == "hf_model" else kind) for k, p, kind in model_host_paths(c)
    ],
    needs_gpu=lambda e: True,  # TurboMind and LMDeploy's PyTorch backend serve on GPUs
    ray=RAY,
    rank_env=RAY.rank_env,
    rank_command=RAY.rank_command,
    summary="LMDeploy pipeline (TurboMind or PyTorch backend); one tritonserver per model copy per node",
    first_token_split=True,  # launcher.python_backend.async_runtime
)
