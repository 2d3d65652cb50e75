"""Stand-in for the `vllm` package (tests only; see tests/standins/_standin.py).

Follows the public API of vLLM's V1 engine as of vLLM 0.11 - 0.33 (vllm-project/vllm main):
`vllm.engine.arg_utils.AsyncEngineArgs`, `vllm.v1.engine.async_llm.AsyncLLM` with
`from_engine_args`, `generate(prompt, sampling_params, request_id)` (an async generator
of `RequestOutput`), `abort(request_id)`, `shutdown()`, and
`vllm.sampling_params.SamplingParams` / `RequestOutputKind`.
"""

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.async_llm import AsyncLLM

AsyncLLMEngine = AsyncLLM  # vLLM >= 0.10 exports the V1 engine under the old name too

__all__ = [
    "AsyncEngineArgs",
    "AsyncLLM",
    "AsyncLLMEngine",
    "CompletionOutput",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
]
