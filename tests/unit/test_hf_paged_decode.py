"""The hf engine's paged decode attention kernel (launcher/hf/paged_decode.py) against the gather path it replaces on
GPUs, run here in Triton's interpreter on CPU (TRITON_INTERPRET=1, tests/unit/conftest.py): the same kernel source the GPU compiles, at its
Python API boundary; its compiled speed and the on-device check are measured on the lent GPU
(docs/performance/hf.md, the paged KV cache rows)."""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from launcher.hf.attention import StepContext, _sdpa, _slot_attention, decode_mask, gather, tls  # noqa: E402
from launcher.hf.paged_decode import MIN_SPLIT_TILES, TILE, check, paged_decode, splits_for  # noqa: E402


def _pool(blocks, block_size, kv_heads, head_dim, dtype, gen):
    k = torch.randn(blocks, block_size, kv_heads, head_dim, generator=gen, dtype=torch.float32).to(dtype)
    v = torch.randn(blocks, block_size, kv_heads, head_dim, generator=gen, dtype=torch.float32).to(dtype)
    return k, v


def _reference(q, k, v, table, lens, length, scale):
    n = -(-length // k.shape[1])
    mask = decode_mask(lens, torch.arange(length), torch.float32, q.device)
    return _sdpa(
        q.float(), gather(k.float(), table[:, :n], length), gather(v.float(), table[:, :n], length), mask, scale=scale
    )


@pytest.mark.parametrize(
    "rows,kv_heads,rep,head_dim,block_size,length,programs",
    [
        (3, 2, 4, 64, 16, 100, 1),  # one split: the normalized output written by the kernel
        (5, 1, 3, 32, 16, 8 * TILE + 5, 64),  # two splits combined, the second past some rows' lengths
        (2, 4, 1, 64, 8, 50, 1000),  # one query head per kv head (no grouping); small blocks
        (4, 2, 2, 80, 16, 130, 40),  # a head size that is not a power of two
        (2, 1, 20, 64, 16, 40, 1),  # more query heads per kv head than the smallest product tile
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_kernel_reads_the_blocks_where_they_lie_as_the_gather_path_does(
    rows, kv_heads, rep, head_dim, block_size, length, programs, dtype
):
    gen = torch.Generator().manual_seed(rows * 1000 + length)
    blocks = 64
    k, v = _pool(blocks, block_size, kv_heads, head_dim, dtype, gen)
    per_row = -(-length // block_size)
    # each row's blocks drawn out of order from the whole pool, rows sharing some
    table = torch.stack([torch.randperm(blocks, generator=gen)[:per_row] for _ in range(rows + 1)])
    lens = torch.randint(1, length + 1, (rows,), generator=gen)
    lens[0] = length
    q = torch.randn(rows, kv_heads, rep, head_dim, generator=gen).to(dtype)
    got = paged_decode(q, k, v, table, lens, length, head_dim**-0.5, programs=programs)
    assert got.shape == q.shape and got.dtype == dtype
    want = _reference(q, k, v, table[:rows], lens, length, head_dim**-0.5)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    assert (got.float() - want).abs().max().item() < tol


def test_splits_fill_the_gpu_and_never_outnumber_the_tiles():
    assert splits_for(rows=128, kv_heads=8, length=256, programs=264) == 1  # the batch alone fills it
    assert splits_for(rows=1, kv_heads=8, length=256, programs=264) == 1  # too short to be worth a second kernel
    assert splits_for(rows=1, kv_heads=8, length=2048, programs=264) == 2048 // TILE // MIN_SPLIT_TILES
    assert splits_for(rows=1, kv_heads=8, length=16384, programs=264) == 16  # capped
    assert splits_for(rows=1, kv_heads=8, length=10, programs=264) == 1


def test_the_start_check_accepts_the_kernel_and_names_what_a_wrong_one_got_wrong():
    kernel = functools.partial(paged_decode, programs=8)
    assert check(kernel, 2, 4, 64, 16, torch.float32, torch.device("cpu")) is None
    assert check(kernel, 2, 4, 64, 16, torch.float16, torch.device("cpu")) is None
    wrong = lambda *a: paged_decode(*a, programs=8) * 1.01  # noqa: E731
    assert "differ by" in check(wrong, 2, 4, 64, 16, torch.float32, torch.device("cpu"))


def test_a_decode_step_attends_alike_through_the_kernel_and_through_the_gather():
    """The attention function's decode part (query heads folded on their kv head, rows scattered onto their slots'
    rows, the step's keys written into the pool first) gives the same output with either path."""
    gen = torch.Generator().manual_seed(7)
    n_kv, rep, head_dim, block_size, slots = 2, 3, 32, 4, 5
    k_cache, v_cache = _pool(40, block_size, n_kv, head_dim, torch.float32, gen)
    table = torch.stack([torch.randperm(39, generator=gen)[:8] + 1 for _ in range(slots)])
    decode_slots, positions = [0, 3, 4], [9, 20, 1]  # slots 1 and 2 idle: rows of one ignored position
    lens = torch.ones(slots, dtype=torch.long)
    lens[decode_slots] = torch.tensor(positions) + 1
    length = 32
    query = torch.randn(1, n_kv * rep, 3, head_dim, generator=gen)
    key = torch.randn(1, n_kv, 3, head_dim, generator=gen)
    value = torch.randn(1, n_kv, 3, head_dim, generator=gen)
    rows_of = (
        table[decode_slots, torch.tensor(positions) // block_size] * block_size + torch.tensor(positions) % block_size
    )
    outs = []
    for kernel in (None, functools.partial(paged_decode, programs=4)):
        ctx = StepContext()
        ctx.flat_idx = (rows_of[:, None] * n_kv + torch.arange(n_kv)[None, :]).reshape(-1)
        ctx.n_dec, ctx.dec_rows, ctx.dec_len = 3, slots, length
        ctx.dec_scatter = torch.tensor(decode_slots)
        ctx.eager, ctx.chunks, ctx.groups = False, [], []
        ctx.table, ctx.block_size = table, block_size
        ctx.dec_lens, ctx.dec_kernel = lens, kernel
        ctx.dec_mask = decode_mask(lens, torch.arange(length), torch.float32, "cpu") if kernel is None else None
        tls.ctx, tls.cache = ctx, [(k_cache.clone(), v_cache.clone())]
        try:
            outs.append(_slot_attention(0, query, key, value, head_dim**-0.5))
        finally:
            tls.ctx = tls.cache = None
    assert outs[0].shape == (1, 3, n_kv * rep, head_dim)
    assert (outs[0] - outs[1]).abs().max().item() < 1e-5
