"""Stand-in: tensorrt_llm.llmapi (LLM, its argument models in llm_args)."""

from tensorrt_llm.llmapi.llm import LLM, RequestOutput
from tensorrt_llm.llmapi.llm_args import TorchLlmArgs, TrtLlmArgs

__all__ = ["LLM", "RequestOutput", "TorchLlmArgs", "TrtLlmArgs"]
