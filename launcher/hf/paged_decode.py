"""Decode attention read straight from the paged KV cache: a Triton kernel that follows the block tables.

Gathering a decode batch's blocks into a padded [rows, kv_heads, length, head_dim] copy and running SDPA on it
(launcher.hf.attention.gather) reads every live key and value twice and writes them once more per layer and step;
at 64-128 sequences on a 1 B model that copy is as large as the attention itself and cost a third of the tokens/s
on an H200.  This kernel reads each sequence's keys and values once, where they lie in the pool: one program per
(row, kv head, split of the sequence) computes the query heads of that kv head together (grouped-query attention
without repeating keys), with an online softmax over tiles of positions; when the batch alone does not fill the
GPU, the positions are split and the partial results combined (flash decoding).

Used on CUDA when Triton is there and `check` agrees with the gather path on the device at start
(launcher.hf.loading); elsewhere (CPU, eager runs for the identity tests) the gather path runs.  The CPU tests run
this kernel in Triton's interpreter (TRITON_INTERPRET=1) against the gather path: tests/unit/test_hf_paged_decode.py.
"""

from __future__ import annotations

import functools

TILE = 64  # positions a program reads at once (several blocks: the block table is read per position)
MAX_SPLITS = 16  # at most this many programs share one sequence's positions
MIN_SPLIT_TILES = 4  # the fewest tiles a split reads


@functools.cache
def _kernel():
    """(the decode kernel, the kernel that combines its splits): launcher.hf.paged_decode_kernels, imported here at
    their first use, so that this module loads where Triton is not (the gather path runs there)."""
    from launcher.hf import paged_decode_kernels

    return paged_decode_kernels.paged_decode, paged_decode_kernels.combine


def splits_for(rows: int, kv_heads: int, length: int, programs: int) -> int:
    """How many programs share a sequence: enough that rows x kv_heads x splits fills `programs` (about two per
    streaming multiprocessor), each with at least MIN_SPLIT_TILES tiles of positions (a split costs a second
    kernel that combines them: at short lengths one program reading them all is sooner), at most MAX_SPLITS."""
    tiles = -(-length // TILE)
    want = -(-programs // max(1, rows * kv_heads))
    return max(1, min(tiles // MIN_SPLIT_TILES, want, MAX_SPLITS))


def paged_decode(q, k_cache, v_cache, table, lens, length: int, scale: float, programs: int = 264):
    """Attention of decode rows over their sequences' blocks.  q: [rows, kv_heads, rep, head_dim] (the query heads
    of each kv head together); k_cache/v_cache: the pool [blocks, block_size, kv_heads, head_dim]; table: block ids
    [>= rows, max_blocks] (row r's sequence in table row r); lens: [rows] positions attended (>= 1); length: the
    longest of lens or more (a static bound, so a CUDA graph captures one grid).  -> [rows, kv_heads, rep, head_dim]."""
    import torch
    import triton

    rows, kv_heads, rep, head_dim = q.shape
    block_size = k_cache.shape[1]
    if k_cache.stride(3) != 1 or q.stride(3) != 1 or table.stride(1) != 1:
        raise ValueError("paged_decode needs the last dimension of q, the pool and the block table contiguous")
    splits = splits_for(rows, kv_heads, length, programs)
    tiles = -(-length // TILE)
    tiles_per_split = -(-tiles // splits)
    rep_p = max(16, triton.next_power_of_2(rep))  # tl.dot's smallest tile
    d_p = max(16, triton.next_power_of_2(head_dim))
    out = q.new_empty(rows, kv_heads, rep, head_dim)
    if splits == 1:
        part, m, den = out, out, out  # m and den unused
    else:
        part = torch.empty(rows, kv_heads, splits, rep, head_dim, dtype=torch.float32, device=q.device)
        m = torch.empty(rows, kv_heads, splits, rep, dtype=torch.float32, device=q.device)
        den = torch.empty_like(m)
    kernel, combine = _kernel()
    kernel[(rows, kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        table,
        lens,
        part,
        m,
        den,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        table.stride(0),
        float(scale),
        splits,
        tiles_per_split,
        REP=rep,
        REP_P=rep_p,
        D=head_dim,
        D_P=d_p,
        BS=block_size,
        T=TILE,
        SPLIT=splits > 1,
        # float32 products in full precision (not TF32), so a float32 model decodes as the gather path does
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    if splits > 1:
        combine[(rows, kv_heads)](part, m, den, out, splits, REP=rep, REP_P=rep_p, D=head_dim, D_P=d_p)
    return out


# the largest difference from the gather path `check` accepts, by dtype: float32 computes alike up to summation
# order; half types round the probabilities before the product with the values (as SDPA's kernels do)
TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 4e-2}


def check(kernel, kv_heads: int, rep: int, head_dim: int, block_size: int, dtype, device, seed: int = 0):
    """None if `kernel` (paged_decode's signature) computes what the gather path computes on `device`, for the
    model's heads and dtype over a small pool with its blocks out of order, rows of several lengths and each split
    count it uses; else what differed."""
    import torch

    from launcher.hf.attention import _sdpa, decode_mask, gather

    gen = torch.Generator(device="cpu").manual_seed(seed)
    blocks, max_len = 64, 8 * TILE
    per_row = -(-max_len // block_size)
    name = str(dtype).replace("torch.", "")
    for rows, length in ((1, max_len), (3, TILE + 1), (40, 2 * TILE)):
        k = torch.randn(blocks, block_size, kv_heads, head_dim, generator=gen).to(device, dtype)
        v = torch.randn(blocks, block_size, kv_heads, head_dim, generator=gen).to(device, dtype)
        table = torch.stack([torch.randperm(blocks, generator=gen)[:per_row] for _ in range(rows)]).to(device)
        lens = torch.randint(1, length + 1, (rows,), generator=gen)
        lens[0] = length
        lens = lens.to(device)
        q = torch.randn(rows, kv_heads, rep, head_dim, generator=gen).to(device, dtype)
        scale = head_dim**-0.5
        got = kernel(q, k, v, table, lens, length, scale).float()
        n = -(-length // block_size)
        mask = decode_mask(lens, torch.arange(length, device=device), torch.float32, device)
        want = _sdpa(
            q.float(),
            gather(k.float(), table[:, :n], length),
            gather(v.float(), table[:, :n], length),
            mask,
            scale=scale,
        )
        diff = (got - want).abs().max().item()
        if not diff <= TOLERANCE.get(name, 4e-2):  # NaN fails too
            return f"{rows} rows over {length} positions differ by {diff:.3g} in {name}"
    return None
