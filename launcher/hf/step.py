"""What one step of the `hf` engine runs, as plain data, and how an eager step is laid out for the model.

The scheduler (launcher/hf/engine.py) decides *what* runs in a step and describes it as a
`StepInputs` of plain Python lists; `HFModelRunner.execute(step)` runs it and
returns the sampled token per output row.  `StepInputs` holds no tensors and no
references to requests, so a tensor-parallel leader can broadcast it to worker
ranks that hold the same shard (`torch.distributed.broadcast_object_list`) and
every rank calls `execute` on the same object.

`prepare_step` turns a step into the model's inputs and the attention's `StepContext` (launcher.hf.attention): decode tokens
first, then prompt chunks, with prompt-starting chunks grouped for one padded attention call per group
(`group_first_chunks`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from launcher.hf.attention import StepContext, set_decode_lengths
from launcher.hf.paged_prefill import tiles


@dataclass
class PrefillChunk:
    slot: int  # cache slot of the sequence
    start: int  # position of the first token of the chunk (tokens before it are already cached)
    length: int  # tokens in the chunk
    sample: bool  # the chunk ends the prompt: compute logits of its last token and sample
    logprobs: int = -1  # >= 0: the log probability of each prompt token after its positions, and the top this many
    next_token: int = -1  # with logprobs, a chunk that does not end its prompt: the prompt's token after its last


@dataclass
class SamplingRows:
    """Per output row sampling settings (rows are: decode sequences in order, then prefill chunks with sample=True)."""

    slots: list[int] = field(default_factory=list)  # cache slot of each row (indexes per-slot penalty state)
    temperature: list[float] = field(default_factory=list)  # 0 = greedy
    top_k: list[int] = field(default_factory=list)  # 0 = off
    top_p: list[float] = field(default_factory=list)  # 1.0 = off
    uniform: list[float] = field(default_factory=list)  # one U(0,1] draw per row from the request's own RNG
    repetition_penalty: list[float] = field(default_factory=list)  # 1.0 = off
    presence_penalty: list[float] = field(default_factory=list)  # 0.0 = off
    frequency_penalty: list[float] = field(default_factory=list)  # 0.0 = off
    banned: list[tuple[int, int]] = field(
        default_factory=list
    )  # (row, token) pairs forced to -inf (min_length, bad words)
    any_sampling: bool = False  # some row has temperature > 0
    any_top: bool = False  # some row uses top_k or top_p
    any_penalty: bool = False  # some row uses a penalty
    logprobs: list[int] = field(default_factory=list)  # per row: -1, or its token's log prob and the top this many
    guided: list[int] = field(default_factory=list)  # rows whose tokens keep to a guide (launcher.hf.guided)
    guide_masks: bytes = b""  # their allowed-token bitmasks, one row of int32 words each, in `guided` order


@dataclass
class StepInputs:
    """Everything one step needs, as plain data (broadcastable to tensor-parallel workers)."""

    decode_slots: list[int]  # slot of each decode token (one per decoding sequence)
    decode_tokens: list[int]  # the token fed for each decode sequence
    decode_positions: list[int]  # its position (= tokens already cached for that slot)
    prefill: list[PrefillChunk]  # prompt chunks, in token order after the decode tokens
    prefill_tokens: list[int]  # the prompt tokens of all chunks, concatenated
    sampling: SamplingRows
    # Penalty bookkeeping: slots (re)starting a request that uses penalties, with the prompt tokens to count and the
    # tokens it generated before (a request preempted and computed again).
    penalty_resets: list[tuple[int, list[int], list[int]]] = field(default_factory=list)
    # Block tables (launcher.hf.blocks): (slot, from block index, the block ids from there on) for the slots whose
    # table changed, applied before the step runs (every rank applies the same, so their tables stay one)
    block_updates: list[tuple[int, int, list[int]]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.decode_tokens) + len(self.prefill_tokens)


def group_first_chunks(lengths: list[int], waste: float = 0.5) -> list[list[int]]:
    """Indices of prompt-starting chunks grouped for one padded attention call each.

    Sorted by length, longest first; a group takes the next chunk while padding stays within `waste` of
    the group's padded tokens (n * longest), so one long prompt does not pad a crowd of short ones.
    Chunks left alone (groups of one) run unpadded."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        g = groups[-1] if groups else None
        if g is not None:
            longest = lengths[g[0]]
            real = sum(lengths[j] for j in g) + lengths[i]
            if real >= (1.0 - waste) * longest * (len(g) + 1):
                g.append(i)
                continue
        groups.append([i])
    return groups


def _padded(members, dev, extra: list[int] = ()) -> tuple:
    """The index tensors of one padded attention over chunks [(offset, PrefillChunk)] of the packed step:
    (pad_idx, n, length, real, dst, extra): pad_idx picks [n * length] token rows (a chunk shorter than the
    longest repeats its last token: any real row works, its output is dropped), real the real rows of the padded
    output, dst where they go in the step; `extra` rides the same host->device copy."""
    import torch

    length = max(c.length for _, c in members)
    pad, real, dst = [], [], []
    for row, (off, c) in enumerate(members):
        pad.extend(range(off, off + c.length))
        pad.extend([off + c.length - 1] * (length - c.length))
        real.extend(range(row * length, row * length + c.length))
        dst.extend(range(off, off + c.length))
    idx = torch.tensor(pad + real + dst + list(extra), dtype=torch.long).to(dev, non_blocking=True)
    n_pad, n_real = len(pad), len(real)
    edges = (n_pad, n_pad + n_real, n_pad + 2 * n_real)
    return idx[: edges[0]], len(members), length, idx[edges[0] : edges[1]], idx[edges[1] : edges[2]], idx[edges[2] :]


def _continuations(members, dev) -> tuple:
    """One padded attention for continuation chunks [(offset, PrefillChunk)]: (pad_idx, n, length, real, dst,
    slots, span, mask) as launcher.hf.attention reads them.  Query row i of a chunk starting at `start` is its
    position start + i and sees the cache up to it."""
    import torch

    pad_idx, n, length, real, dst, slots = _padded(members, dev, [c.slot for _, c in members])
    span = max(c.start + c.length for _, c in members)
    q_pos = [[c.start + min(i, c.length - 1) for i in range(length)] for _, c in members]
    q = torch.tensor(q_pos, dtype=torch.long).to(dev, non_blocking=True)
    mask = (torch.arange(span, device=dev)[None, None, :] <= q[:, :, None]).unsqueeze(1)  # [n, 1, length, span]
    return pad_idx, n, length, real, dst, slots, span, mask


def _prompt_attention(ctx: StepContext, step: StepInputs, tokens, dev, prefill_kernel, prefill_tile: int) -> None:
    """The prompt chunks' part of an eager step's context (`tokens`: the slot and the position of each of its tokens,
    host lists): prompt-starting chunks grouped (ctx.groups, ctx.chunks); continuation chunks through
    `prefill_kernel` (ctx.paged) or, without one, gathered (ctx.conts)."""
    chunks, firsts, conts, offset = [], [], [], len(step.decode_tokens)
    for c in step.prefill:
        (firsts if c.start == 0 else conts).append((offset, c))
        offset += c.length
    # continuation chunks attend to the cache, through their block tables: a group of one too
    if conts and prefill_kernel is not None:
        # the kernel's index rows in one tensor of their own, each aligned (index_rows): meta's rows need not be
        first, count = tiles([(off, c.length) for off, c in conts], prefill_tile)
        t = index_rows([first, count, *tokens], dev)
        n, total = len(first), len(tokens[0])
        ctx.paged = (prefill_kernel, t[2, :total], t[3, :total], t[0, :n], t[1, :n])
    else:
        groups = group_first_chunks([c.length for _, c in conts])
        ctx.conts = [_continuations([conts[i] for i in g], dev) for g in groups]
    ctx.groups = []
    for group in group_first_chunks([c.length for _, c in firsts]):
        if len(group) == 1:
            off, c = firsts[group[0]]
            chunks.append((off, c.length))
            continue
        ctx.groups.append(_padded([firsts[i] for i in group], dev)[:5])
    ctx.chunks = chunks


def index_rows(values, device):
    """`values` (lists of ints, the longest n long, the others padded with 0) as an int64 tensor [len(values), n] on
    `device` whose every row starts 16-byte aligned: the rows are viewed out of a tensor of an even width.  Why:
    Triton compiles a kernel for the alignment of each pointer it is given (16 bytes or not); after a row of odd
    length the next one starts 8 bytes off, so an eager step whose token or tile count is odd would compile another
    variant of the paged prefill kernel while serving (about half a second the first time each is met, every stream
    waiting), where the start check compiled the aligned one."""
    import torch

    n = max((len(v) for v in values), default=0)
    width = n + (n & 1)
    host = torch.tensor([list(v) + [0] * (width - len(v)) for v in values], dtype=torch.long)
    return host.to(device, non_blocking=True)[:, :n]


def decode_span(max_position: int, block_size: int, limit: int) -> int:
    """The positions a decode step attends over: past the longest row's, rounded up to whole blocks and to a multiple
    of 16 (fused kernels want aligned masks; the rest is masked out), at most `limit`."""
    m = block_size * 16 // math.gcd(block_size, 16)
    return min(-(-(max_position + 1) // m) * m, limit)


def cache_rows(table, slots, positions, block_size: int):
    """The KV-cache row (block * block_size + offset) of each token: `slots` and `positions` device tensors, `table`
    the runner's block tables [slots, blocks]."""
    return table[slots, positions // block_size] * block_size + positions % block_size


def prompt_logit_rows(step: StepInputs) -> list[int]:
    """The packed rows whose logits give prompt log probabilities (chunks with logprobs >= 0), in chunk order: every
    position of such a chunk but the one that ends its prompt (that one's logits sample the first new token)."""
    rows, offset = [], len(step.decode_tokens)
    for c in step.prefill:
        if c.logprobs >= 0:
            rows.extend(range(offset, offset + c.length - c.sample))
        offset += c.length
    return rows


def prepare_step(
    step: StepInputs,
    device,
    num_kv_heads: int,
    table,
    block_size: int,
    dtype,
    eager: bool,
    decode_kernel=None,
    prefill_kernel=None,
    prefill_tile: int = 1,
):
    """(StepContext, input_ids [1, T], positions [1, T], the token rows whose logits to keep: the sampled rows, then
    `prompt_logit_rows`) of a step run eagerly:
    its tokens packed in one row, decode tokens first (HFModelRunner._run; a graph's step is laid out by
    launcher.hf.graphs).  `table`: the runner's block tables (device), with this step's updates applied;
    `decode_kernel`: the runner's paged decode attention, or None (launcher.hf.attention.set_decode_lengths);
    `prefill_kernel`: the runner's paged prefill attention (launcher.hf.paged_prefill), which then takes the
    continuation chunks in tiles of `prefill_tile` tokens, or None (they are gathered, one padded attention per
    group)."""
    import torch

    dev = device
    n_dec = len(step.decode_tokens)
    chunk_slots: list[int] = []
    chunk_pos: list[int] = []
    logits_idx: list[int] = list(range(n_dec))
    offset = n_dec
    for c in step.prefill:
        chunk_slots.extend([c.slot] * c.length)
        chunk_pos.extend(range(c.start, c.start + c.length))
        offset += c.length
        if c.sample:
            logits_idx.append(offset - 1)
    logits_idx += prompt_logit_rows(step)
    # one host->device copy for all per-token index data
    tok_slots, tok_pos = step.decode_slots + chunk_slots, step.decode_positions + chunk_pos
    host = torch.tensor([step.decode_tokens + step.prefill_tokens, tok_pos, tok_slots], dtype=torch.long)
    meta = host.to(dev, non_blocking=True)
    input_ids, positions, slots = meta[0:1], meta[1:2], meta[2]
    ctx = StepContext()
    ctx.table, ctx.block_size = table, block_size
    # row of token t, kv head h in the cache viewed as [blocks * block_size * kv_heads, head_dim]
    heads = torch.arange(num_kv_heads, device=dev)
    rows = cache_rows(table, slots, meta[1], block_size)
    ctx.flat_idx = (rows[:, None] * num_kv_heads + heads[None, :]).reshape(-1)
    ctx.n_dec = n_dec
    ctx.eager = eager
    ctx.dec_scatter = None
    ctx.dec_mask = None
    if n_dec:
        rows = max(step.decode_slots) + 1
        length = decode_span(max(step.decode_positions), block_size, table.shape[1] * block_size)
        lens = [1] * rows  # rows without a decode token attend to one (ignored) position: no NaN
        for s, p in zip(step.decode_slots, step.decode_positions):
            lens[s] = p + 1
        lens_t = torch.tensor(lens, dtype=torch.long).to(dev, non_blocking=True)
        set_decode_lengths(ctx, lens_t, length, None if eager else decode_kernel, dtype, dev)
        ctx.dec_rows, ctx.dec_len = rows, length
        if rows != n_dec or step.decode_slots != list(range(n_dec)):
            ctx.dec_scatter = meta[2, :n_dec]
    _prompt_attention(ctx, step, (tok_slots, tok_pos), dev, None if eager else prefill_kernel, prefill_tile)
    logits_idx_t = torch.tensor(logits_idx, dtype=torch.long).to(dev, non_blocking=True)
    return ctx, input_ids, positions, logits_idx_t
