"""Stand-in: sglang.srt.server_args.ServerArgs (a dataclass; a subset of SGLang's fields, same names)."""

from dataclasses import dataclass
from typing import Optional


@dataclass
class ServerArgs:
    model_path: str
    tokenizer_path: Optional[str] = None
    dtype: str = "auto"
    context_length: Optional[int] = None
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    mem_fraction_static: Optional[float] = None
    max_running_requests: Optional[int] = None
    random_seed: Optional[int] = None
    log_level: str = "info"
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: Optional[str] = None
    incremental_streaming_output: bool = False
    enable_deterministic_inference: bool = False  # SGLang samples with a request's sampling_seed only with it
    attention_backend: Optional[str] = None
    prefill_attention_backend: Optional[str] = None
    decode_attention_backend: Optional[str] = None
    tokenizer_worker_num: int = 1  # > 1: SGLang's multi-tokenizer mode (a router and that many tokenizer workers)
    enable_metrics: bool = False
    host: str = "127.0.0.1"
    port: int = 30000


@dataclass
class PortArgs:
    """The IPC addresses of one Engine's processes (a subset of SGLang's PortArgs, same names)."""

    tokenizer_ipc_name: str
    scheduler_input_ipc_name: str
    detokenizer_ipc_name: str
    tokenizer_worker_ipc_name: Optional[str] = None
