"""llmlaunch's SGLang model: the common contract served by SGLang's offline `Engine`.

Targets the `sglang.Engine` API of SGLang 0.4.x - 0.5.x (read against sgl-project/sglang
main, python/sglang/srt/entrypoints/engine.py, managers/tokenizer_manager.py,
sampling/sampling_params.py, server_args.py; PyPI 0.5.23): `Engine(**ServerArgs fields)`,
`engine.tokenizer_manager.generate_request(GenerateReqInput(text=..., sampling_params={...}, stream=True, rid=...))`
(what `Engine.async_generate` returns: an async generator of dicts: "text", "output_ids", "meta_info" with "finish_reason",
"prompt_tokens", "completion_tokens"), `engine.tokenizer_manager.abort_request(rid=...)`
and `engine.shutdown()`. Learned from SGLang's Triton python backend and
Triton's vllm_backend; written for llmlaunch.

* The Engine is built on the runtime's event loop thread
  (launcher.python_backend.async_runtime), so its tokenizer manager binds to that loop;
  SGLang registers its signal handlers only on the main thread, so it skips them here
  and Triton keeps control of the stub process's signals.
* Streaming: unless `incremental_streaming_output` (older: `stream_output`) is set, each
  chunk's "text" is the whole text so far; the delta is the new suffix. SGLang's
  detokenizer only releases whole characters, and stop strings are trimmed from the text.
* Contract -> sampling params: max_tokens -> max_new_tokens, min_length ->
  min_new_tokens, temperature (0 = greedy), top_k (0 -> -1 = off), top_p,
  repetition/presence/frequency penalties, random_seed/seed -> sampling_seed (a sampled request with a seed
  is refused unless the engine runs enable_deterministic_inference, the only mode in which SGLang uses it),
  stop_words -> stop, end_id -> stop_token_ids, ignore_eos, the guide (guided_decoding_guide_type / _guide) ->
  json_schema / regex / ebnf, bad_words -> logit_bias (-inf on each spelling of a word, with and without a leading
  space, that is one token: SGLang has no ban on a sequence of tokens, so a word no spelling of which is one token
  is refused, naming it). pad_id and exclude_input_in_output are accepted and ignored; log probabilities and
  token-id prompts are refused naming the engine.
* Multi-node: every node of a model copy runs a tritonserver with this model; node i
  builds the Engine with nnodes=<nodes of the copy>, node_rank=i,
  dist_init_addr=<leader address>:<_LLMLAUNCH_DIST_PORT> (SGLang also uses the next few
  ports above it). Node 0 serves requests. On the other nodes
  SGLANG_BLOCK_NONZERO_RANK_CHILDREN=0 makes `Engine()` return once its schedulers are
  up; their tritonserver has no network services, the model answers any request with
  an error, and if the schedulers die it stops its tritonserver so the job fails fast.

* Several instances (`frontends` N, the config's instance_group count): N stubs are N front ends of one engine,
  as SGLang's own server runs `tokenizer_worker_num` HTTP workers. The first instance (Triton's instance name
  ends in _0) builds the Engine with tokenizer_worker_num=N, so SGLang starts its MultiTokenizerRouter in place of
  a tokenizer manager, and publishes the engine's ServerArgs and PortArgs once it is up
  (launcher.python_backend.instances); every instance (the first too) then builds a `TokenizerWorker` on its own
  IPC address and generates through it.
  SGLang's detokenizer sends each request's outputs to the worker that sent it, so each stub tokenizes,
  detokenizes and answers only its own requests, under its own GIL.

Parameters (config.pbtxt, written by launcher/engines/registry.py): model_path,
tokenizer_path, tp_size, pp_size, nnodes, max_num_seqs (-> max_running_requests), dtype,
max_model_len (-> context_length), mem_fraction_static, extra_args (a JSON object of more
ServerArgs fields; unknown names are refused), ready_timeout_s (with several front ends: how long the others wait
for the first one's Engine). Where sgl_kernel was installed without FlashAttention-3 (its
flash_ops, 1.76 GB of the kernel wheel) and no attention backend is set, the engine runs SGLang's triton
attention instead of failing on SGLang's Hopper default.
"""

import base64
import dataclasses
import glob
import importlib.util
import inspect
import json
import os
import pickle

from launcher.contract import INPUT_NAMES
from launcher.handoff.rank_env import RankEnv
from launcher.python_backend.adapter import EngineAdapter, Log, Piece
from launcher.python_backend.async_runtime import RuntimeModel
from launcher.python_backend.triton_io import MUST_HONOUR, InvalidRequest


def server_args_kwargs(params: dict, environ) -> dict:
    """config.pbtxt parameters + the rank's environment -> sglang.Engine keyword arguments."""
    kw = {
        "model_path": params["model_path"],
        "tp_size": int(params.get("tp_size", 1)),
        "log_level": params.get("log_level", "warning"),
    }
    if params.get("tokenizer_path") and params.get("tokenizer_path") != params["model_path"]:
        kw["tokenizer_path"] = params["tokenizer_path"]
    if int(params.get("pp_size", 1)) > 1:
        kw["pp_size"] = int(params["pp_size"])
    if params.get("max_num_seqs"):
        kw["max_running_requests"] = int(params["max_num_seqs"])
    if params.get("dtype", "auto") != "auto":
        kw["dtype"] = params["dtype"]
    if int(params.get("max_model_len", 0) or 0) > 0:
        kw["context_length"] = int(params["max_model_len"])
    if params.get("mem_fraction_static"):
        kw["mem_fraction_static"] = float(params["mem_fraction_static"])
    nnodes = int(params.get("nnodes", 1) or 1)
    if nnodes > 1:
        rank = RankEnv.from_environ(environ)
        if not rank.dist_port or not rank.leader_addr:
            raise RuntimeError(
                f"sglang: a model copy over several nodes needs {RankEnv.var('leader_addr')} and "
                f"{RankEnv.var('dist_port')} (set by `python -m launcher.rank`)"
            )
        kw.update(nnodes=nnodes, node_rank=rank.group_rank or 0, dist_init_addr=f"{rank.leader_addr}:{rank.dist_port}")
    else:
        kw["nnodes"] = 1
    kw.update(json.loads(params.get("extra_args") or "{}"))
    if not any(kw.get(k) for k in _ATTENTION_KEYS) and kernels_lack_flash_attention_3():
        # SGLang picks FlashAttention-3 on Hopper and fails at its first forward when sgl_kernel was installed
        # without it (flash_ops is most of the kernel wheel); triton attention needs no prebuilt kernel.
        kw["attention_backend"] = "triton"
    return kw


# ServerArgs fields that choose attention kernels; any of them set in engine.extra_args is the user's choice
_ATTENTION_KEYS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")


def kernels_lack_flash_attention_3() -> bool:
    """Whether sgl_kernel is installed without FlashAttention-3 (its flash_ops), found without importing sgl_kernel
    (that loads its CUDA ops). No sgl_kernel at all: False, SGLang then fails with its own message."""
    spec = importlib.util.find_spec("sgl_kernel")
    if spec is None:
        return False
    return not any(glob.glob(os.path.join(d, "flash_ops*.so")) for d in spec.submodule_search_locations or ())


def banned_tokens(tokenizer, words) -> dict:
    """bad_words -> SGLang's logit_bias ({token id as text: -inf}) for each spelling of each word (as given, stripped,
    and after a space, as vLLM spells them) that the tokenizer makes one token.  A word with no single-token spelling
    cannot be banned by a bias (SGLang has no sequence ban): InvalidRequest naming it."""
    if tokenizer is None:
        raise InvalidRequest(
            "bad_words: this SGLang engine runs without a tokenizer (skip_tokenizer_init), which banning words needs"
        )
    bias = {}
    for word in words:
        bare = word.strip()
        spellings = dict.fromkeys((bare, " " + bare))
        single = [ids[0] for ids in (tokenizer.encode(s, add_special_tokens=False) for s in spellings) if len(ids) == 1]
        if not bare or not single:
            raise InvalidRequest(
                f"bad_words: {word!r} is more than one token however it is spelled, and SGLang bans single tokens "
                "only (logit_bias); ban one of its tokens instead, or serve with engine=vllm, which bans sequences"
            )
        bias.update({str(i): float("-inf") for i in single})
    return bias


def sampling_params(p, tokenizer=None) -> dict:
    """launcher.python_backend.triton_io.SamplingParams -> SGLang's sampling_params dict (`tokenizer`: the engine's,
    for bad_words)."""
    sp = {
        "max_new_tokens": p.max_tokens,
        "min_new_tokens": p.min_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k if p.top_k > 0 else -1,
        "repetition_penalty": p.repetition_penalty,
        "presence_penalty": p.presence_penalty,
        "frequency_penalty": p.frequency_penalty,
        "ignore_eos": p.ignore_eos,
        "skip_special_tokens": True,
    }
    if p.stop:
        sp["stop"] = list(p.stop)
    if p.end_id is not None:
        sp["stop_token_ids"] = [p.end_id]
    if p.seed is not None:
        sp["sampling_seed"] = p.seed
    if p.bad_words:
        sp["logit_bias"] = banned_tokens(tokenizer, p.bad_words)
    if p.guide is not None:  # SGLang's grammar backend (xgrammar by default) compiles it
        kind, guide = p.guide
        sp[_STRUCTURED[kind]] = '{"type": "object"}' if kind == "json" else guide
    return sp


# the contract's guide kinds -> SGLang's sampling_params keys (any JSON object: the schema of every object)
_STRUCTURED = {"json": "json_schema", "json_schema": "json_schema", "regex": "regex", "ebnf_grammar": "ebnf"}


class SGLangAdapter(EngineAdapter):
    name = "sglang"
    # structured output it maps (sampling_params); log probabilities and token-id prompts it is refused
    supported = frozenset(INPUT_NAMES) - set(MUST_HONOUR) | {
        "guided_decoding_guide_type",
        "guided_decoding_guide",
    }

    def __init__(self, params: dict, log: Log, model_name: str = "sglang"):
        self.params = params
        self.log = log
        self.model_name = model_name
        self.engine = None  # sglang.Engine, where this stub started it
        self.manager = None  # what generates: the engine's tokenizer manager, or this front end's TokenizerWorker
        self.share = None  # launcher.python_backend.instances.InstanceShare when several instances share the engine
        self.node_rank = 0
        self.incremental = False
        self.seeded = False

    async def start(self):
        kwargs = server_args_kwargs(self.params, os.environ)
        self.node_rank = int(kwargs.get("node_rank", 0))
        self.serves = self.node_rank == 0
        frontends, index = int(self.params.get("frontends", 1)), int(self.params.get("frontend_index", 0))
        if not self.serves:
            if index > 0:
                return  # a node > 0 hosts one engine share, started by its first instance
            # Without it, Engine() on nodes > 0 blocks until its schedulers exit (SGLang's server mode).
            os.environ["SGLANG_BLOCK_NONZERO_RANK_CHILDREN"] = "0"
        elif frontends > 1:
            kwargs["tokenizer_worker_num"] = frontends
        import sglang
        from sglang.srt.server_args import ServerArgs

        fields = {f.name for f in dataclasses.fields(ServerArgs)}
        unknown = sorted(set(kwargs) - fields)
        if unknown:
            raise ValueError(
                f"sglang: ServerArgs has no {unknown}; fix engine.extra_args (valid names are ServerArgs fields)"
            )
        if self.serves and frontends > 1:
            args = self._front_end(kwargs, frontends, index, sglang)
        else:
            self.log.info(
                f"building sglang.Engine (node {self.node_rank}) with {json.dumps(kwargs, sort_keys=True, default=str)}"
            )
            self.engine = sglang.Engine(**kwargs)
            self.manager = self.engine.tokenizer_manager
            args = getattr(self.engine, "server_args", None)
        self.incremental = bool(
            getattr(args, "incremental_streaming_output", False) or getattr(args, "stream_output", False)
        )
        # SGLang draws with a request's sampling_seed only under deterministic inference (it ignores it otherwise)
        self.seeded = bool(getattr(args, "enable_deterministic_inference", False))
        # the context SGLang resolved (the model's, or context_length where set): ServerArgs keeps only the setting
        context = getattr(self.manager, "context_len", None) or getattr(args, "context_length", None)
        self.max_model_len = int(context) if context else None

    def _front_end(self, kwargs, count, index, sglang):
        """Front end `index` of `count` of one Engine (the first instance starts it): this stub's TokenizerWorker on
        an IPC address of its own; the engine's resolved ServerArgs."""
        from launcher.python_backend.instances import InstanceShare, private_dir, share_key

        self.share = InstanceShare("sglang", self.model_name, index, count)
        if index == 0:
            self.log.info(
                f"building sglang.Engine for {count} front ends with {json.dumps(kwargs, sort_keys=True, default=str)}"
            )
            try:
                self.engine = sglang.Engine(**kwargs)
                # what a TokenizerWorker needs, as SGLang's server hands it to its HTTP workers (pickled); the
                # share's files are in a directory only this user can read
                shared = (self.engine.server_args, self.engine.port_args)
                info = {
                    "args": base64.b64encode(pickle.dumps(shared)).decode(),
                    "max_req_input_len": getattr(self.engine.tokenizer_manager, "max_req_input_len", None),
                }
                self.share.publish(info)
            except BaseException as exc:
                self.share.fail(f"{type(exc).__name__}: {exc}")
                raise
        else:
            # the first front end's engine loads within the launch's serve.ready_timeout_s (config.pbtxt)
            info = self.share.wait(float(self.params.get("ready_timeout_s", "") or 3600))
        server_args, port_args = pickle.loads(base64.b64decode(info["args"]))
        from sglang.srt.managers.multi_tokenizer_mixin import TokenizerWorker

        # the detokenizer sends a request's outputs to the address of the worker that sent it
        address = os.path.join(private_dir(), f"sglang-{share_key(self.model_name)}-{index}.ipc")
        port_args = dataclasses.replace(port_args, tokenizer_ipc_name=f"ipc://{address}")
        self.manager = TokenizerWorker(server_args, port_args)
        self.manager.max_req_input_len = info["max_req_input_len"]
        started = "started here" if index == 0 else "attached"
        self.log.info(f"front end {index} of {count} of one SGLang engine ({started})")
        return server_args

    def _generate_stream(self, request_id, prompt, sp):
        """The request's chunks from this stub's tokenizer manager (the Engine's, or its TokenizerWorker): what
        Engine.async_generate(stream=True) returns, which it builds the same way."""
        from sglang.srt.managers.io_struct import GenerateReqInput

        request = GenerateReqInput(text=prompt, sampling_params=sp, stream=True, rid=request_id)
        return self.manager.generate_request(request, None)

    async def generate(self, request_id, request):
        p = request.params
        if p.seed is not None and p.temperature > 0 and not self.seeded:
            raise InvalidRequest(
                "random_seed: SGLang samples with a seed only under deterministic inference; serve with "
                "engine.extra_args.enable_deterministic_inference=true, or leave the seed out"
            )
        sp = sampling_params(p, getattr(self.manager, "tokenizer", None))
        stream = self._generate_stream(request_id, request.prompt, sp)
        text_so_far = ""
        async for chunk in stream:
            meta = chunk.get("meta_info") or {}
            text = chunk.get("text") or ""
            if self.incremental:
                delta = text
            else:
                delta, text_so_far = text[len(text_so_far) :], (text if len(text) >= len(text_so_far) else text_so_far)
            reason = meta.get("finish_reason")
            finish = None
            if reason:
                kind = reason.get("type") if isinstance(reason, dict) else str(reason)
                if kind == "abort":
                    message = reason.get("message") if isinstance(reason, dict) else ""
                    raise RuntimeError(f"SGLang aborted the request: {message or reason}")
                finish = "length" if kind == "length" else "stop"
            piece = Piece(delta, int(meta.get("completion_tokens", 0)), int(meta.get("prompt_tokens", 0)), finish)
            piece.cached_tokens = meta.get("cached_tokens")  # the prompt tokens its radix cache served
            yield piece

    async def abort(self, request_id):
        if self.manager is None:
            return
        result = self.manager.abort_request(rid=request_id)
        if inspect.isawaitable(result):
            await result

    async def stop(self):
        self.manager = None
        try:
            if self.engine is not None:
                self.engine.shutdown()
                self.engine = None
        finally:
            if self.share is not None:
                self.share.release()

    def wait_engine_exit(self) -> bool:
        init = getattr(self.engine, "_scheduler_init_result", None)
        block = getattr(init, "block_until_scheduler_exits", None)
        if self.serves or block is None:
            return False
        block()
        return True


class TritonPythonModel(RuntimeModel):
    name = "sglang"

    def make_adapter(self, params, args, log):
        from launcher.python_backend.instances import frontend_params

        config = json.loads(args["model_config"])
        # the instance_group count (llmlaunch: engine.frontends): this many stubs are front ends of one engine
        params = frontend_params(params, config, args.get("model_instance_name", ""))
        return SGLangAdapter(params, log, config.get("name", "sglang"))
