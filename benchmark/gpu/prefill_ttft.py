"""Time to first token of the hf engine on one GPU, with and without prompt CUDA graphs (docs/performance/hf.md).

    python -m benchmark.gpu.prefill_ttft --model /tmp/llama-1b [--lengths 16 128 512 2000] [--requests 20]

Two engines in this process on the same GPU (the GPU defaults: torch.compile, decode graphs), one capturing
the prompt graphs (HFModelRunner, prompt-only steps of one prompt, the default) and one not (prefill_graphs=0).
Requests go one at a time, each finding its engine idle (what every request meets at concurrency 1), the two
engines taking turns: TTFT = `add_request` (tokens given, no tokenizer) to the first output on the engine's
thread.  One new token a request (max_tokens=1), so the step measured is the prompt's alone.  Per prompt length:
median and p90 TTFT of each engine, their ratio, and the engine's own split of those steps (launch, wait for the
GPU, GPU busy; EngineStats).  Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time


def engine(model: str, device: str, dtype: str, prefill_graphs: int | None):
    from launcher.engines.hf.config import HFEngineArgs
    from launcher.hf.engine import Engine

    t0 = time.perf_counter()
    args = HFEngineArgs(model_path=model, device=device, dtype=dtype, max_num_seqs=8)
    if prefill_graphs is not None:
        args.prefill_graphs = prefill_graphs
    eng = Engine.from_args(args).start()
    print(
        f"[prefill_ttft] engine prefill_graphs={prefill_graphs} ready in {time.perf_counter() - t0:.1f} s: "
        f"{eng.features}",
        file=sys.stderr,
        flush=True,
    )
    return eng


def ttft(eng, prompt: list[int]) -> float:
    from launcher.hf.engine import SamplingParams

    first, done = [], threading.Event()

    def on_output(out):
        if not first:
            first.append(time.perf_counter())
        if out.finish_reason is not None:
            done.set()

    t0 = time.perf_counter()
    eng.add_request(f"r{t0}", prompt, SamplingParams(max_tokens=1, ignore_eos=True), on_output)
    if not done.wait(120):
        raise RuntimeError("no output within 120 s")
    return first[0] - t0


def split(before: dict, after: dict) -> dict:
    steps = after["steps"] - before["steps"]
    per = lambda key: round(1000 * (after[key] - before[key]) / max(1, steps), 3)  # noqa: E731
    return {"steps": steps, "launch_ms": per("launch_s"), "wait_ms": per("wait_s"), "gpu_busy_ms": per("gpu_s")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="HF model folder")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda", help="cpu runs the script (no graphs there: both engines eager)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[16, 128, 512, 2000], help="prompt lengths (tokens)")
    ap.add_argument("--requests", type=int, default=20, help="requests per length and engine (after 3 warm-up ones)")
    args = ap.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("prefill_ttft.py measures a GPU; none is visible", file=sys.stderr)
        return 2
    engines = {
        "graphs": engine(args.model, args.device, args.dtype, None),
        "eager": engine(args.model, args.device, args.dtype, 0),
    }
    out = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        "dtype": args.dtype,
        "features": {name: e.features for name, e in engines.items()},
        "lengths": [],
    }
    rng = random.Random(0)
    vocab = min(e.vocab_size for e in engines.values())
    try:
        for length in args.lengths:
            prompts = [
                [rng.randrange(vocab // 8, vocab - vocab // 8) for _ in range(length)] for _ in range(args.requests + 3)
            ]
            times = {name: [] for name in engines}
            stats = {}
            for i, prompt in enumerate(prompts):
                if i == 3:  # warm-up done: count from here
                    stats = {name: e.stats_dict() for name, e in engines.items()}
                for name, e in engines.items() if i % 2 else reversed(engines.items()):  # take turns going first
                    t = ttft(e, prompt)
                    if i >= 3:
                        times[name].append(1000 * t)
            row = {"prompt_tokens": length}
            for name, e in engines.items():
                ts = sorted(times[name])
                row[f"{name}_ttft_ms_p50"] = round(statistics.median(ts), 3)
                row[f"{name}_ttft_ms_p90"] = round(ts[int(0.9 * (len(ts) - 1))], 3)
                row[f"{name}_step"] = split(stats[name], e.stats_dict())
            row["graphs_over_eager_ttft_p50"] = round(row["graphs_ttft_ms_p50"] / row["eager_ttft_ms_p50"], 3)
            print(f"[prefill_ttft] {json.dumps(row)}", file=sys.stderr, flush=True)
            out["lengths"].append(row)
    finally:
        for e in engines.values():
            e.shutdown()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
