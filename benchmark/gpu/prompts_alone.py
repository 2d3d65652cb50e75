"""Prompts that arrive while others decode: beside the decode rows through mixed graphs, through their CUDA graphs one
at a time, or in one eager step, side by side.

    python benchmark/gpu/prompts_alone.py --model /tmp/llama-1b [--concurrency 8 32 128]
    python benchmark/gpu/prompts_alone.py --device cpu --concurrency 2 --rounds 1 --max-tokens 12 --max-tokens-min 2

Three in-process engines on one GPU (the GPU defaults: torch.compile, decode and prompt graphs, overlap), taking
turns round by round: `mixed` (the default: waiting prompts that fit a mixed graph go beside the decode rows in
their step through it, Engine._prompts_mixed; more go in waves), `alone` (mixed_graphs=0: one waiting prompt goes through its prompt graph in a step of its own while the decode rows
wait, two or more through a wave graph, Engine._prompt_wave) and `eager` (prefill_graphs=0, mixed_graphs=0: no
prompt, wave or mixed graphs, so every step with prompt tokens runs eagerly beside the decode rows, ~10-11 ms of kernel launches
on an H100 host).  The load
is overhead.py's closed loop (C requests in flight, `--requests-per-stream` x C in all, --prompt-tokens prompts),
each request with an exact output length of its own drawn from [--max-tokens-min, --max-tokens], the same for
both engines and every round: requests end apart and their successors arrive one by one while the others
decode, as in real traffic.  With one length for all (--max-tokens-min = --max-tokens) they end together and
arrive in waves: through wave graphs with `mixed` and `alone`, in one eager step with `eager`.

Per C and engine (medians over rounds): output tokens/s, TTFT mean / p50 / p99, ITL p50, the p99 gap between a
request's tokens, and the engine's step split (share of steps with prompts, through a prompt or wave graph and
through a mixed graph); then mixed / alone and alone / eager.  Prints a table on stderr and one JSON document on
stdout.  On a CPU (no graphs) the engines
run the same steps: a dry run of the script.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# engine name -> its settings: the defaults (prompts beside the decode rows through mixed graphs, waves through
# theirs), prompts alone and waves through their graphs (no mixed graphs), all prompt steps eager
CONFIGS = {"mixed": {}, "alone": {"mixed_graphs": 0},
           "eager": {"prefill_graphs": 0, "mixed_graphs": 0}}
KEYS = ("ttft_ms_mean", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "gap_ms_p99")


def log(msg: str) -> None:
    print(f"[prompts_alone] {msg}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    from benchmark.overhead import add_side_by_side_args, check_side_by_side_args

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_side_by_side_args(ap, max_tokens=192, max_tokens_min=64)
    args = ap.parse_args(argv)
    check_side_by_side_args(ap, args, lowest_min=1)

    from benchmark.overhead import random_prompt_ids, side_by_side, side_by_side_summary, write_json
    from launcher.bench.loads import draw_output_lengths
    from launcher.engines.hf_engine import Engine, describe_features
    from launcher.tiny import ensure_tiny_model

    model = args.model or str(ensure_tiny_model())
    engines = {}
    try:
        for name, settings in CONFIGS.items():
            engines[name] = Engine(model, device=args.device, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
                                   **settings).start()
            log(f"{name} engine: {describe_features(engines[name].features)}")
        out = {"model": model, "device": args.device, "dtype": args.dtype, "prompt_tokens": args.prompt_tokens,
               "max_tokens": [args.max_tokens_min, args.max_tokens], "rounds": args.rounds, "runs": []}
        vocab = next(iter(engines.values())).vocab_size
        for c in args.concurrency:
            n = c * args.requests_per_stream
            prompts = random_prompt_ids(n, args.prompt_tokens, vocab, seed=c)
            lengths = draw_output_lengths(n, args.max_tokens_min, args.max_tokens, seed=c)
            runs = side_by_side(engines, prompts, c, lengths, args.rounds, args.max_tokens, lambda c, r, runs: log(
                f"C={c} round {r + 1}: " + ", ".join(f"{name} {rs[-1]['tokens_per_s']:.0f} tok/s"
                                                     for name, rs in runs.items())))
            row = {"concurrency": c, "requests": n, "output_tokens": sum(lengths)}
            row.update({name: side_by_side_summary(rs, KEYS) for name, rs in runs.items()})
            row["mixed_vs_alone"] = round(row["mixed"]["tokens_per_s"] / row["alone"]["tokens_per_s"], 4)
            row["alone_vs_eager"] = round(row["alone"]["tokens_per_s"] / row["eager"]["tokens_per_s"], 4)
            out["runs"].append(row)
    finally:
        for eng in engines.values():
            eng.shutdown()

    log(f"{'C':>4} {'engine':<6} {'tok/s':>9} {'TTFT mean':>9} {'p50':>7} {'p99':>8} {'ITL p50':>8} {'gap p99':>8} "
        f"{'prompt steps':>12} {'via graph':>9} {'mixed':>6}")
    for row in out["runs"]:
        for name in engines:
            r, es = row[name], row[name].get("engine_steps", {})
            log(f"{row['concurrency']:>4} {name:<6} {r['tokens_per_s']:>9.1f} {r['ttft_ms_mean'] or 0:>9.2f} "
                f"{r['ttft_ms_p50'] or 0:>7.2f} {r['ttft_ms_p99'] or 0:>8.2f} {r['itl_ms_p50'] or 0:>8.3f} "
                f"{r['gap_ms_p99'] or 0:>8.3f} {100 * es.get('prompt', 0):>11.1f}% "
                f"{100 * es.get('prompt_graph', 0):>8.1f}% {100 * es.get('mixed', 0):>5.1f}%")
        log(f"{row['concurrency']:>4} mixed / alone: {row['mixed_vs_alone']:.3f}, alone / eager: "
            f"{row['alone_vs_eager']:.3f}")
    write_json(out, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
