"""Prompts that reach the hf engine process together: tokenized in one call or one at a time, in a wave graph or not.

    python benchmark/gpu/intake.py --model /tmp/llama-1b [--concurrency 8 32 128]
    python benchmark/gpu/intake.py --device cpu --concurrency 4 --rounds 1 --max-tokens 8     # a dry run

Engine processes (`EngineProcess`, as the served hf model runs its engine, without the stub, tritonserver and
gRPC) on one GPU with the GPU defaults, taking turns round by round (--variants):
  single   LLMLAUNCH_HF_BATCH_TOKENIZE=0, LLMLAUNCH_HF_WAVE_GRAPHS=0: each "add" tokenized and queued as it is read,
           and more than 4 prompts waiting in one eager step (to measure against)
  batched  the reader takes every message a connection has sent so far and tokenizes their prompts in one call
           (a fast tokenizer spreads it over threads with the GIL released); waves still eager
  waves    batched, and two or more waiting prompts in steps of their own through wave graphs; prompts that arrive
           while others decode and fit a mixed graph go beside the decode rows through it (the default)
  nomixed  waves without mixed graphs (LLMLAUNCH_HF_MIXED_GRAPHS=0: such
           prompts go in steps of their own too).  `--variants nomixed waves` measures what mixed graphs gain
  wait     waves, but a step of prompts (and the decode rows' turn after it) waits for the tokens of the step
           running before it is queued (LLMLAUNCH_HF_PROMPTS_AHEAD=0; by
           default it is queued behind that step at once).  `--variants wait waves` measures what that gains
  unfused  waves, with HF's separate q/k/v and gate/up products (LLMLAUNCH_HF_FUSE_PROJECTIONS=0; the others fuse
           each group into one product, the default: launcher/engines/hf_fuse.py).  `--variants unfused waves`
           measures what fusing gains under load
  fullwait waves, but while requests wait for a slot (every slot taken) each decode step waits for the running
           step's tokens (LLMLAUNCH_HF_FULL_AHEAD=0; by default it is queued
           ahead).  `--variants fullwait waves --request-rate 240` measures what that gains past the engine's capacity
The load is overhead.py's closed loop: C requests in flight, --requests-per-stream x C in all, text prompts of
--prompt-tokens tokens (tokenized in the engine process, as served), each finished request's successor sent at
once from the driver thread.  With one output length for all (the default) requests end together and their
successors arrive in a burst: "add" was 15 ms a request at 128 streams with one at a time, and a burst of 8 got
its first tokens later when tokenized together but prefilled in one eager step.
--request-rate R adds open loops (overhead.py's): R x --open-seconds requests a round sent at Poisson arrival times,
the same for every variant, whatever is in flight; past the engine's capacity requests queue for a slot.

Per C and variant (medians over rounds): output tokens/s; add (the driver's add_request -> the engine process
received it) mean / p50 / p99; TTFT mean / p50; ITL p50; the engine's step time, the share of its steps queued
ahead of the last one's tokens and the GPU's idle time a step (on a GPU).  Then each against the first.  Prints a
table on stderr and one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# engine process -> its environment: prompts tokenized one at a time or together, waves of prompts through wave
# graphs (HFModelRunner.WAVE_ROWS) or in one eager step, prompt steps queued ahead or not, projections fused or not.
# "waves" is the default.
VARIANTS = {"single": {"LLMLAUNCH_HF_BATCH_TOKENIZE": "0", "LLMLAUNCH_HF_WAVE_GRAPHS": "0"},
            "batched": {"LLMLAUNCH_HF_BATCH_TOKENIZE": "1", "LLMLAUNCH_HF_WAVE_GRAPHS": "0"},
            "waves": {"LLMLAUNCH_HF_BATCH_TOKENIZE": "1", "LLMLAUNCH_HF_WAVE_GRAPHS": "1"},
            "wait": {"LLMLAUNCH_HF_BATCH_TOKENIZE": "1", "LLMLAUNCH_HF_WAVE_GRAPHS": "1",
                     "LLMLAUNCH_HF_PROMPTS_AHEAD": "0"},
            "unfused": {"LLMLAUNCH_HF_BATCH_TOKENIZE": "1", "LLMLAUNCH_HF_WAVE_GRAPHS": "1",
                        "LLMLAUNCH_HF_FUSE_PROJECTIONS": "0"},
            "nomixed": {"LLMLAUNCH_HF_BATCH_TOKENIZE": "1", "LLMLAUNCH_HF_WAVE_GRAPHS": "1",
                        "LLMLAUNCH_HF_MIXED_GRAPHS": "0"},
            "fullwait": {"LLMLAUNCH_HF_BATCH_TOKENIZE": "1", "LLMLAUNCH_HF_WAVE_GRAPHS": "1",
                         "LLMLAUNCH_HF_FULL_AHEAD": "0"}}
KEYS = ("add_ms_mean", "add_ms_p50", "add_ms_p99", "ttft_ms_mean", "ttft_ms_p50", "itl_ms_p50", "in_flight_mean")


def log(msg: str) -> None:
    print(f"[intake] {msg}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    from benchmark.overhead import add_open_loop_args, add_side_by_side_args, check_open_loop_args, check_side_by_side_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_side_by_side_args(ap, max_tokens=128, max_tokens_min=0)  # 0: every request --max-tokens
    ap.add_argument("--variants", nargs="+", default=["single", "batched", "waves"], choices=list(VARIANTS),
                    help="engine processes to compare (the first is the baseline of the ratios)")
    add_open_loop_args(ap, "the same times for every variant")
    args = ap.parse_args(argv)
    check_open_loop_args(ap, args)
    check_side_by_side_args(ap, args, lowest_min=0)

    from transformers import AutoTokenizer

    from benchmark.overhead import (draw_output_lengths, make_loads, make_prompts, side_by_side,
                                    side_by_side_summary, write_json)
    from launcher.engines.hf_engine import describe_features
    from launcher.engines.hf_process import EngineProcess
    from launcher.tiny import ensure_tiny_model

    model = args.model or str(ensure_tiny_model())
    tokenizer = AutoTokenizer.from_pretrained(model)
    engines: dict = {}
    saved = dict(os.environ)
    try:
        for name in args.variants:  # the child reads the variables from the environment it inherits
            os.environ.update(VARIANTS[name])
            try:
                engines[name] = EngineProcess(model, device=args.device, dtype=args.dtype,
                                              max_num_seqs=args.max_num_seqs).start()
            finally:
                os.environ.clear()
                os.environ.update(saved)
            log(f"{name} engine process ready (pid {engines[name].info.get('pid')}): "
                f"{describe_features(engines[name].features)}")
        out = {"model": model, "device": args.device, "dtype": args.dtype, "prompt_tokens": args.prompt_tokens,
               "max_tokens": [args.max_tokens_min or args.max_tokens, args.max_tokens], "rounds": args.rounds,
               "cpus": os.cpu_count(), "runs": []}
        for load in make_loads(args):
            n, label = load.requests, load.label()
            prompts = make_prompts(tokenizer, n, args.prompt_tokens, seed=load.seed)
            lengths = (draw_output_lengths(n, args.max_tokens_min, args.max_tokens, seed=load.seed)
                       if args.max_tokens_min else args.max_tokens)
            warm = load.warmup(args.max_num_seqs).concurrency
            runs = side_by_side(engines, prompts, warm, lengths, args.rounds, args.max_tokens, lambda c, r, runs: log(
                f"{label} round {r + 1}: " + ", ".join(
                    f"{name} {rs[-1]['tokens_per_s']:.0f} tok/s, add {rs[-1].get('add_ms_mean', 0):.2f} ms"
                    for name, rs in runs.items())), arrivals=load.arrivals())
            row = {"concurrency": load.concurrency or None, "request_rate": load.rate or None, "label": label,
                   "requests": n}
            row.update({name: side_by_side_summary(rs, KEYS) for name, rs in runs.items()})
            base = args.variants[0]
            row.update({f"{name}_vs_{base}": round(row[name]["tokens_per_s"] / row[base]["tokens_per_s"], 4)
                        for name in args.variants[1:]})
            out["runs"].append(row)
    finally:
        for eng in engines.values():
            eng.shutdown()

    log(f"{'load':>10} {'variant':<8} {'tok/s':>9} {'add mean':>8} {'p50':>6} {'p99':>7} {'TTFT mean':>9} {'p50':>7} "
        f"{'ITL p50':>7} {'step ms':>7} {'ahead':>5} {'GPU idle':>8} {'in flight':>9} {'slot wait ms':>12}")
    for row in out["runs"]:
        for name in engines:
            r, es = row[name], row[name].get("engine_steps", {})
            log(f"{row['label']:>10} {name:<8} {r['tokens_per_s']:>9.1f} {r['add_ms_mean'] or 0:>8.2f} "
                f"{r['add_ms_p50'] or 0:>6.2f} {r['add_ms_p99'] or 0:>7.2f} {r['ttft_ms_mean'] or 0:>9.2f} "
                f"{r['ttft_ms_p50'] or 0:>7.2f} {r['itl_ms_p50'] or 0:>7.3f} {es.get('step_ms', 0):>7.3f} "
                f"{es.get('ahead', 0):>5.2f} {es.get('gpu_idle_ms') or 0:>8.3f} {r['in_flight_mean'] or 0:>9.1f} "
                f"{es.get('queue_ms', 0):>12.2f}")
        log(f"{row['label']:>10} tok/s against {args.variants[0]}: " + ", ".join(
            f"{name} {row[f'{name}_vs_{args.variants[0]}']:.3f}" for name in args.variants[1:]))
    write_json(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
