"""`engine=lmdeploy`: an LMDeploy pipeline in a python model, TurboMind or its PyTorch backend, one tritonserver per
model copy per node; the PyTorch backend spans nodes through a per-copy Ray cluster.

config.py  its settings (LMDeployEngineConfig); `engine.extra_args` passes the backend config's own fields through
model.py   the Triton python model (model_repository/lmdeploy/1/model.py loads it)
"""

from __future__ import annotations

from typing import Dict, List

from launcher.engines.base import Engine, HostPath, Problem, RenderedModel, python_engine_model, require_path
from launcher.engines.lmdeploy.config import LMDeployEngineConfig
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


class LMDeployEngine(Engine):
    """LMDeploy pipeline (TurboMind or PyTorch backend); one tritonserver per model copy per node."""

    name = "lmdeploy"
    Config = LMDeployEngineConfig
    layout = "per_group"
    first_token_split = True  # launcher.python_backend.async_runtime
    ray = RAY

    def models(self, spec) -> List[RenderedModel]:
        return [python_engine_model(spec, "lmdeploy", _params(spec))]

    def check(self, c, scheduler) -> List[Problem]:
        return require_path(c, engine="lmdeploy")

    def spans_nodes(self, engine) -> bool:
        return engine.backend == "pytorch"

    def why_single_node(self, engine) -> str:
        return "LMDeploy's TurboMind backend runs tensor parallelism inside one node only (its PyTorch backend spans nodes through Ray)"

    def host_paths(self, c) -> List[HostPath]:
        # an HF folder or a TurboMind workspace (lmdeploy convert)
        return [(k, p, "hf_or_turbomind" if kind == "hf_model" else kind) for k, p, kind in super().host_paths(c)]

    def needs_gpu(self, engine) -> bool:
        return True  # TurboMind and LMDeploy's PyTorch backend serve on GPUs
