"""SGLang's settings in llmlaunch; every other ServerArgs field passes through `extra_args`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

from launcher.domains import IDENTIFIER, Float, FreeMapping, Int, Name, arg
from launcher.engines.config import ARG_NAME_WHAT, EngineConfig


@dataclass
class SGLangEngineConfig(EngineConfig):
    name: str = arg(Name(), "sglang")  # SGLang offline Engine in a python model
    model_name: str = arg(Name(empty="the engine's default"), "sglang_model")  # Triton model name clients address
    max_num_seqs: int = arg(
        Int("sequences batched at once"), 256
    )  # sequences batched at once (also the config's max_batch_size)
    mem_fraction_static: float = arg(
        Float("SGLang's static share of GPU memory", 0.0, 1.0, lo_open=True, hi_open=True, zero="SGLang's default"), 0.0
    )  # SGLang's static memory fraction; 0 = its default
    extra_args: Dict[str, Any] = arg(
        FreeMapping(IDENTIFIER, ARG_NAME_WHAT), factory=dict
    )  # more sglang ServerArgs fields, passed through
    frontends: int = arg(
        Int(
            "the front ends of one SGLang engine (model instances, each a stub process with a tokenizer worker)",
            fix="set {key}=1, or 4 on a GPU node",
        ),
        4,
    )  # stub processes (model instances) that are front ends of one SGLang engine, as SGLang's server runs tokenizer_worker_num HTTP workers: each tokenizes, detokenizes and sends the responses of its share of the requests under its own GIL. One H200, 64 closed streams: 4 cut TTFT p50 from 94 to 41 ms and ITL p50 from 38 to 6 ms (1 sends ~14 tokens a response); 1 costs 1.5 ms less at one stream (docs/performance/sglang.md)
