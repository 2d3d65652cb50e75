"""llmlaunch's TensorRT-LLM model: the common contract served by `tensorrt_llm.LLM` (the LLM API).

`engine=trtllm engine.layout=llmapi` (the default). Targets the LLM API of TensorRT-LLM 0.18 and later, read
against NVIDIA/TensorRT-LLM: tensorrt_llm/llmapi/llm.py (`LLM(model, ..., **kwargs)`, `backend` defaulting to
pytorch, `generate_async(inputs, sampling_params=..., streaming=...)`, `shutdown()`),
tensorrt_llm/llmapi/llm_args.py (`TorchLlmArgs`, `TrtLlmArgs`: pydantic models whose fields are LLM's
keyword arguments), tensorrt_llm/sampling_params.py (`SamplingParams`), tensorrt_llm/executor/result.py
(the request's result: an async iterator of itself, `outputs[0].text` / `token_ids` cumulative,
`finish_reason`, `finished`, `prompt_token_ids`, `abort()`), and its Triton model
(triton_backend/all_models/llmapi/tensorrt_llm/1/model.py); written for llmlaunch.

* The LLM's arguments are `1/model.yaml`, written by launcher/engines/trtllm/llmapi.py from the launch and
  `engine.llm_args`. A key the LLM's argument model does not have is refused, naming the valid ones.
* The LLM is built on the runtime's loop thread (launcher.python_backend.async_runtime), in an executor so
  the loop stays free; each request is `generate_async(prompt, SamplingParams(...), streaming=True)`, and
  its result is kept until it ends so a cancelled request is aborted in the engine (`result.abort()`).
* Before tensorrt_llm is imported, the variables that make this stub look like one rank of the job's MPI
  world (srun's PMIx ones) are removed: a one-GPU copy under srun must not join the job's world, and on a
  copy of several GPUs trtllm-llmapi-launch has removed them already (the LLM reaches TensorRT-LLM's MPI
  leader through the proxy address it exported).
* Contract -> SamplingParams: max_tokens, min_length -> min_tokens, temperature (0 = greedy: top_k 1),
  top_k (0 = off), top_p, repetition/presence/frequency penalties, random_seed/seed -> seed,
  stop_words -> stop (not returned), bad_words -> bad, ignore_eos, end_id -> an extra stop token id (EOS
  still stops unless ignore_eos). pad_id and exclude_input_in_output are accepted (the LLM API never
  returns the prompt); return_log_probs is accepted and ignored (noted once): the contract has no
  log-prob output.
"""

import asyncio
import inspect
import json
import os

import triton_python_backend_utils as pb_utils  # noqa: F401 - the stub's module; RuntimeModel uses it

from launcher.contract import INPUT_NAMES
from launcher.python_backend.adapter import EngineAdapter, Log, Piece
from launcher.python_backend.async_runtime import RuntimeModel
from launcher.python_backend.triton_io import MUST_HONOUR

ARGS_FILE = "model.yaml"
# What makes a process one rank of an MPI job: the rank's identity and its launcher's server. Configuration
# (OMPI_MCA_*, PMIX_MCA_*, UCX_*) stays: it says how to talk, not who this process is.
MPI_RANK_PREFIXES = ("OMPI_COMM_WORLD_", "PMIX_", "PMI_", "OMPI_MCA_orte_", "ORTE_")
MPI_RANK_NAMES = ("OMPI_UNIVERSE_SIZE", "OMPI_FIRST_RANKS", "OMPI_APP_CTX_NUM_PROCS")
MPI_KEEP_PREFIXES = ("PMIX_MCA_",)


def leave_mpi_world(environ) -> list:
    """Remove the MPI rank variables from `environ`; returns the names removed."""
    gone = [
        k
        for k in list(environ)
        if (k.startswith(MPI_RANK_PREFIXES) or k in MPI_RANK_NAMES) and not k.startswith(MPI_KEEP_PREFIXES)
    ]
    for k in gone:
        del environ[k]
    return gone


def llm_arg_names(backend: str):
    """The keyword arguments tensorrt_llm.LLM takes for `backend` (the fields of its argument model), or None
    when this release does not say."""
    try:
        from tensorrt_llm.llmapi import llm_args
    except ImportError:
        return None
    model = getattr(llm_args, "TrtLlmArgs" if backend == "tensorrt" else "TorchLlmArgs", None)
    names = getattr(model, "model_fields", None)
    return None if names is None else set(names) | {"backend"}  # LLM takes `backend` itself


def llm_kwargs(raw: dict, names) -> dict:
    """model.yaml -> LLM keyword arguments: refuse keys the LLM does not take, listing the valid ones."""
    if not isinstance(raw, dict) or not raw.get("model"):
        raise ValueError(
            f"{ARGS_FILE}: a mapping with at least `model` (a Hugging Face folder); render the repository again"
        )
    unknown = sorted(set(raw) - names) if names is not None else []
    if unknown:
        raise ValueError(
            f"{ARGS_FILE}: tensorrt_llm.LLM takes no {unknown}; remove them from engine.llm_args "
            f"(valid keys: {', '.join(sorted(names))})"
        )
    return dict(raw)


def sampling_kwargs(p) -> dict:
    """launcher.python_backend.triton_io.SamplingParams -> tensorrt_llm.SamplingParams keyword arguments."""
    kw = {"n": 1, "max_tokens": p.max_tokens, "ignore_eos": p.ignore_eos, "skip_special_tokens": True}
    if p.temperature > 0:
        kw["temperature"] = p.temperature
        if p.top_k > 0:
            kw["top_k"] = p.top_k
        if p.top_p < 1.0:
            kw["top_p"] = p.top_p
    else:
        kw["top_k"] = 1  # greedy: TensorRT-LLM takes temperature > 0 only
    if p.min_tokens:
        kw["min_tokens"] = p.min_tokens
    if p.repetition_penalty != 1.0:
        kw["repetition_penalty"] = p.repetition_penalty
    if p.presence_penalty:
        kw["presence_penalty"] = p.presence_penalty
    if p.frequency_penalty:
        kw["frequency_penalty"] = p.frequency_penalty
    if p.seed is not None:
        kw["seed"] = p.seed
    if p.stop:
        kw["stop"] = list(p.stop)
    if p.bad_words:
        kw["bad"] = list(p.bad_words)
    if p.end_id is not None:
        kw["stop_token_ids"] = [p.end_id]
    return kw


class LLMAPIAdapter(EngineAdapter):
    name = "trtllm"
    supported = frozenset(INPUT_NAMES) - set(MUST_HONOUR)

    def __init__(self, params: dict, version_dir: str, log: Log):
        self.params = params
        self.log = log
        self.path = os.path.join(version_dir, params.get("llm_args_file", ARGS_FILE))
        self.llm = None
        self.results = {}  # request id -> the running request's result (for abort)

    def _read_args(self) -> dict:
        import yaml

        try:
            with open(self.path) as f:
                return yaml.safe_load(f)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"trtllm: {self.path} is missing; llmlaunch writes it from engine.llm_args "
                "(render the repository again)"
            ) from None

    async def start(self):
        raw = self._read_args()
        gone = leave_mpi_world(os.environ)
        if gone:
            self.log.info(f"left the job's MPI world before loading TensorRT-LLM (removed {len(gone)} variables)")
        from tensorrt_llm import LLM

        kwargs = llm_kwargs(raw, llm_arg_names(str((raw or {}).get("backend", "pytorch"))))
        self.log.info(f"building tensorrt_llm.LLM with {json.dumps(kwargs, sort_keys=True, default=str)}")
        loop = asyncio.get_running_loop()
        self.llm = await loop.run_in_executor(None, lambda: LLM(**kwargs))
        args = getattr(self.llm, "args", None)
        limit = getattr(args, "max_seq_len", None)
        self.max_model_len = int(limit) if isinstance(limit, int) and limit > 0 else None

    async def generate(self, request_id, request):
        from tensorrt_llm import SamplingParams

        sp = SamplingParams(**sampling_kwargs(request.params))
        result = self.llm.generate_async(request.prompt, sampling_params=sp, streaming=True)
        self.results[request_id] = result
        sent = 0
        try:
            async for out in result:
                c = out.outputs[0]
                text = c.text or ""
                delta, sent = text[sent:], max(sent, len(text))
                finish = None
                if out.finished:
                    if c.finish_reason == "cancelled":
                        raise RuntimeError("TensorRT-LLM cancelled the request")
                    finish = "length" if c.finish_reason == "length" else "stop"
                yield Piece(delta, len(c.token_ids or ()), len(out.prompt_token_ids or ()), finish)
        finally:
            if getattr(
                result, "finished", False
            ):  # else it is still running: abort() (which the runtime calls next) ends it
                self.results.pop(request_id, None)

    async def abort(self, request_id):
        result = self.results.pop(request_id, None)
        if result is None:
            return
        done = result.abort()
        if inspect.isawaitable(done):
            await done

    async def stop(self):
        if self.llm is not None:
            llm, self.llm = self.llm, None
            await asyncio.get_running_loop().run_in_executor(None, llm.shutdown)


class TritonPythonModel(RuntimeModel):
    name = "trtllm"

    def make_adapter(self, params, args, log):
        return LLMAPIAdapter(params, os.path.join(args["model_repository"], args["model_version"]), log)
