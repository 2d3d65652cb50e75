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
    import triton
    import triton.language as tl

    @triton.jit
    def paged_decode(
        q_ptr,  # [rows, kv_heads, rep, head_dim]
        k_ptr,  # [blocks, block_size, kv_heads, head_dim]: the pool
        v_ptr,
        table_ptr,  # [>= rows, max_blocks] block ids
        lens_ptr,  # [rows] positions each row attends to
        out_ptr,  # splits == 1: [rows, kv_heads, rep, head_dim]; else float32 [rows, kv_heads, splits, rep, head_dim]
        m_ptr,  # float32 [rows, kv_heads, splits, rep]: running max of each split (splits > 1)
        l_ptr,  # float32 [rows, kv_heads, splits, rep]: softmax denominator of each split (splits > 1)
        sq_r,
        sq_h,
        sq_g,
        sk_b,
        sk_t,
        sk_h,
        st_r,
        scale,
        splits,
        tiles_per_split,
        REP: tl.constexpr,
        REP_P: tl.constexpr,
        D: tl.constexpr,
        D_P: tl.constexpr,
        BS: tl.constexpr,
        T: tl.constexpr,
        SPLIT: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        row = tl.program_id(0)
        head = tl.program_id(1)
        split = tl.program_id(2)
        g = tl.arange(0, REP_P)
        d = tl.arange(0, D_P)
        t = tl.arange(0, T)
        g_ok = g < REP
        d_ok = d < D
        q = tl.load(
            q_ptr + row * sq_r + head * sq_h + g[:, None] * sq_g + d[None, :],
            mask=g_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        length = tl.load(lens_ptr + row)
        first = split * tiles_per_split * T
        last = tl.minimum(length, first + tiles_per_split * T)
        m = tl.full([REP_P], float("-inf"), tl.float32)
        den = tl.zeros([REP_P], tl.float32)
        acc = tl.zeros([REP_P, D_P], tl.float32)
        for start in range(first, last, T):
            pos = start + t
            ok = pos < last
            block = tl.load(table_ptr + row * st_r + pos // BS, mask=ok, other=0)
            at = block.to(tl.int64) * sk_b + (pos % BS) * sk_t + head * sk_h
            kv_ok = ok[:, None] & d_ok[None, :]
            k = tl.load(k_ptr + at[:, None] + d[None, :], mask=kv_ok, other=0.0)
            v = tl.load(v_ptr + at[:, None] + d[None, :], mask=kv_ok, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            s = tl.where(ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m - m_new)
            den = den * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m = m_new
        keep = g_ok[:, None] & d_ok[None, :]
        if SPLIT:
            base = (row * tl.num_programs(1) + head) * splits + split
            tl.store(out_ptr + (base * REP + g[:, None]) * D + d[None, :], acc, mask=keep)
            tl.store(m_ptr + base * REP + g, m, mask=g_ok)
            tl.store(l_ptr + base * REP + g, den, mask=g_ok)
        else:
            o = acc / den[:, None]
            at = ((row * tl.num_programs(1) + head) * REP + g[:, None]) * D + d[None, :]
            tl.store(out_ptr + at, o.to(out_ptr.dtype.element_ty), mask=keep)

    @triton.jit
    def combine(
        part_ptr,  # float32 [rows, kv_heads, splits, rep, head_dim]
        m_ptr,  # float32 [rows, kv_heads, splits, rep]
        l_ptr,
        out_ptr,  # [rows, kv_heads, rep, head_dim]
        splits,
        REP: tl.constexpr,
        REP_P: tl.constexpr,
        D: tl.constexpr,
        D_P: tl.constexpr,
    ):
        base = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)  # (row, kv head)
        g = tl.arange(0, REP_P)
        d = tl.arange(0, D_P)
        g_ok = g < REP
        keep = g_ok[:, None] & (d[None, :] < D)
        top = tl.full([REP_P], float("-inf"), tl.float32)
        for i in range(0, splits):
            top = tl.maximum(top, tl.load(m_ptr + (base * splits + i) * REP + g, mask=g_ok, other=float("-inf")))
        top = tl.where(g_ok, top, 0.0)
        den = tl.zeros([REP_P], tl.float32)
        acc = tl.zeros([REP_P, D_P], tl.float32)
        for i in range(0, splits):
            at = (base * splits + i) * REP
            w = tl.exp(tl.load(m_ptr + at + g, mask=g_ok, other=float("-inf")) - top)  # 0 for a split with no tile
            den += w * tl.load(l_ptr + at + g, mask=g_ok, other=0.0)
            acc += w[:, None] * tl.load(part_ptr + (at + g[:, None]) * D + d[None, :], mask=keep, other=0.0)
        den = tl.where(g_ok, den, 1.0)
        o = acc / den[:, None]
        tl.store(out_ptr + (base * REP + g[:, None]) * D + d[None, :], o.to(out_ptr.dtype.element_ty), mask=keep)

    return paged_decode, combine


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
