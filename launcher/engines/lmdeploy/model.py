"""llmlaunch's LMDeploy model: the common contract served by LMDeploy's `AsyncEngine`.

Targets LMDeploy 0.18.0's serving API (lmdeploy/serve/core/async_engine.py,
serve/managers/session_manager.py, serve/core/exceptions.py, messages.py):
`AsyncEngine(model_path, backend="turbomind"|"pytorch",
backend_config=TurbomindEngineConfig|PytorchEngineConfig)`, `start_loop(loop,
use_async_api=True)` on the loop that drives it, per request a `Session` from
`session_mgr.get()`, `await preprocess(messages=prompt, session_id=session,
gen_config=GenerationConfig(...), do_preprocess=False)` then `async for out in
generate(request, stream_response=True)`. Each GenOut carries `response` = the text new
since the previous one (incremental detokenization), `generate_token_len` (cumulative)
and `input_token_len`; the last one has `finish_reason` "stop" (a stop token), "length"
or "abort" (cancelled) and usually no text. Failures are raised as `RequestError` (code,
message): by `preprocess` for a request LMDeploy refuses (context length, max_new_tokens)
and by `generate` for an engine error. `await session.async_abort()` cancels a request
that holds one of the engine's request handles; `close()` shuts the engine down.
Releases before the preprocess/generate split (0.6 - 0.10: `generate(messages, session_id,
gen_config, stream_response, sequence_start, sequence_end, do_preprocess)` and
`stop_session(session_id)`) are served through the same adapter, chosen by whether the
engine has `preprocess`. Learned from LMDeploy's Triton python backend and
Triton's vllm_backend; written for llmlaunch.

* The prompt goes in as is (`do_preprocess=False`: no chat template), as TensorRT-LLM's
  ensemble does with `text_input`.
* Contract -> GenerationConfig: max_tokens -> max_new_tokens, min_length ->
  min_new_tokens, temperature (0 = greedy: do_sample=False; LMDeploy accepts at most 2),
  top_k (0 = off: LMDeploy then samples from the whole vocabulary), top_p,
  repetition_penalty, random_seed/seed -> random_seed, bad_words -> bad_words, end_id ->
  stop_token_ids, ignore_eos. LMDeploy maps bad words to the vocabulary tokens containing
  them, so a word spanning several tokens is not matched as a sequence.
  presence/frequency penalties, pad_id, exclude_input_in_output and return_log_probs are
  accepted and ignored.
* stop_words are matched here, in the text, as the contract says (the answer ends before
  the first stop string, which is not returned; not before min_length tokens): LMDeploy's
  own stop_words stop at any vocabulary token containing a word (a word made of several
  tokens never matches; a longer token that contains it does), and with ignore_eos it bans
  those tokens instead. The last len(longest stop) - 1 characters are held back until they
  cannot begin a stop string; on a match the stream is closed, which cancels the request
  in the engine (LMDeploy's safe_run).
* Greedy with a repetition penalty: LMDeploy's `preprocess` resets repetition_penalty
  to 1 when do_sample is False, so such a request is sent as do_sample=True, top_k=1,
  temperature=1 (top_k=1 leaves only the highest penalized logit to sample: the argmax),
  which keeps the contract's greedy-with-penalty meaning.
* ignore_eos: LMDeploy does not merely skip stopping; it moves every stop token (EOS,
  end_id) to the banned tokens, so none of them is generated.
* Backends: TurboMind (default) runs tensor parallelism inside one node. The PyTorch
  backend spans nodes through Ray (docs/en/advance/pytorch_multinodes.md): on a copy of
  several nodes this model (on the copy's leader) starts the Ray head on
  _LLMLAUNCH_DIST_PORT, waits for the other nodes' `ray start`, and builds the engine with
  `distributed_executor_backend="ray"` (launcher.engines.ray).

Parameters (config.pbtxt, written by launcher/engines/registry.py): model_path, tp_size,
pp_size, nnodes, max_num_seqs (-> max_batch_size), dtype, max_model_len / session_len,
backend, cache_max_entry_count, model_name, extra_args (a JSON object of more
backend-config fields; unknown names are refused).
"""

import dataclasses
import itertools
import json

from launcher.contract import INPUT_NAMES
from launcher.python_backend.adapter import EngineAdapter, Log, Piece
from launcher.python_backend.async_runtime import RuntimeModel
from launcher.python_backend.triton_io import MUST_HONOUR

DTYPES = ("auto", "float16", "bfloat16")


def backend_config_kwargs(params: dict, fields: set) -> dict:
    """config.pbtxt parameters -> TurbomindEngineConfig / PytorchEngineConfig keyword arguments."""
    dtype = params.get("dtype", "auto")
    if dtype not in DTYPES:
        raise ValueError(
            f"lmdeploy: dtype {dtype!r} is not supported by LMDeploy; use model.dtype=auto, float16 or bfloat16"
        )
    kw = {
        "tp": int(params.get("tp_size", 1)),
        "dtype": dtype,
        "cache_max_entry_count": float(params.get("cache_max_entry_count", 0.8)),
    }
    if params.get("max_num_seqs"):
        kw["max_batch_size"] = int(params["max_num_seqs"])
    session_len = int(params.get("session_len", 0) or 0) or int(params.get("max_model_len", 0) or 0)
    if session_len:
        kw["session_len"] = session_len
    if int(params.get("pp_size", 1) or 1) > 1:
        raise ValueError("lmdeploy: pipeline parallelism is not offered through llmlaunch; use pp=1 and tp")
    if int(params.get("nnodes", 1) or 1) > 1:
        if params.get("backend", "turbomind") != "pytorch":
            raise ValueError("lmdeploy: only the PyTorch backend spans nodes (engine.backend=pytorch)")
        kw["distributed_executor_backend"] = "ray"
    kw.update(json.loads(params.get("extra_args") or "{}"))
    unknown = sorted(set(kw) - fields)
    if unknown:
        raise ValueError(
            f"lmdeploy: the {params.get('backend', 'turbomind')} backend config has no {unknown}; fix engine.extra_args"
        )
    return kw


def generation_kwargs(p) -> dict:
    """launcher.python_backend.triton_io.SamplingParams -> lmdeploy.GenerationConfig keyword arguments."""
    if p.temperature > 2:
        raise ValueError(f"LMDeploy accepts temperature in [0, 2] (0 = greedy), got {p.temperature}")
    greedy = p.temperature == 0
    kw = {
        "n": 1,
        "max_new_tokens": p.max_tokens,
        "do_sample": not greedy,
        "temperature": 1.0 if greedy else p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k,
        "repetition_penalty": p.repetition_penalty,
        "ignore_eos": p.ignore_eos,
        "skip_special_tokens": True,
    }
    if greedy and p.repetition_penalty != 1.0:
        # preprocess() drops the penalty of a do_sample=False request; top_k=1 sampling is the same argmax
        # over the penalized logits
        kw.update(do_sample=True, top_k=1, top_p=1.0)
    if p.min_tokens:
        kw["min_new_tokens"] = p.min_tokens
    if p.seed is not None:
        kw["random_seed"] = p.seed
    if p.bad_words:
        kw["bad_words"] = list(p.bad_words)
    if p.end_id is not None:
        kw["stop_token_ids"] = [p.end_id]
    return kw


def _request_error_types() -> tuple:
    """LMDeploy's RequestError (releases with serve/core/exceptions.py, 0.18 among them), or nothing to catch."""
    try:
        from lmdeploy.serve.core.exceptions import RequestError
    except ImportError:
        return ()
    return (RequestError,)


def describe_request_error(exc: BaseException, refused: bool) -> str:
    """A RequestError as one line: LMDeploy's code and message, and the engine error behind a generic one."""
    code = getattr(getattr(exc, "code", None), "value", None) or type(exc).__name__
    msg = f"LMDeploy {'refused the request' if refused else 'failed the request'} ({code}): {getattr(exc, 'message', None) or exc}"
    cause = exc.__cause__
    if cause is not None and str(cause) and str(cause) not in msg:
        msg += f" ({type(cause).__name__}: {cause})"
    return msg


class LMDeployAdapter(EngineAdapter):
    name = "lmdeploy"
    supported = frozenset(INPUT_NAMES) - {"presence_penalty", "frequency_penalty", *MUST_HONOUR}

    def __init__(self, params: dict, log: Log):
        self.params = params
        self.log = log
        self.engine = None
        self.ray_head = None
        self.sessions = {}  # request id -> Session (new API) or int session id (old API)
        self._ids = itertools.count(1)
        self.new_api = True

    async def start(self):
        import asyncio

        from lmdeploy import PytorchEngineConfig, TurbomindEngineConfig

        try:
            from lmdeploy.serve.core import AsyncEngine
        except ImportError:  # releases before the serve/core split
            from lmdeploy.serve.async_engine import AsyncEngine

        backend = self.params.get("backend", "turbomind")
        if backend not in ("turbomind", "pytorch"):
            raise ValueError(f"lmdeploy: backend {backend!r}; use engine.backend=turbomind or pytorch")
        config_cls = TurbomindEngineConfig if backend == "turbomind" else PytorchEngineConfig
        cfg_kwargs = backend_config_kwargs(self.params, {f.name for f in dataclasses.fields(config_cls)})
        try:
            backend_config = config_cls(**cfg_kwargs)
        except AssertionError as exc:  # LMDeploy checks its config fields with asserts, some without a message
            raise ValueError(
                f"lmdeploy: {config_cls.__name__} refused {cfg_kwargs}: {exc or 'a value out of range'} "
                "(the PyTorch backend wants cache_max_entry_count in (0, 1))"
            ) from exc
        nnodes = int(self.params.get("nnodes", 1) or 1)
        if nnodes > 1:
            from launcher.engines.ray import start_copy_head

            self.ray_head = start_copy_head("lmdeploy", nnodes, self.log.info)
        self.log.info(
            f"building AsyncEngine({self.params['model_path']}, backend={backend}, {config_cls.__name__}({cfg_kwargs}))"
        )
        engine_kwargs = {"backend": backend, "backend_config": backend_config}
        if self.params.get("model_name"):
            engine_kwargs["model_name"] = self.params["model_name"]
        try:
            self.engine = AsyncEngine(self.params["model_path"], **engine_kwargs)
        except BaseException:
            if self.ray_head is not None:  # the load failed: leave no Ray head behind
                self.ray_head.stop()
            raise
        if hasattr(self.engine, "start_loop"):
            self.engine.start_loop(asyncio.get_running_loop(), use_async_api=True)
        self.new_api = hasattr(self.engine, "preprocess")
        self.max_model_len = getattr(self.engine, "session_len", None)

    async def generate(self, request_id, request):
        from lmdeploy import GenerationConfig

        gen_config = GenerationConfig(**generation_kwargs(request.params))
        request_errors = _request_error_types()
        session = None
        if self.new_api:
            session = self.engine.session_mgr.get()
            self.sessions[request_id] = session
            try:
                prepared = await self.engine.preprocess(
                    messages=request.prompt, session_id=session, gen_config=gen_config, do_preprocess=False
                )
            except request_errors as exc:  # a request LMDeploy refuses: context length, max_new_tokens, ...
                self.sessions.pop(request_id, None)
                raise RuntimeError(describe_request_error(exc, refused=True)) from exc
            outputs = self.engine.generate(prepared, stream_response=True)
        else:
            session_id = next(self._ids)
            self.sessions[request_id] = session_id
            outputs = self.engine.generate(
                request.prompt,
                session_id,
                gen_config=gen_config,
                stream_response=True,
                sequence_start=True,
                sequence_end=True,
                do_preprocess=False,
            )
        try:
            stops = [w for w in request.params.stop if w]
            hold = max((len(w) for w in stops), default=1) - 1  # characters that may begin a stop string
            held = ""  # text not sent yet (stop strings only)
            async for out in outputs:
                finish = out.finish_reason
                if finish in ("error", "abort"):
                    # "abort": cancelled without llmlaunch asking (an abort llmlaunch sends also cancels the task)
                    raise RuntimeError(f"LMDeploy ended the request with finish_reason={finish!r}")
                if finish is not None:
                    finish = "length" if finish == "length" else "stop"
                text, n_out, n_in = out.response or "", int(out.generate_token_len), int(out.input_token_len)
                if stops:
                    held += text
                    if n_out >= request.params.min_tokens:
                        hit = min((i for i in (held.find(w) for w in stops) if i >= 0), default=-1)
                        if hit >= 0:  # closing the stream (finally) cancels the request in the engine
                            yield Piece(held[:hit], n_out, n_in, "stop")
                            return
                    cut = len(held) if finish is not None else max(0, len(held) - hold)
                    text, held = held[:cut], held[cut:]
                yield Piece(text, n_out, n_in, finish)
        except request_errors as exc:
            raise RuntimeError(describe_request_error(exc, refused=False)) from exc
        finally:
            await outputs.aclose()
            self.sessions.pop(request_id, None)
            if session is not None and self.engine is not None:
                # generate() forgets the session when it ran; one cancelled before its first output never ran
                self.engine.session_mgr.remove(session)

    async def abort(self, request_id):
        session = self.sessions.get(request_id)
        if session is None or self.engine is None:
            return
        if self.new_api:
            await session.async_abort()
        else:
            await self.engine.stop_session(session)

    async def stop(self):
        import asyncio

        try:
            if self.engine is not None:
                self.engine.close()
                self.engine = None
                # The PyTorch engine's close() only cancels its main-loop task; that task releases the executor
                # (and its worker processes) as it ends, so give it, and whatever it stops, the loop to finish on.
                others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                if others:
                    await asyncio.wait(others, timeout=10)
        finally:
            if self.ray_head is not None:
                self.ray_head.stop()


class TritonPythonModel(RuntimeModel):
    name = "lmdeploy"

    def make_adapter(self, params, args, log):
        return LMDeployAdapter(params, log)
