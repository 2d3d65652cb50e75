"""llmlaunch's vLLM model: the common contract served by vLLM's async engine.

Targets vLLM's V1 `AsyncLLM` API (vLLM 0.11 and later; read against vllm-project/vllm main,
vllm/v1/engine/async_llm.py, vllm/sampling_params.py, vllm/engine/arg_utils.py as of
PyPI 0.33.0), with the pre-V1 `AsyncLLMEngine` import as a fallback (same `generate` /
`abort` shape). Learned from Triton's vllm_backend (src/model.py); written for llmlaunch.

* Engine arguments come from `1/model.json` (seed 004's vllm_engine_args.json): the
  launcher writes model, tokenizer, tensor/pipeline parallel sizes, max_num_seqs,
  gpu_memory_utilization, dtype, max_model_len and distributed_executor_backend there,
  and `engine.engine_args` entries override them. Keys `AsyncEngineArgs` does not have
  are refused with the list of the unknown ones (`disable_log_requests`, removed in
  vLLM 0.12, is translated to `enable_log_requests`).
* `AsyncLLM.from_engine_args(...)` builds the engine on the runtime's event loop
  (launcher.engines.vllm_sglang_lmdeploy); each request is `engine.generate(prompt,
  SamplingParams(..., output_kind=DELTA), request_id)`, so every RequestOutput carries
  only new text and tokens; cancelled requests get `engine.abort(request_id)`; `finalize`
  calls `engine.shutdown()`.
* Contract -> SamplingParams: max_tokens, min_length -> min_tokens, temperature (0 = greedy),
  top_k (0 -> -1 = off), top_p, repetition/presence/frequency penalties, random_seed/seed
  -> seed, stop_words -> stop (not returned), bad_words, ignore_eos, end_id -> an extra
  stop token id (EOS still stops unless ignore_eos). pad_id, exclude_input_in_output and
  return_log_probs are accepted and ignored.
* Multi-node (a model copy spanning nodes, `distributed_executor_backend: ray`): this
  model runs on the copy's leader only; it starts the copy's Ray head on
  LLMLAUNCH_DIST_PORT, waits for the other nodes' `ray start` (the registry's
  rank_command for vllm) and lets vLLM place its workers on that cluster
  (launcher.engines.vllm_ray).
"""

import dataclasses
import json
import os
import sys

import triton_python_backend_utils as pb_utils

# The python backend stub does not read PYTHONPATH (Triton 2.51); honour it here, after the stub's own
# paths, so `launcher` and the engine packages resolve as they do for the rank that started the server.
for _p in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    if _p and _p not in sys.path:
        sys.path.append(_p)

from launcher.contract import INPUT_NAMES
from launcher.engines.vllm_sglang_lmdeploy import EngineAdapter, Log, Piece, RuntimeModel

ENGINE_ARGS_FILE = "model.json"
RENAMED_ARGS = {"disable_log_requests": ("enable_log_requests", lambda v: not _truthy(v))}


def _truthy(value):
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")


def engine_kwargs(raw: dict, fields: set) -> dict:
    """model.json -> AsyncEngineArgs kwargs: translate renamed keys, refuse unknown ones."""
    kwargs = {}
    for key, value in raw.items():
        if key not in fields and key in RENAMED_ARGS and RENAMED_ARGS[key][0] in fields:
            new, convert = RENAMED_ARGS[key]
            kwargs[new] = convert(value)
        else:
            kwargs[key] = value
    unknown = sorted(set(kwargs) - fields)
    if unknown:
        raise ValueError(f"{ENGINE_ARGS_FILE}: vLLM's AsyncEngineArgs has no {unknown}; remove them from engine.engine_args "
                         f"(valid keys are AsyncEngineArgs fields, e.g. {sorted(fields)[:12]} ...)")
    return kwargs


def sampling_kwargs(p) -> dict:
    """launcher.serving.triton_io.SamplingParams -> vllm.SamplingParams keyword arguments."""
    kw = {
        "n": 1,
        "max_tokens": p.max_tokens,
        "min_tokens": p.min_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k if p.top_k > 0 else -1,
        "repetition_penalty": p.repetition_penalty,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "ignore_eos": p.ignore_eos,
        "skip_special_tokens": True,
    }
    if p.seed is not None:
        kw["seed"] = p.seed
    if p.stop:
        kw["stop"] = list(p.stop)
    if p.bad_words:
        kw["bad_words"] = list(p.bad_words)
    if p.end_id is not None:
        kw["stop_token_ids"] = [p.end_id]
    return kw


class VLLMAdapter(EngineAdapter):
    name = "vllm"
    supported = frozenset(INPUT_NAMES) - {"return_log_probs"}

    def __init__(self, params: dict, version_dir: str, log: Log):
        self.params = params
        self.log = log
        path = os.path.join(version_dir, params.get("engine_args_file", ENGINE_ARGS_FILE))
        try:
            with open(path) as f:
                self.raw_args = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"vllm: {path} is missing; llmlaunch writes it from engine.engine_args (render the repository again)") from None
        self.engine = None
        self.ray_head = None

    async def start(self):
        from vllm.engine.arg_utils import AsyncEngineArgs

        try:
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError:  # vLLM before the V1 engine
            from vllm import AsyncLLMEngine as AsyncLLM

        kwargs = engine_kwargs(self.raw_args, {f.name for f in dataclasses.fields(AsyncEngineArgs)})
        nnodes = int(self.params.get("nnodes", "1") or 1)
        if nnodes > 1:
            if kwargs.get("distributed_executor_backend") != "ray":
                raise ValueError(f"vllm: a model copy over {nnodes} nodes needs distributed_executor_backend=ray (got {kwargs.get('distributed_executor_backend')!r})")
            self.ray_head = _start_ray_head(nnodes, self.log)
        self.log.info(f"building AsyncLLM with {json.dumps(kwargs, sort_keys=True, default=str)}")
        try:
            self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        except BaseException:
            if self.ray_head is not None:  # the load failed: leave no Ray head behind
                self.ray_head.stop()
            raise
        model_config = getattr(self.engine, "model_config", None)
        self.max_model_len = getattr(model_config, "max_model_len", None)

    async def generate(self, request_id, request):
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        sp = SamplingParams(output_kind=RequestOutputKind.DELTA, **sampling_kwargs(request.params))
        n_in = n_out = 0
        async for out in self.engine.generate(request.prompt, sp, request_id):
            if out.prompt_token_ids:
                n_in = len(out.prompt_token_ids)
            c = out.outputs[0]
            n_out += len(c.token_ids)
            finish = None
            if out.finished:
                finish = "length" if c.finish_reason == "length" else "stop"
            yield Piece(c.text, n_out, n_in, finish)

    async def abort(self, request_id):
        if self.engine is not None:
            await self.engine.abort(request_id)

    async def stop(self):
        try:
            if self.engine is not None:
                self.engine.shutdown()
                self.engine = None
        finally:
            if self.ray_head is not None:
                self.ray_head.stop()


def _start_ray_head(nnodes, log):
    from launcher.engines.vllm_ray import RayHead

    port = int(os.environ.get("LLMLAUNCH_DIST_PORT", "0") or 0)
    if not port:
        raise RuntimeError("vllm: LLMLAUNCH_DIST_PORT is not set; multi-node copies are started by `python -m launcher.rank`")
    head = RayHead(port, os.environ.get("LLMLAUNCH_LEADER_ADDR", ""), nnodes, log=log.info)
    head.start()
    return head


class TritonPythonModel(RuntimeModel):
    name = "vllm"

    def make_adapter(self, params, args, log):
        return VLLMAdapter(params, os.path.join(args["model_repository"], args["model_version"]), log)
