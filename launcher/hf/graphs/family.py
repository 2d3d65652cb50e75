"""What every CUDA graph family of the hf engine shares: capturing a graph, replaying it, and turning the family off
when a capture fails (fatal with tp > 1).  The families (decode.py, prompt.py, mixed.py) say which shapes they
capture and how a step is padded into one; this module is the one place that touches torch.cuda.CUDAGraph, so the
capture rules (warm-up runs, the shared memory pool, the capture mode beside NCCL's watchdog) hold for all of them.
"""

from __future__ import annotations

import logging

from launcher.hf.attention import StepContext, tls
from launcher.hf.step import StepInputs, cache_rows

log = logging.getLogger("launcher.hf.graphs")  # one logger for every family, the package's


class Captured:
    """One captured graph: the graph, its output, and every tensor it reads (they must outlive it: a freed input's
    memory would be reused under it); `meta` and `keep` are the first two of them."""

    __slots__ = ("graph", "logits", "buffers", "meta", "keep")

    def __init__(self, graph, logits, buffers: tuple):
        self.graph, self.logits, self.buffers = graph, logits, buffers
        self.meta, self.keep = buffers[0], buffers[1]


class GraphFamily:
    """The CUDA graphs of one kind of step of a runner (HFModelRunner), keyed by their padded shape.  A subclass
    defines buffers, body, key_for, load, turn_off and, where it picks rows otherwise, outputs; and which shapes it
    captures at start (its capture_all, which hands them to `capture_each`)."""

    kind = ""  # HFModelRunner.last_graph after one of these replayed
    label = ""  # its name in messages (kind where empty)
    fallback = ""  # what runs instead once a capture failed (for the log)
    reads_host_tokens = False  # the graph takes its tokens from the host only, not from the step before (launch, prev)

    def __init__(self, runner):
        self.runner = runner
        self.graphs: dict = {}  # key -> Captured, in capture order
        self.error = ""  # why a capture failed; "" while none did
        # tests without a GPU: a key that key_for gives without a graph runs `body` eagerly, as a capture records it
        self.stand_in = False

    # -- what a family defines --------------------------------------------------------------------------------
    def buffers(self, key) -> tuple:
        """(meta, keep, any other tensor `body` reads) of graph `key`, on the device, holding a padding-only step."""
        raise NotImplementedError

    def body(self, key, meta, keep, *rest):
        """Logits of the padded step of graph `key` whose inputs are the buffers (what the graph holds)."""
        raise NotImplementedError

    def key_for(self, step: StepInputs):
        """The key of the graph that runs `step`, or None (not a step of this family, or none captured fits)."""
        raise NotImplementedError

    def load(self, step: StepInputs, key, ids, meta, keep, *rest):
        """Write `step`'s inputs into graph `key`'s buffers (`buffers`' tensors); returns what `outputs` picks the
        step's rows with.  ids: the decode tokens as a device tensor (HFModelRunner.launch), in place of
        step.decode_tokens."""
        raise NotImplementedError

    def outputs(self, logits, step: StepInputs, picked):
        """The step's output rows of the graph's logits."""
        return logits.index_select(0, picked)

    def turn_off(self) -> None:
        """After a failed capture: stop offering steps to these graphs (and to the ones that depend on them)."""
        raise NotImplementedError

    # -- shared -----------------------------------------------------------------------------------------------
    def replay(self, step: StepInputs, key, ids=None):
        """Logits [output rows, vocab] of `step` through graph `key` (captured now where it is not yet), or None
        when that capture fails (then run the step eagerly)."""
        entry = self.graphs.get(key)
        if entry is None:
            if self.stand_in:
                buffers = self.buffers(key)
                picked = self.load(step, key, ids, *buffers)
                return self.outputs(self.body(key, *buffers), step, picked)
            entry = self.capture(key)
            if entry is None:
                return None
        picked = self.load(step, key, ids, *entry.buffers)
        entry.graph.replay()
        return self.outputs(entry.logits, step, picked)

    def capture_each(self, keys) -> bool:
        """Capture every graph of `keys` not captured yet; False once one fails (the family is off then)."""
        for key in keys:
            if key not in self.graphs and self.capture(key) is None:
                return False
        return True

    def capture(self, key):
        """The Captured graph `key`, or None if the capture fails: then `failed` turns the family off."""
        try:
            buffers = self.buffers(key)
            graph, logits = self._capture_graph(lambda: self.body(key, *buffers))
        except Exception as e:  # a model whose forward cannot be captured still serves, eagerly
            self.failed(e)
            return None
        entry = self.graphs[key] = Captured(graph, logits, buffers)
        log.debug("hf engine: captured %s graph %s", self.label or self.kind, key)
        return entry

    def failed(self, exc: Exception) -> None:
        """A capture raised `exc`: fatal with tp > 1 (see launcher.hf.graphs' doc), else the family turns off."""
        r, label = self.runner, self.label or self.kind
        if r.tp > 1:
            raise RuntimeError(
                f"tp={r.tp}, rank {r.tp_group.rank}: capturing a {label} CUDA graph failed "
                f"({type(exc).__name__}: {exc}); the ranks cannot fall back to eager steps one by "
                f"one, so set engine.cuda_graphs=false"
            ) from exc
        self.error = f"{type(exc).__name__}: {exc}"
        self.turn_off()
        log.warning("hf engine: %s CUDA graph capture failed (%s); %s", label, self.error, self.fallback)

    def _capture_graph(self, body):
        """(graph, its output) of `body()` captured after two warm-up runs on a side stream (lazy inits, the
        allocator, cuDNN's plan); every graph of the runner shares one memory pool (they replay one at a time)."""
        import torch

        r = self.runner
        dev = r.device
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        # tp > 1: torch's NCCL watchdog thread queries the events of earlier collectives; in the default ("global")
        # capture mode such a call from another thread during a capture is an error, so only this thread is
        # checked, and the device is idle (no collective left for the watchdog) before the capture starts
        mode = "thread_local" if r.tp > 1 else "global"
        with r.capture_backends():  # the same kernels for the warm-up and the capture
            with torch.cuda.stream(side):
                for _ in range(2):
                    body()
            torch.cuda.current_stream(dev).wait_stream(side)
            if r.tp > 1:
                torch.cuda.synchronize(dev)
            if r.graph_pool is None:
                r.graph_pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=r.graph_pool, capture_error_mode=mode):
                out = body()
        return graph, out

    def _forward_meta(self, ctx: StepContext, meta, keep):
        """Logits of `keep` for a graph's inputs: `meta` rows ids, positions, slots (each token's cache row, through the
        slot's block table, set in ctx.flat_idx here), `ctx` the rest of the step's attention context."""
        import torch

        r = self.runner
        heads = torch.arange(r.num_kv_heads, device=r.device)
        ctx.flat_idx = (
            cache_rows(r.block_table, meta[2], meta[1], r.block_size)[:, None] * r.num_kv_heads + heads[None, :]
        ).reshape(-1)
        ctx.table, ctx.block_size = r.block_table, r.block_size
        tls.ctx, tls.cache = ctx, r.cache
        try:
            return r.model_forward(meta[0:1], meta[1:2], keep)
        finally:
            tls.ctx = None
