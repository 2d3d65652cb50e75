"""LMDeploy's settings in llmlaunch; more backend-config fields pass through `extra_args`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

from launcher.domains import IDENTIFIER, Choice, Float, FreeMapping, Int, Name, arg
from launcher.engines.config import ARG_NAME_WHAT, EngineConfig


@dataclass
class LMDeployEngineConfig(EngineConfig):
    name: str = arg(Name(), "lmdeploy")  # LMDeploy pipeline in a python model
    model_name: str = arg(Name(empty="the engine's default"), "lmdeploy_model")  # Triton model name clients address
    max_num_seqs: int = arg(
        Int("sequences batched at once"), 128
    )  # sequences batched at once (also the config's max_batch_size)
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
        FreeMapping(IDENTIFIER, ARG_NAME_WHAT), factory=dict
    )  # more backend-config fields, passed through
