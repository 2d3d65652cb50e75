"""The hf model's streams inside the Triton python-backend stub: each request's sender state (`Stream`) and the
responder threads that turn the engine's outputs into Triton responses (`HFStreams`, which the model in
launcher/engines/hf/model.py takes its response methods from).

Its own module: this is the stub's hot path, one response per running stream per engine step, with its own rules
(a stream's first outputs answered where they arrive, pieces merged per response, first and final responses first,
rate-limited cancellation checks); the model file keeps reading its arguments, starting the engine and taking
requests.  `triton_python_backend_utils` exists only inside the stub, so it is imported where a response is built.
"""

from __future__ import annotations

import queue
import sys
import threading
import time

from launcher.python_backend import logprob_io, triton_io


def _pb():
    """The python backend's `triton_python_backend_utils` (only importable inside the stub)."""
    import triton_python_backend_utils as pb_utils

    return pb_utils


def stub_log(level: str, message: str) -> None:
    """A line of the hf model in tritonserver's log (level: info, warn, error), "[hf]" first."""
    logger = getattr(_pb(), "Logger", None)
    if logger is not None:
        getattr(logger, f"log_{level}")(f"[hf] {message}")
    else:  # older python backends
        print(f"[hf] {level}: {message}", file=sys.stderr, flush=True)


class Stream:
    """Per-request state of the sender side."""

    __slots__ = (
        "sender",
        "stream",
        "parts",
        "input_tokens",
        "last_check",
        "cancelled",
        "last_sent",
        "shard",
        "began",
        "queued",
        "times",
        "routed",
        "counts",
        "lp",
        "prompt_lp",
        "ids",
        "ids_sent",
        "handle",
        "timed",
    )

    def __init__(self, sender, stream: bool, shard: int, counts: bool = True, token_ids: bool = False):
        self.sender = sender  # pb_utils response sender
        self.stream = stream  # stream=true: a response per piece of text
        self.counts = counts  # counts on every streamed response (false: final_counts_only, text alone before the end)
        self.parts = []  # text not sent yet (stream=false: all of it; stream_interval_ms: held-back pieces)
        self.input_tokens = None  # the input_tokens tensor, built once (for the first response with counts)
        self.last_check = time.monotonic()  # last is_cancelled() poll
        self.cancelled = False  # the client cancelled; the engine was asked to abort
        self.last_sent = None  # time of the last streamed response
        self.shard = shard  # the responder thread that owns this stream (its responses stay in order)
        self.began = 0.0  # time.monotonic() when execute took the request (FirstTokenTimes)
        self.queued = 0.0  # ... when execute had read it and queued it with the engine
        self.times = None  # (received, first output made) in the engine process, + when this stub had it (the receive
        # thread's stamp); until the first response
        self.routed = False  # engine process: outputs of this stream reached the receive thread before (see _route)
        self.lp = None  # log probabilities of tokens not sent yet (LogProbRows), for a request that asked
        self.prompt_lp = None  # its prompt's, until its first response
        # return_token_ids: the ids not sent yet (output_ids goes out with the response whose text settles them),
        # and how many were sent
        self.ids = [] if token_ids else None
        self.ids_sent = 0
        self.handle = ""  # a kv_export request's kv_handle (where this engine serves its prompt's blocks), if any
        # its first response's time is counted (FirstTokenTimes): a stream's, and a kv_export request's one token,
        # whose time is part of the first token of the stream its decode replica goes on with
        self.timed = stream


class HFStreams:
    """The response side of the hf model (TritonPythonModel).  It reads what the model set up: `engine_process`,
    `engine` (abort), `_responders` (the thread count), `_responder` (a triton_io.Responder), `_streams` (request
    id -> Stream), `_next_id`, `stream_interval_s`, `cancel_check_s` and `_first_token` (FirstTokenTimes); it owns
    `_queues` and `_threads`, from `_start_responders` to `_stop_responders`."""

    def _start_responders(self):
        n = self._responders.threads
        # Shard 0 is answered where the outputs arrive, on the engine process's receive thread: one stream's
        # token goes out with no thread hand-off.  The in-thread engine's callback runs on the engine's own
        # thread, which must not send, so there shard 0 has a thread too.
        self._queues = [None if i == 0 and self.engine_process else queue.SimpleQueue() for i in range(n)]
        self._threads = [
            threading.Thread(target=self._respond_loop, args=(q,), name=f"hf-respond-{i}", daemon=True)
            for i, q in enumerate(self._queues)
            if q is not None
        ]
        for t in self._threads:
            t.start()

    def _stop_responders(self):
        """Let every responder thread finish what it was given, and wait for it (finalize, after the engine stopped)."""
        for q in self._queues:
            if q is not None:
                q.put(None)
        for t in self._threads:
            t.join(timeout=10)

    def _on_output(self, out):
        """In-thread engine: one output, on the engine's thread; the responder sends it."""
        self._queues[0].put([out])

    def _route(self, outputs):
        """Engine process: the outputs of one or more engine steps, on its receive thread -> each stream's
        responder (one put per thread, so a thread takes a whole step at once; shard 0 last, here).

        A stream's first outputs are answered here, before anything is handed over, whichever thread owns the
        stream: a hand-off costs a first token ~0.1 ms, and with several response
        processes most streams belong to a responder thread.  The stream's later outputs go to its thread only in
        later calls, after this one has sent its first response, so its responses stay in order.  The engine
        process sends a step's first outputs ahead of its others as well (launcher.hf.multiplexer.Peers.send_outputs)."""
        got = time.monotonic()
        shares = [[] for _ in self._queues]
        first, new = [], []
        for out in outputs:
            st = self._streams.get(out.request_id)
            if st is not None:
                if out.times is not None:  # a first output: when this stub had it (FirstTokenTimes' "back")
                    out.times = (*out.times, got)
                if st.routed:
                    shares[st.shard].append(out)
                else:  # every output of the stream in this call (steps that queued up) stays here
                    first.append(out)
                    new.append(st)
        for st in new:
            st.routed = True
        if first:
            self._respond_batch(first)
        for q, share in zip(self._queues, shares):
            if share and q is not None:
                q.put(share)
        if shares and shares[0]:
            self._respond_batch(shares[0])

    def _shard(self):
        """The responder thread of a new stream: the receive thread's (0, no hand-off) while fewer streams are open
        than there are threads, else the next in turn.  A stream keeps its thread, so its responses stay in order."""
        n = len(self._queues)
        return 0 if len(self._streams) < n else self._next_id % n

    def _respond_loop(self, outputs):
        while True:
            batch = outputs.get()
            if batch is None:
                return
            stop = False
            while True:  # take everything queued: pieces of one request merge into one response
                try:
                    more = outputs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                    break
                batch.extend(more)
            self._respond_batch(batch)
            if stop:
                return

    def _respond_batch(self, outputs):
        """Outputs of one or more engine steps -> at most one response per request."""
        merged = {}
        for out in outputs:
            prev = merged.get(out.request_id)
            if prev is None:
                merged[out.request_id] = [out.text, out, out.times, out.logprobs, out.prompt_logprobs, out.token_ids]
            else:
                prev[0] += out.text
                prev[1] = out
                prev[5] = prev[5] + out.token_ids
                prev[2] = prev[2] or out.times  # the first output's stamps (engine process only)
                prev[3] = logprob_io.merged(prev[3], out.logprobs)
                prev[4] = prev[4] or out.prompt_logprobs

        # First responses and final ones go first: under load one batch holds a response for every running
        # stream (~100 us each), and a stream's first token (its TTFT) or its end (the client's next request
        # waits for it) should not queue behind 127 middle-of-stream tokens.
        def urgency(item):
            st = self._streams.get(item[0])
            return 0 if st is not None and (st.last_sent is None or item[1][1].finish_reason is not None) else 1

        for rid, (text, out, times, lp, prompt_lp, ids) in sorted(merged.items(), key=urgency):
            try:
                if lp is not None or prompt_lp is not None or ids:
                    st = self._streams.get(rid)
                    if st is not None:  # held with the text until a response carries them
                        st.lp = logprob_io.merged(st.lp, lp)
                        st.prompt_lp = st.prompt_lp or prompt_lp
                        if st.ids is not None:
                            st.ids.extend(ids)
                self._respond(rid, text, out, times)
            except Exception as exc:  # never let one request stop the others
                stub_log("error", f"request {rid}: sending a response failed: {exc!r}")

    def _respond(self, rid, text, out, times=None):
        st = self._streams.get(rid)
        if st is None:
            return
        if times is not None:
            st.times = times
        if st.input_tokens is None and (st.counts or out.finish_reason is not None):
            # built for the first response that carries counts: a final_counts_only stream's first response (its
            # TTFT) does not wait for a tensor it does not send
            st.input_tokens = self._responder.input_tokens(out.input_tokens)
        if out.finish_reason is not None:
            del self._streams[rid]
            if st.cancelled:
                pb = _pb()
                err = pb.TritonError("request cancelled by the client", getattr(pb.TritonError, "CANCELLED", 0))
                self._send(st.sender, pb.InferenceResponse(output_tensors=[], error=err), final=True)
            elif out.finish_reason == "error":
                self._send(st.sender, triton_io.error_response(out.error or "generation failed"), final=True)
            else:
                if st.parts:  # held-back pieces (stream_interval_ms) or the whole text (stream=false)
                    st.parts.append(text)
                    text = "".join(st.parts)
                extra = self._log_probs(st) + self._output_ids(st, out.settled)
                if st.handle:
                    extra.append(self._responder.text_tensor("kv_handle", st.handle))
                response = self._responder.build(
                    text, st.input_tokens, out.output_tokens, out.finish_reason, extra=extra
                )
                self._send_text(st, response, final=True)
            if out.finish_reason == "cancelled" and st.cancelled:
                stub_log("info", f"request {rid} cancelled by the client after {out.output_tokens} tokens")
            return
        now = time.monotonic()
        if not st.stream:
            st.parts.append(text)
        elif text or st.parts:
            if st.last_sent is not None and now - st.last_sent < self.stream_interval_s:
                st.parts.append(text)  # too soon after the previous response: merged into the next one
            else:
                if st.parts:
                    st.parts.append(text)
                    text = "".join(st.parts)
                    st.parts.clear()
                st.last_sent = now
                extra = self._log_probs(st) + self._output_ids(st, out.settled)
                response = self._responder.build(
                    text, st.input_tokens, out.output_tokens, counts=st.counts, extra=extra
                )
                self._send_text(st, response)
        # Client cancellation: each check is a round trip to the server process, so it is rate-limited per request.
        if not st.cancelled and now - st.last_check >= self.cancel_check_s:
            st.last_check = now
            if st.sender.is_cancelled():
                st.cancelled = True
                self.engine.abort(rid)

    @staticmethod
    def _log_probs(st) -> list:
        """The log-probability tensors of what `st` holds (sent with the response being built), or []."""
        if st.lp is None and st.prompt_lp is None:
            return []
        tensors = logprob_io.tensors(st.lp, st.prompt_lp)
        st.lp = st.prompt_lp = None
        return tensors

    def _output_ids(self, st, settled: int) -> list:
        """The output_ids tensor of the ids `st` holds whose text is out with the response being built (the first
        `settled` the engine generated for it: launcher.hf.outputs.Output), where it asked; else []."""
        n = settled - st.ids_sent
        if st.ids is None or n <= 0:
            return []
        ids, st.ids = st.ids[:n], st.ids[n:]
        st.ids_sent += n
        return [self._responder.output_ids(ids)]

    def _send_text(self, st, response, final=False):
        """Send a response of `st` that carries text; if it was a stream's first, count where its first token's time
        went (FirstTokenTimes: `respond` ends as the send begins, `send` as it returns)."""
        sending = time.monotonic()
        self._send(st.sender, response, final)
        if st.timed and st.times is not None:
            self._first_token.add(st.began, st.queued, *st.times, sending, time.monotonic())
            st.times = None

    @staticmethod
    def _send(sender, response, final=False):
        flags = _pb().TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        try:
            sender.send(response, flags=flags)
        except Exception as exc:  # the client is gone; nothing else to do for this request
            stub_log("warn", f"could not send a response: {exc}")
