"""`engine=trtllm`: TensorRT-LLM in one of two repository layouts (`engine.layout`).

`llmapi` (the default, llmapi.py): its LLM API in our python model on a Hugging Face checkpoint, one MPI world under
trtllm-llmapi-launch for a copy of several GPUs. `ensemble` (ensemble.py): the C++ backend's preprocessing ->
tensorrt_llm -> postprocessing ensemble on a built engine, one tritonserver per GPU in leader mode. Each hook below
picks the layout's.

config.py  its settings (TRTLLMEngineConfig)
models/    the Triton python models: llmapi, and the ensemble's preprocessing, postprocessing and tensorrt_llm_bls
           (model_repository/trtllm/<model>/1/model.py loads each)
"""

from __future__ import annotations

import os
from typing import Dict, List

from launcher.engines.base import Engine, HostPath, Problem, RenderedModel
from launcher.engines.trtllm import ensemble, llmapi
from launcher.engines.trtllm.config import TRTLLMEngineConfig


def _llmapi(c) -> bool:
    """Does this spec or config (anything with .engine) use the llmapi layout?"""
    return c.engine.layout == "llmapi"


class TRTLLMEngine(Engine):
    """TensorRT-LLM: its LLM API in our python model (llmapi, default; one MPI world under trtllm-llmapi-launch for
    several GPUs), or the C++ backend's ensemble (one tritonserver per GPU, leader mode)."""

    name = "trtllm"
    Config = TRTLLMEngineConfig
    # one task per GPU either way: llmapi's MPI world under trtllm-llmapi-launch, or the ensemble's tritonserver per
    # GPU in leader mode
    layout = "per_gpu"
    worker_models = ("tensorrt_llm",)
    kv_heads_replicate = True  # TensorRT-LLM repeats KV heads over the ranks where tp exceeds them
    server_uses_mpi = True

    def models(self, spec) -> List[RenderedModel]:
        return llmapi.render_models(spec) if _llmapi(spec) else ensemble.render_models(spec)

    def model_name(self, engine) -> str:
        return engine.model_name or (llmapi.DEFAULT_MODEL_NAME if engine.layout == "llmapi" else "ensemble")

    def workers_load(self, engine):
        return () if engine.layout == "llmapi" else self.worker_models  # llmapi workers run TensorRT-LLM's MPI worker

    def check(self, c, scheduler) -> List[Problem]:
        """Rules across fields (each field's own domain, the layout's choices and the KV fraction, is declared in
        config.py), by layout."""
        return llmapi.check(c, scheduler) if _llmapi(c) else ensemble.check(c)

    def host_paths(self, c) -> List[HostPath]:
        return llmapi.host_paths(c) if _llmapi(c) else ensemble.host_paths(c)

    def needs_gpu(self, engine) -> bool:
        return True  # TensorRT-LLM engines run on GPUs only

    def tokenizer_folders(self, spec) -> List[str]:
        return [*super().tokenizer_folders(spec), spec.engine.tokenizer_dir]

    def rank_env(self, spec, ctx) -> Dict[str, str]:
        """Leader mode: each rank is one MPI process and TensorRT-LLM picks its GPU by MPI rank among the
        node's visible GPUs; with one GPU per rank it falls back to device 0 and warns that the custom
        all-reduce (peer-to-peer between the node's GPUs) is slower. So every rank keeps all the GPUs the
        job holds on its node visible (read from the task's environment, as Slurm set it). Only for one
        model copy per job (replicas=1); separate copies keep one GPU per rank."""
        visible = (
            os.environ.get("CUDA_VISIBLE_DEVICES")
            or os.environ.get("SLURM_STEP_GPUS")
            or os.environ.get("SLURM_JOB_GPUS")
        )
        if not visible or spec.tp * spec.pp == 1 or spec.replicas != 1:
            return {}
        ids = [x for x in visible.split(",") if x]
        return {"CUDA_VISIBLE_DEVICES": ",".join(ids[: spec.gpus_per_node_used or len(ids)])}

    def rank_argv(self, spec, rank, argv: List[str]) -> List[str]:
        return llmapi.rank_argv(spec, rank, argv) if _llmapi(spec) else argv

    def runs_server(self, spec, rank) -> bool:
        return llmapi.runs_server(spec, rank) if _llmapi(spec) else True
