"""What one request of the vLLM, SGLang and LMDeploy models still has to send (launcher.python_backend.async_runtime).

The runtime's event loop posts a request's new text to its `Outbox`; one of `SEND_THREADS` sender threads, the one
that owns the request, takes everything posted since its last send and sends it as one response.
"""

from __future__ import annotations

import threading
from typing import Optional

# Sender threads of one model instance. Each owns a share of the requests (assigned in turn), so a request's
# responses leave in order; four let four round trips to tritonserver overlap, which one stream per step at
# 64-128 streams needs, and they sleep when there is nothing to send.
SEND_THREADS = 4


class Outbox:
    """What one request still has to send: streamed text not sent yet, and its final response once known.
    The loop thread posts to it; the sender thread of its shard takes everything posted since its last send."""

    __slots__ = (
        "sender",
        "shard",
        "lock",
        "parts",
        "n_in",
        "n_out",
        "counts",
        "final",
        "queued",
        "in_tensor",
        "in_n",
        "lp",
        "prompt_lp",
        "times",
        "ids",
    )

    def __init__(self, sender, shard: int):
        self.sender = sender
        self.shard = shard
        self.lock = threading.Lock()
        self.parts: list = []  # streamed text not sent yet
        self.n_in = self.n_out = 0  # the engine's counts as of the last post
        self.counts = True  # streamed responses carry the counts too (False: final_counts_only)
        self.final: Optional[tuple] = None  # ("done", text, finish_reason, kv_handle) | ("error", message), once posted
        self.queued = False  # waiting in its sender's queue
        self.lp = self.prompt_lp = None  # log probabilities not sent yet (LogProbRows), for a request that asked
        self.in_tensor, self.in_n = None, None  # this request's input_tokens tensor (its sender thread's own)
        # a streamed request's first-token stamps (time.monotonic()): execute took it, the loop handed it to the
        # engine, the loop had its first piece, then the engine's own two (Piece.engine_times) where it gave them;
        # None once counted, and for a request that does not stream
        self.times: Optional[tuple] = None
        # return_token_ids: the ids of the tokens whose text is posted and not sent yet (they go out as output_ids
        # with it); [-1] on a request its engine cannot continue elsewhere (the front end then never moves it);
        # None for a request that did not ask
        self.ids: Optional[list] = None
