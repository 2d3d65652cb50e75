"""The engines' config dataclasses, one per engine (part of the schema, launcher/schema.py): each registered as
`engine/base_<name>` so `conf/engine/<name>.yaml` extends it; one comment per field, its domain beside it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

from omegaconf import MISSING

from launcher.domains import (
    DEVICES,
    IDENTIFIER,
    Choice,
    Flag,
    Float,
    FreeMapping,
    Int,
    Name,
    Path,
    arg,
)
from launcher.engines import trtllm
from launcher.engines.registry import ENGINES
from launcher.hf.args import CUDNN_ATTENTION, HFEngineArgs

_ARG_NAME_WHAT = "an argument name (a Python identifier: letters, digits and _)"


def _engines():
    return sorted(ENGINES)


@dataclass
class EngineConfig:
    name: str = arg(Choice(_engines), MISSING)  # registry key: hf | trtllm | vllm | sglang | lmdeploy
    model_name: str = arg(
        Name(empty="the engine's default"), ""
    )  # Triton model name clients address; empty = the engine's default
    max_num_seqs: int = arg(
        Int("sequences batched at once"), 64
    )  # sequences batched at once (also the config's max_batch_size)
    device: str = arg(Choice(DEVICES), "auto")  # auto (cuda when the cluster has GPUs, else cpu) | cpu | cuda


_HF = HFEngineArgs()  # the hf engine's defaults: each field below takes its own from here


@dataclass
class HFEngineConfig(EngineConfig):
    """The hf engine's settings a user chooses.  What each does, and its default, is HFEngineArgs' field of the same
    name (launcher/hf/args.py); the registry writes them to the model's model.json."""

    name: str = arg(Choice(_engines), "hf")  # our own continuous-batching engine on HF transformers
    max_num_seqs: int = arg(
        Int("sequences batched at once"), _HF.max_num_seqs
    )  # sequences batched at once (also the config's max_batch_size)
    device: str = arg(Choice(DEVICES), _HF.device)  # auto (cuda when the cluster has GPUs, else cpu) | cpu | cuda
    attn_implementation: str = arg(
        Choice(("sdpa", "eager")), _HF.attn_implementation
    )  # transformers attention kernel: sdpa | eager
    prefill_chunk: int = arg(
        Int(
            "prompt tokens per engine step",
            zero="the engine's default",
            fix="set {key}=0 (512 on CPU, 2048 on a GPU) or a positive number like 1024",
        ),
        _HF.prefill_chunk,
    )  # prompt tokens prefilled per engine step (0: by device)
    cuda_graphs: bool = arg(
        Flag(), _HF.cuda_graphs
    )  # replay decode steps and prompt steps as captured CUDA graphs (GPU)
    stream_interval_ms: int = arg(
        Int(
            "least ms between two responses of a stream",
            zero="a response per engine step",
            fix="set {key}=0, or 8 to merge a stream's tokens into fewer responses under load",
        ),
        _HF.stream_interval_ms,
    )  # least time between two streamed responses of a request (0: every step)
    response_processes: int = arg(
        Int("model instances sharing the engine", fix="set {key}=1, or 4 to send responses from four processes"), 1
    )  # Triton model instances (stub processes, each with its own GIL) that share the engine process and send its responses; tp=1 only. The one responder setting (launcher/python_backend/responders.py derives threads per stub, nice and front-end processes from it, the device and the CPUs): one stub sends a few thousand responses/s whatever its threads, so the streams served at once, which only the user knows, decide it (1 up to tens of streams, 2-4 for 128 on a GPU)
    # a str field, so Hydra's engine.torch_compile=true arrives as 'True'
    torch_compile: str = arg(
        Choice(("auto", "true", "false"), normalize=lambda v: str(v).lower()), _HF.torch_compile
    )  # auto | true | false: fuse the model's small kernels with torch.compile
    cudnn_attention: str = arg(
        Choice(CUDNN_ATTENTION), _HF.cudnn_attention
    )  # graphs | all | off: where attention may use cuDNN
    tp_timeout_s: float = arg(
        Float("a deadline in seconds", 0.0, lo_open=True, fix="set a deadline in seconds, e.g. {key}=120"),
        _HF.tp_timeout_s,
    )  # tp > 1: a collective waiting longer fails the engine (a hung or dead rank fails the job)
    kv_cache_memory: float = arg(
        Float("GiB of KV cache", 0.0, zero="0.5 GiB on CPU, 85% of the GPU memory free after the weights"),
        _HF.kv_cache_memory,
    )  # GiB the KV-cache pool takes (0: 0.5 GiB on CPU, 85% of the free GPU memory after the weights)
    block_size: int = arg(
        Choice(tuple(str(2**i) for i in range(9)), normalize=str, fix="set {key}=16 (a power of two up to 256)"),
        _HF.block_size,
    )  # tokens a KV-cache block holds (prefix caching shares whole blocks)
    prefix_caching: bool = arg(
        Flag(), _HF.prefix_caching
    )  # reuse the KV-cache blocks of a prompt's longest prefix another request computed


@dataclass
class TRTLLMEngineConfig(EngineConfig):
    name: str = arg(
        Choice(_engines), "trtllm"
    )  # TensorRT-LLM: its LLM API in our python model (llmapi), or the C++ backend's ensemble
    layout: str = arg(
        Choice(trtllm.LAYOUTS), "llmapi"
    )  # llmapi (tensorrt_llm.LLM on a HF checkpoint, no engine build; TensorRT-LLM >= 0.18) | ensemble (prebuilt engine on the C++ tensorrtllm backend, for releases that still ship it); docs/engines.md
    llm_args: Dict[str, Any] = arg(
        FreeMapping(IDENTIFIER, _ARG_NAME_WHAT), factory=dict
    )  # llmapi: more tensorrt_llm.LLM arguments for model.yaml; they win over the ones llmlaunch derives (model, tp, pp, max_batch_size, ...); a key LLM does not take fails the model's load, naming the valid ones
    # The fields below are the ensemble's (layout=ensemble); llmapi reads max_num_seqs and kv_cache_free_gpu_mem_fraction only.
    engine_dir: str = arg(
        Path("engine"), ""
    )  # built TensorRT-LLM engine folder (gpt_model_path); required for the ensemble
    tokenizer_dir: str = arg(
        Path("engine"), ""
    )  # tokenizer for pre/postprocessing; empty = model.tokenizer or model.path
    tokenizer_type: str = arg(
        Choice(trtllm.TOKENIZER_TYPES), "auto"
    )  # auto | llama | t5 (older backends' names; we load with AutoTokenizer)
    batching_strategy: str = arg(
        Choice(trtllm.BATCHING), "inflight_fused_batching"
    )  # gpt_model_type: inflight_fused_batching | V1
    batch_scheduler_policy: str = arg(
        Choice(trtllm.POLICIES), "guaranteed_no_evict"
    )  # guaranteed_no_evict | max_utilization
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
        Choice(trtllm.BACKENDS), "tensorrtllm"
    )  # tensorrtllm (C++ backend, >= v0.9 layout) | python (LLM-API model.py, >= v0.17)


@dataclass
class VLLMEngineConfig(EngineConfig):
    name: str = arg(Choice(_engines), "vllm")  # vLLM AsyncLLMEngine in a python model
    engine_args: Dict[str, Any] = arg(
        FreeMapping(IDENTIFIER, _ARG_NAME_WHAT), factory=dict
    )  # passed through to vLLM's AsyncEngineArgs as model.json
    gpu_memory_utilization: float = arg(
        Float("vLLM's share of each GPU", 0.0, 1.0, lo_open=True), 0.9
    )  # vLLM's share of each GPU
    distributed_executor_backend: str = arg(
        Choice(("auto", "mp", "ray")), "auto"
    )  # auto (mp on one node, ray across nodes) | mp | ray
    frontends: int = arg(
        Int(
            "the front ends of one vLLM engine core (model instances, each a stub process)",
            fix="set {key}=1, or 4 on a GPU node",
        ),
        4,
    )  # stub processes (model instances) that are front ends of one vLLM engine core, as vllm serve --api-server-count: each tokenizes, detokenizes and sends the responses of its share of the requests under its own GIL. One H100, 128 closed streams: 1 kept up only by merging 17 tokens a response (first token +170 ms over vLLM in-process), 4 added none (docs/performance/vllm.md, host B); 1 costs least at one stream


@dataclass
class SGLangEngineConfig(EngineConfig):
    name: str = arg(Choice(_engines), "sglang")  # SGLang offline Engine in a python model
    mem_fraction_static: float = arg(
        Float("SGLang's static share of GPU memory", 0.0, 1.0, lo_open=True, hi_open=True, zero="SGLang's default"), 0.0
    )  # SGLang's static memory fraction; 0 = its default
    extra_args: Dict[str, Any] = arg(
        FreeMapping(IDENTIFIER, _ARG_NAME_WHAT), factory=dict
    )  # more sglang ServerArgs fields, passed through
    frontends: int = arg(
        Int(
            "the front ends of one SGLang engine (model instances, each a stub process with a tokenizer worker)",
            fix="set {key}=1, or 4 on a GPU node",
        ),
        4,
    )  # stub processes (model instances) that are front ends of one SGLang engine, as SGLang's server runs tokenizer_worker_num HTTP workers: each tokenizes, detokenizes and sends the responses of its share of the requests under its own GIL. One H200, 64 closed streams: 4 cut TTFT p50 from 94 to 41 ms and ITL p50 from 38 to 6 ms (1 sends ~14 tokens a response); 1 costs 1.5 ms less at one stream (docs/performance/sglang.md)


@dataclass
class LMDeployEngineConfig(EngineConfig):
    name: str = arg(Choice(_engines), "lmdeploy")  # LMDeploy pipeline in a python model
    backend: str = arg(
        Choice(("turbomind", "pytorch")), "turbomind"
    )  # turbomind (HF weights or a converted workspace) | pytorch
    session_len: int = arg(
        Int("session length in tokens", zero="the model's"), 0
    )  # LMDeploy session length; 0 = the model's
    cache_max_entry_count: float = arg(
        Float("KV-cache share of free GPU memory", 0.0, 1.0, lo_open=True), 0.8
    )  # KV-cache share of free GPU memory
    extra_args: Dict[str, Any] = arg(
        FreeMapping(IDENTIFIER, _ARG_NAME_WHAT), factory=dict
    )  # more backend-config fields, passed through


ENGINE_SCHEMAS = {
    "hf": HFEngineConfig,
    "trtllm": TRTLLMEngineConfig,
    "vllm": VLLMEngineConfig,
    "sglang": SGLangEngineConfig,
    "lmdeploy": LMDeployEngineConfig,
}
