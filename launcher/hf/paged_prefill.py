"""Attention of prompt chunks read straight from the paged KV cache: a Triton kernel that follows the block tables,
for chunks that start anywhere in their prompt.

Why: a prompt whose prefix came from the prefix cache starts part-way (so does a long prompt's later chunk): its
queries attend over blocks already cached and over its own keys.  The gather path (launcher.hf.attention's
continuation groups) copies those blocks into a padded tensor whose shape depends on the prefix's length, so no
CUDA graph could hold it, and a step with such a prompt ran eagerly: on an H200 the prefix cache saved the prefill
and lost it again to kernel launches.  This kernel's grid depends only on the number of query tokens: a step's
tokens are cut into tiles (`tiles`), each up to `query_tokens(rep)` consecutive tokens of one chunk, and one program
computes a tile's tokens x the query heads of one kv head as the rows of one product, over its slot's keys up to the
tile's last position, each row masked to its own position (causal).  So a mixed graph (launcher.hf.graphs.mixed)
holds prompts that start at any position, and tiles left unused (a count of 0) cost an empty program.

Used on CUDA when Triton is there and `check` agrees with `reference` on the device at start (launcher.hf.warmup);
elsewhere the gather path runs.  The CPU tests run this kernel in Triton's interpreter (TRITON_INTERPRET=1):
tests/unit/test_hf_paged_prefill.py.
"""

from __future__ import annotations

import functools

TILE = 64  # key positions a program reads at once
ROWS = 64  # rows of a program's product: query tokens x query heads of its kv head (padded to a power of two)


@functools.cache
def _kernel():
    """launcher.hf.paged_prefill_kernels.paged_prefill, imported at its first use, so that this module loads where
    Triton is not (the gather path runs there)."""
    from launcher.hf import paged_prefill_kernels

    return paged_prefill_kernels.paged_prefill


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def query_tokens(rep: int) -> int:
    """Query tokens a tile holds with `rep` query heads per kv head: ROWS rows of one product (at least one token)."""
    return max(1, ROWS // _pow2(rep))


def tiles(chunks, per_tile: int, count: int | None = None) -> tuple[list[int], list[int]]:
    """(first token row, rows) of each tile of `chunks` [(first row in the step, tokens)]: each chunk cut into tiles
    of at most `per_tile` tokens; `count`: pad with unused tiles (0, 0) to that many (a graph's fixed grid)."""
    first, rows = [], []
    for row, length in chunks:
        for at in range(0, length, per_tile):
            first.append(row + at)
            rows.append(min(per_tile, length - at))
    if count is not None:
        if len(first) > count:
            raise ValueError(f"{len(first)} tiles do not fit a grid of {count}")
        first += [0] * (count - len(first))
        rows += [0] * (count - len(rows))
    return first, rows


def packed(lengths, at: int = 0) -> list[tuple[int, int]]:
    """(first row, tokens) of chunks of these lengths packed one after another from row `at`: `tiles`' chunks."""
    out = []
    for n in lengths:
        out.append((at, n))
        at += n
    return out


def max_tiles(tokens: int, chunks: int, per_tile: int) -> int:
    """The most tiles `chunks` chunks of `tokens` tokens in all can need (each chunk's last tile may be short)."""
    return -(-tokens // per_tile) + chunks


def paged_prefill(q, k_cache, v_cache, table, slots, positions, first, count, out, scale: float):
    """Write into `out` the attention of the tiles' query tokens over their slots' blocks.  q, out: [tokens, heads,
    head_dim] (any strides, the last dimension contiguous); k_cache/v_cache: the pool [blocks, block_size,
    kv_heads, head_dim], already holding the step's own keys/values; table: block ids [slots, max_blocks]; slots,
    positions: [tokens] each token's slot and position; first, count: [tiles] (`tiles`).  Rows outside the
    tiles are left as they are."""
    import torch
    import triton

    tokens, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    rep = heads // kv_heads
    if k_cache.stride(3) != 1 or q.stride(2) != 1 or out.stride(2) != 1 or table.stride(1) != 1:
        raise ValueError("paged_prefill needs the last dimension of q, out, the pool and the block table contiguous")
    rep_p = _pow2(rep)
    bm = query_tokens(rep)
    if bm * rep_p < 16:  # tl.dot's smallest tile
        raise ValueError(f"{rep} query heads per kv head make {bm * rep_p} rows, fewer than 16")
    d_p = max(16, triton.next_power_of_2(head_dim))
    _kernel()[(first.shape[0], kv_heads)](
        q,
        k_cache,
        v_cache,
        table,
        slots,
        positions,
        first,
        count,
        out,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        table.stride(0),
        float(scale),
        REP=rep,
        REP_P=rep_p,
        BM=bm,
        D=head_dim,
        D_P=d_p,
        BS=k_cache.shape[1],
        T=TILE,
        # float32 products in full precision (not TF32), so a float32 model computes as the gather path does
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        # a program holds a 64-row tile of queries and its float32 sums: at head size 128 and more, spread over
        # twice the threads so that they stay in registers
        num_warps=8 if d_p >= 128 else 4,
    )
    return out


def reference(q, k_cache, v_cache, table, slots, positions, first, count, out, scale: float):
    """What `paged_prefill` computes, in torch: each tile token as a decode row over its slot's blocks up to its
    position (the gather path).  Reads the tiles on the host: for the start check and the CPU tests."""
    import torch

    from launcher.hf.attention import _sdpa, decode_mask, gather

    rows = [r for f, c in zip(first.tolist(), count.tolist()) for r in range(f, f + c)]
    if not rows:
        return out
    idx = torch.tensor(rows, dtype=torch.long, device=q.device)
    lens = positions[idx] + 1
    span = int(lens.max())
    blocks = table[slots[idx], : -(-span // k_cache.shape[1])]
    _, heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    qr = q[idx].reshape(len(rows), kv_heads, heads // kv_heads, head_dim)
    mask = decode_mask(lens, torch.arange(span, device=q.device), q.dtype, q.device)
    o = _sdpa(qr, gather(k_cache, blocks, span), gather(v_cache, blocks, span), mask, scale=scale)
    out[idx] = o.reshape(len(rows), heads, head_dim).to(out.dtype)
    return out


# the largest difference from `reference` (in float32) that `check` accepts, by dtype (as launcher.hf.paged_decode's)
TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 4e-2}


def check(kernel, kv_heads: int, rep: int, head_dim: int, block_size: int, dtype, device, seed: int = 0):
    """None if `kernel` (paged_prefill's signature) computes what `reference` computes on `device`, for the model's
    heads and dtype over a small pool with its blocks out of order: a chunk from position 0, one after a cached
    prefix, a one-token chunk and an unused tile; else what differed."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    blocks, heads = 64, kv_heads * rep
    chunks = ((0, 37), (100, 20), (300, 1))  # (start position, tokens) of slots 0, 1, 2
    per_row = -(-301 // block_size)
    if per_row > blocks:
        blocks = per_row
    k = torch.randn(blocks, block_size, kv_heads, head_dim, generator=gen).to(device, dtype)
    v = torch.randn(blocks, block_size, kv_heads, head_dim, generator=gen).to(device, dtype)
    table = torch.stack([torch.randperm(blocks, generator=gen)[:per_row] for _ in range(3)]).to(device)
    slots = torch.tensor([s for s, (_, n) in enumerate(chunks) for _ in range(n)], device=device)
    positions = torch.tensor([p for start, n in chunks for p in range(start, start + n)], device=device)
    tokens = positions.shape[0]
    q = torch.randn(tokens, heads, head_dim, generator=gen).to(device, dtype)
    rows = packed(n for _, n in chunks)
    per_tile = query_tokens(rep)
    first, count = tiles(rows, per_tile, max_tiles(tokens, len(rows), per_tile) + 1)
    first, count = (torch.tensor(x, device=device) for x in (first, count))
    scale = head_dim**-0.5
    got = kernel(q, k, v, table, slots, positions, first, count, torch.zeros_like(q), scale).float()
    want = torch.zeros_like(q, dtype=torch.float32)
    reference(q.float(), k.float(), v.float(), table, slots, positions, first, count, want, scale)
    diff = (got - want).abs().max().item()
    name = str(dtype).replace("torch.", "")
    if not diff <= TOLERANCE.get(name, 4e-2):  # NaN fails too
        return f"{tokens} query tokens in {len(rows)} chunks differ by {diff:.3g} in {name}"
    return None
