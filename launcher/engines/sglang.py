"""`engine=sglang`: SGLang's Engine in a python model (model_repository/sglang), one tritonserver per model copy per
node; nnodes, node_rank and the distributed init address come from the rendezvous."""

from __future__ import annotations

from typing import Dict

from launcher.engines.base import EngineDef, copy_nodes, model_path, python_engine_models, require_path


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


def _rank_env(spec, ctx) -> Dict[str, str]:
    """Every node of a copy runs tritonserver + sglang_model; nodes > 0 only host the engine's share:
    SGLang's Engine() must return there instead of blocking (SGLANG_BLOCK_NONZERO_RANK_CHILDREN=0).
    nnodes / node_rank / dist_init_addr reach the model through the rank's group size, group rank, leader
    address and dist port (launcher.rank.topology.rank_environment)."""
    if copy_nodes(spec) <= 1 or ctx.rank.group_rank == 0:
        return {}
    return {"SGLANG_BLOCK_NONZERO_RANK_CHILDREN": "0"}


ENGINE = EngineDef(
    name="sglang",
    default_model_name="sglang_model",
    layout="per_group",
    # engine.frontends instances: the front ends of one engine (sglang model.py); ready_timeout_s: how long the
    # other front ends wait for the first one's engine
    models=python_engine_models("sglang", _params, instances=lambda s: s.engine.frontends),
    worker_models=(),
    check=lambda c, scheduler: require_path(c, engine="sglang"),
    needs_gpu=lambda e: True,  # SGLang serves on GPUs
    kv_heads_replicate=True,  # as vLLM's layers, which SGLang's are built on
    rank_env=_rank_env,
    summary="SGLang Engine; one tritonserver per model copy per node, nnodes/node_rank from the rendezvous",
    first_token_split=True,  # launcher.python_backend.async_runtime
)
