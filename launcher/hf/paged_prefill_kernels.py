"""The Triton kernel of launcher.hf.paged_prefill (which says what it computes and launches it).  Imported at the
kernel's first use (paged_prefill._kernel): importing Triton reads TRITON_INTERPRET, and where Triton is not installed
this module is never loaded.  It folds keys into its online softmax as the decode kernel does (`fold`, from
launcher.hf.paged_decode_kernels, which also reads its keys and values: `read_kv`), with a causal mask per query row."""

from __future__ import annotations

import triton
import triton.language as tl

from launcher.hf.paged_decode_kernels import fold, read_kv


@triton.jit
def paged_prefill(
    q_ptr,  # the step's queries, [tokens, heads, head_dim] (strided)
    k_ptr,  # [blocks, block_size, kv_heads, head_dim]: the pool
    v_ptr,
    table_ptr,  # [slots, max_blocks] block ids
    slots_ptr,  # [tokens] each token's slot
    pos_ptr,  # [tokens] each token's position
    first_ptr,  # [tiles] the first token row of each tile
    count_ptr,  # [tiles] its rows (0: an unused tile)
    out_ptr,  # [tokens, heads, head_dim] (strided): the tiles' rows are written, no other
    sq_t,
    sq_h,
    so_t,
    so_h,
    sk_b,
    sk_t,
    sk_h,
    st_r,
    scale,
    REP: tl.constexpr,
    REP_P: tl.constexpr,
    BM: tl.constexpr,
    D: tl.constexpr,
    D_P: tl.constexpr,
    BS: tl.constexpr,
    T: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """One program: BM query tokens of one chunk (one slot, consecutive positions) x the query heads of one kv head,
    as BM * REP_P rows of one product, over the keys of the slot up to the tile's last position."""
    tile = tl.program_id(0)
    head = tl.program_id(1)
    first = tl.load(first_ptr + tile).to(tl.int64)
    n = tl.load(count_ptr + tile)
    r = tl.arange(0, BM * REP_P)
    i = r // REP_P
    g = r % REP_P
    d = tl.arange(0, D_P)
    t = tl.arange(0, T)
    d_ok = d < D
    row_ok = (i < n) & (g < REP)
    tok = first + i
    q = tl.load(
        q_ptr + tok[:, None] * sq_t + (head * REP + g)[:, None] * sq_h + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    last = tl.maximum(n - 1, 0)
    # rows past the tile's tokens take its last token's position: finite, and never stored
    q_pos = tl.load(pos_ptr + first + tl.minimum(i, last))
    end = tl.where(n > 0, tl.load(pos_ptr + first + last) + 1, 0)
    slot = tl.load(slots_ptr + first).to(tl.int64)
    m = tl.full([BM * REP_P], float("-inf"), tl.float32)
    den = tl.zeros([BM * REP_P], tl.float32)
    acc = tl.zeros([BM * REP_P, D_P], tl.float32)
    for start in range(0, end, T):
        pos = start + t
        ok = pos < end
        k, v = read_kv(table_ptr + slot * st_r, pos, ok, head, k_ptr, v_ptr, sk_b, sk_t, sk_h, d, d_ok, BS)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        # a row's first tile always holds position 0, which every row sees: the running max is finite from it on
        s = tl.where(ok[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
        m, den, acc = fold(s, v, m, den, acc, PRECISION)
    o = acc / tl.where(den > 0, den, 1.0)[:, None]  # an unused tile read nothing (its rows are not stored)
    tl.store(
        out_ptr + tok[:, None] * so_t + (head * REP + g)[:, None] * so_h + d[None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )
