"""Stand-in: lmdeploy.messages (a subset of the fields, same names, defaults and checks as LMDeploy 0.18)."""

from dataclasses import dataclass
from typing import Dict, List, Optional


@dataclass
class GenerationConfig:
    n: int = 1
    max_new_tokens: int = 512
    do_sample: bool = False
    top_p: float = 1.0
    top_k: int = 50
    min_p: float = 0.0
    temperature: float = 0.8
    repetition_penalty: float = 1.0
    ignore_eos: bool = False
    random_seed: Optional[int] = None
    stop_words: Optional[List[str]] = None
    bad_words: Optional[List[str]] = None
    stop_token_ids: Optional[List[int]] = None
    bad_token_ids: Optional[List[int]] = None
    min_new_tokens: Optional[int] = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logprobs: Optional[int] = None
    include_stop_str_in_output: bool = False

    def __post_init__(self):
        # LMDeploy checks with bare asserts: a value out of range raises AssertionError
        assert type(self.n) is int and self.n > 0, "n is not a positive integer"
        assert 0 <= self.top_p <= 1
        assert self.top_k >= 0, "top_k can not be a negative integer"
        assert 0 <= self.temperature <= 2
        assert 0 <= self.min_p <= 1


@dataclass
class TurbomindEngineConfig:
    dtype: str = "auto"
    tp: int = 1
    session_len: Optional[int] = None
    max_batch_size: Optional[int] = None
    cache_max_entry_count: float = 0.8
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: Optional[str] = None
    enable_prefix_caching: bool = False
    quant_policy: int = 0


@dataclass
class PytorchEngineConfig:
    dtype: str = "auto"
    tp: int = 1
    dp: int = 1
    dp_rank: int = 0
    ep: int = 1
    session_len: Optional[int] = None
    max_batch_size: Optional[int] = None
    cache_max_entry_count: float = 0.8
    prefill_interval: int = 16
    block_size: int = 64
    max_prefill_token_num: int = 8192
    cudagraph_capture_batch_sizes: Optional[List[int]] = None
    thread_safe: bool = False
    enable_prefix_caching: bool = False
    device_type: str = "cuda"
    eager_mode: bool = False
    download_dir: Optional[str] = None
    distributed_executor_backend: Optional[str] = None
    empty_init: bool = False
    enable_mp_engine: bool = False
    enable_metrics: bool = True
    hf_overrides: Optional[Dict[str, object]] = None

    def __post_init__(self):
        assert self.dtype in ["auto", "float16", "bfloat16"]
        assert self.tp >= 1, "invalid tp"
        assert 0 < self.cache_max_entry_count < 1, "invalid cache_max_entry_count"
