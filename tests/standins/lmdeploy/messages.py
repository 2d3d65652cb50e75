"""Stand-in: lmdeploy.messages (a subset of the fields, same names and defaults)."""

from dataclasses import dataclass
from typing import List, Optional


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
    session_len: Optional[int] = None
    max_batch_size: Optional[int] = None
    cache_max_entry_count: float = 0.8
    distributed_executor_backend: Optional[str] = None
    enable_prefix_caching: bool = False
    eager_mode: bool = False
