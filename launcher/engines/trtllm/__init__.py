"""`engine=trtllm`: TensorRT-LLM in one of two repository layouts (`engine.layout`).

`llmapi` (the default, launcher/engines/trtllm/llmapi.py): its LLM API in our python model on a Hugging Face
checkpoint, one MPI world under trtllm-llmapi-launch for a copy of several GPUs. `ensemble`
(launcher/engines/trtllm/ensemble.py): the C++ backend's preprocessing -> tensorrt_llm -> postprocessing ensemble
on a built engine, one tritonserver per GPU in leader mode. Each hook below picks the layout's.
"""

from __future__ import annotations

import os
from typing import Dict, List

from launcher.engines.base import EngineDef, RenderedModel
from launcher.engines.trtllm import ensemble, llmapi

LAYOUTS = ("llmapi", "ensemble")  # engine.layout: the LLM API model (llmapi.py) or the C++ backend's ensemble
BATCHING = ("inflight_fused_batching", "V1")  # ensemble: gpt_model_type
POLICIES = ("guaranteed_no_evict", "max_utilization", "guaranteed_completion")  # ensemble: batch_scheduler_policy
TOKENIZER_TYPES = ("auto", "llama", "t5")  # ensemble: pre/postprocessing tokenizer_type
BACKENDS = ("tensorrtllm", "python")  # ensemble: the tensorrt_llm model's backend


def _llmapi(spec) -> bool:
    return spec.engine.layout == "llmapi"


def _models(spec) -> List[RenderedModel]:
    return llmapi.render_models(spec) if _llmapi(spec) else ensemble.render_models(spec)


def _check(c, scheduler):
    """Rules across fields (each field's own domain, the layout's choices and the KV fraction, is declared in
    launcher/engine_schema.py), by layout."""
    return llmapi.check(c, scheduler) if _llmapi(c) else ensemble.check(c)


def _rank_env(spec, ctx) -> Dict[str, str]:
    """Leader mode: each rank is one MPI process and TensorRT-LLM picks its GPU by MPI rank among the
    node's visible GPUs; with one GPU per rank it falls back to device 0 and warns that the custom
    all-reduce (peer-to-peer between the node's GPUs) is slower. So every rank keeps all the GPUs the
    job holds on its node visible (read from the task's environment, as Slurm set it). Only for one
    model copy per job (replicas=1); separate copies keep one GPU per rank."""
    visible = (
        os.environ.get("CUDA_VISIBLE_DEVICES") or os.environ.get("SLURM_STEP_GPUS") or os.environ.get("SLURM_JOB_GPUS")
    )
    if not visible or spec.tp * spec.pp == 1 or spec.replicas != 1:
        return {}
    ids = [x for x in visible.split(",") if x]
    return {"CUDA_VISIBLE_DEVICES": ",".join(ids[: spec.gpus_per_node_used or len(ids)])}


ENGINE = EngineDef(
    name="trtllm",
    default_model_name="ensemble",
    # one task per GPU either way: llmapi's MPI world under trtllm-llmapi-launch, or the ensemble's tritonserver
    # per GPU in leader mode
    layout="per_gpu",
    models=_models,
    worker_models=("tensorrt_llm",),
    check=_check,
    host_paths=lambda c: llmapi.host_paths(c) if _llmapi(c) else ensemble.host_paths(c),
    needs_gpu=lambda e: True,  # TensorRT-LLM engines run on GPUs only
    kv_heads_replicate=True,  # TensorRT-LLM repeats KV heads over the ranks where tp exceeds them
    rank_env=_rank_env,
    server_uses_mpi=True,
    rank_argv=lambda spec, rank, argv: llmapi.rank_argv(spec, rank, argv) if _llmapi(spec) else argv,
    runs_server=lambda spec, rank: llmapi.runs_server(spec, rank) if _llmapi(spec) else True,
    default_model_name_of=lambda e: llmapi.DEFAULT_MODEL_NAME if e.layout == "llmapi" else "",
    worker_models_of=lambda e: () if e.layout == "llmapi" else None,  # llmapi workers run TensorRT-LLM's MPI worker
    summary="TensorRT-LLM: its LLM API in our python model (llmapi, default; one MPI world under trtllm-llmapi-launch "
    "for several GPUs), or the C++ backend's ensemble (one tritonserver per GPU, leader mode)",
)
