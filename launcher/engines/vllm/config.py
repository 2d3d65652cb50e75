"""vLLM's settings in llmlaunch: the few llmlaunch derives or needs itself; every other vLLM engine argument passes
through `engine_args` to 1/model.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

from launcher.domains import IDENTIFIER, Choice, Float, FreeMapping, Int, Name, arg
from launcher.engines.config import ARG_NAME_WHAT, EngineConfig


@dataclass
class VLLMEngineConfig(EngineConfig):
    name: str = arg(Name(), "vllm")  # vLLM (its V1 engine core and AsyncLLM front ends) in a python model
    model_name: str = arg(Name(empty="the engine's default"), "vllm_model")  # Triton model name clients address
    max_num_seqs: int = arg(
        Int("sequences batched at once"), 256
    )  # sequences batched at once (also the config's max_batch_size)
    engine_args: Dict[str, Any] = arg(
        FreeMapping(IDENTIFIER, ARG_NAME_WHAT), factory=lambda: {"enable_log_requests": False}
    )  # passed through to vLLM's AsyncEngineArgs as model.json (enable_log_requests is vLLM >= 0.12's name; older: disable_log_requests: true)
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
