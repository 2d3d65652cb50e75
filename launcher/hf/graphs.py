"""CUDA graphs of the `hf` engine's steps: one abstraction, four families.

Why graphs: a step run eagerly is kernel launches from Python (a decode step of a 1 B model launches ~20 kernels
per layer; on the H100 host that cost ~15 ms per step whatever the batch, the GPU idle).  Replaying a captured graph
launches them all at once.  A graph has static shapes, so a step is padded to a bucket; padded tokens write their
keys/values to a spare cache slot nobody reads (slot max_num_seqs) and their logits are dropped.

A `GraphFamily` is one kind of step with its graphs: which shapes it captures (its `capture_all`), the static input
buffers of one shape (`buffers`: `meta`, the per-token rows a replay fills in, and `keep`, the token rows whose
logits come out), the padded step a graph holds (`body`: everything computed from the buffers, so a replay sees the
new step), when a step replays one of its graphs (`key_for`), and how a step's inputs go in (`load`) and its logits
come out (`outputs`).  Capture, replay and what a failed capture turns off are shared:

* DecodeGraphs: decode-only steps;
* PromptGraphs: steps of one whole prompt, and WaveGraphs: steps of several (they share the prompt-graph limit);
* MixedGraphs: decode rows and whole prompts in one step.

Every graph of a runner shares one memory pool (they replay one at a time), and is captured at start (`warm_up`),
so that serving never stalls on a capture (~0.1 s each, and a capture mid-run delays every running request).

tp > 1: a graph holds the layers' NCCL all-reduces, so each rank's replay meets its peers' replays of the same
graph.  Every rank captures the same buckets in the same order in `warm_up` (the leader's plan) and picks graph or
eager for a step by the same rule (HFModelRunner._replay, from the broadcast StepInputs alone); a capture that fails
is fatal there (a rank falling back to eager steps alone would hang its peers).
"""

from __future__ import annotations

import logging
import time

from launcher.hf.attention import StepContext, decode_mask, tls
from launcher.hf.step import StepInputs
from launcher.stage import announce

log = logging.getLogger(__name__)


def token_limit(value, name: str, default: int, meaning: str) -> int:
    """A runner's token-count setting: `value`, else `default`; a negative one is refused naming the setting and
    what it means."""
    if value is None:
        value = default
    if int(value) < 0:
        raise ValueError(f"{name}={value} is negative: {meaning}")
    return int(value)


def prefill_buckets(limit: int) -> list[int]:
    """Padded prompt lengths up to `limit`: 16, 24, 32, 48, 64, 96, ... (each <= 1.5x the one before), and
    `limit` itself last, so a prompt pads by less than half its length."""
    out, n = [], 16
    while n < limit:
        out.append(n)
        n = n * 3 // 2 if (n & (n - 1)) == 0 else n * 4 // 3  # 16 -> 24 -> 32 -> 48 -> 64 ...
    if limit > 0:
        out.append(limit)
    return out


def mixed_buckets(limit: int) -> list[int]:
    """Packed prompt sizes of the mixed graphs for a limit of `limit` tokens: 32, 64, ... and `limit` last."""
    out, n = [], 32
    while n < limit:
        out.append(n)
        n *= 2
    if limit > 0:
        out.append(limit)
    return out


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

    def load(self, step: StepInputs, key, ids, meta, keep):
        """Write `step`'s inputs into graph `key`'s buffers; returns what `outputs` picks the step's rows with.
        ids: the decode tokens as a device tensor (HFModelRunner.launch), in place of step.decode_tokens."""
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
                picked = self.load(step, key, ids, buffers[0], buffers[1])
                return self.outputs(self.body(key, *buffers), step, picked)
            entry = self.capture(key)
            if entry is None:
                return None
        picked = self.load(step, key, ids, entry.meta, entry.keep)
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
        """A capture raised `exc`: fatal with tp > 1 (see the module's doc), else the family turns off."""
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
        """Logits of `keep` for a graph's inputs: `meta` rows ids, positions, slots (each token's cache row, set in
        ctx.flat_idx here), `ctx` the rest of the step's attention context."""
        import torch

        r = self.runner
        heads = torch.arange(r.num_kv_heads, device=r.device)
        ctx.flat_idx = (
            (meta[2][:, None] * r.num_kv_heads + heads[None, :]) * r.max_model_len + meta[1][:, None]
        ).reshape(-1)
        tls.ctx, tls.cache = ctx, r.cache
        try:
            return r.model_forward(meta[0:1], meta[1:2], keep)
        finally:
            tls.ctx = None


class DecodeGraphs(GraphFamily):
    """Decode-only steps.  A step is padded to a bucket (rows, length): R rows (one per cache slot 0..R-1, R = the
    power of two >= the highest decoding slot + 1) attending over L positions (a power of two from 256, >= the
    longest sequence).  Row r carries the token of the sequence in slot r; rows of idle slots carry a dummy token
    that writes its keys/values to the spare slot and attends to one position, and their logits are dropped.  A
    bucket not captured at start is captured when a step first needs it; a failed capture turns graphs off."""

    kind, fallback = "decode", "decode steps run eagerly"
    MIN_LEN = 256  # the shortest length bucket

    def bucket(self, rows: int, length: int) -> tuple[int, int]:
        r = 1
        while r < rows:
            r *= 2
        n = self.MIN_LEN
        while n < length:
            n *= 2
        return min(r, self.runner.max_num_seqs), min(n, self.runner.max_model_len)

    def capture_all(self) -> int:
        """Capture every decode bucket now; returns the number of graphs."""
        import torch

        r = self.runner
        if not r.use_graphs:
            return 0
        rows = sorted({self.bucket(n, 1)[0] for n in range(1, r.max_num_seqs + 1)})
        lengths, n = [], self.MIN_LEN
        while True:
            lengths.append(min(n, r.max_model_len))
            if n >= r.max_model_len:
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

        rows, length = key
        dev = self.runner.device
        meta = torch.zeros(4, rows, dtype=torch.long, device=dev)  # ids, positions, slots, lengths
        meta[2].fill_(self.runner.max_num_seqs)
        meta[3].fill_(1)
        heads = torch.arange(self.runner.num_kv_heads, device=dev)
        span = torch.arange(length, device=dev)
        keep = torch.arange(rows, device=dev)  # every row's logits (a tensor, as in mixed steps: one compiled form)
        return meta, keep, heads, span

    def body(self, key, meta, keep, heads, span):
        r = self.runner
        rows, length = key
        ctx = StepContext()
        ctx.n_dec, ctx.dec_rows, ctx.dec_len = rows, rows, length
        ctx.eager, ctx.dec_scatter, ctx.chunks, ctx.groups = r.eager, None, [], []
        # index tensors are computed inside the graph, from `meta`, so a replay sees the new step
        ctx.flat_idx = (
            (meta[2][:, None] * r.num_kv_heads + heads[None, :]) * r.max_model_len + meta[1][:, None]
        ).reshape(-1)
        ctx.dec_mask = decode_mask(meta[3], span, r.dtype, r.device)
        tls.ctx, tls.cache = ctx, r.cache
        try:
            return r.model_forward(meta[0:1], meta[1:2], keep)
        finally:
            tls.ctx = None

    def load(self, step: StepInputs, key, ids, meta, keep):
        import torch

        meta.copy_(torch.tensor(self.layout(step, key[0]), dtype=torch.long), non_blocking=True)
        picked = torch.tensor(step.decode_slots, dtype=torch.long).to(self.runner.device, non_blocking=True)
        if ids is not None:
            meta[0].index_copy_(0, picked, ids)
        return picked

    def turn_off(self) -> None:
        self.runner.use_graphs = False


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
        ctx.chunks = [(0, 0, 0, key, None)]  # one first chunk: causal attention over its own tokens
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
    (hf_attention's groups).  The decode rows wait that step (Engine._prompt_wave)."""

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
    prompts to take steps of their own."""

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

    def fits(self, lengths: list[int]) -> bool:
        """Would whole prompts of these lengths go beside decode rows through a mixed graph?"""
        return (bool(self.graphs) or self.stand_in) and 0 < len(lengths) <= self.PROMPTS and sum(lengths) <= self.limit

    def key_for(self, step: StepInputs):
        """The mixed graph (rows, length, tokens) that runs `step`, or None: decode rows and whole prompts, each
        sampled, that fit one."""
        if not (self.graphs or self.stand_in) or not step.decode_tokens or not step.prefill:
            return None
        if any(c.start != 0 or not c.sample for c in step.prefill):
            return None
        if not self.fits([c.length for c in step.prefill]):
            return None
        rows, length = self.decode.bucket(max(step.decode_slots) + 1, max(step.decode_positions) + 1)
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
            pos.extend(range(c.length))
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
        return meta, keep

    def body(self, key, meta, keep):
        """The padded mixed step: logits [rows + PROMPTS, vocab] of `keep`."""
        import torch

        rows, length, tokens = key
        r = self.runner
        dev = r.device
        ctx = StepContext()
        ctx.n_dec, ctx.dec_rows, ctx.dec_len, ctx.dec_scatter = rows, rows, length, None
        ctx.dec_mask = decode_mask(meta[3, :rows], torch.arange(length, device=dev), r.dtype, r.device)
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

    def load(self, step: StepInputs, key, ids, meta, keep):
        """Its prompt tokens come from the host, its decode tokens may follow on the device (ids)."""
        import torch

        rows, _, tokens = key
        values, kept, out = self.inputs(step, rows, tokens)
        width = rows + tokens
        host = torch.tensor(
            values + [kept + [0] * (width - len(kept)), out + [0] * (width - len(out))], dtype=torch.long
        )
        dev = host.to(self.runner.device, non_blocking=True)
        meta.copy_(dev[:4])
        keep.copy_(dev[4, : len(kept)])
        if ids is not None:
            meta[0].index_copy_(0, dev[5, : len(step.decode_tokens)], ids.to(torch.long))
        return dev[5, : len(out)]

    def turn_off(self) -> None:
        self.limit = 0
        self.graphs.clear()
