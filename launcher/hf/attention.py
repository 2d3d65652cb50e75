"""The attention of the `hf` engine: the new keys/values written into the paged KV cache, then attention over it.

Registered with transformers' `AttentionInterface` (so any decoder whose attention modules call the attention
interface works, not only Llama), and as a custom torch op for torch.compile.  A step packs all its tokens into one
row (`input_ids` of shape [1, T]): first one token per decoding sequence, then prompt chunks of sequences in
prefill, so the model's linear layers never see padding.  Per layer our attention writes the new keys/values into
the pool of blocks `[blocks, block_size, kv_heads, head_dim]` (launcher.hf.blocks; a token's row is its sequence's
block for its position, through the runner's block tables) with one `index_copy_`, then runs

* one batched attention for all decode tokens over their sequences' blocks, query heads folded onto their kv head
  (no `repeat_kv` copy): on a GPU a Triton kernel that reads the blocks where they lie (launcher.hf.paged_decode),
  elsewhere SDPA over the blocks gathered through the block tables (`[rows, kv_heads, len, head_dim]`) with a
  per-row additive length mask;
* prompt chunks that start a prompt (nothing cached yet) in one causal SDPA
  per group of similar lengths (launcher.hf.step.group_first_chunks): the group's chunks are gathered into a padded
  batch [n, H, L, D] (right padding: a causal mask already hides the padded
  keys from every real query, and padded queries are dropped);
* whole prompts packed after the decode rows (a mixed CUDA graph, launcher.hf.graphs) in one SDPA with a block-diagonal mask;
* continuation chunks (against the cache: the prefix and itself; a prompt whose prefix came from the prefix cache
  starts this way) in one SDPA per group of similar lengths, their sequences' blocks gathered through the block
  tables; on a GPU through the paged prefill kernel instead (launcher.hf.paged_prefill), which reads the blocks
  where they lie, and through which a mixed graph attends for all its prompts (so they may start anywhere).

Why groups: a step that admits a wave of requests (64 prompts at once, say)
would otherwise call attention 64 times per layer, and on a GPU each call is
launch-bound (~10 us of Python each), so a 16-layer model paid ~40 ms per step
for what one kernel per layer does.

Everything that depends on the step but not on the layer (index tensors, masks) is built once per step, into a
`StepContext` that the runner puts in `tls` (with the cache) around the model's forward.
"""

from __future__ import annotations

import threading

ATTN_NAME = "llmlaunch_slots"  # name of our attention function in transformers' AttentionInterface


class StepContext:
    """Per-step tensors shared by every layer's attention call."""

    __slots__ = (
        "flat_idx",
        "n_dec",
        "dec_rows",
        "dec_len",
        "dec_mask",
        "dec_lens",
        "dec_kernel",
        "dec_scatter",
        "chunks",
        "groups",
        "conts",
        "paged",
        "eager",
        "packed",
        "table",
        "block_size",
    )

    def __init__(self):
        # (offset, tokens, additive mask [tokens, tokens]): whole prompts packed one after another from `offset`,
        # each causal over its own tokens (a mixed graph's prompt part, launcher.hf.graphs.mixed.MixedGraphs); None: none
        self.packed = None
        # decode attention straight from the pool (launcher.hf.paged_decode, the runner's `decode_kernel`), reading
        # `dec_lens` ([rows] positions attended); None: gather the blocks and run SDPA with `dec_mask`
        self.dec_kernel = None
        # continuation chunks (a prompt part-way: its prefix in the cache) batched, one padded attention per group:
        # (pad_idx, n, length, real, dst, slots, span, mask), launcher.hf.step.prepare_step, where no paged prefill
        # kernel takes them (CPU); no graph holds these
        self.conts = []
        # prompt chunks through the paged prefill kernel: (kernel, slots, positions, first, count), the step's
        # tokens' slots and positions and the kernel's tiles (launcher.hf.paged_prefill.tiles); None: none
        self.paged = None


# the step's StepContext (`ctx`) and the KV cache (`cache`: per layer the pool's (keys, values)) while the model runs
tls = threading.local()


def _sdpa(q, k, v, mask=None, causal=False, scale=None, eager=False, gqa=False):
    """softmax(q k^T * scale + mask) v; `eager` uses plain matmuls.  `gqa`: k/v have fewer heads than q."""
    import torch
    import torch.nn.functional as F

    if not eager:
        if gqa:
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True
            )
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
    if gqa:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if causal:
        n = q.shape[-2]
        mask = torch.ones(n, k.shape[-2], dtype=torch.bool, device=q.device).tril_(k.shape[-2] - n)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return torch.matmul(scores.softmax(dim=-1), v)


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Our transformers attention function: cache write + slot attention.  Shapes: query [1, H, T, D], key/value
    [1, KVH, T, D]; returns ([1, T, H, D], None)."""
    import torch

    if torch.compiler.is_compiling():
        # torch.compile traces the model around our attention, which stays one opaque op (see _OP_SCHEMA)
        scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        return torch.ops.llmlaunch.slot_attention(query, key, value, module.layer_idx, scale), None
    return _slot_attention(module.layer_idx, query, key, value, scaling), None


# The attention as a custom torch op, for torch.compile (HFModelRunner, torch_compile=True).  Why opaque: it reads the
# step's context and the KV cache from `tls` and writes the cache in place, neither of which may become an input
# of the compiled graph (functionalizing the cache write would copy the whole cache every step).  Inductor fuses
# everything around it (norms, rotary, residuals, activations).  This is the pattern vLLM uses for its attention.
_OP_SCHEMA = "(Tensor query, Tensor key, Tensor value, int layer_idx, float scaling) -> Tensor"
_op_registered = False


def register_attention() -> None:
    """Our attention in transformers' AttentionInterface, and as the custom op it calls under torch.compile."""
    global _op_registered
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, _attention)
    if _op_registered:
        return
    import torch

    op = torch.library.custom_op("llmlaunch::slot_attention", mutates_args=(), schema=_OP_SCHEMA)(
        lambda query, key, value, layer_idx, scaling: _slot_attention(layer_idx, query, key, value, scaling)
    )
    # the output's shape, for tracing: [1, T, H, D] from the query's [1, H, T, D]
    op.register_fake(
        lambda query, key, value, layer_idx, scaling: query.new_empty(1, query.shape[2], query.shape[1], query.shape[3])
    )
    _op_registered = True


def _slot_attention(layer_idx, query, key, value, scaling):
    ctx: StepContext = tls.ctx
    k_cache, v_cache = tls.cache[layer_idx]
    _, n_heads, n_tok, head_dim = query.shape
    n_kv = key.shape[1]
    rep = n_heads // n_kv
    eager = ctx.eager
    # 1. write this step's keys/values at (slot, head, position): one index_copy_ into the flattened cache
    k_cache.view(-1, head_dim).index_copy_(0, ctx.flat_idx, key[0].transpose(0, 1).reshape(-1, head_dim))
    v_cache.view(-1, head_dim).index_copy_(0, ctx.flat_idx, value[0].transpose(0, 1).reshape(-1, head_dim))

    out = None
    if ctx.paged is not None:  # a graph's padded prompt tokens are in no tile: zeros, not whatever the memory held
        out = query.new_zeros(n_tok, n_heads, head_dim)
    elif ctx.chunks or ctx.groups or ctx.conts or ctx.packed is not None:
        out = query.new_empty(n_tok, n_heads, head_dim)
    n_dec = ctx.n_dec
    if n_dec:
        # 2. decode tokens, batched: [n_dec, H, D] -> [n_dec, KVH, rep, D], query heads grouped on their kv head
        q = query[0, :, :n_dec].transpose(0, 1).reshape(n_dec, n_kv, rep, head_dim)
        rows, length = ctx.dec_rows, ctx.dec_len
        if ctx.dec_scatter is not None:  # decode slots are not 0..n_dec-1: place queries on their slot rows
            q_rows = q.new_zeros(rows, n_kv, rep, head_dim)
            q_rows[ctx.dec_scatter] = q
            q = q_rows
        if ctx.dec_kernel is not None:
            o = ctx.dec_kernel(q, k_cache, v_cache, ctx.table, ctx.dec_lens, length, scaling or head_dim**-0.5)
        else:
            blocks = ctx.table[:rows, : -(-length // ctx.block_size)]
            k, v = gather(k_cache, blocks, length), gather(v_cache, blocks, length)
            o = _sdpa(q, k, v, ctx.dec_mask, scale=scaling, eager=eager)
        if ctx.dec_scatter is not None:
            o = o[ctx.dec_scatter]
        dec_out = o.reshape(n_dec, n_heads, head_dim)
        if out is None:
            return dec_out.unsqueeze(0)
        out[:n_dec] = dec_out
    # 3. prompt-starting chunks, a padded batch per group: gather [n*L] token rows, causal SDPA, keep real rows
    for pad_idx, n, length, real, dst in ctx.groups:
        q = query[0].index_select(1, pad_idx).view(n_heads, n, length, head_dim).transpose(0, 1)
        k = key[0].index_select(1, pad_idx).view(n_kv, n, length, head_dim).transpose(0, 1)
        v = value[0].index_select(1, pad_idx).view(n_kv, n, length, head_dim).transpose(0, 1)
        o = _sdpa(q, k, v, None, causal=True, scale=scaling, eager=eager, gqa=rep > 1)
        out.index_copy_(0, dst, o.transpose(1, 2).reshape(n * length, n_heads, head_dim).index_select(0, real))
    # 4. whole prompts packed after the decode rows (a mixed graph): one attention, each prompt causal over itself
    if ctx.packed is not None:
        offset, length, mask = ctx.packed
        q, k, v = (t[:, :, offset : offset + length] for t in (query, key, value))
        o = _sdpa(q, k, v, mask, scale=scaling, eager=eager, gqa=rep > 1)
        out[offset : offset + length] = o[0].transpose(0, 1)
    # 5. continuation chunks, a padded batch per group: their queries over their sequences' blocks (the prefix and
    # themselves, written in 1.), each query row masked to the positions up to its own
    for pad_idx, n, length, real, dst, slots, span, mask in ctx.conts:
        q = query[0].index_select(1, pad_idx).view(n_heads, n, length, head_dim).transpose(0, 1)
        blocks = ctx.table[slots, : -(-span // ctx.block_size)]
        k, v = gather(k_cache, blocks, span), gather(v_cache, blocks, span)
        o = _sdpa(q, k, v, mask, scale=scaling, eager=eager, gqa=rep > 1)
        out.index_copy_(0, dst, o.transpose(1, 2).reshape(n * length, n_heads, head_dim).index_select(0, real))
    # 5b. prompt chunks through the paged prefill kernel: each tile's queries over its slot's blocks (written in 1.)
    if ctx.paged is not None:
        kernel, slots, positions, first, count = ctx.paged
        kernel(
            query[0].transpose(0, 1),
            k_cache,
            v_cache,
            ctx.table,
            slots,
            positions,
            first,
            count,
            out,
            scaling or head_dim**-0.5,
        )
    # 6. prompt-starting chunks alone in their group: plain causal attention over their own keys
    for offset, length in ctx.chunks:
        q, k, v = (t[:, :, offset : offset + length] for t in (query, key, value))
        o = _sdpa(q, k, v, None, causal=True, scale=scaling, eager=eager, gqa=rep > 1)
        out[offset : offset + length] = o[0].transpose(0, 1)
    return out.unsqueeze(0)


def gather(cache, blocks, length: int):
    """The keys (or values) of `blocks` ([rows, n] block ids) as [rows, kv_heads, length, head_dim]: the blocks' rows
    of the pool `cache` ([blocks, block_size, kv_heads, head_dim]) one after another, cut at `length` tokens."""
    rows, n = blocks.shape
    _, block_size, kv_heads, head_dim = cache.shape
    return cache[blocks].view(rows, n * block_size, kv_heads, head_dim)[:, :length].transpose(1, 2)


def set_decode_lengths(ctx: StepContext, lens, length: int, kernel, dtype, device) -> None:
    """The decode rows' lengths on `ctx`: `lens` ([rows] device tensor) for the paged kernel `kernel`, or, without
    one, as the additive mask the gather path's SDPA takes (over `length` positions)."""
    import torch

    ctx.dec_lens, ctx.dec_kernel = lens, kernel
    ctx.dec_mask = None if kernel is not None else decode_mask(lens, torch.arange(length, device=device), dtype, device)


def decode_mask(lens, span, dtype, device):
    """Additive attention mask [rows, 1, 1, len(span)] of decode rows over their cache row: row r sees its first
    lens[r] positions (`span`: the positions 0..n-1 as a device tensor)."""
    import torch

    valid = span[None, :] < lens[:, None]
    return torch.zeros(lens.shape[0], 1, 1, span.shape[0], dtype=dtype, device=device).masked_fill_(
        ~valid[:, None, None, :], float("-inf")
    )
