"""The kernels of one batch-1 decode step of the hf engine, with and without torch.compile (one_gpu.sh step 2b).

    python -m benchmark.gpu.decode_kernels --model /tmp/llama-1b [--replays 20] [--top 25] [--variants ...]

Builds the engine's model runner (bf16, CUDA graphs) once per variant (--variants; default both:
uncompiled and compiled), captures the decode graphs, and profiles --replays replays of the batch-1 graph (one sequence at position 199)
with torch.profiler.  Prints, per variant, the kernels per step and their summed GPU time per step,
then the kernels that take the most time: launches per step, mean time, time per step, name.  The
sum is GPU busy time; a replay's wall time (decode_bandwidth.py) adds the gaps between kernels.
"""

from __future__ import annotations

import argparse
import collections
import sys

from benchmark.gpu.decode_bandwidth import batch1_graph

# variant -> torch_compile
VARIANTS = {"uncompiled": False, "compiled": True}


def kernel_times(prof) -> dict:
    """{kernel name: [launches, GPU us]} of a torch.profiler run's CUDA events (engine_profile.py reads them too)."""
    import torch

    per_kernel: dict = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            us = getattr(e, "device_time_total", None)
            per_kernel[e.name][0] += 1
            per_kernel[e.name][1] += e.cuda_time_total if us is None else us
    return per_kernel


def profile_step(model: str, torch_compile: bool, replays: int) -> tuple[float, float, list]:
    """(kernels per step, GPU ms per step, [(launches per step, mean us, us per step, name)] by time)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from launcher.hf.runner import HFModelRunner

    runner = HFModelRunner(model, device="cuda", dtype="bfloat16", max_num_seqs=8, torch_compile=torch_compile)
    runner.warm_up()
    graph, _ = batch1_graph(runner)
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    per_kernel = kernel_times(prof)
    del runner, graph
    torch.cuda.empty_cache()
    kernels = sum(n for n, _ in per_kernel.values()) / replays
    busy_ms = sum(t for _, t in per_kernel.values()) / replays / 1000
    rows = sorted(((n / replays, t / n, t / replays, name) for name, (n, t) in per_kernel.items()), key=lambda r: -r[2])
    return kernels, busy_ms, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="HF model folder")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--top", type=int, default=25, help="kernels listed per variant")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("decode_kernels.py profiles a GPU; none is visible", file=sys.stderr)
        return 2
    print(torch.cuda.get_device_name())
    for name in args.variants:
        compiled = VARIANTS[name]
        kernels, busy_ms, rows = profile_step(args.model, compiled, args.replays)
        print(
            f"== {name} (torch_compile={compiled}): {kernels:.0f} kernels per step, "
            f"{busy_ms:.3f} ms of GPU time per step"
        )
        for n, mean, per_step, name in rows[: args.top]:
            print(f"{n:6.1f} x {mean:8.2f} us = {per_step:8.1f} us  {name[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
