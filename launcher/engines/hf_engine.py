"""The `hf` engine: continuous batching over a HF transformers causal LM, in pure Python (no Triton).

    engine = Engine("/path/to/hf/folder", device="cpu")
    engine.start()
    engine.add_request("r1", "Once upon a time", SamplingParams(max_tokens=32), on_output)
    ...
    engine.abort("r1")
    engine.shutdown()

`on_output(Output)` is called from the engine thread once per generated token
with the new text (possibly empty while a multi-byte character or a possible
stop string is incomplete); the last call has `finish_reason` set ("length",
"stop", "cancelled" or "error").  Callbacks must be quick: hand the output to
another thread (queue.put) and return.

Design
------
* One engine thread runs the loop: take new requests and aborts from a queue,
  admit waiting requests into free cache slots, build a `StepInputs`, let the
  `HFModelRunner` execute it, then turn the sampled tokens into outputs.
  Requests join and leave between steps (continuous batching).
* Scheduler and executor are split: the scheduler only produces `StepInputs`
  (plain lists) and consumes a list of token ids.  Tensor parallelism slots in
  there: rank 0 broadcasts `StepInputs`, every rank executes it on its shard.
* A step = one decode token for every running sequence + at most
  `max_prefill_tokens` prompt tokens of new sequences (long prompts are
  chunked over steps), so admitting a long prompt stalls running streams by one
  bounded chunk, not a whole prefill.
* Greedy decoding equals `model.generate` (tests check it); sampling is batched
  (see hf_sampling); text is detokenized incrementally (see hf_detok).
* `launcher.engines.hf_process.EngineProcess` runs this engine in a child
  process behind the same API; the Triton model uses it so that sending
  responses never takes the GIL from the engine loop.
"""

from __future__ import annotations

import heapq
import logging
import os
import queue
import random
import threading
import time
from bisect import insort
from collections import deque
from dataclasses import asdict, dataclass
from typing import Callable

from launcher.engines.hf_args import DEFAULTS, prefill_tokens
from launcher.engines.hf_detok import StopMatcher, TokenTable
from launcher.engines.hf_encode import PromptEncoder
from launcher.engines.hf_runner import HFModelRunner, PrefillChunk, SamplingRows, StepInputs
from launcher.engines.hf_tp import AHEAD
from launcher.serving.triton_io import InvalidRequest, SamplingParams

log = logging.getLogger(__name__)

__all__ = ["Engine", "Output", "SamplingParams", "InvalidRequest"]


@dataclass
class Output:
    request_id: str
    text: str  # new text since the previous output of this request
    token_ids: list[int]  # new token ids since the previous output
    input_tokens: int  # tokens in the prompt
    output_tokens: int  # tokens generated so far (cumulative)
    finish_reason: str | None = None  # None while running; "length", "stop", "cancelled" or "error"
    error: str | None = None  # message when finish_reason == "error"
    # engine process only, on a request's first output: (request received, first output made), time.monotonic()
    # of that process; CLOCK_MONOTONIC is one clock for the whole machine, so the parent can set its own against it
    times: tuple[float, float] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineStats:
    """Running totals of the engine loop (engine thread).  Per step, wall = launch + wait + host work, where the
    host work is scheduling, detokenizing, stop checks and handing outputs on; on a GPU, gpu_idle says whether
    that host work kept the GPU waiting (launcher.serving.timings.engine_step_split makes per-step means)."""
    steps: int = 0
    decode_tokens: int = 0
    prefill_tokens: int = 0
    finished: int = 0
    busy_s: float = 0.0  # from a step's launch to its tokens on the host (the model call, with overlap its wait)
    ahead_steps: int = 0  # steps launched before the tokens of the step before were known (overlap)
    wall_s: float = 0.0  # the engine loop's time in iterations that ran a step (not idle waiting for requests)
    launch_s: float = 0.0  # in HFModelRunner.launch: preparing inputs and queueing the step's GPU work
    wait_s: float = 0.0  # blocked until a step's tokens reached the host (waiting for the GPU)
    gpu_s: float = 0.0  # GPU: from each step's first work to its last (CUDA events)
    gpu_idle_s: float = 0.0  # GPU idle between a step and the next one, because the host queued it late
    gpu_steps: int = 0  # steps timed on the GPU (0 off the GPU)
    prompt_steps: int = 0  # steps with prompt tokens
    prompt_graph_steps: int = 0  # of those, steps of prompts replayed as a CUDA graph (one prompt or a wave)
    mixed_steps: int = 0  # of those, steps of decode rows and whole prompts replayed as a mixed CUDA graph
    # Per request, from add_request (its prompt tokenized) on: where a first token's time inside the engine goes
    admitted: int = 0  # requests given a KV-cache slot
    queued_s: float = 0.0  # summed: add_request to a slot (waiting for the loop's next schedule, or a free slot)
    first_tokens: int = 0  # requests whose first token reached the host
    to_first_token_s: float = 0.0  # summed: add_request to the first token on the host (queued + prompt steps)
    # add_requests (the engine process's reader hands over what it read at once; their text prompts are tokenized in
    # one call): requests / calls is how many prompts arrive together
    intake_calls: int = 0
    intake_requests: int = 0


def describe_features(f: dict) -> str:
    """'torch_compile on (12.3 s), 16 decode graphs, ..., cuDNN attention in graphs' from Engine.features
    ('' for none)."""
    if not f:
        return ""
    parts = [f"torch_compile failed ({f['compile_error']})" if f.get("compile_error") else
             f"torch_compile on ({f.get('compile_s', 0):.1f} s)" if f.get("torch_compile") else "torch_compile off",
             f"decode graphs failed ({f['graph_error']})" if f.get("graph_error") else
             f"{f.get('decode_graphs', 0)} decode graphs",
             f"prompt graphs failed ({f['prefill_graph_error']})" if f.get("prefill_graph_error") else
             f"{f.get('prefill_graphs', 0)} prompt graphs, {f.get('wave_graphs', 0)} wave graphs",
             f"mixed graphs failed ({f['mixed_graph_error']})" if f.get("mixed_graph_error") else
             f"{f.get('mixed_graphs', 0)} mixed graphs"]
    if "fused" in f:  # layers whose q/k/v (gate/up) projections run as one product (hf_fuse)
        fused = {k: n for k, n in f["fused"].items() if n}
        parts.append("projections fused (" + ", ".join(f"{k.replace('_proj', '')} x{n}" for k, n in fused.items())
                     + ")" if fused else "projections unfused")
    if f.get("prompt_encode"):  # hf_encode.PromptEncoder: the backend's encode, or why prompts go through the call
        parts.append("prompts: backend encode" if f["prompt_encode"] == "backend" else
                     f"prompts: tokenizer call ({f['prompt_encode']})")
    where = {"graphs": "in graphs", "all": "everywhere", "off": "off"}.get(f.get("cudnn_attention", ""))
    if where:  # GPU only: CPU attention has no cuDNN
        parts.append(f"cuDNN attention {where}")
    return ", ".join(parts)


class _Seq:
    """Scheduler-side state of one request."""

    __slots__ = ("request_id", "prompt_ids", "out_ids", "params", "on_output", "slot", "num_computed",
                 "decoder", "stopper", "rng", "eos", "max_tokens", "min_tokens", "bad", "penalties",
                 "prefill_started", "added")

    def __init__(self, request_id, prompt_ids, params: SamplingParams, on_output, decoder, eos, bad):
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.out_ids: list[int] = []
        self.params = params
        self.on_output = on_output
        self.slot = -1
        self.num_computed = 0  # tokens whose keys/values are in the cache
        self.decoder = decoder
        self.stopper = StopMatcher(params.stop) if params.stop else None
        self.rng = random.Random(params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little"))
        self.eos = eos  # frozenset of token ids that end the request (empty with ignore_eos)
        self.max_tokens = params.max_tokens
        self.min_tokens = params.min_tokens
        self.bad = bad  # list of token-id sequences that must not be generated
        self.penalties = (params.repetition_penalty != 1.0 or params.presence_penalty != 0.0
                          or params.frequency_penalty != 0.0)
        self.prefill_started = False
        self.added = time.monotonic()  # when add_request queued it (EngineStats.queued_s, to_first_token_s)


_STOP = object()


def prepare_prompt(encode: Callable[[str], list[int]], prompt: str | list[int], params: SamplingParams,
                   max_model_len: int, vocab_size: int) -> list[int]:
    """Validate a request and tokenize its prompt (`encode`: text -> ids, a PromptEncoder); raises InvalidRequest
    naming the problem and the fix."""
    params.validate(max_model_len)
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequest("the prompt is empty")
        prompt_ids = encode(prompt)
    else:
        prompt_ids = [int(t) for t in prompt]
        if any(not 0 <= t < vocab_size for t in prompt_ids):
            raise InvalidRequest(f"prompt token ids must be in [0, {vocab_size})")
    n = len(prompt_ids)
    if n == 0:
        raise InvalidRequest("the prompt is empty")
    if n + params.max_tokens > max_model_len:
        raise InvalidRequest(
            f"the prompt ({n} tokens) plus max_tokens ({params.max_tokens}) exceeds the model context of "
            f"{max_model_len} tokens; shorten the prompt or lower max_tokens")
    if params.end_id is not None and not 0 <= params.end_id < vocab_size:
        raise InvalidRequest(f"end_id {params.end_id} is outside the vocabulary [0, {vocab_size})")
    return prompt_ids


class Engine:
    """Continuous-batching text generation on one device.  Thread-safe API; the work runs on one engine thread."""

    def __init__(self, model_path: str, device: str = DEFAULTS.device, dtype: str = DEFAULTS.dtype,
                 max_num_seqs: int = DEFAULTS.max_num_seqs,
                 max_model_len: int | None = None, tp: int | None = None, max_prefill_tokens: int | None = None,
                 tokenizer_path: str | None = None, attn_implementation: str = DEFAULTS.attn_implementation,
                 kv_cache_memory: float | None = None, after_step: Callable[[], None] | None = None,
                 threads: int | None = None, tp_group=None, cuda_graphs: bool | None = None,
                 torch_compile: bool | None = None, cudnn_attention: str | None = None,
                 prefill_graphs: int | None = None, prompts_alone: int | None = None,
                 mixed_graphs: int | None = None, awake_board: str | None = None, awake_slot: int = 0):
        """Keyword defaults are hf_args.HFEngineArgs' (the model builds the engine with `Engine.from_args`).
        model_path: HF-format folder (config, weights, tokenizer unless tokenizer_path is given).
        device: auto (cuda when available) | cpu | cuda | cuda:N.  dtype: auto | float32 | bfloat16 | float16.
        max_num_seqs: sequences decoded together (KV cache slots).  max_model_len: context limit
        (prompt + generated tokens); None = the model's own, capped at 4096.
        max_prefill_tokens: prompt tokens prefilled per step (long prompts are chunked); None or 0: the device's
        default (hf_args.prefill_tokens: HFEngineArgs.prefill_chunk says why).
        attn_implementation: sdpa (torch's fused kernels) | eager (matmul + softmax).
        kv_cache_memory: bytes the KV cache may use (default: half the RAM on CPU, 85% of free GPU memory).
        after_step: called on the engine thread after each step's outputs were delivered (batching hook).
        threads: torch intra-op threads of the engine thread (default: torch's default, one per core).
        tp: tensor-parallel ranks (see hf_tp); this engine is rank 0 and broadcasts each step to the workers.
        tp_group: an hf_tp.TPGroup (default: one made from the LLMLAUNCH_* environment when tp > 1).
        cuda_graphs / torch_compile: see HFModelRunner (None: on for GPUs).
        cudnn_attention: graphs | all | off, where attention may use cuDNN (see
        HFModelRunner._init_attention_backends; None: HFEngineArgs.cudnn_attention).
        prefill_graphs: the longest prompt whose prompt-only step replays a CUDA graph (see
        HFModelRunner._init_prefill_graphs; None: HFEngineArgs.prefill_graphs; 0: none).
        prompts_alone: at most this many waiting prompts go one per step through their prompt graphs (see
        PROMPTS_ALONE_MAX; None: HFEngineArgs.prompts_alone; 0: never).
        mixed_graphs: the most prompt tokens that go beside decode rows in one step through a mixed CUDA graph (see
        HFModelRunner.MIXED_PROMPTS and _prompts_mixed; None: HFEngineArgs.mixed_graphs; 0: none).
        While the GPU runs a step, the next one is queued behind it where it can be, and the host works on the last
        meanwhile (overlap; see `_schedule`).
        awake_board / awake_slot: where to post how many requests the engine holds after each step, for the
        serve.keep_cpus_awake spinners that pause under load (launcher/awake.py; None: the board the environment
        names, LLMLAUNCH_AWAKE_BOARD, in the slot of LLMLAUNCH_LOCAL_RANK; none there: no posts).
        """
        from transformers import AutoTokenizer, GenerationConfig

        # prompts taken one at a time through their graphs (PROMPTS_ALONE_MAX; 0: never), checked before loading
        # and compiling the model (minutes on a GPU)
        if prompts_alone is None:
            prompts_alone = self.PROMPTS_ALONE_MAX
        if int(prompts_alone) < 0:
            raise ValueError(f"prompts_alone={prompts_alone} is negative: the most prompts to take alone, 0 for none")
        prompts_alone = int(prompts_alone)
        self.model_path = str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or self.model_path)
        self._encode = PromptEncoder(self.tokenizer)  # prompts: the call's ids, without its Python (hf_encode)
        self.runner = HFModelRunner(self.model_path, device=device, dtype=dtype, max_num_seqs=max_num_seqs,
                                    max_model_len=max_model_len, attn_implementation=attn_implementation,
                                    kv_cache_memory=kv_cache_memory, tp=int(tp or 1), tp_group=tp_group,
                                    cuda_graphs=cuda_graphs, torch_compile=torch_compile,
                                    cudnn_attention=cudnn_attention, prefill_graphs=prefill_graphs,
                                    mixed_graphs=mixed_graphs)
        self.max_prefill_tokens = prefill_tokens(max_prefill_tokens, self.runner.device.type)
        # before serving: a compile or capture mid-run would stall every running request
        self.runner.warm_up(self.max_prefill_tokens)
        # tp > 1: this engine is the leader (group rank 0) of a tensor-parallel group; see hf_tp
        self._tp = self.runner.tp_group
        if self._tp is not None and self._tp.rank != 0:
            raise ValueError(f"the Engine runs on group rank 0 only; rank {self._tp.rank} runs hf_tp.run_worker")
        self._heartbeat_s = self._tp.timeout / 4 if self._tp is not None else None
        self.max_model_len = self.runner.max_model_len
        self.max_num_seqs = self.runner.max_num_seqs
        self.device = str(self.runner.device)
        self.dtype = str(self.runner.dtype).replace("torch.", "")
        self.vocab_size = self.runner.vocab_size
        # models often pad the embedding beyond the tokenizer (Qwen: 151936 vs 151665): never sample those ids
        self.runner.sampler.valid_vocab = min(self.vocab_size, len(self.tokenizer))
        eos: set[int] = set()
        try:
            gen_eos = GenerationConfig.from_pretrained(self.model_path).eos_token_id
        except OSError:
            gen_eos = None
        for value in (gen_eos, self.runner.config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(value, int):
                eos.add(value)
            elif value:
                eos.update(int(v) for v in value)
        self.eos_token_ids = frozenset(eos)
        self._table = TokenTable(self.tokenizer)

        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._active: set[str] = set()  # request ids accepted and not finished (guarded by _lock)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.stats = EngineStats()
        self._after_step = after_step
        from launcher.awake import LoadPoster

        self._load = LoadPoster(awake_board, awake_slot) if awake_board else LoadPoster.from_env()
        self._threads = int(threads) if threads else None
        # scheduler state (engine thread only)
        self._waiting: deque[_Seq] = deque()
        self._prefilling: list[_Seq] = []
        self._decoding: list[tuple[int, _Seq]] = []  # (slot, seq), sorted by slot
        self._by_id: dict[str, _Seq] = {}
        self._prompts_alone = prompts_alone  # checked above, before the model loaded
        self._waved = False  # the last step was a wave of prompts that decode rows waited for (_prompt_wave)
        # (step, rows, handle): a step launched before the tokens of the one before were known
        self._ahead = None
        self._free = list(range(self.max_num_seqs))
        heapq.heapify(self._free)

    # -- public API ----------------------------------------------------------------------------------------
    @property
    def features(self) -> dict:
        """What speeds this engine up, as it started (for the server's log line): see describe_features."""
        r = self.runner
        return {"torch_compile": r.use_compile, "compile_s": round(r.compile_s, 1), "compile_error": r.compile_error,
                "decode_graphs": len(r._graphs), "graph_error": r.graph_error,
                "prefill_graphs": len(r._prefill_graphs), "wave_graphs": len(r._wave_graphs),
                "prefill_graph_error": r.prefill_graph_error, "fused": dict(r.fused),
                "mixed_graphs": len(r._mixed_graphs), "mixed_graph_error": r.mixed_graph_error,
                "cudnn_attention": r.cudnn_attention if r.device.type == "cuda" else "",
                "prompt_encode": self._encode.why_not or "backend"}

    @classmethod
    def from_args(cls, args, **runtime) -> "Engine":
        """The engine for `args` (an hf_args.HFEngineArgs); `runtime`: the keywords no launch sets (after_step,
        tp_group, kv_cache_memory, awake_board, awake_slot)."""
        return cls(**args.engine_kwargs(), **runtime)

    def start(self) -> "Engine":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hf-engine", daemon=True)
            self._thread.start()
        return self

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    on_output: Callable[[Output], None]) -> int:
        """Queue a request; returns its prompt token count.  Raises InvalidRequest for bad input (nothing queued)."""
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError(f"the hf engine is not running{f': {self._error}' if self._error else ''}")
        prompt_ids = prepare_prompt(self._encode, prompt, params, self.max_model_len, self.vocab_size)
        eos = frozenset() if params.ignore_eos else (
            frozenset((params.end_id,)) if params.end_id is not None else self.eos_token_ids)
        bad = self._bad_word_ids(params.bad_words) if params.bad_words else []
        seq = _Seq(request_id, prompt_ids, params, on_output, self._table.decoder(prompt_ids), eos, bad)
        with self._lock:
            if request_id in self._active:
                raise InvalidRequest(f"request id {request_id!r} is already running")
            self._active.add(request_id)
        self._inbox.put(seq)
        return len(prompt_ids)

    def add_requests(self, requests: list[tuple[str, str | list[int], SamplingParams, Callable[[Output], None]]]
                     ) -> list[Exception | None]:
        """Queue several requests (request_id, prompt, params, on_output), their text prompts tokenized in one call.

        A fast tokenizer encodes a batch on several threads with the GIL released (PromptEncoder.many).  One at a
        time, the successors of 128 requests that ended in one step waited 15 ms on average to reach the engine (the
        engine process's reader tokenizing those before them).

        Returns, per request, None (queued) or the exception that refused it (InvalidRequest for bad input), as
        `add_request` would raise it; a refused request does not keep the others out."""
        self.stats.intake_calls += 1  # the caller's thread (the reader); ints under the GIL, read by stats_dict
        self.stats.intake_requests += len(requests)
        prompts = [r[1] for r in requests]
        texts = [i for i, p in enumerate(prompts) if isinstance(p, str) and p]  # "" keeps add_request's error
        if len(texts) > 1:
            try:
                encoded = self._encode.many([prompts[i] for i in texts])
            except Exception:  # left to add_request, one at a time: each request gets its own error
                encoded = [prompts[i] for i in texts]
            for i, ids in zip(texts, encoded):
                prompts[i] = ids
        refused: list[Exception | None] = []
        for (request_id, _, params, on_output), prompt in zip(requests, prompts):
            try:
                self.add_request(request_id, prompt, params, on_output)
                refused.append(None)
            except Exception as exc:
                refused.append(exc)
        return refused

    def abort(self, request_id: str) -> None:
        """Cancel a request: within one step it gets a final output with finish_reason 'cancelled'."""
        self._inbox.put(("abort", request_id))

    def shutdown(self, timeout: float = 30.0) -> None:
        if self._thread is not None:
            self._inbox.put(_STOP)
            self._thread.join(timeout)
            self._thread = None

    def generate(self, prompt: str | list[int], params: SamplingParams, timeout: float | None = None) -> Output:
        """Blocking convenience: the whole completion as one Output (text and token_ids accumulated)."""
        done = threading.Event()
        parts: list[Output] = []
        request_id = f"generate-{id(done)}"

        def collect(out: Output) -> None:
            parts.append(out)
            if out.finished:
                done.set()

        self.add_request(request_id, prompt, params, collect)
        if not done.wait(timeout):
            self.abort(request_id)
            done.wait()
        last = parts[-1]
        return Output(request_id, "".join(p.text for p in parts), [t for p in parts for t in p.token_ids],
                      last.input_tokens, last.output_tokens, last.finish_reason, last.error)

    @property
    def num_running(self) -> int:
        with self._lock:
            return len(self._active)

    def stats_dict(self) -> dict:
        """EngineStats as a dict (running totals; read from any thread, a step may be half counted)."""
        return asdict(self.stats)

    @property
    def idle(self) -> bool:
        """Nothing waiting, prefilling or decoding (engine thread: e.g. from after_step)."""
        return not (self._waiting or self._prefilling or self._decoding)

    # -- engine thread -------------------------------------------------------------------------------------
    def _run(self) -> None:
        if self._threads:
            import torch

            torch.set_num_threads(self._threads)
        after_step = self._after_step or (lambda: None)
        if self._load is not None:  # the spinners' board (serve.keep_cpus_awake) learns the load before the outputs go
            post, step_hook = self._load.post, after_step

            def after_step() -> None:
                post(len(self._waiting) + len(self._prefilling) + len(self._decoding))
                step_hook()
        stats = self.stats
        try:
            while True:
                idle = not (self._waiting or self._prefilling or self._decoding)
                if idle:
                    self.runner.mark_idle()  # a gap before the next step is no request, not a late host
                t0 = time.perf_counter()
                if not self._drain(block=idle):
                    break
                if self._waiting or self._prefilling or self._decoding:
                    if idle:
                        t0 = time.perf_counter()  # from the request's arrival
                    self._step()
                    after_step()
                    stats.wall_s += time.perf_counter() - t0
                else:
                    after_step()  # also after aborts of waiting requests, which end without a step
        except BaseException as exc:  # keep the reason for add_request's error message
            self._error = exc
            log.exception("hf engine loop died")
            self._fail_all(f"engine failure: {exc!r}")
            raise
        finally:
            self._fail_all("engine shut down", reason="cancelled")
            after_step()
            if self._tp is not None:
                if self._error is None:
                    try:
                        self._tp.broadcast("stop")  # workers leave their loop
                    except Exception as exc:
                        log.warning("hf engine: telling the tp workers to stop failed: %r", exc)
                self._tp.close()

    def _drain(self, block: bool) -> bool:
        """Apply queued requests/aborts; False when asked to stop."""
        inbox = self._inbox
        try:
            if not block:
                item = inbox.get_nowait()
            elif self._heartbeat_s is None:
                item = inbox.get()
            else:
                item = inbox.get(timeout=self._heartbeat_s)
        except queue.Empty:
            if block and self._tp is not None:
                self._tp.broadcast("ping")  # idle: keep the workers' collective timeout from firing
            return True
        while True:
            if item is _STOP:
                return False
            if isinstance(item, _Seq):
                self._by_id[item.request_id] = item
                self._waiting.append(item)
            else:
                self._abort(item[1])
            try:
                item = inbox.get_nowait()
            except queue.Empty:
                return True

    def _abort(self, request_id: str) -> None:
        seq = self._by_id.get(request_id)
        if seq is None:
            return
        if seq.slot < 0:
            self._waiting.remove(seq)
        self._finish(seq, "cancelled", "", [])

    def _step(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:  # launched during the last step: only its tokens are left to take
            (step, rows, handle), chunk_seqs = ahead, []
        else:
            scheduled = self._schedule()
            if scheduled is None:
                return
            step, rows, chunk_seqs, _ = scheduled
            handle = None
        t0 = time.perf_counter()
        queued: list[_Seq] = []  # the rows of the step scheduled behind this one
        try:
            if handle is None:
                if self._tp is not None:
                    self._tp.broadcast(step)  # every worker rank executes the same step on its shard
                handle = self._launch(step)
            nxt = self._schedule(ahead_of=rows)
            if nxt is not None:
                nstep, queued, _, prev_rows = nxt
                if prev_rows is None:  # prompts only: nothing of the running step's (see _schedule)
                    if self._tp is not None:
                        self._tp.broadcast(nstep)
                    nhandle = self._launch(nstep)
                else:
                    if self._tp is not None:  # its decode tokens follow on the device (hf_tp: AHEAD)
                        self._tp.broadcast((AHEAD, nstep))
                    nhandle = self._launch(nstep, prev=handle, prev_rows=prev_rows)
                self._ahead = (nstep, queued, nhandle)
                self.stats.ahead_steps += 1
            tokens = self._wait(handle)
        except Exception as exc:  # a failed step fails the requests in it, not the engine
            if self._tp is not None:
                raise  # with tp > 1 the ranks may be out of step: fatal (the loop fails every request)
            log.exception("hf engine step failed")
            # the step scheduled behind it (launched or not) is dropped too: its rows (some of this step's, rows that
            # sat this step out, or prompts) were scheduled as if this one had run
            self._ahead = None
            for seq in rows + chunk_seqs + queued:
                if seq.slot >= 0:
                    self._finish(seq, "error", "", [], error=f"generation failed: {exc!r}")
            return
        self.stats.busy_s += time.perf_counter() - t0
        self.stats.steps += 1
        self.stats.decode_tokens += len(step.decode_tokens)
        self.stats.prefill_tokens += len(step.prefill_tokens)
        self.stats.prompt_steps += bool(step.prefill_tokens)
        for seq, tok in zip(rows, tokens):
            self._on_token(seq, tok)

    def _launch(self, step, **kw):
        t0 = time.perf_counter()
        handle = self.runner.launch(step, **kw)
        self.stats.launch_s += time.perf_counter() - t0
        if self.runner.last_graph in ("prompt", "wave"):
            self.stats.prompt_graph_steps += 1
        elif self.runner.last_graph == "mixed":
            self.stats.mixed_steps += 1
        return handle

    def _wait(self, handle) -> list[int]:
        stats, t0 = self.stats, time.perf_counter()
        tokens = self.runner.wait(handle)
        stats.wait_s += time.perf_counter() - t0
        timed = self.runner.gpu_times(handle)
        if timed is not None:
            stats.gpu_s += timed[0]
            stats.gpu_idle_s += timed[1] or 0.0
            stats.gpu_steps += 1
        return tokens

    def _schedule(self, ahead_of: list[_Seq] | None = None):
        """The next step: (step, output rows, sequences with a prompt chunk that does not end their prompt,
        prev_rows).  Every decoding sequence decodes one token, waiting requests take free slots, and prompt
        chunks fill the step up to max_prefill_tokens.

        ahead_of: the output rows of a step still running (overlap).  This step is made and launched before that
        one's tokens are known, so that the host work of that step (detokenize, stop checks, send) runs while
        the GPU runs this one.  It decodes those rows again, their tokens passed from the step before on the
        device (`prev_rows`: each decode row's output row there).  Left out: a row that ends by length in the
        running step.  A row that ends by EOS or a stop string there decodes one token too many, which is dropped
        (`_on_token` skips finished sequences) and whose cache entry the slot's next user overwrites.
        Rows that sat the running step out (it was a step of prompts only) decode here too, with their last tokens
        from the host (prev_rows -1).
        Where prompts wait, the runner has mixed graphs and all of them fit one, they go beside the decode rows in one
        step through it (_prompts_mixed), queued ahead too: their tokens come from the host, the decode rows' from the
        device.  Otherwise, where prompts wait and the runner replays prompt graphs, two or more of them go in steps
        of their own through wave graphs, taking turns with the decode rows (_prompt_wave), and one, or a few where
        there are no wave graphs (PROMPTS_ALONE_MAX), one per step alone, while the decode rows wait that step
        (_prompt_alone).  Such a step needs nothing of the running step's, so it is launched ahead too (prev_rows
        None): the GPU goes from the running step to the prompts, and from them to the decode rows' turn, without
        waiting for the host in between (on an H100 at 128 streams about one step in six carried or followed
        prompts and each waited ~1.5 ms for the host).
        Requests waiting for a slot (every slot taken) hold nothing back: the decode rows go ahead, and a request
        takes the slot of a row that ended in the step scheduled after the host has that row's last token.
        None (wait for the running step) where a row's sampling needs its last token on the host (bad words),
        a request is in the inbox, a prompt is part-way through prefill, or waiting prompts would go in one step
        beside the decode rows (no prompt graphs).  A step with prompt tokens beside decode rows cannot replay a
        CUDA graph, and launched ahead one prompt at a time, as requests arrive, nearly every step under load
        became such a step (measured on an H100 at 128 streams: 6.1 ms a step instead of 3.2); prompts that
        arrive during a run of decode steps are taken together, in one step, once it ends.
        """
        prev_rows = None
        prompts = []  # sequences whose prompt (or its next chunk) this step may take
        if ahead_of is None:
            decoding = [s for _, s in self._decoding]
            self._admit()
            prompts = self._prefilling
            mixed = self._prompts_mixed(decoding)
            if mixed:  # the prompts beside the decode rows, through a mixed graph
                prompts = mixed
            else:
                only = self._prompts_only(decoding)
                if only:  # the prompts through their graph; the decode rows wait this step
                    decoding, prompts = [], only
                elif only is not None:  # the decode rows' turn between two waves
                    prompts = []
        else:
            prev_rows = [i for i, s in enumerate(ahead_of)
                         if s.slot >= 0 and len(s.out_ids) + 1 < s.max_tokens]  # not finished, not ending now
            decoding = [ahead_of[i] for i in prev_rows]
            if any(s.bad for s in decoding) or not self._inbox.empty():
                return None
            ids = {id(s) for s in ahead_of}
            if any(id(s) not in ids and s.num_computed for s in self._prefilling):  # a prompt part-way through
                return None
            # rows that sat the running step out (a step of prompts): their last tokens are on the host
            waited = [s for _, s in self._decoding if id(s) not in ids]
            prompts_waiting = bool(self._waiting) or any(id(s) not in ids for s in self._prefilling)
            prev_rows += [-1] * len(waited)
            decoding += waited
            if prompts_waiting:
                self._admit()
                pending = [s for s in self._prefilling if id(s) not in ids]  # not those the running step prefills
                # Every slot taken: the waiting requests wait for one whatever this step is, so the decode rows go
                # ahead.  (Waiting for the running step instead lost the overlap exactly when the engine is full:
                # on an H100 with Poisson arrivals past its capacity, 42-61% of steps queued ahead instead of 99%,
                # each waiting for the host, and the queue grew faster.)
                # A slot frees when the host has a row's last token, so a waiting request is admitted in the step
                # scheduled after that.
                mixed = self._prompts_mixed(decoding, pending)
                if mixed:  # beside the decode rows (their tokens follow on the device), through a mixed graph
                    only, prompts = [], mixed
                elif pending:
                    only = self._prompts_only(decoding, pending)
                else:
                    only, self._waved = [], False  # the decode rows' turn
                if only:  # prompts only, through their graph: nothing of the running step's
                    decoding, prompts, prev_rows = [], only, None
                elif only is None:  # the prompts go beside the decode rows, in one step once the running one ends
                    return None
                # else (only == []): the decode rows' turn, the prompts wait for the next step
            elif waited:
                self._waved = False  # the rows that waited for a wave step have their turn
        rows = list(decoding)
        decode_slots = [s.slot for s in decoding]
        # ahead: the tokens of the running step's rows follow on the device; rows that sat it out have theirs here
        decode_tokens = ([s.out_ids[-1] for s in decoding] if ahead_of is None else
                         [0 if r >= 0 else s.out_ids[-1] for s, r in zip(decoding, prev_rows or [])])
        decode_positions = [s.num_computed for s in decoding]
        for s in decoding:
            s.num_computed += 1  # the fed token is cached by this step

        chunks: list[PrefillChunk] = []
        prefill_tokens: list[int] = []
        penalty_resets = []
        chunk_seqs = []  # sequences whose chunk here does not end their prompt
        if prompts:  # queued ahead, a step carries prompts only through a prompt, wave or mixed graph (see above)
            budget = self.max_prefill_tokens
            for seq in prompts:
                if budget <= 0:
                    break
                start = seq.num_computed
                length = min(len(seq.prompt_ids) - start, budget)
                budget -= length
                last = start + length == len(seq.prompt_ids)
                chunks.append(PrefillChunk(seq.slot, start, length, last))
                prefill_tokens.extend(seq.prompt_ids[start:start + length])
                seq.num_computed = start + length
                if not seq.prefill_started:
                    seq.prefill_started = True
                    if seq.penalties:
                        penalty_resets.append((seq.slot, seq.prompt_ids))
                if last:
                    rows.append(seq)
                else:
                    chunk_seqs.append(seq)
        if not rows and not chunks:
            return None
        running = sum(r >= 0 for r in prev_rows) if prev_rows is not None else 0  # the running step's rows: first
        step = StepInputs(decode_slots, decode_tokens, decode_positions, chunks, prefill_tokens,
                          self._sampling_rows(rows, pending_rows=running), penalty_resets)
        return step, rows, chunk_seqs, prev_rows

    def _admit(self) -> None:
        """Waiting requests into free slots (lowest slot first keeps the decode batch rows compact)."""
        now = time.monotonic()
        while self._waiting and self._free:
            seq = self._waiting.popleft()
            seq.slot = heapq.heappop(self._free)
            self._prefilling.append(seq)
            self.stats.admitted += 1
            self.stats.queued_s += now - seq.added

    # At most this many prompts waiting to be prefilled are taken one at a time, each alone in a step that replays
    # its prompt graph, instead of together in one eager step beside the decode rows.  Why: an eager step with
    # prompt tokens is kernel launches from Python, ~10-11 ms on an H100 host for a 1 B model whatever it holds,
    # while a prompt graph of up to 512 tokens replays in 2.2-3.8 ms and the decode rows' graph in ~1.7 ms.
    # So k prompts alone cost ~2.5 k ms (+ one decode step for the rows
    # that waited) against ~11 ms together: better for the prompts up to 4, and not worse for the decode rows.
    # A wave (more prompts than that) still goes in together, where the eager step's cost is shared.  Where the
    # runner has wave graphs, two or more prompts go through one of those instead (_prompt_wave).
    PROMPTS_ALONE_MAX = DEFAULTS.prompts_alone

    def _prompts_mixed(self, decoding: list[_Seq], pending: list[_Seq] | None = None) -> list[_Seq] | None:
        """The waiting prompts, where they all go beside the decode rows in one step through a mixed graph
        (HFModelRunner.MIXED_PROMPTS): whole prompts, no more of them and no more tokens than one holds.  None
        otherwise: more prompts than that go in waves (one step takes them all while the decode rows wait it, where
        mixed steps would take several), and a prompt part-way through its chunks goes as before.
        pending: as in _prompt_alone."""
        pending = self._prefilling if pending is None else pending
        if not decoding or not pending or any(s.num_computed for s in pending):
            return None
        lengths = [len(s.prompt_ids) for s in pending]
        if sum(lengths) > self.max_prefill_tokens or not self.runner.mixed_prompts_fit(lengths):
            return None
        self._waved = False
        return list(pending)

    def _prompts_only(self, decoding: list[_Seq], pending: list[_Seq] | None = None) -> list[_Seq] | None:
        """The prompts of a step of prompts only, through a graph (a wave, `_prompt_wave`, or one alone,
        `_prompt_alone`); [] for the decode rows' turn between two waves; None: no such step (the prompts, if any,
        go beside the decode rows).  pending: as in _prompt_alone."""
        wave = self._prompt_wave(decoding, pending)
        if wave is not None:
            return wave
        alone = self._prompt_alone(decoding, pending)
        return None if alone is None else [alone]

    def _prompt_alone(self, decoding: list[_Seq], pending: list[_Seq] | None = None) -> _Seq | None:
        """The prompt to prefill alone in this step (its prompt graph), or None (one step for everything).
        pending: the prompts to choose from (default: all admitted and not prefilled yet)."""
        pending = self._prefilling if pending is None else pending
        if not pending or len(pending) > self._prompts_alone or (len(pending) == 1 and not decoding):
            return None  # nothing to prefill, a wave, or a prompt alone anyway
        first = pending[0]  # graphed prompts fit the prefill chunk (capture_prefill_graphs caps them at it)
        if first.num_computed or not self.runner.prompt_graphed(len(first.prompt_ids)):
            return None
        return first

    def _prompt_wave(self, decoding: list[_Seq], pending: list[_Seq] | None = None) -> list[_Seq] | None:
        """Two or more prompts waiting, where the runner has wave graphs (HFModelRunner.WAVE_ROWS): the first of them
        (as many as the largest wave graph that fits holds) for a step of their own through a wave graph; [] for a
        decode-only step, so that decode rows sit out at most every other step while a long wave goes in; None: no
        wave (one prompt goes alone, `_prompt_alone`, or everything in one eager step).

        Why waves before prompts alone: k prompts alone take k steps, each with the decode rows waiting, and a wave
        of them one.  pending: as in _prompt_alone."""
        pending = self._prefilling if pending is None else pending
        if not pending or not self.runner.wave_rows:
            self._waved = False
            return None
        if decoding and self._waved:  # the decode rows waited for the last wave step: theirs now
            self._waved = False
            return []
        take = []
        for seq in pending[:max(self.runner.wave_rows)]:
            if seq.num_computed:  # a prompt part-way through its chunks: not a whole prompt
                break
            take.append(seq)
        while len(take) >= 2 and (sum(len(s.prompt_ids) for s in take) > self.max_prefill_tokens
                                  or self.runner.wave_graph_key([len(s.prompt_ids) for s in take]) is None):
            take.pop()  # the longest prompts may not fit a wave of that many: fewer, in a smaller one
        if len(take) < 2:
            self._waved = False
            return None
        self._waved = bool(decoding)
        return take

    def _sampling_rows(self, rows: list[_Seq], pending_rows: int = 0) -> SamplingRows:
        """pending_rows: the first rows each have a token sampled by a step still running (not yet in out_ids)."""
        sr = SamplingRows()
        sampled = [s for s in rows if s.params.temperature > 0]
        penal = any(s.penalties for s in rows)
        if sampled or penal:
            sr.slots = [s.slot for s in rows]
            sr.temperature = [s.params.temperature for s in rows]
        if sampled:
            sr.any_sampling = True
            sr.any_top = any(s.params.top_k > 0 or s.params.top_p < 1.0 for s in sampled)
            sr.top_k = [s.params.top_k for s in rows]
            sr.top_p = [s.params.top_p for s in rows]
            sr.uniform = [1.0 - s.rng.random() if s.params.temperature > 0 else 1.0 for s in rows]
        if penal:
            sr.any_penalty = True
            sr.repetition_penalty = [s.params.repetition_penalty for s in rows]
            sr.presence_penalty = [s.params.presence_penalty for s in rows]
            sr.frequency_penalty = [s.params.frequency_penalty for s in rows]
        for i, s in enumerate(rows):
            n = len(s.out_ids) + (i < pending_rows)
            if n < s.min_tokens and s.eos:
                sr.banned.extend((i, t) for t in s.eos)
            if s.bad:
                for word in s.bad:
                    if len(word) == 1 or s.out_ids[-(len(word) - 1):] == word[:-1]:
                        sr.banned.append((i, word[-1]))
        return sr

    def _on_token(self, seq: _Seq, tok: int) -> None:
        if seq.slot < 0:  # finished during this step (cannot happen today; defensive)
            return
        if not seq.out_ids:
            # first token: the sequence moves from prefill to decode
            self._prefilling.remove(seq)
            self.stats.first_tokens += 1
            self.stats.to_first_token_s += time.monotonic() - seq.added
            insort(self._decoding, (seq.slot, seq), key=lambda x: x[0])
        seq.out_ids.append(tok)
        n = len(seq.out_ids)
        finish = None
        if tok in seq.eos and n > seq.min_tokens - 1:
            finish = "stop"
            text = ""
        else:
            text = seq.decoder.push(tok)
        if seq.stopper is not None and finish is None:
            text, hit = seq.stopper.push(text, can_stop=n >= seq.min_tokens)
            if hit:
                finish = "stop"
                self._finish(seq, finish, text, [tok])
                return
        if finish is None and n >= seq.max_tokens:
            finish = "length"
        if finish is not None:
            tail = seq.decoder.flush()
            if seq.stopper is not None:
                more, hit = seq.stopper.push(tail, can_stop=True)
                text += more if hit else more + seq.stopper.flush()
            else:
                text += tail
            self._finish(seq, finish, text, [tok])
            return
        self._emit(seq, Output(seq.request_id, text, [tok], len(seq.prompt_ids), n))

    def _emit(self, seq: _Seq, out: Output) -> None:
        try:
            seq.on_output(out)
        except Exception:
            log.exception("on_output callback of request %s failed; cancelling it", seq.request_id)
            if not out.finished:
                self._finish(seq, "cancelled", "", [])

    def _finish(self, seq: _Seq, reason: str, text: str, token_ids: list[int], error: str | None = None) -> None:
        if self._by_id.pop(seq.request_id, None) is None:
            return
        if seq.slot >= 0:
            if seq.out_ids:
                self._decoding.remove((seq.slot, seq))
            elif seq in self._prefilling:
                self._prefilling.remove(seq)
            heapq.heappush(self._free, seq.slot)
            seq.slot = -1
        with self._lock:
            self._active.discard(seq.request_id)
        self.stats.finished += 1
        self._emit(seq, Output(seq.request_id, text, token_ids, len(seq.prompt_ids), len(seq.out_ids), reason,
                               error))

    def _fail_all(self, message: str, reason: str = "error") -> None:
        for seq in list(self._by_id.values()):
            if seq in self._waiting:
                self._waiting.remove(seq)
            self._finish(seq, reason, "", [], error=message if reason == "error" else None)

    def _bad_word_ids(self, words) -> list[list[int]]:
        out = []
        for word in words:
            for variant in (word, " " + word):
                ids = self.tokenizer(variant, add_special_tokens=False).input_ids
                if ids and ids not in out:
                    out.append(ids)
        return out
