"""One layer's prompt attention in the hf engine, by path: the paged prefill kernel against what it replaces
(docs/performance/hf.md).

    python -m benchmark.gpu.prefill_kernels [--heads 32 --kv-heads 8 --head-dim 64] [--block-size 16] [--reps 50]

Per case (prompt chunks of a step: how many, how long, after how many cached tokens), the attention function of one
layer (launcher.hf.attention: the step's keys and values written into the pool, then attention over it) timed with
CUDA events, median of --reps calls, through
  paged   the paged prefill kernel (launcher.hf.paged_prefill): what eager steps and mixed graphs run on a GPU;
  gather  the eager path without it: prompts from position 0 in causal SDPA groups, prompts part-way with their
          prefix gathered from the blocks into one padded tensor per group;
  packed  whole prompts packed under a block-diagonal mask in one SDPA (the mixed graphs' attention without the
          kernel; whole prompts only).
Each path's largest difference from the kernel's reference (float32) is printed beside its time; on a GPU each
path is timed again as one replay of a CUDA graph that holds the call (its GPU time alone, as a mixed graph runs it:
an eager call's time is mostly the host launching its kernels).  The default
heads are the 1.24 B model's (32 x 64, 8 kv heads); --head-dim 128 is the Llama-3.1-8B shape's.  Off a GPU
(--device cpu, TRITON_INTERPRET=1) it runs the same code for a check, its times meaning nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys

# (name, chunks: (cached tokens before the chunk, tokens in it) each)
CASES = (
    ("1 x 128 after 1,024 cached", [(1024, 128)]),
    ("4 whole x 128", [(0, 128)] * 4),
    ("8 x 128 after 1,024 cached", [(1024, 128)] * 8),
    ("8 whole x 64", [(0, 64)] * 8),
    ("1 x 512 after 2,048 cached", [(2048, 512)]),
)


def _setup(chunks, heads, kv_heads, head_dim, block_size, dtype, device, gen):
    """(step, table, pool (k, v), query, key, value) of one step of `chunks`, chunk i in slot i, over a pool whose
    blocks each slot takes out of order."""
    import torch

    from launcher.hf.step import PrefillChunk, SamplingRows, StepInputs

    span = max(s + n for s, n in chunks)
    per_slot = -(-span // block_size)
    blocks = per_slot * len(chunks) + 1
    order = torch.randperm(blocks - 1, generator=gen) + 1  # block 0: the null block nobody reads
    table = order[: per_slot * len(chunks)].view(len(chunks), per_slot).to(device)
    pool = [torch.randn(blocks, block_size, kv_heads, head_dim, generator=gen).to(device, dtype) for _ in range(2)]
    step = StepInputs(
        [],
        [],
        [],
        [PrefillChunk(i, s, n, True) for i, (s, n) in enumerate(chunks)],
        [0] * sum(n for _, n in chunks),
        SamplingRows(),
    )
    tokens = sum(n for _, n in chunks)
    qkv = [torch.randn(1, h, tokens, head_dim, generator=gen).to(device, dtype) for h in (heads, kv_heads, kv_heads)]
    return step, table, pool, qkv


def _contexts(step, table, pool, heads, kv_heads, block_size, dtype, device):
    """{path: StepContext} of the step (paths that do not apply to it left out)."""
    import torch

    from launcher.hf.attention import StepContext
    from launcher.hf.paged_prefill import paged_prefill, query_tokens, reference
    from launcher.hf.step import prepare_step

    kernel = reference if device.type == "cpu" and not _interpreted() else paged_prefill
    tile = query_tokens(heads // kv_heads)
    out = {}
    for path, k in (("paged", kernel), ("gather", None)):
        ctx, *_ = prepare_step(step, device, kv_heads, table, block_size, dtype, False, None, k, tile)
        if k is not None and ctx.paged is None:  # prompts from position 0 only: the kernel in a mixed graph's layout
            ctx.groups, ctx.chunks = [], []
            first, count = _tiles(step, tile)
            meta = torch.tensor(
                [
                    [c.slot for c in step.prefill for _ in range(c.length)],
                    [p for c in step.prefill for p in range(c.start, c.start + c.length)],
                ],
                dtype=torch.long,
            ).to(device)
            ctx.paged = (k, meta[0], meta[1], first.to(device), count.to(device))
        out[path] = ctx
    if all(c.start == 0 for c in step.prefill):
        ctx = StepContext()
        ctx.flat_idx, ctx.n_dec, ctx.eager, ctx.groups, ctx.chunks = out["gather"].flat_idx, 0, False, [], []
        ctx.table, ctx.block_size = table, block_size
        seg = torch.tensor([i for i, c in enumerate(step.prefill) for _ in range(c.length)], device=device)
        idx = torch.arange(seg.shape[0], device=device)
        allowed = (seg[:, None] == seg[None, :]) & (idx[None, :] <= idx[:, None])
        mask = torch.zeros(seg.shape[0], seg.shape[0], dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))
        ctx.packed = (0, seg.shape[0], mask)
        out["packed"] = ctx
    return out


def _tiles(step, tile):
    import torch

    from launcher.hf.paged_prefill import packed, tiles

    first, count = tiles(packed(c.length for c in step.prefill), tile)
    return torch.tensor(first), torch.tensor(count)


def _interpreted() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def time_path(ctx, pool, qkv, reps: int, device) -> tuple[float, object]:
    """(median ms of one call, its output) of the attention function with `ctx` over `pool`."""
    import time

    from launcher.hf.attention import _slot_attention, tls

    q, k, v = qkv
    tls.ctx, tls.cache = ctx, [tuple(pool)]
    try:
        out = _slot_attention(0, q, k, v, q.shape[-1] ** -0.5)  # the first call compiles (Triton) or warms up
        if device.type == "cuda":
            return _median_cuda_ms(lambda: _slot_attention(0, q, k, v, q.shape[-1] ** -0.5), reps), out
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            _slot_attention(0, q, k, v, q.shape[-1] ** -0.5)
            times.append((time.perf_counter() - t0) * 1000)
        return statistics.median(times), out
    finally:
        tls.ctx = tls.cache = None


def _median_cuda_ms(call, reps: int) -> float:
    """Median ms of `reps` calls of `call` between two CUDA events."""
    import torch

    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def time_graph(ctx, pool, qkv, reps: int) -> float | None:
    """Median ms of one replay of the attention function captured in a CUDA graph: its GPU time alone, as a mixed
    graph runs it (an eager call's time above is mostly the host launching its kernels).  None where the path cannot
    be captured."""
    import torch

    from launcher.hf.attention import _slot_attention, tls

    q, k, v = qkv
    tls.ctx, tls.cache = ctx, [tuple(pool)]
    try:
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            _slot_attention(0, q, k, v, q.shape[-1] ** -0.5)
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            _slot_attention(0, q, k, v, q.shape[-1] ** -0.5)
    except RuntimeError:
        return None
    finally:
        tls.ctx = tls.cache = None
    return _median_cuda_ms(graph.replay, reps)


def run(args) -> list[dict]:
    import torch

    from launcher.hf.paged_prefill import reference

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for name, chunks in CASES[: args.cases]:
        step, table, pool, qkv = _setup(
            chunks, args.heads, args.kv_heads, args.head_dim, args.block_size, dtype, device, gen
        )
        row = {"case": name, "query tokens": sum(n for _, n in chunks)}
        ctxs = _contexts(step, table, pool, args.heads, args.kv_heads, args.block_size, dtype, device)
        want = None
        for path, ctx in ctxs.items():
            ms, out = time_path(ctx, pool, qkv, args.reps, device)
            if want is None:  # the reference, in float32, over the pool the first call wrote the step's keys into
                slots = torch.tensor([c.slot for c in step.prefill for _ in range(c.length)], device=device)
                pos = torch.tensor([p for c in step.prefill for p in range(c.start, c.start + c.length)], device=device)
                first, count = _tiles(step, 1)
                q = qkv[0][0].transpose(0, 1).float()
                want = torch.zeros_like(q)
                k, v = (p.float() for p in pool)
                reference(q, k, v, table, slots, pos, first.to(device), count.to(device), want, args.head_dim**-0.5)
            row[f"{path} ms"] = round(ms, 4)
            if device.type == "cuda":
                gpu = time_graph(ctx, pool, qkv, args.reps)
                row[f"{path} graph ms"] = round(gpu, 4) if gpu is not None else "—"
            row[f"{path} diff"] = float(f"{(out[0].float() - want).abs().max().item():.3g}")
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--cases", type=int, default=len(CASES), help="the first this many cases")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    rows = run(args)
    paths = [p for p in ("paged", "gather", "packed") if any(f"{p} ms" in r for r in rows)]
    graphs = [p for p in paths if any(f"{p} graph ms" in r for r in rows)]
    heads = [f"{p} ms (diff)" for p in paths] + [f"{p} in a graph ms" for p in graphs]
    print(f"| case | query tokens | {' | '.join(heads)} |")
    print("|---|---|" + "---|" * len(heads))
    for r in rows:
        cells = [f"{r[f'{p} ms']} ({r[f'{p} diff']})" if f"{p} ms" in r else "—" for p in paths]
        cells += [str(r.get(f"{p} graph ms", "—")) for p in graphs]
        print(f"| {r['case']} | {r['query tokens']} | {' | '.join(cells)} |")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
