"""The `hf` engine: continuous batching over a HF transformers causal LM, in pure Python (no Triton).

    engine = Engine.from_args(HFEngineArgs(model_path="/path/to/hf/folder", device="cpu"))
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
* One engine thread runs the loop (this module): take new requests and aborts
  from a queue, let the scheduler (launcher.hf.scheduler) admit waiting requests into
  free cache slots and build a `StepInputs`, let the `HFModelRunner` execute it,
  then let output processing (launcher.hf.outputs) turn the sampled tokens into outputs.
  Requests join and leave between steps (continuous batching).
* Scheduler and executor are split: the scheduler only produces `StepInputs`
  (plain lists) and consumes a list of token ids.  Tensor parallelism slots in
  there: rank 0 broadcasts `StepInputs`, every rank executes it on its shard.
* A step = one decode token for every running sequence + at most
  `max_prefill_tokens` prompt tokens of new sequences (long prompts are
  chunked over steps), so admitting a long prompt stalls running streams by one
  bounded chunk, not a whole prefill.
* Greedy decoding equals `model.generate` (tests check it); sampling is batched
  (see launcher.hf.sampling); text is detokenized incrementally (see launcher.hf.detok).
* `launcher.hf.client.EngineProcess` runs this engine in a child
  process behind the same API; the Triton model uses it so that sending
  responses never takes the GIL from the engine loop.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict
from typing import TYPE_CHECKING, Callable

from launcher.engines.hf.config import HFEngineArgs
from launcher.hf.detok import TokenTable
from launcher.hf.encode import PromptEncoder
from launcher.hf.guided import Guides
from launcher.hf.outputs import Output, OutputProcessor
from launcher.hf.reporting import EngineStats, engine_features
from launcher.hf.runner import HFModelRunner
from launcher.hf.scheduler import Scheduler
from launcher.hf.sequence import Seq, bad_word_ids, eos_token_ids, prepare_prompt
from launcher.hf.tp import AHEAD
from launcher.kv_events import publisher_from_env
from launcher.python_backend.generation import InvalidRequest, SamplingParams
from launcher.python_backend.logprob_io import merged

if TYPE_CHECKING:
    from launcher.hf.kv_transfer import KVPrefix

log = logging.getLogger(__name__)

__all__ = ["Engine", "Output", "SamplingParams", "InvalidRequest", "prepare_prompt"]


_STOP = object()


class Engine:
    """Continuous-batching text generation on one device.  Thread-safe API; the work runs on one engine thread."""

    def __init__(
        self,
        args: HFEngineArgs,
        *,
        after_step: Callable[[], None] | None = None,
        tp_group=None,
    ):
        """args: what to load and how (launcher.engines.hf.config.HFEngineArgs: each field says what it does and holds its default;
        0 / "" / auto are decided once the device is known).  The keywords are what no launch sets:
        after_step: called on the engine thread after each step's outputs were delivered (batching hook).
        tp_group: with args.tp_size > 1, an launcher.hf.tp.TPGroup (default: one made from the LLMLAUNCH_* environment); this
        engine is rank 0 and broadcasts each step to the workers.
        While the GPU runs a step, the next one is queued behind it where it can be, and the host works on the last
        meanwhile (overlap; see `Scheduler.schedule`).
        """
        from transformers import AutoTokenizer

        # prompts taken one at a time through their graphs (Scheduler.PROMPTS_ALONE_MAX; 0: never), checked before
        # loading and compiling the model (minutes on a GPU)
        prompts_alone = int(args.prompts_alone)
        if prompts_alone < 0:
            raise ValueError(f"prompts_alone={prompts_alone} is negative: the most prompts to take alone, 0 for none")
        self.args = args
        self.model_path = str(args.model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_path or self.model_path)
        self._encode = PromptEncoder(self.tokenizer)  # prompts: the call's ids, without its Python (launcher.hf.encode)
        self._load_model(args, tp_group)
        # tp > 1: this engine is the leader (group rank 0) of a tensor-parallel group; see launcher.hf.tp
        self._tp = self.runner.tp_group
        if self._tp is not None and self._tp.rank != 0:
            raise ValueError(
                f"the Engine runs on group rank 0 only; rank {self._tp.rank} runs launcher.hf.worker.run_worker"
            )
        self._heartbeat_s = self._tp.timeout / 4 if self._tp is not None else None
        self.max_model_len = self.runner.max_model_len
        self.max_num_seqs = self.runner.max_num_seqs
        self.device = str(self.runner.device)
        self.dtype = str(self.runner.dtype).replace("torch.", "")
        self.vocab_size = self.runner.vocab_size
        # models often pad the embedding beyond the tokenizer (Qwen: 151936 vs 151665): never sample those ids
        self.runner.sampler.valid_vocab = min(self.vocab_size, len(self.tokenizer))
        self.eos_token_ids = eos_token_ids(self.model_path, self.runner.config, self.tokenizer)
        self._table = TokenTable(self.tokenizer)
        self.guides = Guides(self.tokenizer, self.vocab_size, self.eos_token_ids)
        self._init_loop(args, after_step, prompts_alone)

    def _load_model(self, args: HFEngineArgs, tp_group) -> None:
        """The runner (the model's weights and KV cache on the device), warmed up: a compile or capture mid-run
        would stall every running request.  The load phases' times and the versions this engine runs on go to the
        log, for the time-to-READY breakdown and the run record (launcher/readiness.py reads them)."""
        t0 = time.perf_counter()
        self.runner = HFModelRunner(self.model_path, tp_group=tp_group, **args.runner_kwargs())
        self.max_prefill_tokens = args.prefill_tokens(self.runner.device.type)
        loaded = time.perf_counter()
        self.runner.warm_up(self.max_prefill_tokens)
        import torch
        import transformers

        from launcher.readiness import report_phase, report_version

        report_phase("weights", loaded - t0)  # read, shard, move to the device, allocate the KV cache
        report_phase("compile", self.runner.compile_s)
        report_phase("graphs", time.perf_counter() - loaded - self.runner.compile_s)  # CUDA graph capture
        report_version("torch", torch.__version__)
        report_version("transformers", transformers.__version__)

    def _init_loop(self, args: HFEngineArgs, after_step, prompts_alone: int) -> None:
        """What the engine thread works with: its inbox, the scheduler and output processing over one set of stats,
        and the KV-cache event publisher."""
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._active: set[str] = set()  # request ids accepted and not finished (guarded by _lock)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.stats = EngineStats()
        self._after_step = after_step
        self._threads = args.torch_threads or None
        self.scheduler = Scheduler(
            self.runner, self.max_prefill_tokens, prompts_alone, self.stats, self._inbox.empty, args.prefix_caching
        )
        self.stats.kv_blocks = self.scheduler.pool.capacity
        # serve.routing=kv: the prefix cache's changes go to the front end as KV-cache events after every step
        self._kv_events = publisher_from_env() if args.prefix_caching else None
        if self._kv_events is not None:
            self.scheduler.pool.events = []
        self.outputs = OutputProcessor(self.scheduler, self.stats, self._active, self._lock)
        # (step, rows, handle): a step launched before the tokens of the one before were known
        self._ahead = None

    # -- public API ----------------------------------------------------------------------------------------
    @property
    def features(self) -> dict:
        """What speeds this engine up, as it started (for the server's log line): see reporting.describe_features."""
        return engine_features(self.runner, self._encode.why_not, self.scheduler.pool.prefix_caching)

    @classmethod
    def from_args(cls, args: HFEngineArgs, **runtime) -> "Engine":
        """The engine for `args` (an launcher.engines.hf.config.HFEngineArgs); `runtime`: the keywords no launch sets (after_step,
        tp_group)."""
        return cls(args, **runtime)

    def start(self) -> "Engine":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hf-engine", daemon=True)
            self._thread.start()
        return self

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        on_output: Callable[[Output], None],
        kv_prefix: KVPrefix | None = None,
    ) -> int:
        """Queue a request; returns its prompt token count.  Raises InvalidRequest for bad input (nothing queued).
        `kv_prefix`: the prompt's first blocks from another engine (its export_prefix), cached here before admission."""
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError(f"the hf engine is not running{f': {self._error}' if self._error else ''}")
        prompt_ids = prepare_prompt(self._encode, prompt, params, self.max_model_len, self.vocab_size)
        if kv_prefix is not None:
            self._check_prefix(kv_prefix, prompt_ids)
        eos = (
            frozenset()
            if params.ignore_eos
            else (frozenset((params.end_id,)) if params.end_id is not None else self.eos_token_ids)
        )
        bad = bad_word_ids(self.tokenizer, params.bad_words) if params.bad_words else []
        matcher = None
        if params.guide is not None:  # compiled here, on the caller's thread: not on the engine loop
            matcher = self.guides.matcher(
                *params.guide, stop_ids=(params.end_id,) if params.end_id is not None else None
            )
        if matcher is not None:  # a request that moved here: its guide has seen what it generated
            for tok in params.continue_ids:
                if not matcher.accept_token(tok):
                    raise InvalidRequest(f"continue_ids: token {tok} leaves the request's guide")
        decoder = self._table.decoder(prompt_ids + list(params.continue_ids))  # its context: what comes before
        seq = Seq(request_id, prompt_ids, params, on_output, decoder, eos, bad, matcher)
        with self._lock:
            if request_id in self._active:
                raise InvalidRequest(f"request id {request_id!r} is already running")
            self._active.add(request_id)
        self._inbox.put(seq if kv_prefix is None else ("import", kv_prefix, seq))
        return len(prompt_ids)

    def export_prefix(self, prompt: list[int], timeout: float | None = 60.0) -> KVPrefix:
        """The keys and values of `prompt`'s longest prefix of whole blocks cached here (a prefill ran it), all but
        its last token, on the host (launcher.hf.kv_transfer.read_prefix); empty where none is cached."""
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError(f"the hf engine is not running{f': {self._error}' if self._error else ''}")
        self._check_prefix(None, prompt)
        done: Future = Future()
        self._inbox.put(("export", list(prompt), done))
        return done.result(timeout)

    def _check_prefix(self, prefix: KVPrefix | None, prompt_ids: list[int]) -> None:
        from launcher.hf.kv_transfer import prefix_problem

        if why := prefix_problem(self.runner, prefix, prompt_ids):
            raise InvalidRequest(why)

    def add_requests(
        self, requests: list[tuple[str, str | list[int], SamplingParams, Callable[[Output], None]]]
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
        out = Output(
            request_id,
            "".join(p.text for p in parts),
            [t for p in parts for t in p.token_ids],
            last.input_tokens,
            last.output_tokens,
            last.finish_reason,
            last.error,
        )
        for p in parts:
            out.logprobs = merged(out.logprobs, p.logprobs)
            out.prompt_logprobs = out.prompt_logprobs or p.prompt_logprobs
        return out

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
        return self.scheduler.idle

    # -- engine thread -------------------------------------------------------------------------------------
    def _run(self) -> None:
        if self._threads:
            import torch

            torch.set_num_threads(self._threads)
        after_step = self._after_step or (lambda: None)
        stats, sched = self.stats, self.scheduler
        try:
            while True:
                idle = not (sched.waiting or sched.prefilling or sched.decoding)
                if idle:
                    self.runner.mark_idle()  # a gap before the next step is no request, not a late host
                t0 = time.perf_counter()
                if not self._drain(block=idle):
                    break
                if sched.waiting or sched.prefilling or sched.decoding:
                    if idle:
                        t0 = time.perf_counter()  # from the request's arrival
                    self._step()
                    if self._kv_events is not None and sched.pool.events:
                        self._kv_events.send(sched.pool.events)
                        sched.pool.events = []
                    after_step()
                    stats.wall_s += time.perf_counter() - t0
                else:
                    after_step()  # also after aborts of waiting requests, which end without a step
        except BaseException as exc:  # keep the reason for add_request's error message
            self._error = exc
            log.exception("hf engine loop died")
            self.outputs.fail_all(f"engine failure: {exc!r}")
            raise
        finally:
            self.outputs.fail_all("engine shut down", reason="cancelled")
            after_step()
            if self._kv_events is not None:
                self._kv_events.close()
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
            if isinstance(item, Seq):
                self.scheduler.add(item)
            elif item[0] == "import":
                from launcher.hf.kv_transfer import store_prefix

                self.stats.imported_prompt_tokens += store_prefix(self.runner, self.scheduler.pool, item[1])
                self.scheduler.add(item[2])
            elif item[0] == "export":
                from launcher.hf.kv_transfer import read_prefix

                try:
                    prefix = read_prefix(self.runner, self.scheduler.pool, item[1])
                    if prefix.num_blocks:  # fetched: a kv_export prefill's hold of these blocks ends
                        self.scheduler.pins.drop(prefix.keys[-1])
                    item[2].set_result(prefix)
                except Exception as exc:  # the caller's error, not the loop's
                    item[2].set_exception(exc)
            else:
                self._abort(item[1])
            try:
                item = inbox.get_nowait()
            except queue.Empty:
                return True

    def _abort(self, request_id: str) -> None:
        seq = self.scheduler.by_id.get(request_id)
        if seq is None:
            return
        if seq.slot < 0:
            self.scheduler.waiting.remove(seq)
        self.outputs.finish(seq, "cancelled", "", [])

    def _step(self) -> None:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:  # launched during the last step: only its tokens are left to take
            step, rows, handle, chunk_seqs = ahead
        else:
            scheduled = self.scheduler.schedule()
            if scheduled is None:
                return
            step, rows, chunk_seqs, _ = scheduled
            handle = None
        t0 = time.perf_counter()
        queued: list[Seq] = []  # the rows of the step scheduled behind this one
        try:
            if handle is None:
                if self._tp is not None:
                    self._tp.broadcast(step)  # every worker rank executes the same step on its shard
                handle = self._launch(step)
            nxt = self.scheduler.schedule(ahead_of=rows)
            if nxt is not None:
                nstep, queued, nchunks, prev_rows = nxt
                if prev_rows is None:  # prompts only: nothing of the running step's (see Scheduler.schedule)
                    if self._tp is not None:
                        self._tp.broadcast(nstep)
                    nhandle = self._launch(nstep)
                else:
                    if self._tp is not None:  # its decode tokens follow on the device (launcher.hf.tp: AHEAD)
                        self._tp.broadcast((AHEAD, nstep))
                    nhandle = self._launch(nstep, prev=handle, prev_rows=prev_rows)
                self._ahead = (nstep, queued, nhandle, nchunks)
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
                    self.outputs.finish(seq, "error", "", [], error=f"generation failed: {exc!r}")
            self.scheduler.resend_block_table()  # the requests admitted meanwhile: their rows never reached it
            return
        self.stats.busy_s += time.perf_counter() - t0
        self.stats.steps += 1
        self.stats.decode_tokens += len(step.decode_tokens)
        self.stats.prefill_tokens += len(step.prefill_tokens)
        self.stats.prompt_steps += bool(step.prefill_tokens)
        on_token = self.outputs.on_token
        lps = self.runner.logprobs(handle)
        if lps is None:
            for seq, tok in zip(rows, tokens):
                on_token(seq, tok)
            return
        per_row, per_chunk = lps
        by_slot = {seq.slot: seq for seq in rows + chunk_seqs}
        for chunk, got in zip(step.prefill, per_chunk):
            seq = by_slot.get(chunk.slot)
            if got is not None and seq is not None and seq.prompt_lp is not None:
                seq.prompt_lp.extend(got)
        for seq, tok, lp in zip(rows, tokens, per_row):
            on_token(seq, tok, lp)

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
            stats.gpu_steps += 1
            if timed[1] is not None:
                stats.gpu_idle_s += timed[1]
                stats.gpu_gaps += 1
        return tokens
