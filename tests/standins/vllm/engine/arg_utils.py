"""Stand-in: vllm.engine.arg_utils.AsyncEngineArgs (a dataclass; a subset of vLLM's fields, same names)."""

from dataclasses import dataclass
from typing import Optional


@dataclass
class AsyncEngineArgs:
    model: str = "facebook/opt-125m"
    tokenizer: Optional[str] = None
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    distributed_executor_backend: Optional[str] = None
    max_num_seqs: Optional[int] = None
    max_model_len: Optional[int] = None
    gpu_memory_utilization: float = 0.9
    dtype: str = "auto"
    seed: Optional[int] = None
    enforce_eager: bool = False
    trust_remote_code: bool = False
    disable_log_stats: bool = False
    enable_log_requests: bool = False  # vLLM >= 0.12 (disable_log_requests was removed)
