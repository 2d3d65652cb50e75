"""The hf engine's output processing: sampled tokens -> per-request outputs.

Per token of a request: incremental detokenization (launcher.hf.detok), EOS / stop-string / length checks, and the
request's callback with its new text; a request that ends frees its slot in the scheduler (launcher.hf.scheduler) and is
dropped from the engine's running set.  Runs on the engine thread, once per token: keep it lean.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from launcher.hf.scheduler import Scheduler
from launcher.hf.sequence import Seq
from launcher.python_backend.logprob_io import LogProbRows

log = logging.getLogger("launcher.hf.engine")  # the engine's one logger, as its log lines always named it


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
    logprobs: LogProbRows | None = None  # the new tokens' log probabilities, for a request that asked
    prompt_logprobs: LogProbRows | None = None  # its prompt's, on the first output of a request that asked
    # how many of the tokens this server generated for the request (continue_ids not counted) have their text out,
    # in this output or before: all but those whose text the detokenizer or the stop strings' matcher holds back.
    # The ids are sent (output_ids) only that far, so a request moved elsewhere continues (continue_ids) exactly
    # after the text its client has
    settled: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class OutputProcessor:
    """Tokens -> outputs, stop checks and request ends (engine thread only)."""

    def __init__(self, scheduler: Scheduler, stats, active: set[str], lock: threading.Lock):
        """stats: the engine's EngineStats (first_tokens, to_first_token_s, finished); active / lock: the engine's
        set of running request ids (add_request reads it on other threads) and its lock."""
        self._scheduler = scheduler
        self._started_decoding = scheduler.started_decoding
        self._release = scheduler.release
        self.stats = stats
        self._active = active
        self._lock = lock

    def on_token(self, seq: Seq, tok: int, lp: LogProbRows | None = None) -> None:
        """seq's next token (and its log probabilities, `lp`, if it asked): its new text (incremental
        detokenization, held back while a stop string may be starting), whether it ends (EOS past min_tokens, a stop
        string, max_tokens), and its output."""
        if seq.slot < 0:  # finished during this step (cannot happen today; defensive)
            return
        prompt_lp = None
        if seq.prompt_lp is not None:  # the first output carries the prompt's log probabilities
            prompt_lp, seq.prompt_lp = seq.prompt_lp, None
        if not seq.decoding:  # its prefill sampled this token: the sequence moves from prefill to decode
            self._started_decoding(seq)
            if not seq.out_ids:  # a first token (not a preempted request's token after it was computed again)
                self.stats.first_tokens += 1
                self.stats.to_first_token_s += time.monotonic() - seq.added
        seq.out_ids.append(tok)
        n = len(seq.out_ids)
        finish = None
        if seq.matcher is not None and not seq.matcher.accept_token(tok):  # the mask allowed it: never expected
            self.finish(seq, "error", "", [tok], error=f"token {tok} left the request's guide")
            return
        if (tok in seq.eos and n > seq.min_tokens - 1) or (seq.matcher is not None and seq.matcher.is_terminated()):
            finish = "stop"  # EOS, or the stop token that ends a complete guided output
            text = ""
        else:
            text = seq.decoder.push(tok)
        if seq.stopper is not None and finish is None:
            text, hit = seq.stopper.push(text, can_stop=n >= seq.min_tokens)
            if hit:
                finish = "stop"
                self.finish(seq, finish, text, [tok], lp=lp, prompt_lp=prompt_lp)
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
            self.finish(seq, finish, text, [tok], lp=lp, prompt_lp=prompt_lp)
            return
        # Text goes out only where no token's text is held back (a character's first bytes, a stop string's start):
        # there the text sent is exactly that of the ids sent (Output.settled), so a request that moves to another
        # server after it goes on with no piece of text twice. What comes before such a hold waits with it.
        if seq.decoder.holds or (seq.stopper is not None and seq.stopper.holds):
            seq.held_text += text
            text = ""
        else:
            if seq.held_text:
                text, seq.held_text = seq.held_text + text, ""
            seq.settled = n - seq.continued
        out = Output(seq.request_id, text, [tok], len(seq.prompt_ids), n, settled=seq.settled)
        if lp is not None or prompt_lp is not None:
            out.logprobs, out.prompt_logprobs = lp, prompt_lp
        self.emit(seq, out)

    def emit(self, seq: Seq, out: Output) -> None:
        """Hand `out` to the request's callback; a callback that raises cancels its request."""
        try:
            seq.on_output(out)
        except Exception:
            log.exception("on_output callback of request %s failed; cancelling it", seq.request_id)
            if not out.finished:
                self.finish(seq, "cancelled", "", [])

    def finish(
        self,
        seq: Seq,
        reason: str,
        text: str,
        token_ids: list[int],
        error: str | None = None,
        lp: LogProbRows | None = None,
        prompt_lp: LogProbRows | None = None,
    ) -> None:
        """End seq (once): free its slot, and send its last output with the reason (and the log probabilities of
        its last token, and of its prompt if this is its first output, for a request that asked)."""
        # a kv_export prefill that ended as asked keeps its prompt's blocks for the decode engine that fetches them
        if not self._release(seq, seq.params.kv_export and reason in ("length", "stop")):
            return
        with self._lock:
            self._active.discard(seq.request_id)
        self.stats.finished += 1
        if seq.held_text:
            text, seq.held_text = seq.held_text + text, ""
        out = Output(seq.request_id, text, token_ids, len(seq.prompt_ids), len(seq.out_ids), reason, error)
        out.settled = len(seq.out_ids) - seq.continued  # the last output: every text is out
        out.logprobs, out.prompt_logprobs = lp, prompt_lp
        self.emit(seq, out)

    def fail_all(self, message: str, reason: str = "error") -> None:
        """End every request the engine holds (the loop died, or the engine shuts down)."""
        waiting = self._scheduler.waiting
        for seq in list(self._scheduler.by_id.values()):
            if seq in waiting:
                waiting.remove(seq)
            self.finish(seq, reason, "", [], error=message if reason == "error" else None)
