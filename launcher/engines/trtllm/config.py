"""TensorRT-LLM's settings in llmlaunch, for both layouts (llmapi and the C++ backend's ensemble)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

from launcher.domains import IDENTIFIER, Choice, Flag, Float, FreeMapping, Int, Name, Path, arg
from launcher.engines.config import ARG_NAME_WHAT, EngineConfig

LAYOUTS = ("llmapi", "ensemble")  # engine.layout: the LLM API model (llmapi.py) or the C++ backend's ensemble
BATCHING = ("inflight_fused_batching", "V1")  # ensemble: gpt_model_type
POLICIES = ("guaranteed_no_evict", "max_utilization", "guaranteed_completion")  # ensemble: batch_scheduler_policy
TOKENIZER_TYPES = ("auto", "llama", "t5")  # ensemble: pre/postprocessing tokenizer_type
BACKENDS = ("tensorrtllm", "python")  # ensemble: the tensorrt_llm model's backend


@dataclass
class TRTLLMEngineConfig(EngineConfig):
    name: str = arg(
        Name(), "trtllm"
    )  # TensorRT-LLM: its LLM API in our python model (llmapi), or the C++ backend's ensemble
    layout: str = arg(
        Choice(LAYOUTS), "llmapi"
    )  # llmapi (tensorrt_llm.LLM on a HF checkpoint, no engine build; TensorRT-LLM >= 0.18) | ensemble (prebuilt engine on the C++ tensorrtllm backend, for releases that still ship it); docs/engines.md
    llm_args: Dict[str, Any] = arg(
        FreeMapping(IDENTIFIER, ARG_NAME_WHAT), factory=dict
    )  # llmapi: more tensorrt_llm.LLM arguments for model.yaml; they win over the ones llmlaunch derives (model, tp, pp, max_batch_size, ...); a key LLM does not take fails the model's load, naming the valid ones
    # The fields below are the ensemble's (layout=ensemble); llmapi reads max_num_seqs and kv_cache_free_gpu_mem_fraction only.
    engine_dir: str = arg(
        Path("engine"), ""
    )  # built TensorRT-LLM engine folder (gpt_model_path); required for the ensemble
    tokenizer_dir: str = arg(
        Path("engine"), ""
    )  # tokenizer for pre/postprocessing; empty = model.tokenizer or model.path
    tokenizer_type: str = arg(
        Choice(TOKENIZER_TYPES), "auto"
    )  # auto | llama | t5 (older backends' names; we load with AutoTokenizer)
    batching_strategy: str = arg(
        Choice(BATCHING), "inflight_fused_batching"
    )  # gpt_model_type: inflight_fused_batching | V1
    batch_scheduler_policy: str = arg(Choice(POLICIES), "guaranteed_no_evict")  # guaranteed_no_evict | max_utilization
    kv_cache_free_gpu_mem_fraction: float = arg(
        Float("a fraction of free GPU memory", 0.0, 1.0, lo_open=True, fix="use a value in (0, 1] for {key}, e.g. 0.9"),
        0.9,
    )  # fraction of free GPU memory for the paged KV cache
    max_tokens_in_paged_kv_cache: int = arg(
        Int("KV-cache tokens", zero="unset (the fraction decides)"), 0
    )  # cap on KV-cache tokens; 0 = unset (use the fraction)
    max_attention_window_size: int = arg(
        Int("attention window in tokens", zero="unset (full)"), 0
    )  # sliding attention window; 0 = unset (full)
    enable_kv_cache_reuse: bool = arg(Flag(), False)  # reuse KV blocks across requests with a shared prefix
    enable_chunked_context: bool = arg(Flag(), False)  # chunked prefill in the C++ batcher
    decoupled: bool = arg(Flag(), True)  # decoupled (streaming) mode of the tensorrt_llm model
    max_beam_width: int = arg(Int("beams the engine was built for"), 1)  # beams the engine was built for
    exclude_input_in_output: bool = arg(Flag(), True)  # tensorrt_llm returns only new tokens
    max_queue_delay_microseconds: int = arg(
        Int("dynamic batcher delay in microseconds", zero="no delay"), 0
    )  # dynamic batcher delay for tensorrt_llm
    preprocessing_instances: int = arg(
        Int("pre/postprocessing instances", zero="match max_num_seqs up to 8"), 0
    )  # pre/postprocessing instances; 0 = match max_num_seqs up to 8
    postprocessing_instances: int = arg(
        Int("pre/postprocessing instances", zero="match max_num_seqs up to 8"), 0
    )  # see preprocessing_instances
    bls: bool = arg(Flag(), False)  # add the tensorrt_llm_bls model (streaming with stop words in Python)
    backend: str = arg(
        Choice(BACKENDS), "tensorrtllm"
    )  # tensorrtllm (C++ backend, >= v0.9 layout) | python (LLM-API model.py, >= v0.17)
