"""The serving loop shared by the vLLM, SGLang and LMDeploy python models.

Each of those `model.py` files is a thin adapter (`EngineAdapter`, launcher/python_backend/adapter.py): how to build the
engine, how to turn a contract request into the engine's async stream of new text, how
to abort one request, how to shut down. Everything else is here, once:

* an asyncio loop on its own thread drives the engine (the engines' async APIs need a
  running loop; Triton's `execute` must return at once for a decoupled model);
* `execute` parses each request with `launcher.python_backend.triton_io` and schedules it; a bad
  request gets an error response naming the input and the fix;
* the loop only posts a request's new text to its outbox; `SEND_THREADS` sender threads,
  each owning a share of the requests, build and send the responses. A send is a round trip
  to tritonserver (tens to hundreds of microseconds, the GIL free meanwhile), so one thread
  would serialize every stream's responses behind each other; and text that arrives while
  a request's previous response is being sent goes out merged in its next response, so a
  busy stub sends fewer, larger responses instead of falling behind the engine;
* a watchdog asks Triton every `cancel_poll_s` whether clients cancelled (stream closed,
  client gone), aborts those requests in the engine and cancels their tasks, even when
  the engine has produced nothing for them yet;
* an exception from the engine becomes an error response for that request only; the
  model keeps serving;
* where a streamed request's first token spends its time in the stub goes to Triton metrics, the hf model's
  split (launcher.python_backend.timings): `parse` (execute took the request -> the loop read and checked it: the
  hop onto the loop, whose wait grows when the loop is busy), the engine's share (handed to the engine -> its first
  piece reached the loop), `respond` (the loop had it -> a sender thread built the response) and `send`.  Where the
  engine stamps the request itself (`Piece.engine_times`: vLLM), its share splits as the hf engine's does: `add`
  (to its scheduler's queue: its front end's tokenizing and hand-over), `engine` (queued -> first token made: the
  queue and the prefill), `back` (made -> the piece on the loop: its output path); otherwise it is all `engine`;
* `stop()` (the model's `finalize`) cancels what is in flight, shuts the engine down and
  ends both threads, in reverse order of `start()`.

On ranks that only run a share of the engine (SGLang nodes other than 0), the adapter
says `serves = False`: requests get a clear error, and if the adapter can watch its
engine processes, the rank's tritonserver is stopped when they die, so the launcher
sees the rank fail instead of a server that looks healthy.
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import sys
import threading
import time
import traceback
import uuid
from typing import Callable, Dict, Optional, Sequence

from launcher.python_backend import counters, logprob_io, timings, triton_io
from launcher.python_backend.adapter import EngineAdapter, Log
from launcher.python_backend.logprob_io import merged
from launcher.python_backend.outbox import SEND_THREADS, Outbox
from launcher.python_backend.settle import Settle


def _new_task(coro, loop) -> asyncio.Task:
    """A task for `coro` on `loop` (the running one), eagerly started where asyncio can (Python 3.12 and later):
    it runs at once, up to its first wait, instead of from the loop's next iteration."""
    if sys.version_info >= (3, 12):
        return asyncio.Task(coro, loop=loop, eager_start=True)
    return loop.create_task(coro)


class _Active:
    __slots__ = ("outbox", "task", "cancelled")

    def __init__(self, outbox):
        self.outbox = outbox
        self.task: Optional[asyncio.Task] = None
        self.cancelled = False


class AsyncEngineRuntime:
    def __init__(
        self,
        adapter: EngineAdapter,
        log: Optional[Log] = None,
        cancel_poll_s: float = 0.2,
        drain_timeout_s: float = 10.0,
        model_name: str = "",
    ):
        self.adapter = adapter
        self.log = log or Log(adapter.name)
        self.cancel_poll_s = cancel_poll_s
        self.drain_timeout_s = drain_timeout_s
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop_thread: Optional[threading.Thread] = None
        self._send_queues = [queue.SimpleQueue() for _ in range(SEND_THREADS)]
        self._send_threads: list = []
        self._next_shard = 0
        self._watch_thread: Optional[threading.Thread] = None
        self._watchdog: Optional[asyncio.Task] = None
        self._active: Dict[str, _Active] = {}
        self._tasks: set = set()  # every request's task, until it is done
        self._stopping = False
        self._ignored_noted: set = set()
        self._responder = None  # triton_io.Responder (streamed responses; its tensors are kept per sender thread)
        self._server_pid = os.getppid()  # the tritonserver that started this stub: the one to stop if the engine dies
        self.model_name = model_name or adapter.name  # the metrics' model label
        self.first_token = counters.FirstTokenTimes()
        self.prompt_tokens = counters.PromptTokens()  # the prefix cache's hits, where the engine reports them
        self._metrics: Optional[counters.Counters] = None
        self._whole: Dict[int, bool] = {}  # token id -> it decodes whole on its own (launcher.python_backend.settle)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the loop thread, build the engine on it (errors propagate), start the helpers."""
        self._responder = triton_io.Responder()
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._run_loop, name=f"{self.adapter.name}-loop", daemon=True)
        self._loop_thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.adapter.start(), self.loop).result()
        except BaseException:
            self._stop_loop()
            raise
        self._send_threads = [
            threading.Thread(target=self._send_loop, args=(q,), name=f"{self.adapter.name}-send-{i}", daemon=True)
            for i, q in enumerate(self._send_queues)
        ]
        for t in self._send_threads:
            t.start()
        kv_usage = getattr(self.adapter, "kv_usage", None)  # a counters.Latest where the engine reports its KV cache
        moved = getattr(self.adapter, "kv_transfers", None)  # a counters.KVTransfers where its engine moves KV
        steps = getattr(self.adapter, "engine_steps", None)  # a counters.EngineSteps where it reports engine steps

        def totals() -> dict:
            out = {**self.first_token.totals_map(), **self.prompt_tokens.totals_map()}
            if kv_usage is not None:
                out["kv_cache_usage"] = kv_usage.take()
            if moved is not None:
                out.update(moved.totals_map())
            if steps is not None:
                out.update(steps.totals_map())
            return out

        gauges = timings.ENGINE_GAUGES if kv_usage is not None else ()
        rows = timings.RUNTIME_COUNTERS + (timings.KV_TRANSFER_COUNTERS if moved is not None else ())
        rows += timings.VLLM_STEP_COUNTERS if steps is not None else ()
        self._metrics = counters.Counters(self.model_name, rows, totals, gauges=gauges).start()
        self._watchdog = asyncio.run_coroutine_threadsafe(self._start_watchdog(), self.loop).result()
        if not self.adapter.serves:
            self._watch_thread = threading.Thread(
                target=self._watch_engine, name=f"{self.adapter.name}-watch", daemon=True
            )
            self._watch_thread.start()

    def stop(self) -> None:
        """Cancel in-flight requests (they are aborted in the engine), shut the engine down, end the threads."""
        if self.loop is None:
            return
        self._stopping = True
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(timeout=self.drain_timeout_s + 120)
        except Exception as exc:  # finalize must not raise: log and go on tearing down
            self.log.error(f"engine shutdown failed: {exc!r}")
        for q in self._send_queues:
            q.put(None)
        for t in self._send_threads:
            t.join(timeout=30)
        if self._metrics is not None:
            self._metrics.stop()
            self.log.info(self.first_token.summary())
        self._stop_loop()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _stop_loop(self) -> None:
        if self.loop is not None and self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        if self._loop_thread is not None:
            self._loop_thread.join(timeout=30)
        if self.loop is not None and not self.loop.is_running():
            self.loop.close()
        self.loop = None

    async def _start_watchdog(self) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(self._watch_cancellations())

    async def _shutdown(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        tasks = [a.task for a in self._active.values() if a.task is not None]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=self.drain_timeout_s)
        await self.adapter.stop()
        self.log.info("engine shut down")

    # ------------------------------------------------------------------ requests
    def submit(self, request) -> None:
        """Called from execute(): schedule one request on the loop and return at once."""
        import triton_python_backend_utils as pb_utils

        began = time.monotonic()
        sender = request.get_response_sender()
        if self._stopping or self.loop is None:
            sender.send(
                triton_io.error_response(f"{self.adapter.name}: the model is shutting down; retry on another server"),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
            return
        self.loop.call_soon_threadsafe(self._start_serving, self._serve(request, sender, began))

    def _start_serving(self, coro) -> None:
        """Loop thread: the request's task, started here and now where the Python can (3.12's eager start): its
        parse and its hand-over to the engine run in this callback instead of one loop iteration later, behind every
        other stream's callbacks of that iteration (`run_coroutine_threadsafe` takes those two iterations).  On the
        vLLM stand-in at 8 streams (benchmark/runtime_alone.py, 2-core machine) the runtime's `parse` went from
        0.53-0.84 to 0.33-0.63 ms."""
        task = _new_task(coro, self.loop)
        self._tasks.add(task)  # the loop holds tasks weakly: kept until done
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, request, sender, began: float = 0.0) -> None:
        name = self.adapter.name
        out = Outbox(sender, self._next_shard)
        self._next_shard = (self._next_shard + 1) % len(self._send_queues)
        greq = self._accept(request, out)
        if greq is None:
            return
        rid = uuid.uuid4().hex
        entry = _Active(out)
        entry.task = asyncio.current_task()
        self._active[rid] = entry
        n_in = n_out = 0
        cached = None  # the prompt tokens the engine's prefix cache served, once it says
        parts = []  # a non-streamed request's text; a streamed one's last piece (sent with the final response)
        finish = handle = None
        if (greq.stream or greq.params.kv_export) and began:  # a prefill's one token is its decode's first token
            out.times = (began, time.monotonic())
        settle = self._settle(greq, out)
        settled: list = []  # ids whose text is out, to go with the next text posted
        stream = self.adapter.generate(rid, greq)
        try:
            async for piece in stream:
                if settle is not None and piece.token_ids:
                    settled += settle.feed(piece.token_ids)
                if out.times is not None and len(out.times) == 2:  # the first piece is on the loop
                    out.times = (*out.times, time.monotonic(), *(piece.engine_times or ()))
                n_in, n_out = piece.input_tokens or n_in, piece.output_tokens
                cached = piece.cached_tokens if piece.cached_tokens is not None else cached
                if piece.logprobs is not None or piece.prompt_logprobs is not None:
                    with out.lock:  # sent with the next response that goes
                        out.lp = merged(out.lp, piece.logprobs)
                        out.prompt_lp = out.prompt_lp or piece.prompt_logprobs
                if piece.finish_reason:
                    finish = piece.finish_reason
                    parts.append(piece.text)
                    handle = piece.kv_handle
                    break
                if not greq.stream:
                    parts.append(piece.text)
                elif piece.text:
                    self._post(out, piece.text, n_in, n_out, settled)
                    if settled:
                        settled = []
            if finish is None:  # the engine ended the stream without saying why
                finish = "length" if n_out >= greq.params.max_tokens else "stop"
            if settled:  # the last piece's: they go with the final response, which sends its text
                with out.lock:
                    out.ids += settled
            self._active.pop(rid, None)
            if cached is not None:
                self.prompt_tokens.add(n_in, cached)
            self._post_final(out, ("done", "".join(parts), finish, handle), n_in, n_out)
        except asyncio.CancelledError:
            await self._cancelled(rid, entry, n_in, n_out)
        except triton_io.InvalidRequest as exc:  # the engine refused what it was asked (a guide it cannot compile)
            await self._abort(rid)
            self._active.pop(rid, None)
            self._post_final(out, ("error", f"{name}: {exc}"))
        except Exception as exc:
            self.log.error(f"request {rid} failed in the engine: {traceback.format_exc()}")
            await self._abort(rid)
            self._active.pop(rid, None)
            self._post_final(out, ("error", f"{name} engine error: {type(exc).__name__}: {exc}"))
        finally:
            try:
                await stream.aclose()
            except BaseException:  # noqa: BLE001 - closing a failed stream must not mask the response already sent
                pass

    def _settle(self, greq, out: Outbox) -> Optional[Settle]:
        """A streamed request that asked for output_ids (return_token_ids): its Settle, or None where its engine
        cannot continue it elsewhere (its first response then carries output_ids [-1], which the front end reads as
        "never move it") or it did not ask."""
        if not (greq.return_token_ids and greq.stream):
            return None
        if self.adapter.cannot_continue(greq.params):
            out.ids = [-1]
            return None
        out.ids = []
        return Settle(self.adapter.tokenizer, self._whole)

    def _accept(self, request, out: Outbox):
        """The request's GenerationRequest, or None where it was answered with an error (this rank takes no requests,
        or the request is bad)."""
        name = self.adapter.name
        if not self.adapter.serves:
            why = "this rank runs part of the engine and takes no requests"
            self._post_final(out, ("error", f"{name}: {why}; send them to the model copy's leader (rank 0)"))
            return None
        try:
            greq = triton_io.parse_request(
                request, self.adapter.supported, self.adapter.max_model_len, f"engine={name}"
            )
        except triton_io.InvalidRequest as exc:
            self._post_final(out, ("error", f"{name}: {exc}"))
            return None
        self._note_ignored(greq.ignored)
        out.counts = not greq.final_counts_only  # else text alone: the counts come with the final response
        return greq

    async def _cancelled(self, rid: str, entry: _Active, n_in: int, n_out: int) -> None:
        """Request rid's task was cancelled: by the watchdog for its client (which aborted it in the engine
        already), or by a shutdown.  Its final response says which."""
        name = self.adapter.name
        task = asyncio.current_task()
        if task is not None and hasattr(task, "uncancel"):
            task.uncancel()  # the cancellation is handled here; later awaits must not see it again
        if not entry.cancelled:  # shutting down (a client cancel was aborted by the watchdog already)
            await self._abort(rid)
        self._active.pop(rid, None)
        why = "cancelled by the client" if entry.cancelled else "the model is shutting down"
        self.log.info(f"request {rid} {why} after {n_out} tokens; aborted in the engine")
        if entry.cancelled:
            self._post_final(entry.outbox, ("done", "", "cancelled", None), n_in, n_out)
        else:
            self._post_final(entry.outbox, ("error", f"{name}: {why}; the request was aborted after {n_out} tokens"))

    async def _abort(self, rid: str) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self.adapter.abort(rid)), timeout=10)
        except BaseException as exc:  # noqa: BLE001 - best effort; the request is answered either way
            self.log.warn(f"abort of request {rid} failed: {exc!r}")

    def _note_ignored(self, ignored) -> None:
        new = [n for n in ignored if n not in self._ignored_noted]
        if new:
            self._ignored_noted.update(new)
            self.log.warn(f"{self.adapter.name} does not honour inputs {new}; they are ignored (noted once)")

    # ------------------------------------------------------------------ cancellation
    async def _watch_cancellations(self) -> None:
        while True:
            await asyncio.sleep(self.cancel_poll_s)
            for rid, entry in list(self._active.items()):
                if entry.cancelled or entry.task is None:
                    continue
                try:
                    cancelled = entry.outbox.sender.is_cancelled()
                except Exception:  # noqa: BLE001 - a sender whose request is gone counts as cancelled
                    cancelled = True
                if cancelled and rid in self._active:
                    # Abort while the request is still live in the engine (some engines forget a
                    # request once its stream is torn down), then stop serving it.
                    entry.cancelled = True
                    await self._abort(rid)
                    entry.task.cancel()

    # ------------------------------------------------------------------ sending
    def _post(self, out: Outbox, text: str, n_in: int, n_out: int, ids: Sequence[int] = ()) -> None:
        """Loop thread: a streamed request's new text (and the ids of the tokens it completes, for a request that asked
        for them); its sender sends it, merged with whatever else is waiting."""
        with out.lock:
            out.parts.append(text)
            if ids:
                out.ids += ids
            out.n_in, out.n_out = n_in, n_out
            wake = not out.queued
            out.queued = True
        if wake:
            self._send_queues[out.shard].put(out)

    def _post_final(self, out: Outbox, final: tuple, n_in: int = 0, n_out: int = 0) -> None:
        """Loop thread: the request's end; its sender sends what is left and then the final response."""
        with out.lock:
            out.final = final
            out.n_in, out.n_out = n_in or out.n_in, n_out or out.n_out
            wake = not out.queued
            out.queued = True
        if wake:
            self._send_queues[out.shard].put(out)

    def _send_loop(self, q: "queue.SimpleQueue") -> None:
        while True:
            out = q.get()
            if out is None:
                return
            with out.lock:
                text = "".join(out.parts)
                out.parts.clear()
                final, n_in, n_out = out.final, out.n_in, out.n_out
                out.queued = False
                lp, prompt_lp, out.lp, out.prompt_lp = out.lp, out.prompt_lp, None, None
                times = out.times if out.times is not None and len(out.times) >= 3 else None
                ids = out.ids
                if ids:
                    out.ids = []
            try:
                extra = logprob_io.tensors(lp, prompt_lp)
                if ids:  # last: the front end looks there first (launcher/frontend/migration.py: take_ids)
                    extra.append(self._responder.output_ids(ids))
                if final is None:
                    if out.counts and out.in_n != n_in:
                        out.in_tensor, out.in_n = self._responder.input_tokens(n_in), n_in
                    response = self._responder.build(text, out.in_tensor, n_out, counts=out.counts, extra=extra)
                    self._send_streamed(out, response, times if text else None)
                elif final[0] == "done":
                    if final[3]:  # a kv_export request's handle (the front end sends it on as kv_from)
                        extra.append(self._responder.text_tensor("kv_handle", final[3]))
                    response = triton_io.response(text + final[1], n_in, n_out, final[2], extra=extra)
                    # counted where it carries text, and a kv_export request's always (its handle: the decode's
                    # first token waits for it, whatever the one token's text)
                    self._send_streamed(out, response, times if text or final[1] or final[3] else None, final=True)
                else:
                    if text:  # what was generated before the failure still reaches the client
                        self._send(out.sender, self._responder.build(text, self._responder.input_tokens(n_in), n_out))
                    self._send(out.sender, triton_io.error_response(final[1]), final=True)
            except Exception:  # noqa: BLE001 - building a response must not end the sender thread
                self.log.warn(f"building a response failed: {traceback.format_exc(limit=2)}")

    def _send_streamed(self, out: Outbox, response, times: Optional[tuple], final: bool = False) -> None:
        """Send a streamed response; if `times` (the request's stamps) is given it is the request's first text, and
        where its first token spent its time is counted (`respond` ends as the send begins, `send` as it returns)."""
        sending = time.monotonic()
        self._send(out.sender, response, final)
        if times is not None:
            began, handed, got, *engine = times
            # without the engine's stamps, its whole share is `engine` (add and back 0)
            queued, made = engine if len(engine) == 2 else (handed, got)
            self.first_token.add(began, handed, queued, made, got, sending, time.monotonic())
            out.times = None

    def _send(self, sender, response, final: bool = False) -> None:
        import triton_python_backend_utils as pb_utils

        try:
            if final:
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                sender.send(response)
        except Exception:  # noqa: BLE001 - e.g. the client went away; nothing else to do for it
            self.log.warn(f"sending a response failed: {traceback.format_exc(limit=2)}")

    # ------------------------------------------------------------------ worker ranks
    def _watch_engine(self, kill: Callable[[int, int], None] = os.kill) -> None:
        if not self.adapter.wait_engine_exit() or self._stopping:
            return  # the adapter cannot watch, or this is a normal shutdown
        if os.getppid() != self._server_pid:
            # The server is gone already (we were re-parented): its pid may be someone else's by now.
            self.log.error("the engine's processes on this worker rank exited, and so did this rank's tritonserver")
            return
        self.log.error(
            "the engine's processes on this worker rank exited; stopping this rank's tritonserver so the job fails fast"
        )
        kill(self._server_pid, signal.SIGTERM)


class RuntimeModel:
    """The TritonPythonModel shell the vLLM, SGLang and LMDeploy models share: check decoupled
    mode, build the engine's adapter, hand every request to the runtime, stop it on unload.
    A model.py subclasses it as `TritonPythonModel` and defines `name` and `make_adapter`."""

    name = ""  # engine name, used in the log and the error message

    def make_adapter(self, params: Dict[str, str], args: Dict[str, str], log: Log) -> EngineAdapter:
        raise NotImplementedError

    def initialize(self, args):
        import json

        import triton_python_backend_utils as pb_utils

        from launcher.python_backend.triton_io import model_parameters

        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise ValueError(
                f"{config.get('name', self.name)} must be decoupled (model_transaction_policy {{ decoupled: true }}): it streams"
            )
        log = Log(self.name)
        self.runtime = AsyncEngineRuntime(
            self.make_adapter(model_parameters(config), args, log), log, model_name=config.get("name", self.name)
        )
        self.runtime.start()

    def execute(self, requests):
        for request in requests:
            self.runtime.submit(request)
        return None

    def finalize(self):
        self.runtime.stop()
