"""Stand-in: the `tensorrt_llm` package's LLM API surface (tests only; see tests/standins/_standin.py).

TensorRT-LLM's wheel is gigabytes and needs a GPU; llmlaunch's llmapi model (launcher/engines/trtllm/models/llmapi.py)
is tested at its API boundary against these names, as the real package has them: `tensorrt_llm.LLM`,
`tensorrt_llm.SamplingParams` (tensorrt_llm/sampling_params.py), `tensorrt_llm.llmapi.llm_args`
(TorchLlmArgs / TrtLlmArgs: the LLM's keyword arguments as pydantic fields) and the request result of
`LLM.generate_async` (tensorrt_llm/executor/result.py).
"""

from tensorrt_llm.llmapi.llm import LLM, RequestOutput
from tensorrt_llm.sampling_params import SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
