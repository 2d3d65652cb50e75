"""The decode graphs of the hf engine: decode-only steps padded to a (rows, length) bucket.

Their own module: the family every decode-only step replays, and the one the mixed graphs build on (MixedGraphs
takes its buckets and row layout from DecodeGraphs).
"""

from __future__ import annotations

import logging
import time

from launcher.hf.attention import StepContext, set_decode_lengths, tls
from launcher.hf.graphs.family import GraphFamily
from launcher.hf.step import StepInputs, cache_rows
from launcher.stage import announce

log = logging.getLogger("launcher.hf.graphs")  # one logger for every family, the package's


class DecodeGraphs(GraphFamily):
    """Decode-only steps.  A step is padded to a bucket (rows, length): R rows (one per slot 0..R-1, R = the
    power of two >= the highest decoding slot + 1) attending over L positions (a power of two from 256, >= the
    longest sequence, at most MAX_LEN).  Row r carries the token of the sequence in slot r; rows of idle slots carry a dummy token
    that writes its keys/values to the spare slot and attends to one position, and their logits are dropped.  A
    bucket not captured at start is captured when a step first needs it; a failed capture turns graphs off."""

    kind, fallback = "decode", "decode steps run eagerly"
    MIN_LEN = 256  # the shortest length bucket
    # the longest: a step attending further runs eagerly (each bucket is a graph per row count, and a longer one
    # costs the attention more than its launches)
    MAX_LEN = 16384

    @property
    def longest(self) -> int:
        return min(self.MAX_LEN, self.runner.max_model_len)

    def bucket(self, rows: int, length: int) -> tuple[int, int]:
        r = 1
        while r < rows:
            r *= 2
        n = self.MIN_LEN
        while n < length:
            n *= 2
        return min(r, self.runner.max_num_seqs), min(n, self.longest)

    def capture_all(self) -> int:
        """Capture every decode bucket now; returns the number of graphs."""
        import torch

        r = self.runner
        if not r.use_graphs:
            return 0
        rows = sorted({self.bucket(n, 1)[0] for n in range(1, r.max_num_seqs + 1)})
        lengths, n = [], self.MIN_LEN
        while True:
            lengths.append(min(n, self.longest))
            if n >= self.longest:
                break
            n *= 2
        announce(f"hf engine: capturing {len(rows) * len(lengths)} decode CUDA graphs")
        t0 = time.perf_counter()
        with torch.inference_mode():
            if not self.capture_each([(n, length) for length in lengths for n in rows]):
                return 0
        log.info(
            "hf engine: %d decode graphs (rows %s x lengths %s) captured in %.1f s",
            len(self.graphs),
            rows,
            lengths,
            time.perf_counter() - t0,
        )
        return len(self.graphs)

    def key_for(self, step: StepInputs):
        if not self.runner.use_graphs or not step.decode_tokens or step.prefill:
            return None
        if max(step.decode_positions) >= self.longest:
            return None
        return self.bucket(max(step.decode_slots) + 1, max(step.decode_positions) + 1)

    def layout(self, step: StepInputs, rows: int) -> list[list[int]]:
        """[ids, positions, slots, lengths] of a step's decode rows placed on their slot's row of a graph of `rows`
        rows; the rows between them are padding (the spare slot, one position attended: no NaN)."""
        spare = self.runner.max_num_seqs
        ids, pos, slot, lens = [0] * rows, [0] * rows, [spare] * rows, [1] * rows
        for s, t, p in zip(step.decode_slots, step.decode_tokens, step.decode_positions):
            ids[s], pos[s], slot[s], lens[s] = t, p, s, p + 1
        return [ids, pos, slot, lens]

    def buffers(self, key) -> tuple:
        import torch

        rows, _ = key
        dev = self.runner.device
        meta = torch.zeros(4, rows, dtype=torch.long, device=dev)  # ids, positions, slots, lengths
        meta[2].fill_(self.runner.max_num_seqs)
        meta[3].fill_(1)
        heads = torch.arange(self.runner.num_kv_heads, device=dev)
        keep = torch.arange(rows, device=dev)  # every row's logits (a tensor, as in mixed steps: one compiled form)
        return meta, keep, heads

    def body(self, key, meta, keep, heads):
        r = self.runner
        rows, length = key
        ctx = StepContext()
        ctx.n_dec, ctx.dec_rows, ctx.dec_len = rows, rows, length
        ctx.eager, ctx.dec_scatter, ctx.chunks, ctx.groups = r.eager, None, [], []
        # index tensors are computed inside the graph, from `meta`, so a replay sees the new step
        ctx.flat_idx = (
            cache_rows(r.block_table, meta[2], meta[1], r.block_size)[:, None] * r.num_kv_heads + heads[None, :]
        ).reshape(-1)
        set_decode_lengths(ctx, meta[3], length, r.decode_kernel, r.dtype, r.device)
        ctx.table, ctx.block_size = r.block_table, r.block_size
        tls.ctx, tls.cache = ctx, r.cache
        try:
            return r.model_forward(meta[0:1], meta[1:2], keep)
        finally:
            tls.ctx = None

    def load(self, step: StepInputs, key, ids, meta, keep, heads):
        import torch

        meta.copy_(torch.tensor(self.layout(step, key[0]), dtype=torch.long), non_blocking=True)
        picked = torch.tensor(step.decode_slots, dtype=torch.long).to(self.runner.device, non_blocking=True)
        if ids is not None:
            meta[0].index_copy_(0, picked, ids)
        return picked

    def turn_off(self) -> None:
        self.runner.use_graphs = False
