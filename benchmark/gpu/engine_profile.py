"""Where the hf engine's steps go under load: closed loops in-process, the engine's own step split and the GPU's
kernels, per concurrency (docs/performance/hf.md, the 8B profile).

    python -m benchmark.gpu.engine_profile --model /tmp/llama-8b [--concurrency 1 64 128 256] [--set mixed_graphs=0]

One engine (launcher.hf.engine.Engine, the served model's own settings: HFEngineArgs with --set KEY=VALUE on top,
max_num_seqs the largest concurrency) in this process. Per concurrency C, a run of benchmark/overhead_paths.py's closed
loop (its `direct` path): C streams of random --prompt-len token prompts, --requests-per-stream each, exactly --new new
tokens a request (greedy, ignore_eos), the next request added as soon as one ends; every run's prompts are new to the
prefix cache (a concurrency given twice runs again on prompts of its own: a repeat). It gives tokens/s, each stream's
tokens/s, TTFT, TPOT and ITL p50 (as the vLLM yardstick names them) and the engine's step split over the run (step =
launch + wait + host; the GPU's span and idle per step; decode rows and prompt tokens per step; the share of steps with
prompts and how they ran: launcher.python_backend.timings.engine_step_split, which also gives the share of its prompt
tokens the prefix cache served). Then the same load again, --warm-s into it --profile-s under torch.profiler: the GPU
time per step of each kernel and of each kind of kernel (matrix products, attention, the compiled fusions, copies, the
rest), beside that window's own step split (its steps' wall time, decode rows and prompt tokens: closed loops of equal
lengths stay in step, so a short window's mix of prompt and decode steps differs from the run's, and the profiler's
tracing slows them). No tritonserver, no stub, no tokenizer on the way (token ids in and out): the served path's costs
are absent, so what limits the engine itself shows alone. Prints a line per concurrency to stderr, one JSON document to
stdout (--json FILE too). On CPU (--device cpu, a tiny model) it runs the same, without GPU columns.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import threading
import time

# kernel kinds, by name (first match wins): what each costs per step says which part of the model to work on
KINDS = (
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|matmul|sm90_|sm80_", re.I)),
    ("attention", re.compile(r"paged|attn|attention|flash|fmha|sdpa", re.I)),
    ("fused", re.compile(r"^triton_", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy", re.I)),
)


def kind_of(name: str) -> str:
    """A kernel's kind (KINDS), "other" when none matches."""
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "other")


def parse_sets(items: list[str]) -> dict:
    """--set KEY=VALUE items as a dict of raw strings (HFEngineArgs.from_dict coerces and checks them)."""
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SystemExit(f"--set {item!r}: write KEY=VALUE, e.g. --set mixed_graphs=0")
        out[key] = value
    return out


def build_engine(args):
    from launcher.engines.hf.config import HFEngineArgs
    from launcher.hf.engine import Engine

    raw = {
        "model_path": args.model,
        "device": args.device,
        "dtype": args.dtype,
        "max_num_seqs": max(args.concurrency),
        **parse_sets(args.set),
    }
    t0 = time.perf_counter()
    eng = Engine.from_args(HFEngineArgs.from_dict(raw, source="--set")).start()
    print(f"[engine_profile] ready in {time.perf_counter() - t0:.1f} s: {eng.features}", file=sys.stderr, flush=True)
    return eng


def kernel_table(prof, steps: int, top: int) -> dict:
    """GPU ms per step by kernel kind and the `top` kernels by time (launches and us per step)."""
    from benchmark.gpu.decode_kernels import kernel_times

    per_kernel = kernel_times(prof)
    steps = max(1, steps)
    kinds: dict = collections.defaultdict(float)
    for name, (_, us) in per_kernel.items():
        kinds[kind_of(name)] += us
    rows = sorted(per_kernel.items(), key=lambda kv: -kv[1][1])[:top]
    return {
        "gpu_ms_per_step": round(sum(us for _, us in per_kernel.values()) / steps / 1000, 4),
        "kernels_per_step": round(sum(n for n, _ in per_kernel.values()) / steps, 1),
        "kinds_ms_per_step": {k: round(us / steps / 1000, 4) for k, us in sorted(kinds.items(), key=lambda kv: -kv[1])},
        "top": [
            {
                "name": name[:120],
                "kind": kind_of(name),
                "per_step": round(n / steps, 2),
                "us_per_step": round(us / steps, 1),
            }
            for name, (n, us) in rows
        ],
    }


def prompt_seeds(c: int, repeat: int) -> tuple[int, int]:
    """The seeds of concurrency C's measured and profiled prompts in its `repeat`-th run (0: the first): the
    yardsticks' per-load seeds (benchmark.yardstick_loop.load_seed), so a concurrency given twice runs on prompts new to
    the prefix cache; prompts it already held would skip their prefill and make a repeat look faster."""
    from benchmark.yardstick_loop import load_seed

    seed = load_seed(c, repeat)
    return seed, seed + 1


def measure(eng, c: int, args, repeat: int = 0) -> dict:
    """One concurrency: a measured run, then a profiled one (module docstring); `repeat`: the runs of C before."""
    from torch.profiler import ProfilerActivity, profile

    from benchmark.overhead_paths import random_prompt_ids, run_direct
    from launcher.python_backend.timings import engine_step_split

    n = c * args.requests_per_stream
    seed, profiled_seed = prompt_seeds(c, repeat)
    run = run_direct(eng, random_prompt_ids(n, args.prompt_len, eng.vocab_size, seed=seed), c, args.new)
    row = {"concurrency": c, "tokens_per_s": round(run["tokens_per_s"], 1)}
    row["stream_tokens_per_s"] = round(row["tokens_per_s"] / c, 2)
    # named as the vLLM yardstick's rows name them (benchmark/engine_yardstick.py), so the two compare like for like:
    # TPOT a request's mean gap between tokens, ITL the p50 over every gap
    row.update(ttft_ms_p50=run["ttft_ms_p50"], tpot_ms_p50=run["itl_ms_p50"], itl_ms_p50=run["gap_itl_ms_p50"])
    row["split"] = run.get("engine_steps")
    if run["errors"]:
        row["errors"] = run["errors"]
    if args.profile_s > 0:
        # the same load again, profiled from this thread once it has run --warm-s; the GPU's kernels only:
        # recording every host op of the engine's thread would slow the steps it profiles
        again = threading.Thread(
            target=run_direct,
            args=(eng, random_prompt_ids(n, args.prompt_len, eng.vocab_size, profiled_seed), c, args.new),
        )
        again.start()
        time.sleep(args.warm_s)
        activities = [ProfilerActivity.CUDA] if args.device.startswith("cuda") else [ProfilerActivity.CPU]
        with profile(activities=activities) as prof:
            p0 = eng.stats_dict()
            time.sleep(args.profile_s)
            p1 = eng.stats_dict()
        again.join()
        # the profiled window's own steps: closed loops of equal lengths stay in step, so a window of a second can
        # hold more (or fewer) prompt steps than the run's mean, and the profiler itself slows short kernels; the
        # kernel table is per step of this window, read beside its split, not the measured run's
        row["profiled"] = engine_step_split(p0, p1)
        if args.device.startswith("cuda"):
            row["kernels"] = kernel_table(prof, p1["steps"] - p0["steps"], args.top)
    return row


def print_row(row: dict) -> None:
    s = row.get("split") or {}
    line = (
        f"[engine_profile] C={row['concurrency']}: {row['tokens_per_s']} tok/s ({row['stream_tokens_per_s']} a stream), "
        f"TTFT p50 {row['ttft_ms_p50']} ms, TPOT p50 {row['tpot_ms_p50']} ms, ITL p50 {row['itl_ms_p50']} ms; "
        f"step {s.get('step_ms')} ms = launch {s.get('launch_ms')} + wait {s.get('wait_ms')} + host {s.get('host_ms')}; "
        f"gpu {s.get('gpu_ms')} idle {s.get('gpu_idle_ms')} (measured on {s.get('gpu_gap_seen')} of steps); "
        f"rows {s.get('decode_rows')}, prompt tokens "
        f"{s.get('prefill_tokens')}, prompt steps {s.get('prompt')} (graph {s.get('prompt_graph')}, mixed {s.get('mixed')}); "
        f"prompt tokens from the prefix cache {s.get('prefix_hit_rate')}"
    )
    w = row.get("profiled") or {}
    if w:
        line += (
            f"\n  profiled window: {w.get('steps')} steps of {w.get('step_ms')} ms, rows {w.get('decode_rows')}, "
            f"prompt tokens {w.get('prefill_tokens')}, prompt steps {w.get('prompt')}"
        )
    k = row.get("kernels")
    if k:
        kinds = ", ".join(f"{name} {ms}" for name, ms in k["kinds_ms_per_step"].items())
        line += f"\n  kernels: {k['kernels_per_step']} a step, {k['gpu_ms_per_step']} ms a step: {kinds}"
        line += "".join(
            f"\n    {r['us_per_step']:9.1f} us  {r['per_step']:6.2f}x  {r['kind']:9s} {r['name']}" for r in k["top"]
        )
    print(line, file=sys.stderr, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="HF model folder")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 128, 256])
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new", type=int, default=128, help="new tokens a request")
    ap.add_argument("--requests-per-stream", type=int, default=4, help="requests a stream sends in each run")
    ap.add_argument("--warm-s", type=float, default=3.0, help="seconds of the profiled run before the profiler starts")
    ap.add_argument("--profile-s", type=float, default=1.5, help="seconds under torch.profiler (0: no profiled run)")
    ap.add_argument("--top", type=int, default=15, help="kernels listed per concurrency")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an engine argument (HFEngineArgs)")
    ap.add_argument("--json", help="also write the JSON document here")
    args = ap.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            "engine_profile.py: --device cuda but no GPU is visible (--device cpu runs it on a tiny model)",
            file=sys.stderr,
        )
        return 2
    eng = build_engine(args)
    out = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        "model": args.model,
        "sets": parse_sets(args.set),
        "features": eng.features,
        "rows": [],
    }
    try:
        runs: collections.Counter = collections.Counter()
        for c in args.concurrency:
            row = measure(eng, c, args, repeat=runs[c])
            runs[c] += 1
            print_row(row)
            out["rows"].append(row)
    finally:
        eng.shutdown()
    text = json.dumps(out, indent=2, default=str)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    print(text)
    return 1 if any("errors" in r for r in out["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
