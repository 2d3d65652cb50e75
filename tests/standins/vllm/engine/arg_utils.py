"""Stand-in: vllm.engine.arg_utils.AsyncEngineArgs (a dataclass; a subset of vLLM's fields, same names)."""

from dataclasses import dataclass
from types import SimpleNamespace
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
    stream_interval: int = 1
    kv_transfer_config: Optional[object] = None  # vllm.config.kv_transfer.KVTransferConfig
    cudagraph_metrics: bool = False  # each step's CUDAGraphStat in its scheduler statistics (ObservabilityConfig)

    # vLLM's API servers set these two before create_engine_config (api_server_count > 1)
    _api_process_count: int = 1
    _api_process_rank: int = 0

    def create_engine_config(self, usage_context=None):
        """vLLM's VllmConfig, reduced to what the stand-in's engine-core launch and clients read."""
        if not -1 <= self._api_process_rank < self._api_process_count:  # -1: the launcher (vLLM allows it)
            raise ValueError(f"Invalid value of `_api_process_rank`: {self._api_process_rank}")
        return SimpleNamespace(
            engine_args=self, api_process_count=self._api_process_count, api_process_rank=self._api_process_rank
        )
