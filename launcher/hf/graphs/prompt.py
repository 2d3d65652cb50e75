"""The prompt graphs of the hf engine: steps of whole prompts only, one (PromptGraphs) or several (WaveGraphs).

One module for both: they pad a prompt the same way (a row of its own, padded after its last token), share one limit
on prompt length, are captured together and are turned off together when a capture of either fails.
"""

from __future__ import annotations

import logging
import time

from launcher.hf.attention import StepContext
from launcher.hf.graphs.buckets import prefill_buckets
from launcher.hf.graphs.family import GraphFamily
from launcher.hf.step import StepInputs
from launcher.stage import announce

log = logging.getLogger("launcher.hf.graphs")  # one logger for every family, the package's


class _PromptRows(GraphFamily):
    """Graphs of whole prompts only: n rows of `length` tokens, prompt i in row i padded after its last token (a
    padded token sits after every real one of its row, so causality hides it from them; its keys/values go to the
    spare slot), each row's last real token's logits kept.  A failed capture drops every prompt and wave graph and
    prompt steps run eagerly (decode graphs stay)."""

    reads_host_tokens = True
    fallback = "prompt steps run eagerly"

    def rows(self, key) -> tuple[int, int]:
        """(rows, length) of graph `key`."""
        raise NotImplementedError

    def buffers(self, key) -> tuple:
        import torch

        n, length = self.rows(key)
        dev = self.runner.device
        meta = torch.zeros(3, n * length, dtype=torch.long, device=dev)  # ids, positions, slots
        meta[1].copy_(torch.arange(length, device=dev).repeat(n))
        meta[2].fill_(self.runner.max_num_seqs)
        keep = torch.arange(1, n + 1, device=dev) * length - 1
        return meta, keep

    def turn_off(self) -> None:
        prompts = self.prompts
        prompts.limit = 0
        prompts.graphs.clear()
        prompts.waves.graphs.clear()


class PromptGraphs(_PromptRows):
    """Steps of one whole prompt and nothing else.  Why: a request that finds the engine idle (low load: every
    request at concurrency 1) gets its first token from a step that prefills its prompt alone.  Run eagerly that
    step is kernel launches from Python (~290 kernels compiled, ~700 not, ~25 us each on an H100 host) for a few ms
    of GPU work: most of the time to first token.  So it replays a graph: the prompt padded to a bucket B
    (prefill_buckets: 16, 24, 32, 48, ..., up to the engine's prompt chunk), causal attention over its own B tokens.
    A prompt's later chunk stays eager.  Captured at start, after the decode graphs."""

    kind = "prompt"

    def __init__(self, runner, limit: int):
        super().__init__(runner)
        self.prompts = self
        self.limit = limit  # the longest prompt (tokens) whose step replays a graph (0: none)
        self.waves = WaveGraphs(runner, self)

    def rows(self, key) -> tuple[int, int]:
        return 1, key

    def capture_all(self, max_prefill_tokens: int | None = None) -> int:
        """Capture the prompt graph of every bucket up to min(limit, max_prefill_tokens, max_model_len), then the
        wave graphs within that limit.  Returns the number of graphs."""
        import torch

        r = self.runner
        limit = min(self.limit, max_prefill_tokens or self.limit, r.max_model_len)
        if not r.use_graphs or limit <= 0:
            self.limit = 0
            return 0
        buckets = prefill_buckets(limit)
        waves = self.waves.keys(limit)
        announce(
            f"hf engine: capturing {len(buckets)} prompt CUDA graphs (prompts up to {limit} tokens)"
            + (f" and {len(waves)} wave graphs (2 to {max(n for n, _ in waves)} prompts)" if waves else "")
        )
        t0 = time.perf_counter()
        with torch.inference_mode():
            if not self.capture_each(buckets) or not self.waves.capture_each(waves):
                return 0
        self.limit = limit
        log.info(
            "hf engine: %d prompt graphs (lengths %s) and %d wave graphs (prompts x length %s) captured in %.1f s",
            len(self.graphs),
            buckets,
            len(self.waves.graphs),
            waves,
            time.perf_counter() - t0,
        )
        return len(self.graphs) + len(self.waves.graphs)

    def graphed(self, length: int) -> bool:
        """Would a step of one whole prompt of `length` tokens (and nothing else) replay a prompt graph?"""
        return bool(self.graphs) and length <= self.limit

    def key_for(self, step: StepInputs):
        """The bucket whose graph runs `step`, or None: a step of one whole prompt, no decode rows."""
        if not self.graphs or step.decode_tokens or len(step.prefill) != 1:
            return None
        c = step.prefill[0]
        if c.start != 0 or not c.sample or not self.graphed(c.length):
            return None
        return next((b for b in self.graphs if b >= c.length), None)  # captured shortest first

    def inputs(self, step: StepInputs, length: int) -> tuple[list[list[int]], int]:
        """(meta rows [ids, positions, slots] of `length` tokens, kept row) of a one-prompt step padded to a bucket:
        padded tokens (id 0) continue the positions and write to the spare slot; the kept row is the last real."""
        c = step.prefill[0]
        pad = length - c.length
        return (
            [
                list(step.prefill_tokens) + [0] * pad,
                list(range(length)),
                [c.slot] * c.length + [self.runner.max_num_seqs] * pad,
            ],
            c.length - 1,
        )

    def body(self, key, meta, keep):
        """The padded one-prompt step: logits [1, vocab] of row keep[0]."""
        ctx = StepContext()
        ctx.n_dec, ctx.dec_rows, ctx.dec_len, ctx.dec_mask, ctx.dec_scatter = 0, 0, 0, None, None
        ctx.eager, ctx.groups = self.runner.eager, []
        ctx.chunks = [(0, key)]  # one first chunk: causal attention over its own tokens
        return self._forward_meta(ctx, meta, keep)

    def load(self, step: StepInputs, key, ids, meta, keep):
        import torch

        rows, last = self.inputs(step, key)
        meta.copy_(torch.tensor(rows, dtype=torch.long), non_blocking=True)
        keep.fill_(last)

    def outputs(self, logits, step: StepInputs, picked):
        return logits


class WaveGraphs(_PromptRows):
    """Steps of several whole prompts (a wave).  Why: the closed loops of a benchmark, and clients that send in
    bursts, hand the engine many prompts at once (all the requests that ended in one step have their successors
    sent together).  More of them than Engine.PROMPTS_ALONE_MAX went in one eager step, kernel launches from
    Python; a wave of 8 prompts of 128 tokens came out of it 28 ms after it arrived, against 15 ms when the same
    prompts reached the engine one by one and went through their graphs alone.  So a step of n whole prompts
    replays a wave graph: n rows (ROWS; rows left over carry padding only) of L tokens each (a prefill_buckets
    length, n * L at most the prompt-graph limit), each row causal over its own tokens, as one padded group
    (launcher.hf.attention's groups).  The decode rows wait that step (Engine._prompt_wave)."""

    kind, label = "wave", "prompt wave"
    ROWS = (2, 4, 8, 16)  # prompts per wave graph

    def __init__(self, runner, prompts: PromptGraphs):
        super().__init__(runner)
        self.prompts = prompts  # their limit is the waves' limit

    def rows(self, key) -> tuple[int, int]:
        return key

    @property
    def captured_rows(self) -> tuple[int, ...]:
        """The prompts per wave graph captured (none: waves go eagerly)."""
        return tuple(sorted({n for n, _ in self.graphs}))

    def keys(self, limit: int) -> list[tuple[int, int]]:
        """(prompts, length) of every wave graph for a prompt-graph limit of `limit` tokens (no more prompts than
        there are cache slots)."""
        return [
            (n, length)
            for n in self.ROWS
            if n <= self.runner.max_num_seqs
            for length in prefill_buckets(limit)
            if n * length <= limit
        ]

    def key_of(self, lengths: list[int]) -> tuple[int, int] | None:
        """The wave graph that runs whole prompts of these lengths together, or None (none captured fits)."""
        if len(lengths) < 2 or not self.graphs:
            return None
        n = next((r for r in self.ROWS if r >= len(lengths)), None)
        longest = max(lengths)
        limit = self.prompts.limit
        if n is None or longest > limit:
            return None
        length = next((b for b in prefill_buckets(limit) if b >= longest), None)
        return (n, length) if (n, length) in self.graphs else None

    def key_for(self, step: StepInputs):
        """The wave graph that runs `step`, or None: a step of whole prompts only, all of them sampled."""
        if not self.prompts.graphs or step.decode_tokens or len(step.prefill) < 2:
            return None
        if any(c.start != 0 or not c.sample for c in step.prefill):
            return None
        return self.key_of([c.length for c in step.prefill])

    def inputs(self, step: StepInputs, n: int, length: int) -> tuple[list[list[int]], list[int]]:
        """(meta rows [ids, positions, slots] of n x length tokens, the kept token row of each of the n rows) of a
        step of whole prompts: prompt i in row i, padded (id 0, the spare slot) to `length`; rows past the prompts
        are padding only (kept row: their last, whose logits are dropped)."""
        spare = self.runner.max_num_seqs
        ids, slots, keep, offset = [], [], [], 0
        for i, c in enumerate(step.prefill):
            pad = length - c.length
            ids.extend(step.prefill_tokens[offset : offset + c.length])
            ids.extend([0] * pad)
            slots.extend([c.slot] * c.length + [spare] * pad)
            keep.append(i * length + c.length - 1)
            offset += c.length
        for i in range(len(step.prefill), n):
            ids.extend([0] * length)
            slots.extend([spare] * length)
            keep.append(i * length + length - 1)
        return [ids, list(range(length)) * n, slots], keep

    def body(self, key, meta, keep):
        """The padded wave step: logits [n, vocab] of the kept rows."""
        import torch

        n, length = key
        every = torch.arange(n * length, device=self.runner.device)  # one group of n rows, all of them kept
        ctx = StepContext()
        ctx.n_dec, ctx.dec_rows, ctx.dec_len, ctx.dec_mask, ctx.dec_scatter = 0, 0, 0, None, None
        ctx.eager, ctx.chunks = self.runner.eager, []
        ctx.groups = [(every, n, length, every, every)]
        return self._forward_meta(ctx, meta, keep)

    def load(self, step: StepInputs, key, ids, meta, keep):
        import torch

        rows, kept = self.inputs(step, *key)
        host = torch.tensor(rows + [kept + [0] * (len(rows[0]) - len(kept))], dtype=torch.long)
        meta.copy_(host[:3], non_blocking=True)
        keep.copy_(host[3, : len(kept)], non_blocking=True)

    def outputs(self, logits, step: StepInputs, picked):
        return logits[: len(step.prefill)]
