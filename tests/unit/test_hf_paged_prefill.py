"""The hf engine's paged prefill attention kernel (launcher/hf/paged_prefill.py) against its reference (the gather
path, each query token as a decode row over its slot's blocks), run here in Triton's interpreter on CPU
(TRITON_INTERPRET=1, tests/unit/conftest.py): the same kernel source the GPU compiles, at its Python API boundary.
Then the steps it serves: a mixed graph's body with prompts that start part-way (their prefix in the cache), with
decode rows and without, against the eager step through the gather path, on the tiny model.  Its compiled speed
and the on-device check run on the lent GPU (docs/performance/hf.md)."""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from launcher.hf.paged_prefill import (  # noqa: E402
    check,
    max_tiles,
    packed,
    paged_prefill,
    query_tokens,
    reference,
    tiles,
)


def _layout(chunks, block_size, blocks, gen):
    """(table, slots, positions, tile rows) of chunks [(start position, tokens)], chunk i in slot i, each slot's
    blocks drawn out of order from the pool."""
    per_row = -(-max(s + n for s, n in chunks) // block_size)
    table = torch.stack([torch.randperm(blocks, generator=gen)[:per_row] for _ in chunks])
    slots = torch.tensor([i for i, (_, n) in enumerate(chunks) for _ in range(n)])
    positions = torch.tensor([p for s, n in chunks for p in range(s, s + n)])
    return table, slots, positions, packed(n for _, n in chunks)


@pytest.mark.parametrize(
    "kv_heads,rep,head_dim,block_size,chunks",
    [
        (2, 4, 64, 16, [(0, 37), (100, 20), (300, 1)]),  # a prompt from 0, one after a cached prefix, one token
        (1, 1, 32, 8, [(5, 70)]),  # no grouping (64-token tiles): two tiles, a start inside a block
        (2, 3, 80, 16, [(130, 9), (0, 5)]),  # 3 query heads per kv head, head size 80, a prefix of 2+ key tiles
        (1, 20, 64, 16, [(17, 3)]),  # 20 query heads per kv head: tiles of two tokens
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_kernel_attends_each_token_over_its_slots_blocks_up_to_its_own_position(
    kv_heads, rep, head_dim, block_size, chunks, dtype
):
    gen = torch.Generator().manual_seed(head_dim * 100 + rep)
    blocks = 64
    k = torch.randn(blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(blocks, block_size, kv_heads, head_dim, generator=gen).to(dtype)
    table, slots, positions, rows = _layout(chunks, block_size, blocks, gen)
    tokens, heads = positions.shape[0], kv_heads * rep
    # the queries as the attention hands them over: the model's [heads, tokens, head_dim], viewed token-major
    q = torch.randn(heads, tokens + 2, head_dim, generator=gen).to(dtype).transpose(0, 1)
    per_tile = query_tokens(rep)
    first, count = (torch.tensor(x) for x in tiles(rows, per_tile, max_tiles(tokens, len(rows), per_tile) + 2))
    # two rows past the chunks (a graph's padding) in no tile, and the tiles past them unused: left as they are
    slots, positions = (
        torch.cat([slots, torch.zeros(2, dtype=torch.long)]),
        torch.cat([positions, torch.tensor([0, 1])]),
    )
    out = torch.full((tokens + 2, heads, head_dim), 7.0, dtype=dtype)
    got = paged_prefill(q, k, v, table, slots, positions, first, count, out, head_dim**-0.5)
    assert got is out
    want = torch.zeros(tokens + 2, heads, head_dim)
    reference(q.float(), k.float(), v.float(), table, slots, positions, first, count, want, head_dim**-0.5)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    assert (got[:tokens].float() - want[:tokens]).abs().max().item() < tol
    assert torch.equal(got[tokens:], torch.full((2, heads, head_dim), 7.0, dtype=dtype))


def test_tiles_cut_each_chunk_and_pad_the_grid():
    assert tiles([(3, 5), (8, 2)], 4) == ([3, 7, 8], [4, 1, 2])  # a chunk never shares a tile with another
    assert tiles([(0, 4)], 4, 3) == ([0, 0, 0], [4, 0, 0])
    assert max_tiles(6, 2, 4) == 4  # two chunks of 6 tokens in all: at most one short tile each past ceil(6 / 4)
    with pytest.raises(ValueError, match="3 tiles do not fit a grid of 2"):
        tiles([(0, 9)], 4, 2)
    # a tile's product has 64 rows: query tokens x query heads of one kv head (a power of two)
    assert [query_tokens(r) for r in (1, 2, 3, 4, 8, 20, 128)] == [64, 32, 16, 16, 8, 2, 1]


@pytest.mark.parametrize("decode_rows,lengths", [(1, [4]), (0, [3, 2]), (2, [1, 20])])
def test_an_eager_step_gives_the_kernel_index_rows_that_start_16_byte_aligned(decode_rows, lengths):
    """Triton compiles a kernel for the alignment of each pointer (16 bytes or not): the eager step's slots,
    positions and tiles each start aligned whatever its token and tile counts (odd here), so the variant the start
    check compiled serves, and none is compiled while requests wait (launcher.hf.step.index_rows)."""
    from launcher.hf.step import PrefillChunk, SamplingRows, StepInputs, prepare_step

    chunks = [PrefillChunk(decode_rows + i, 5 + i, n, True) for i, n in enumerate(lengths)]  # each part-way
    step = StepInputs(
        list(range(decode_rows)),
        [1] * decode_rows,
        [7] * decode_rows,
        chunks,
        [2] * sum(lengths),
        SamplingRows(),
    )
    table = torch.arange(4 * 8).view(4, 8)
    ctx, *_ = prepare_step(step, torch.device("cpu"), 2, table, 16, torch.float32, False, None, paged_prefill, 2)
    _, slots, positions, first, count = ctx.paged
    assert all(t.data_ptr() % 16 == 0 for t in (slots, positions, first, count))
    assert len(slots) % 2 == 1  # an odd token count: a row after one of them would start 8 bytes off
    want_slots = list(range(decode_rows)) + [c.slot for c in chunks for _ in range(c.length)]
    want_pos = [7] * decode_rows + [p for c in chunks for p in range(c.start, c.start + c.length)]
    assert slots.tolist() == want_slots and positions.tolist() == want_pos
    want = tiles(packed(lengths, decode_rows), 2)
    assert (first.tolist(), count.tolist()) == want


def test_the_start_check_accepts_the_kernel_and_names_what_a_wrong_one_got_wrong():
    cpu = torch.device("cpu")
    assert check(paged_prefill, 2, 4, 64, 16, torch.float32, cpu) is None
    assert check(paged_prefill, 1, 2, 64, 8, torch.float16, cpu) is None
    wrong = lambda *a: paged_prefill(*a) * 1.01  # noqa: E731
    assert "query tokens in 3 chunks differ by" in check(wrong, 2, 4, 64, 16, torch.float32, cpu)


@functools.cache
def _runner(tiny_model_dir):
    """The tiny model's runner on CPU, each slot its own blocks, with slots 0 and 2 decoding and the first blocks of
    slots 1 and 3 holding prefixes (as the prefix cache would give them)."""
    from launcher.hf.runner import HFModelRunner, PrefillChunk, SamplingRows, StepInputs

    runner = HFModelRunner(str(tiny_model_dir), device="cpu", max_num_seqs=4, max_model_len=64)
    w = runner.max_blocks
    runner.apply_block_updates([(s, 0, list(range(1 + s * w, 1 + (s + 1) * w))) for s in range(4)])
    with torch.inference_mode():
        for slot, prompt in ((2, range(60, 69)), (0, range(30, 34)), (1, range(100, 132)), (3, range(200, 216))):
            runner._run(
                StepInputs([], [], [], [PrefillChunk(slot, 0, len(prompt), True)], list(prompt), SamplingRows())
            )
    return runner


def _step(decode, chunks):
    from launcher.hf.runner import PrefillChunk, SamplingRows, StepInputs

    slots = [s for s, _ in decode]
    return StepInputs(
        slots,
        [7 + s for s in slots],
        [p for _, p in decode],
        [PrefillChunk(s, start, n, True) for s, start, n in chunks],
        [(11 * s + i) % 900 + 20 for s, _, n in chunks for i in range(n)],
        SamplingRows(),
    )


@pytest.mark.parametrize(
    "decode,chunks,key",
    [
        ([(0, 4), (2, 9)], [(1, 32, 7), (3, 16, 5)], (4, 64, 32)),  # decode rows and two prompts after their prefixes
        ([], [(1, 32, 7)], (1, 64, 32)),  # a prompt after its prefix, no decode rows: all-padding decode rows
        ([(2, 9)], [(1, 32, 20), (0, 0, 3)], (4, 64, 32)),  # one part-way, one whole prompt
    ],
)
def test_a_mixed_graph_takes_prompts_that_start_part_way_through_the_kernel(tiny_model_dir, decode, chunks, key):
    """The body a mixed graph captures, its prompts attending through the paged prefill kernel (interpreted), gives
    the logits and the cache of the eager step through the gather path, in the step's row order."""
    runner = _runner(tiny_model_dir)
    step = _step(decode, chunks)
    mixed = runner.mixed_graphs
    runner.prefill_kernel, mixed.limit, mixed.stand_in = None, 32, True
    try:
        before = [(k.clone(), v.clone()) for k, v in runner.cache]
        assert mixed.key_for(step) is None  # without the kernel: prompts part-way are not a mixed graph's
        with torch.inference_mode():
            eager = runner._run(step)  # the gather path
        after = [(k.clone(), v.clone()) for k, v in runner.cache]
        runner.prefill_kernel = paged_prefill
        assert mixed.key_for(step) == key
        for (k, v), (k0, v0) in zip(runner.cache, before):
            k.copy_(k0), v.copy_(v0)
        with torch.inference_mode():
            got = mixed.replay(step, key)
        torch.testing.assert_close(got, eager, rtol=1e-5, atol=1e-5)
        for (k, v), (k1, v1) in zip(runner.cache, after):
            torch.testing.assert_close(k[1:], k1[1:], rtol=1e-6, atol=1e-6)  # the slots' blocks; pads in the null one
            torch.testing.assert_close(v[1:], v1[1:], rtol=1e-6, atol=1e-6)
        with torch.inference_mode():  # an eager step with the kernel: its continuation chunks through it too
            torch.testing.assert_close(runner._run(step), eager, rtol=1e-5, atol=1e-5)
    finally:
        for (k, v), (k0, v0) in zip(runner.cache, before):
            k.copy_(k0), v.copy_(v0)
        runner.prefill_kernel, mixed.limit, mixed.stand_in = None, 0, False


def test_whole_prompts_alone_stay_with_the_prompt_and_wave_graphs(tiny_model_dir):
    """With the kernel, a mixed graph still leaves a step of whole prompts and no decode rows to the prompt and wave
    graphs (measured faster for them), and takes no chunk that does not end its prompt."""
    from launcher.hf.runner import PrefillChunk

    runner = _runner(tiny_model_dir)
    mixed = runner.mixed_graphs
    runner.prefill_kernel, mixed.limit, mixed.stand_in = paged_prefill, 32, True
    try:
        assert mixed.key_for(_step([], [(1, 0, 7), (3, 0, 5)])) is None
        assert runner.mixed_any_start
        step = _step([(0, 4)], [(1, 32, 7)])
        step.prefill[0] = PrefillChunk(1, 32, 7, False)
        assert mixed.key_for(step) is None
    finally:
        runner.prefill_kernel, mixed.limit, mixed.stand_in = None, 0, False
    assert not runner.mixed_any_start


def test_the_prefill_kernels_benchmark_times_each_path_and_each_agrees_with_the_reference(capsys):
    """benchmark/gpu/prefill_kernels.py, whose GPU times docs/performance/hf.md takes, run here on the CPU (the kernel
    interpreted; its times mean nothing): a table row per case, every path within float32 rounding of the
    reference, the packed path for whole prompts only."""
    import re

    from benchmark.gpu.prefill_kernels import main

    args = ["--device", "cpu", "--dtype", "float32", "--heads", "4", "--kv-heads", "2", "--head-dim", "16"]
    assert main([*args, "--reps", "1", "--cases", "2"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "| case | query tokens | paged ms (diff) | gather ms (diff) | packed ms (diff) |"
    assert table[2].startswith("| 1 x 128 after 1,024 cached | 128 |") and table[2].endswith("| — |")
    assert table[3].startswith("| 4 whole x 128 | 512 |")
    diffs = [float(d) for line in table[2:] for d in re.findall(r"\(([0-9.e+-]+)\)", line)]
    assert len(diffs) == 5 and max(diffs) < 1e-5, table
