"""Stand-in: vllm.outputs.RequestOutput / CompletionOutput (the attributes llmlaunch reads)."""

from dataclasses import dataclass, field
from typing import List, Optional


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
