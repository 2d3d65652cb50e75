"""The hf engine in-process, tensor parallel on several GPUs, with and without CUDA graphs (docs/performance/hf.md).

    python -m benchmark.gpu.tp_graphs --model /tmp/llama-1b --configs tp1 tp2-graphs tp2-eager tp1-graphs tp2
    python -m benchmark.gpu.tp_graphs --model /tmp/llama-1b --dtype float32 --configs tp1-eager tp2-eager \\
        tp2-graphs tp2 --concurrency 8 --tokens 32        # greedy check: float32, where tp=2 must equal tp=1

Each config starts its ranks fresh: one process per GPU (CUDA_VISIBLE_DEVICES=<rank>), rank 0 an
`Engine` (launcher.hf.engine) and the others `launcher.hf.worker.run_worker`, NCCL between them, as a
served tp>1 model runs them minus tritonserver.  The leader then measures, after a warm-up round:

* greedy: the token ids of 4 prompts of different lengths run together (--greedy-tokens new tokens);
* for each --concurrency C: C requests at once, each a --prompt-tokens prompt (distinct random ids)
  and exactly --tokens new tokens; output tokens/s over the round's wall time, the engine's steps and
  GPU time per step (EngineStats), and at C=1 the decode steps/s between the first and last token.

Configs: tpN (the GPU default: compiled and graphs; tpN-compile is the same), tpN-graphs (graphs,
not compiled), tpN-eager (neither).  Prints a table (tokens/s and its ratio to the first config
at the same C, ms per step, steps/s at C=1, greedy equal to the first config) and, with --json,
writes it.  A config that does not come up within --timeout is reported with its ranks' last lines.
NCCL's NVLink multicast stays off (NCCL_NVLS_ENABLE=0 unless set).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmark.servers import CHECKOUT

GREEDY_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a land far away, there lived",
    "1, 2, 3, 4,",
    "In computer science, a hash table is a data structure that",
]


def parse_config(name: str) -> dict:
    """'tp2-graphs' -> {tp: 2, cuda_graphs: True, torch_compile: False}; tpN alone is the engine's GPU default
    (graphs and compiled), tpN-compile the same spelled out."""
    head, _, mode = name.partition("-")
    if not head.startswith("tp") or not head[2:].isdigit() or mode not in ("", "graphs", "eager", "compile"):
        raise argparse.ArgumentTypeError(f"config {name!r} is not tpN, tpN-graphs, tpN-eager or tpN-compile")
    tp = int(head[2:])
    graphs = mode != "eager"
    compile_ = mode in ("", "compile")
    return {"name": name, "tp": tp, "cuda_graphs": graphs, "torch_compile": compile_}


# ----------------------------------------------------------------------------------------------- one rank
def rank_main(args) -> int:
    """One rank of one config (run by the parent with --rank): the leader measures and prints RESULT <json>."""
    from launcher.hf.tp import TPGroup
    from launcher.hf.worker import run_worker

    cfg = args.configs[0]
    kw = dict(
        device=args.device,
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        cuda_graphs=cfg["cuda_graphs"],
        torch_compile=cfg["torch_compile"],
    )
    group = None
    if cfg["tp"] > 1:
        group = TPGroup(cfg["tp"], rank=args.rank, addr="127.0.0.1", port=args.port, device_type=args.device)
    if args.rank > 0:
        run_worker(args.model, tp=cfg["tp"], group=group, **kw)
        os._exit(0)  # gloo's threads can abort interpreter teardown (pytorch#179291)
    from launcher.engines.hf.config import HFEngineArgs
    from launcher.hf.engine import Engine

    t0 = time.perf_counter()
    # unset graph and compile choices keep the engine's defaults
    chosen = {
        k: (str(v).lower() if k == "torch_compile" else v)
        for k, v in kw.items()
        if k in ("cuda_graphs", "torch_compile") and v is not None
    }
    engine = Engine.from_args(
        HFEngineArgs(
            model_path=args.model,
            tp_size=cfg["tp"],
            max_num_seqs=kw["max_num_seqs"],
            device=kw["device"],
            dtype=kw["dtype"],
            max_model_len=kw["max_model_len"] or 0,
            **chosen,
        ),
        tp_group=group,
    ).start()
    res = {**cfg, "dtype": args.dtype, "ready_s": round(time.perf_counter() - t0, 1), "features": engine.features}
    try:
        res["greedy"] = greedy(engine, args.greedy_tokens)
        rounds(engine, 1, 16, args.prompt_tokens, seed=0)  # warm-up: allocator, kernels not in a graph
        res["rows"] = []
        for c in args.concurrency:
            rounds(engine, c, 16, args.prompt_tokens, seed=1)
            res["rows"].append({"concurrency": c, **rounds(engine, c, args.tokens, args.prompt_tokens, seed=2 + c)})
            print(f"[tp_graphs] {cfg['name']}: {res['rows'][-1]}", file=sys.stderr, flush=True)
    finally:
        engine.shutdown()
    print("RESULT " + json.dumps(res), flush=True)
    os._exit(0)


def greedy(engine, n: int) -> list[list[int]]:
    import threading

    from launcher.hf.engine import SamplingParams

    out: dict = {}

    def go(i, p):
        out[i] = engine.generate(
            p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), timeout=600
        ).token_ids

    threads = [threading.Thread(target=go, args=(i, p)) for i, p in enumerate(GREEDY_PROMPTS)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return [out[i] for i in range(len(GREEDY_PROMPTS))]


def rounds(engine, c: int, tokens: int, prompt_tokens: int, seed: int) -> dict:
    """C requests at once (benchmark/overhead_paths.py's in-process driver); tokens/s over the wall time, the
    engine's steps and GPU time per step, C=1's decode steps/s."""
    from benchmark.overhead_paths import random_prompt_ids, run_direct

    r = run_direct(engine, random_prompt_ids(c, prompt_tokens, min(engine.vocab_size, 32000), seed), c, tokens)
    if r["errors"]:
        raise RuntimeError(f"{r['errors']} of {c} requests failed")
    split = r.get("engine_steps") or {}
    steps = split.get("steps", 0)
    row = {
        "output_tokens_per_s": round(r["tokens_per_s"], 1),
        "wall_s": round(r["wall_s"], 3),
        "steps": steps,
        "ms_per_step": round(1000 * r["wall_s"] / max(1, steps), 3),
        "gpu_ms_per_step": split.get("gpu_ms", 0.0),
    }
    if c == 1:
        row["decode_steps_per_s"] = round(1000 / r["itl_ms_p50"], 1)  # (tokens - 1) / (last - first token time)
    return row


# ----------------------------------------------------------------------------------------------- the parent
def run_config(args, cfg: dict) -> dict:
    from launcher.ports import free_port

    port = free_port()
    procs, logs = [], []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    for r in range(cfg["tp"]):
        log_path = Path(args.workdir) / f"{cfg['name']}_{args.dtype}_rank{r}.log"
        logs.append(log_path)
        cmd = [
            sys.executable,
            "-m",
            "benchmark.gpu.tp_graphs",
            "--rank",
            str(r),
            "--port",
            str(port),
            "--configs",
            cfg["name"],
            "--model",
            args.model,
            "--dtype",
            args.dtype,
            "--device",
            args.device,
            "--max-num-seqs",
            str(args.max_num_seqs),
            "--max-model-len",
            str(args.max_model_len),
            "--tokens",
            str(args.tokens),
            "--prompt-tokens",
            str(args.prompt_tokens),
            "--greedy-tokens",
            str(args.greedy_tokens),
            "--concurrency",
            *map(str, args.concurrency),
        ]
        procs.append(
            subprocess.Popen(
                cmd,
                cwd=CHECKOUT,
                env=dict(env, CUDA_VISIBLE_DEVICES=str(r)),
                stdout=subprocess.PIPE if r == 0 else open(log_path, "w"),
                stderr=open(log_path if r else log_path.with_suffix(".err"), "w"),
                text=True,
            )
        )
    try:
        out, _ = procs[0].communicate(timeout=args.timeout)
        line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        if procs[0].returncode == 0 and line:
            return json.loads(line[-1][len("RESULT ") :])
        why = f"leader exited {procs[0].returncode}"
    except subprocess.TimeoutExpired:
        why = f"no result within {args.timeout:.0f} s"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    tails = []
    for r, path in enumerate(logs):
        f = path.with_suffix(".err") if r == 0 else path
        tails.append(f"rank {r}: " + " | ".join(f.read_text(errors="replace").splitlines()[-8:]) if f.exists() else "")
    return {**cfg, "error": why + "\n" + "\n".join(tails)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="HF model folder")
    ap.add_argument(
        "--configs",
        nargs="+",
        type=parse_config,
        default=None,
        help="tpN, tpN-graphs, tpN-eager, tpN-compile (ratios are to the first; default: tp1 tp1-graphs "
        "tp2-eager tp2-graphs tp2)",
    )
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 128])
    ap.add_argument("--tokens", type=int, default=128, help="new tokens per request")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--greedy-tokens", type=int, default=32)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of this script (gloo, no graphs)")
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--timeout", type=float, default=600, help="seconds a config may take, start to last round")
    ap.add_argument("--workdir", default="/tmp/llmlaunch-tp-graphs", help="ranks' logs")
    ap.add_argument("--json", default="")
    ap.add_argument("--rank", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.configs = args.configs or [parse_config(n) for n in ("tp1", "tp1-graphs", "tp2-eager", "tp2-graphs", "tp2")]
    configs = args.configs
    if args.rank >= 0:
        return rank_main(args)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    results = []
    for cfg in configs:
        print(f"[tp_graphs] {cfg['name']}: starting {cfg['tp']} rank(s), {args.dtype}", file=sys.stderr, flush=True)
        res = run_config(args, cfg)
        results.append(res)
        print(
            f"[tp_graphs] {cfg['name']}: " + (res.get("error") or f"ready in {res['ready_s']} s, {res['features']}"),
            file=sys.stderr,
            flush=True,
        )
    first = next((r for r in results if "rows" in r), None)
    base = {row["concurrency"]: row["output_tokens_per_s"] for row in first["rows"]} if first else {}
    print(
        f"{'config':14} {'C':>4} {'tok/s':>9} {'ratio':>6} {'ms/step':>8} {'GPU ms/step':>11} {'steps/s C=1':>11} "
        f"greedy=first"
    )
    for r in results:
        if "rows" not in r:
            print(f"{r['name']:14} failed: {r['error'].splitlines()[0]}")
            continue
        r["greedy_equals_first"] = r["greedy"] == first["greedy"]
        for row in r["rows"]:
            row["ratio_to_first"] = (
                round(row["output_tokens_per_s"] / base[row["concurrency"]], 3) if row["concurrency"] in base else None
            )
            print(
                f"{r['name']:14} {row['concurrency']:4d} {row['output_tokens_per_s']:9.1f} "
                f"{row['ratio_to_first'] or 0:6.3f} {row['ms_per_step']:8.3f} {row['gpu_ms_per_step']:11.3f} "
                f"{row.get('decode_steps_per_s', ''):>11} {r['greedy_equals_first']}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"dtype": args.dtype, "results": results}, indent=1))
    return 0 if all("rows" in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
