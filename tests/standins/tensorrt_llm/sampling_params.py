"""Stand-in: tensorrt_llm.SamplingParams, with the real class's field names and defaults (a subset: the
ones a request can set through llmlaunch's contract, and their neighbours). Unknown names fail as they do
on the real keyword-only dataclass."""

from dataclasses import dataclass
from typing import List, Optional, Union


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    end_id: Optional[int] = None
    pad_id: Optional[int] = None
    max_tokens: int = 32
    bad: Optional[Union[str, List[str]]] = None
    bad_token_ids: Optional[List[int]] = None
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    include_stop_str_in_output: bool = False
    n: int = 1
    best_of: Optional[int] = None
    use_beam_search: bool = False
    top_k: Optional[int] = None
    top_p: Optional[float] = None
    seed: Optional[int] = None
    temperature: Optional[float] = None
    min_tokens: Optional[int] = None
    repetition_penalty: Optional[float] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    length_penalty: Optional[float] = None
    min_p: Optional[float] = None
    logprobs: Optional[int] = None
    exclude_input_from_output: bool = True
    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
