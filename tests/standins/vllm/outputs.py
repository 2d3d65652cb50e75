"""Stand-in: vllm.outputs.RequestOutput / CompletionOutput (the attributes llmlaunch reads)."""

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class RequestStateStats:
    """vllm.v1.metrics.stats.RequestStateStats: engine-core time.monotonic() stamps (0.0 until they happen)."""

    arrival_time: float = 0.0  # wall clock
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[list] = None
    finish_reason: Optional[str] = None  # "stop" | "length" | "abort"
    stop_reason: Optional[object] = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: Optional[List[int]]
    prompt_logprobs: Optional[list]
    outputs: List[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    metrics: Optional[object] = None  # RequestStateStats where the AsyncLLM keeps statistics, else None
    num_cached_tokens: Optional[int] = None  # prompt tokens the prefix cache served
    kv_transfer_params: Optional[dict] = (
        None  # a KV connector's answer, on the final output (NixlConnector: the handle)
    )
