"""`engine=sglang`: SGLang's Engine in a python model, one tritonserver per model copy per node; nnodes, node_rank and
the distributed init address come from the rendezvous.

config.py  its settings (SGLangEngineConfig); `engine.extra_args` passes SGLang's own ServerArgs fields through
model.py   the Triton python model (model_repository/sglang/1/model.py loads it)
"""

from __future__ import annotations

from typing import Dict, List

from launcher.engines.base import (
    Engine,
    Problem,
    RenderedModel,
    copy_nodes,
    model_path,
    python_engine_model,
    require_path,
)
from launcher.engines.sglang.config import SGLangEngineConfig


def _params(spec) -> Dict[str, object]:
    e = spec.engine
    p: Dict[str, object] = {"model_name": model_path(spec)}  # informational; sglang_model reads model_path
    if e.frontends > 1:
        p["ready_timeout_s"] = spec.serve.ready_timeout_s
    if e.mem_fraction_static:
        p["mem_fraction_static"] = e.mem_fraction_static
    if e.extra_args:
        p["extra_args"] = dict(e.extra_args)
    return p


class SGLangEngine(Engine):
    """SGLang Engine; one tritonserver per model copy per node, nnodes/node_rank from the rendezvous."""

    name = "sglang"
    Config = SGLangEngineConfig
    layout = "per_group"
    kv_heads_replicate = True  # as vLLM's layers, which SGLang's are built on
    first_token_split = True  # launcher.python_backend.async_runtime

    def models(self, spec) -> List[RenderedModel]:
        # engine.frontends instances: the front ends of one engine (model.py); ready_timeout_s: how long the other
        # front ends wait for the first one's engine
        return [python_engine_model(spec, "sglang", _params(spec), instances=spec.engine.frontends)]

    def check(self, c, scheduler) -> List[Problem]:
        return require_path(c, engine="sglang")

    def needs_gpu(self, engine) -> bool:
        return True  # SGLang serves on GPUs

    def rank_env(self, spec, ctx) -> Dict[str, str]:
        """Every node of a copy runs tritonserver + sglang_model; nodes > 0 only host the engine's share:
        SGLang's Engine() must return there instead of blocking (SGLANG_BLOCK_NONZERO_RANK_CHILDREN=0).
        nnodes / node_rank / dist_init_addr reach the model through the rank's group size, group rank, leader
        address and dist port (launcher.rank.topology.rank_environment)."""
        if copy_nodes(spec) <= 1 or ctx.rank.group_rank == 0:
            return {}
        return {"SGLANG_BLOCK_NONZERO_RANK_CHILDREN": "0"}
