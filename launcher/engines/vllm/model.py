"""llmlaunch's vLLM model: the common contract served by vLLM's async engine.

Targets vLLM's V1 `AsyncLLM` API (written and run against vLLM 0.25; read against
vllm/v1/engine/async_llm.py, vllm/v1/engine/utils.py, vllm/sampling_params.py and
vllm/engine/arg_utils.py): the V1 engine core (`launch_core_engines`) and its `AsyncLLM` clients.
Learned from Triton's vllm_backend (src/model.py); written for llmlaunch.

* Engine arguments come from `1/model.json`: the launcher writes model, tokenizer, tensor/pipeline
  parallel sizes, max_num_seqs, gpu_memory_utilization, dtype, max_model_len and
  distributed_executor_backend there, and `engine.engine_args` entries override them. Keys
  `AsyncEngineArgs` does not have are refused with the list of the unknown ones
  (`disable_log_requests`, removed in vLLM 0.12, is translated to `enable_log_requests`).
* The engine core: the first instance (Triton's instance name ends in _0; with `frontends` 1 the only one)
  starts it for the model's N front ends from a process of the launcher's interpreter and library path
  (launcher.engines.vllm.core_process, with vLLM's own `launch_core_engines`), not from the stub: the stub's
  environment is made for the stub, and a core started from it served 0.83-0.86 of the tokens/s on one H100
  (docs/performance/vllm.md). That process stays beside the core to stop it, and stops it if the stub dies.
* Front ends: every instance (the first too) is an `AsyncLLM` client of that core on an address pair of its own
  (the first publishes them once the core is up: launcher.python_backend.instances), as `vllm serve
  --api-server-count N` runs N API servers; each tokenizes its prompts, detokenizes its outputs and sends its
  responses under its own GIL (the core sends each request's outputs to the client that sent it). If the engine
  core dies, the first instance stops its tritonserver, so the rank fails instead of a server that looks healthy.
* Each request is `engine.generate(prompt, SamplingParams(..., output_kind=DELTA), request_id)`, so
  every RequestOutput carries only new text and tokens (vLLM merges the outputs of several steps
  when this stub reads them late); cancelled requests get `engine.abort(request_id)`; `finalize`
  shuts the client and, on the first instance, the engine core down.
* Contract -> SamplingParams: max_tokens, min_length -> min_tokens, temperature (0 = greedy),
  top_k (0 -> -1 = off), top_p, repetition/presence/frequency penalties, random_seed/seed
  -> seed, stop_words -> stop (not returned), bad_words, ignore_eos, end_id -> an extra
  stop token id (EOS still stops unless ignore_eos). pad_id, exclude_input_in_output and
  return_log_probs are accepted and ignored.
* Multi-node (a model copy spanning nodes, `distributed_executor_backend: ray`): this
  model runs on the copy's leader only; it starts the copy's Ray head on
  _LLMLAUNCH_DIST_PORT, waits for the other nodes' `ray start` (the engine's
  rank_command for vllm) and lets vLLM place its workers on that cluster
  (launcher.engines.ray).
* Disaggregated prefill and decode (`disagg.prefill`/`disagg.decode`): model.json carries vLLM's
  `kv_transfer_config` (NixlConnector, kv_both, recompute where a load fails), and each instance runs NIXL's
  side channel on its own port (RankEnv.kv_transfer -> VLLM_NIXL_SIDE_CHANNEL_HOST/PORT, set before the engine
  core starts), with UCX's CUDA-IPC reads on (UCX_CUDA_IPC_ENABLE_GET_ZCOPY, unless the user set it). A
  `kv_export` request (the front end's prefill) asks vLLM to keep its blocks for a remote decode
  (kv_transfer_params do_remote_decode); the kv_transfer_params vLLM returns on its final output go back as
  `kv_handle`, and a request with `kv_from` (that JSON) passes them on, so the decode engine reads the blocks over
  NIXL (read against vLLM 0.25's nixl connector and its toy proxy's request shapes).
"""

import dataclasses
import json
import os
import signal
import threading
from typing import Optional

from launcher.contract import INPUT_NAMES
from launcher.handoff.rank_env import RankEnv
from launcher.kv_events import remove_socket_file, vllm_config as vllm_kv_events
from launcher.python_backend import counters
from launcher.python_backend.adapter import EngineAdapter, Log, Piece
from launcher.python_backend.async_runtime import RuntimeModel
from launcher.python_backend.logprob_io import LogProbRows
from launcher.python_backend.triton_io import InvalidRequest

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
        raise ValueError(
            f"{ENGINE_ARGS_FILE}: vLLM's AsyncEngineArgs has no {unknown}; remove them from engine.engine_args "
            f"(valid keys are AsyncEngineArgs fields, e.g. {sorted(fields)[:12]} ...)"
        )
    return kwargs


def sampling_kwargs(p) -> dict:
    """launcher.python_backend.triton_io.SamplingParams -> vllm.SamplingParams keyword arguments."""
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
    if p.logprobs is not None:
        kw["logprobs"] = p.logprobs
    if p.prompt_logprobs is not None:
        kw["prompt_logprobs"] = p.prompt_logprobs
    if p.guide is not None:
        kw["structured_outputs"] = structured_outputs(*p.guide)
    return kw


# the contract's guide kinds -> vLLM's StructuredOutputsParams field (json_object: any JSON object)
_STRUCTURED = {"json": "json_object", "json_schema": "json", "regex": "regex", "ebnf_grammar": "grammar"}


def structured_outputs(kind: str, guide: str) -> dict:
    """A contract guide as vllm.sampling_params.StructuredOutputsParams keyword arguments (vLLM compiles it with
    its structured-outputs backend, xgrammar by default)."""
    return {_STRUCTURED[kind]: True if kind == "json" else guide}


async def _guide_refused(outputs):
    """A guided request's outputs, with vLLM's refusal of its guide (a ValueError while it checks and compiles the
    request, before any output) as an InvalidRequest that names the guide: the client's fault, not the engine's."""
    first = True
    try:
        async for out in outputs:
            first = False
            yield out
    except ValueError as exc:
        if not first:
            raise
        raise InvalidRequest(f"guided_decoding_guide: vLLM cannot compile it: {exc}") from None


def logprob_rows(token_ids, per_token, k: int) -> LogProbRows:
    """vLLM's log probabilities (per token a dict of token id -> Logprob(logprob, rank, ...): the top k by rank and
    the token itself) as the contract's rows: the token's id and log probability, then the top k, most likely
    first.  A None entry (a prompt's first token) becomes its id and NaN."""
    rows = LogProbRows()
    for tid, d in zip(token_ids, per_token):
        if d is None:
            rows.ids.append([tid])
            rows.lps.append([float("nan")])
            continue
        top = sorted((lp.rank, i, lp.logprob) for i, lp in d.items() if lp.rank is not None and lp.rank <= k)
        own = d.get(tid)
        rows.ids.append([tid, *(i for _, i, _ in top)])
        rows.lps.append([own.logprob if own is not None else float("nan"), *(v for _, _, v in top)])
    return rows


def engine_times(metrics) -> Optional[tuple]:
    """(queued, first token made) of a request, time.monotonic() stamps of vLLM's engine core (RequestOutput.metrics:
    RequestStateStats' queued_ts and first_token_ts, read against vLLM 0.25), or None where it kept none (statistics
    off) or they are not both set yet."""
    queued, made = getattr(metrics, "queued_ts", 0.0), getattr(metrics, "first_token_ts", 0.0)
    return (queued, made) if queued and made else None


# kv_transfer_params of a prefill for a remote decode, as vLLM's own proxies send them (its connector fills in the rest)
REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def transfer_args(params) -> Optional[dict]:
    """SamplingParams.extra_args of a request with kv_export (keep its blocks for a remote decode) or kv_from (read
    them from the prefill's engine: the kv_transfer_params it returned), None for others.  A request that continues
    after tokens made elsewhere (continue_ids) computes its prompt here: its blocks were read, or given up, before."""
    if params.kv_export:
        return {"kv_transfer_params": dict(REMOTE_DECODE)}
    if not params.kv_from or params.continue_ids:
        return None
    try:
        handle = json.loads(params.kv_from)
    except ValueError:
        handle = None
    if not isinstance(handle, dict) or not handle.get("do_remote_prefill"):
        raise InvalidRequest(
            f"kv_from {params.kv_from[:80]!r} is not the kv_handle a vLLM prefill returns (its kv_transfer_params, a "
            "JSON object with do_remote_prefill): send that handle, or leave kv_from out"
        )
    return {"kv_transfer_params": handle}


# UCX's CUDA-IPC transport does GETs (NIXL's reads: the decode instance pulls) only where it finds NVLink unless this
# says `on`; without them UCX emulates each read over loopback TCP through host memory. Measured on one H200 without
# NVLink (two instances sharing it, 64.5 MiB a prompt): 227 ms a read emulated against 16.9 ms over CUDA IPC
# (docs/performance/disagg.md). Where CUDA IPC cannot reach the peer (other nodes, no peer access) UCX picks another
# transport whatever this says.
UCX_GET_ZCOPY = "UCX_CUDA_IPC_ENABLE_GET_ZCOPY"


def nixl_env(kv_transfer: str, environ) -> dict:
    """The variables an instance whose transfer address is `kv_transfer` (host:port, as the other replicas reach it)
    sets before its engine core starts: NIXL's side channel on that address, and UCX's CUDA-IPC reads unless
    `environ` (the user's environment) already says; {} where it has no transfer address."""
    if not kv_transfer:
        return {}
    host, _, port = kv_transfer.rpartition(":")
    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": host.strip("[]"), "VLLM_NIXL_SIDE_CHANNEL_PORT": port}
    if UCX_GET_ZCOPY not in environ:
        env[UCX_GET_ZCOPY] = "on"
    return env


def continued(prompt, continue_ids, encode) -> dict:
    """The prompt of a request that goes on after `continue_ids` (tokens it generated on another server): the
    prompt's ids, as vLLM makes them from its text (`encode`: the tokenizer's, special tokens added) or as sent, then
    those tokens."""
    ids = encode(prompt) if isinstance(prompt, str) else list(prompt)
    return {"prompt_token_ids": [*ids, *continue_ids]}


def continued_kwargs(kw: dict, n: int) -> dict:
    """vllm.SamplingParams keyword arguments of a request that goes on after `n` tokens it generated elsewhere: they
    count against max_tokens and min_tokens.  A seed starts vLLM's generator again (it cannot skip draws), so a
    seeded sampled request that moved is a valid sample, not the one an undisturbed run draws; presence and frequency
    penalties see only the tokens made here (docs/operations.md)."""
    return {**kw, "max_tokens": kw["max_tokens"] - n, "min_tokens": max(0, kw.get("min_tokens", 0) - n)}


class VLLMAdapter(EngineAdapter):
    name = "vllm"
    supported = frozenset(INPUT_NAMES)
    continues = True

    def __init__(self, params: dict, version_dir: str, log: Log, model_name: str = "vllm"):
        self.params = params
        self.log = log
        self.model_name = model_name
        path = os.path.join(version_dir, params.get("engine_args_file", ENGINE_ARGS_FILE))
        try:
            with open(path) as f:
                self.raw_args = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"vllm: {path} is missing; llmlaunch writes it from engine.engine_args (render the repository again)"
            ) from None
        self.frontends = int(params.get("frontends", "1") or 1)
        self.engine = None
        self.ray_head = None
        self.share = (
            None  # launcher.python_backend.instances.InstanceShare when several instances share the engine core
        )
        self.core = None  # the first instance of several: vLLM's engine-core process manager
        self.kv_usage = counters.Latest()  # the engine's KV-cache use, as its scheduler statistics last said
        # keys and values its KV connector moved (disagg: NIXL's transfers), set where the engine has a connector
        self.kv_transfers = None
        # its engine core's steps as the scheduler statistics this front end receives report them
        self.engine_steps = counters.EngineSteps()
        self._stopping = False

    async def start(self):
        from vllm.engine.arg_utils import AsyncEngineArgs

        kwargs = engine_kwargs(self.raw_args, {f.name for f in dataclasses.fields(AsyncEngineArgs)})
        events = RankEnv.from_environ(os.environ).kv_events  # serve.routing=kv: the front end reads the events
        if events:
            kwargs["kv_events_config"] = vllm_kv_events(events)
        if kwargs.get("kv_transfer_config") is not None:
            self.kv_transfers = counters.KVTransfers()
        # this instance's NIXL side channel and UCX's transports: read in the engine core, which inherits them
        os.environ.update(nixl_env(RankEnv.from_environ(os.environ).kv_transfer or "", os.environ))
        nnodes = int(self.params.get("nnodes", "1") or 1)
        if nnodes > 1:
            if kwargs.get("distributed_executor_backend") != "ray":
                raise ValueError(
                    f"vllm: a model copy over {nnodes} nodes needs distributed_executor_backend=ray (got {kwargs.get('distributed_executor_backend')!r})"
                )
            self.ray_head = _start_ray_head(nnodes, self.log)
        self.log.info(f"building AsyncLLM with {json.dumps(kwargs, sort_keys=True, default=str)}")
        try:
            self.engine = self._engine_client(kwargs)
        except BaseException:
            if self.ray_head is not None:  # the load failed: leave no Ray head behind
                self.ray_head.stop()
            self._stop_core()
            raise
        model_config = getattr(self.engine, "model_config", None)
        self.max_model_len = getattr(model_config, "max_model_len", None)
        self.tokenizer = self._tokenizer()

    def _tokenizer(self):
        """The model's tokenizer, as vLLM loads it (transformers' AutoTokenizer): a request that continues after
        tokens made elsewhere is tokenized with it, and Settle decodes with it which tokens' text is out.  None where it
        cannot load (those requests then never move)."""
        path = self.params.get("tokenizer_path") or self.raw_args.get("tokenizer") or self.raw_args.get("model")
        try:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(path, trust_remote_code=bool(self.raw_args.get("trust_remote_code")))
        except Exception as exc:  # noqa: BLE001 - serving goes on; its requests stay where they start
            self.log.warn(f"no tokenizer from {path!r} ({exc}): requests will not move to another replica")
            return None

    def cannot_continue(self, params) -> str:
        """vLLM checks stop strings and guides on the text it generates itself: after a move it would miss a stop
        string begun before it, and start the guide's grammar again.  Requests with either stay where they are."""
        if self.tokenizer is None:
            return "no tokenizer (the stub log says why)"
        if params.stop:
            return "stop strings"
        if params.guide is not None:
            return "a guide (guided decoding)"
        return ""

    def _engine_client(self, kwargs):
        """This instance's AsyncLLM client of the engine core the model's `frontends` instances share.  The first
        instance starts the core in a process of the launcher's interpreter (launcher.engines.vllm.core_process
        says why) and, where there are several, publishes the clients' addresses; the others wait for them."""
        from launcher.engines.vllm import core as vllm_core
        from launcher.engines.vllm.core_process import CoreProcess
        from launcher.python_backend.instances import InstanceShare

        n, index = self.frontends, int(self.params.get("frontend_index", 0))
        timeout = float(self.params.get("ready_timeout_s", "") or 3600)
        args, config = vllm_core.engine_config(vllm_core.vllm_kwargs(kwargs), n, index)
        if n > 1:
            self.share = InstanceShare("vllm", self.model_name, index, n)
        if index == 0:
            try:
                self.core = CoreProcess(kwargs, n, timeout)
                info = self.core.start()
                if self.share is not None:
                    self.share.publish(info)
            except BaseException as exc:
                if self.share is not None:
                    self.share.fail(f"{type(exc).__name__}: {exc}")
                raise
            threading.Thread(target=self._watch_core, name="vllm-core-watch", daemon=True).start()
        else:
            # the first front end's engine core loads within the launch's serve.ready_timeout_s (config.pbtxt)
            info = self.share.wait(timeout)
        self.log.info(f"front end {index} of {n} of one engine core ({'started here' if index == 0 else 'attached'})")
        # the engine's statistics are logged once, by the first front end; every front end keeps its requests' own
        return vllm_core.client(
            config,
            n,
            index,
            info,
            stats=not args.disable_log_stats,
            log_stats=index == 0,
            kv_usage=self.kv_usage,
            transfers=self.kv_transfers,
            steps=self.engine_steps,
        )

    def _watch_core(self):
        """First instance: when the engine core dies, stop this tritonserver so the rank fails."""
        core = self.core
        if core is None:
            return
        codes = core.wait()
        if self._stopping:
            return
        if codes and all(c in (0, -signal.SIGTERM, -signal.SIGINT) for c in codes.values()):
            # the server's process group was signalled (a stop): the core went with it, and so does the server
            self.log.info(f"vLLM's engine core stopped ({codes}); this tritonserver is stopping too")
        else:
            self.log.error(
                f"vLLM's engine core exited ({codes}); stopping this tritonserver so the launcher sees the rank fail"
            )
        os.kill(os.getppid(), signal.SIGTERM)

    async def generate(self, request_id, request):
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        p = request.params
        kw = sampling_kwargs(p)
        if "structured_outputs" in kw:
            from vllm.sampling_params import StructuredOutputsParams

            kw["structured_outputs"] = StructuredOutputsParams(**kw["structured_outputs"])
        cont = p.continue_ids
        if cont:
            why = self.cannot_continue(p)
            if why:
                raise InvalidRequest(f"continue_ids is not supported with {why}: send the request without it")
            kw = continued_kwargs(kw, len(cont))
            prompt = continued(request.prompt, cont, self.tokenizer.encode)
        else:
            prompt = request.prompt if isinstance(request.prompt, str) else {"prompt_token_ids": list(request.prompt)}
        transfer = transfer_args(p)
        if transfer is not None:
            kw["extra_args"] = transfer
        sp = SamplingParams(output_kind=RequestOutputKind.DELTA, **kw)
        n_in, n_out = 0, len(cont)  # the client's prompt tokens; the continued ones count as generated
        prompt_lp = p.prompt_logprobs is not None
        outputs = self.engine.generate(prompt, sp, request_id)
        if p.guide is not None:
            outputs = _guide_refused(outputs)
        stamps = True  # the first output's: vLLM's own request statistics, where it keeps them (log stats on)
        async for out in outputs:
            if out.prompt_token_ids:
                n_in = len(out.prompt_token_ids) - len(cont)
            c = out.outputs[0]
            n_out += len(c.token_ids)
            finish = None
            if out.finished:
                finish = "length" if c.finish_reason == "length" else "stop"
            piece = Piece(c.text, n_out, n_in, finish, token_ids=c.token_ids)
            if finish and p.kv_export and getattr(out, "kv_transfer_params", None):
                piece.kv_handle = json.dumps(out.kv_transfer_params)
            # the prompt tokens its prefix cache served (vLLM V1 counts them at the first prefill; None before V1)
            piece.cached_tokens = getattr(out, "num_cached_tokens", None)
            if stamps:
                stamps = False
                piece.engine_times = engine_times(getattr(out, "metrics", None))
            if p.logprobs is not None and c.logprobs:
                piece.logprobs = logprob_rows(c.token_ids, c.logprobs, p.logprobs)
            if prompt_lp and out.prompt_logprobs:
                piece.prompt_logprobs = logprob_rows(out.prompt_token_ids, out.prompt_logprobs, p.prompt_logprobs)
                prompt_lp = False
            yield piece

    async def abort(self, request_id):
        if self.engine is not None:
            await self.engine.abort(request_id)

    async def stop(self):
        self._stopping = True
        try:
            if self.engine is not None:
                self.engine.shutdown()
                self.engine = None
        finally:
            self._stop_core()
            if self.ray_head is not None:
                self.ray_head.stop()
            remove_socket_file(
                RankEnv.from_environ(os.environ).kv_events or ""
            )  # vLLM's publisher leaves its ipc:// file

    def _stop_core(self):
        self._stopping = True
        if self.core is not None:
            core, self.core = self.core, None
            core.shutdown()
        if self.share is not None:
            self.share.release()


def _start_ray_head(nnodes, log):
    from launcher.engines.ray import start_copy_head

    return start_copy_head("vllm", nnodes, log.info)


class TritonPythonModel(RuntimeModel):
    name = "vllm"

    def make_adapter(self, params, args, log):
        from launcher.python_backend.instances import frontend_params

        config = json.loads(args["model_config"])
        # the instance_group count (llmlaunch: engine.frontends): this many stubs share one engine core
        params = frontend_params(params, config, args.get("model_instance_name", ""))
        return VLLMAdapter(
            params, os.path.join(args["model_repository"], args["model_version"]), log, config.get("name", "vllm")
        )
