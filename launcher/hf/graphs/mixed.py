"""The mixed graphs of the hf engine: decode rows and whole prompts in one step.

Their own module: the one family that combines two layouts (the decode graphs' rows, then packed prompts under a
block-diagonal mask) and is offered only beside the decode graphs it extends (tp = 1).
"""

from __future__ import annotations

import logging
import time

from launcher.hf.attention import StepContext, set_decode_lengths
from launcher.hf.graphs.buckets import mixed_buckets
from launcher.hf.graphs.decode import DecodeGraphs
from launcher.hf.graphs.family import GraphFamily
from launcher.hf.paged_prefill import max_tiles, packed, tiles as prefill_tiles
from launcher.hf.step import StepInputs
from launcher.stage import announce

log = logging.getLogger("launcher.hf.graphs")  # one logger for every family, the package's


class MixedGraphs(GraphFamily):
    """Steps of decode rows and whole prompts together.  Why: a prompt that arrives while others decode went through
    its prompt graph (or a wave graph) in a step of its own, and every decoding row waited that step: on an H100,
    ~2.2-3.8 ms for a 1 B model's 128-token prompt beside ~3 ms decode steps at 128 rows.  Through a server, closed
    loops hand the engine their successors scattered, so 10-11% of its steps at 128 streams were such steps, more
    than in-process; an eager step with prompts and decode rows costs ~10 ms of kernel launches instead.
    A mixed graph runs both in one step: the decode rows as in a decode graph of (rows, length), then up to PROMPTS
    whole prompts packed into `tokens` (a power of two up to the limit), each causal over its own tokens through one
    attention call with a block-diagonal mask.  The prompt tokens cost the decode step little (its matrix products
    read the weights once for all rows).  Padding: decode rows as in a decode graph (the spare slot); packed tokens
    past the prompts write to the spare slot, form a segment of their own, and their logits are dropped.  Graphs:
    one per decode bucket and packed size, captured at start after the prompt graphs; a failed capture leaves
    prompts to take steps of their own.

    With the paged prefill kernel (a GPU where it passed its check at start, launcher.hf.paged_prefill) the packed
    prompts attend through it instead, over their slots' blocks, so a prompt may start anywhere: one whose prefix
    came from the prefix cache (or a long prompt's last chunk) goes through the graph as a whole prompt does, and
    so do steps of such prompts without decode rows (the smallest decode bucket, all padding): they ran eagerly
    before, kernel launches from Python that took back what the cache saved.  Padded tokens then are in no tile
    of the kernel (their attention is zeros)."""

    kind, fallback = "mixed", "prompts take steps of their own"
    PROMPTS = 8  # the most prompts beside the decode rows (logits rows kept for prompts)

    def __init__(self, runner, decode: DecodeGraphs, limit: int):
        super().__init__(runner)
        self.decode = decode  # its buckets are the decode rows' buckets
        self.limit = limit  # the most prompt tokens beside the decode rows (0: none)

    def capture_all(self) -> int:
        """Capture the mixed graph of every decode bucket captured and packed size; returns the number of graphs."""
        import torch

        if not self.runner.use_graphs or self.limit <= 0 or not self.decode.graphs:
            self.limit = 0
            return 0
        keys = [
            (rows, length, tokens)
            for rows, length in sorted(self.decode.graphs)
            for tokens in mixed_buckets(self.limit)
        ]
        announce(
            f"hf engine: capturing {len(keys)} mixed CUDA graphs (decode rows with up to {self.PROMPTS} "
            f"prompts of {self.limit} tokens in all)"
        )
        t0 = time.perf_counter()
        with torch.inference_mode():
            if not self.capture_each(keys):
                return 0
        log.info(
            "hf engine: %d mixed graphs (packed prompt tokens %s) captured in %.1f s",
            len(self.graphs),
            mixed_buckets(self.limit),
            time.perf_counter() - t0,
        )
        return len(self.graphs)

    @property
    def paged(self) -> bool:
        """The prompts attend through the paged prefill kernel (and may start anywhere)."""
        return self.runner.prefill_kernel is not None

    @property
    def any_start(self) -> bool:
        """Would prompts that start part-way go through these graphs (with decode rows or without)?"""
        return self.paged and self.limit > 0 and (bool(self.graphs) or self.stand_in)

    def fits(self, lengths: list[int]) -> bool:
        """Would whole prompts of these lengths go beside decode rows through a mixed graph?"""
        return (bool(self.graphs) or self.stand_in) and 0 < len(lengths) <= self.PROMPTS and sum(lengths) <= self.limit

    def key_for(self, step: StepInputs):
        """The mixed graph (rows, length, tokens) that runs `step`, or None: decode rows and whole prompts, each
        sampled, that fit one; with the paged kernel prompts that start anywhere too, and where one of them starts
        part-way, without decode rows (whole prompts alone are the prompt and wave graphs' steps)."""
        if not (self.graphs or self.stand_in) or not step.prefill:
            return None
        part_way = any(c.start != 0 for c in step.prefill)
        if (part_way and not self.paged) or not (step.decode_tokens or part_way):
            return None
        if not all(c.sample for c in step.prefill) or not self.fits([c.length for c in step.prefill]):
            return None
        if max(step.decode_positions, default=0) >= self.decode.longest:
            return None
        rows, length = self.decode.bucket(
            max(step.decode_slots, default=0) + 1, max(step.decode_positions, default=0) + 1
        )
        total = sum(c.length for c in step.prefill)
        tokens = next(b for b in mixed_buckets(self.limit) if b >= total)
        key = (rows, length, tokens)
        return key if key in self.graphs or self.stand_in else None

    def inputs(self, step: StepInputs, rows: int, tokens: int) -> tuple[list[list[int]], list[int], list[int]]:
        """(meta rows [ids, positions, slots, decode lengths / prompt segments] of rows + tokens entries, the kept
        token of each of the graph's rows + PROMPTS logits rows, the rows of those logits that are this step's
        output rows, in its order: decode rows, then prompts)."""
        spare = self.runner.max_num_seqs
        ids, pos, slot, extra = self.decode.layout(step, rows)
        out = list(step.decode_slots)
        keep = list(range(rows))
        ids.extend(step.prefill_tokens)
        offset = 0
        for i, c in enumerate(step.prefill):
            pos.extend(range(c.start, c.start + c.length))
            slot.extend([c.slot] * c.length)
            extra.extend([i] * c.length)
            offset += c.length
            keep.append(rows + offset - 1)
            out.append(rows + i)
        pad = tokens - offset
        ids.extend([0] * pad)
        pos.extend(range(offset, tokens))  # any position in the cache row; the spare slot's
        slot.extend([spare] * pad)
        extra.extend([-1] * pad)  # a segment of their own: they attend to one another only
        keep.extend([rows + tokens - 1] * (self.PROMPTS - len(step.prefill)))
        return [ids, pos, slot, extra], keep, out

    def buffers(self, key) -> tuple:
        import torch

        rows, _, tokens = key
        dev = self.runner.device
        meta = torch.zeros(4, rows + tokens, dtype=torch.long, device=dev)
        meta[2].fill_(self.runner.max_num_seqs)
        meta[3, :rows].fill_(1)
        meta[3, rows:].fill_(-1)
        meta[1, rows:].copy_(torch.arange(tokens, device=dev))
        keep = torch.cat([torch.arange(rows, device=dev), torch.full((self.PROMPTS,), rows + tokens - 1, device=dev)])
        # the paged kernel's tiles (first row, rows): a fixed grid, tiles past the prompts' unused
        tiles = torch.zeros(2, max_tiles(tokens, self.PROMPTS, self.runner.prefill_tile), dtype=torch.long, device=dev)
        return meta, keep, tiles

    def body(self, key, meta, keep, tiles):
        """The padded mixed step: logits [rows + PROMPTS, vocab] of `keep`."""
        import torch

        rows, length, tokens = key
        r = self.runner
        dev = r.device
        ctx = StepContext()
        ctx.n_dec, ctx.dec_rows, ctx.dec_len, ctx.dec_scatter = rows, rows, length, None
        set_decode_lengths(ctx, meta[3, :rows], length, r.decode_kernel, r.dtype, dev)
        if self.paged:  # each prompt token over its slot's blocks, up to its position
            ctx.paged = (r.prefill_kernel, meta[2], meta[1], tiles[0], tiles[1])
        else:  # each prompt causal over its own tokens, under a block-diagonal mask
            seg = meta[3, rows:]
            idx = torch.arange(tokens, device=dev)
            allowed = (seg[:, None] == seg[None, :]) & (idx[None, :] <= idx[:, None])
            ctx.packed = (
                rows,
                tokens,
                torch.zeros(tokens, tokens, dtype=r.dtype, device=dev).masked_fill_(~allowed, float("-inf")),
            )
        ctx.eager, ctx.chunks, ctx.groups = r.eager, [], []
        return self._forward_meta(ctx, meta, keep)

    def load(self, step: StepInputs, key, ids, meta, keep, tiles):
        """Its prompt tokens come from the host, its decode tokens may follow on the device (ids)."""
        import torch

        rows, _, tokens = key
        values, kept, out = self.inputs(step, rows, tokens)
        n_tiles = tiles.shape[1]
        first, count = [], []
        if self.paged:
            chunks = packed((c.length for c in step.prefill), rows)
            first, count = prefill_tiles(chunks, self.runner.prefill_tile, n_tiles)
        width = max(rows + tokens, n_tiles)
        host = torch.tensor([v + [0] * (width - len(v)) for v in values + [kept, out, first, count]], dtype=torch.long)
        dev = host.to(self.runner.device, non_blocking=True)
        meta.copy_(dev[:4, : rows + tokens])
        keep.copy_(dev[4, : len(kept)])
        if self.paged:
            tiles.copy_(dev[6:8, :n_tiles])
        if ids is not None:
            meta[0].index_copy_(0, dev[5, : len(step.decode_tokens)], ids.to(torch.long))
        return dev[5, : len(out)]

    def turn_off(self) -> None:
        self.limit = 0
        self.graphs.clear()
