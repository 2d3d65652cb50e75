"""The Triton kernels of launcher.hf.paged_decode (which says what they compute and launches them), with the steps of
the decode kernel as @triton.jit helpers that Triton inlines into it.  Imported at the kernels' first use
(paged_decode._kernel): importing Triton reads TRITON_INTERPRET, and where Triton is not installed this module is
never loaded."""

from __future__ import annotations

import triton
import triton.language as tl


# Triton compiles a kernel for each class of its integer arguments' values (1, a multiple of 16, other): the split
# counts vary with the step's rows and length, so an eager step (rows or lengths past the decode graphs) could meet
# a class no graph capture compiled and compile it while every stream waits; one variant serves them all.
@triton.jit(do_not_specialize=["splits", "tiles_per_split"])
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
    """One program: the query heads of one kv head of one row, over one split of its positions."""
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
        m, den, acc = _attend_tile(
            q,
            m,
            den,
            acc,
            start + t,
            last,
            row,
            head,
            k_ptr,
            v_ptr,
            table_ptr,
            sk_b,
            sk_t,
            sk_h,
            st_r,
            scale,
            d,
            d_ok,
            BS,
            PRECISION,
        )
    keep = g_ok[:, None] & d_ok[None, :]
    if SPLIT:
        _store_split(out_ptr, m_ptr, l_ptr, acc, m, den, row, head, split, splits, g, d, g_ok, keep, REP, D)
    else:
        _store_normalized(out_ptr, acc, den, row, head, g, d, keep, REP, D)


@triton.jit
def _attend_tile(
    q,
    m,
    den,
    acc,
    pos,
    last,
    row,
    head,
    k_ptr,
    v_ptr,
    table_ptr,
    sk_b,
    sk_t,
    sk_h,
    st_r,
    scale,
    d,
    d_ok,
    BS: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One tile of positions `pos` (those before `last` count): their keys and values read where the block table
    puts them, folded into the online softmax.  -> (m: the running max, den: its denominator, acc: the weighted
    sum of the values), each of the query heads."""
    ok = pos < last
    k, v = read_kv(table_ptr + row * st_r, pos, ok, head, k_ptr, v_ptr, sk_b, sk_t, sk_h, d, d_ok, BS)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    s = tl.where(ok[None, :], s, float("-inf"))
    return fold(s, v, m, den, acc, PRECISION)


@triton.jit
def read_kv(blocks_ptr, pos, ok, head, k_ptr, v_ptr, sk_b, sk_t, sk_h, d, d_ok, BS: tl.constexpr):
    """The keys and values of one kv head at positions `pos` (those `ok`; the others read as 0) of the sequence whose
    block-table row starts at `blocks_ptr`, read where its blocks put them.  The prefill kernel's too."""
    block = tl.load(blocks_ptr + pos // BS, mask=ok, other=0)
    at = block.to(tl.int64) * sk_b + (pos % BS) * sk_t + head * sk_h
    kv_ok = ok[:, None] & d_ok[None, :]
    k = tl.load(k_ptr + at[:, None] + d[None, :], mask=kv_ok, other=0.0)
    v = tl.load(v_ptr + at[:, None] + d[None, :], mask=kv_ok, other=0.0)
    return k, v


@triton.jit
def fold(s, v, m, den, acc, PRECISION: tl.constexpr):
    """A tile's scores `s` (-inf where masked) and values `v` folded into the online softmax of its rows: -> (m: the
    running max, den: its denominator, acc: the weighted sum of the values).  The prefill kernel's too
    (launcher.hf.paged_prefill_kernels)."""
    m_new = tl.maximum(m, tl.max(s, 1))
    p = tl.exp(s - m_new[:, None])
    alpha = tl.exp(m - m_new)
    den = den * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, den, acc


@triton.jit
def _store_split(
    out_ptr, m_ptr, l_ptr, acc, m, den, row, head, split, splits, g, d, g_ok, keep, REP: tl.constexpr, D: tl.constexpr
):
    """A split's partial result, not normalized, with its running max and denominator: `combine` joins them."""
    base = (row * tl.num_programs(1) + head) * splits + split
    tl.store(out_ptr + (base * REP + g[:, None]) * D + d[None, :], acc, mask=keep)
    tl.store(m_ptr + base * REP + g, m, mask=g_ok)
    tl.store(l_ptr + base * REP + g, den, mask=g_ok)


@triton.jit
def _store_normalized(out_ptr, acc, den, row, head, g, d, keep, REP: tl.constexpr, D: tl.constexpr):
    """The one split's result: the attention output, in the output's dtype."""
    o = acc / den[:, None]
    at = ((row * tl.num_programs(1) + head) * REP + g[:, None]) * D + d[None, :]
    tl.store(out_ptr + at, o.to(out_ptr.dtype.element_ty), mask=keep)


@triton.jit(do_not_specialize=["splits"])
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
    """The splits' partial results of one (row, kv head), weighted by their maxima, as one normalized output."""
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
