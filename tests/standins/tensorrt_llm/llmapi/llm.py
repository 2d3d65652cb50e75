"""Stand-in: tensorrt_llm.LLM and the result of its generate_async (tests only; see tests/standins/_standin.py).

Same shape as TensorRT-LLM's: `LLM(model, tokenizer=None, ..., **kwargs)` (blocking: it loads the model),
`llm.args.max_seq_len`, `generate_async(inputs, sampling_params=None, ..., streaming=False)` returning the
request's result at once; the result is an async iterator that yields itself after each step, with
`outputs[0].text` / `token_ids` cumulative, `outputs[0].finish_reason`, `finished`, `prompt_token_ids` and
`abort()`; `shutdown()`. Records init (with which MPI variables the process still had), generate, abort
and shutdown.
"""

import dataclasses
import itertools
import os
from types import SimpleNamespace
from typing import List, Optional

import _standin
from tensorrt_llm.llmapi.llm_args import TorchLlmArgs, TrtLlmArgs
from tensorrt_llm.sampling_params import SamplingParams

ENGINE = "trtllm"
_ids = itertools.count(1)


@dataclasses.dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: List[int] = dataclasses.field(default_factory=list)
    finish_reason: Optional[str] = None  # 'stop' | 'length' | 'timeout' | 'cancelled'
    stop_reason: Optional[object] = None


class RequestOutput:
    """The request's result (tensorrt_llm.executor.result.GenerationResult's public surface)."""

    def __init__(self, llm, prompt, sampling_params, streaming):
        self.request_id = next(_ids)
        self.prompt = prompt
        self.prompt_token_ids = _standin.prompt_ids(prompt)
        self.outputs = [CompletionOutput(0)]
        self.finished = False
        self._llm = llm
        self._sp = sampling_params
        self._streaming = streaming
        self._aborted = False

    def __aiter__(self):
        return self._steps()

    async def _steps(self):
        sp = self._sp
        stop = [sp.stop] if isinstance(sp.stop, str) else (sp.stop or [])
        out = self.outputs[0]
        async for text, tok, finish in _standin.script(
            self.prompt, sp.max_tokens, sp.min_tokens or 0, sp.ignore_eos, stop, cancelled=lambda: self._aborted
        ):
            out.text += text
            if tok is not None:
                out.token_ids.append(tok)
            if finish is not None:
                out.finish_reason, self.finished = finish, True
            if self._streaming or self.finished:
                yield self
            if self.finished:
                return
        if self._aborted and not self.finished:
            out.finish_reason, self.finished = "cancelled", True
            yield self

    def abort(self) -> None:
        if not self._aborted:
            self._aborted = True
            _standin.record(ENGINE, "abort", request_id=self.request_id)


class LLM:
    def __init__(
        self,
        model,
        tokenizer=None,
        tokenizer_mode="auto",
        skip_tokenizer_init=False,
        trust_remote_code=False,
        tensor_parallel_size=1,
        dtype="auto",
        revision=None,
        tokenizer_revision=None,
        **kwargs,
    ):
        backend = kwargs.pop("backend", "pytorch")
        names = (TrtLlmArgs if backend == "tensorrt" else TorchLlmArgs).model_fields
        unknown = sorted(set(kwargs) - set(names))
        if unknown:  # the real argument model (a strict pydantic model) refuses them too
            raise ValueError(f"unexpected LLM arguments {unknown}")
        args = dict(
            model=model,
            tokenizer=tokenizer,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            backend=backend,
            **kwargs,
        )
        self.args = SimpleNamespace(**args, max_seq_len=kwargs.get("max_seq_len") or 4096)
        mpi = sorted(k for k in os.environ if k.startswith(("PMIX_RANK", "PMI_RANK", "OMPI_COMM_WORLD_")))
        _standin.record(ENGINE, "init", args=args, mpi_env=mpi, proxy=os.environ.get("TLLM_SPAWN_PROXY_PROCESS", ""))

    def generate_async(
        self,
        inputs,
        sampling_params: Optional[SamplingParams] = None,
        lora_request=None,
        prompt_adapter_request=None,
        streaming: bool = False,
        kv_cache_retention_config=None,
        disaggregated_params=None,
        scheduling_params=None,
        cache_salt=None,
        trace_headers=None,
    ):
        sp = sampling_params or SamplingParams()
        result = RequestOutput(self, inputs, sp, streaming)
        _standin.record(
            ENGINE,
            "generate",
            request_id=result.request_id,
            prompt=inputs,
            streaming=streaming,
            sampling=dataclasses.asdict(sp),
        )
        return result

    def shutdown(self) -> None:
        _standin.record(ENGINE, "shutdown")
