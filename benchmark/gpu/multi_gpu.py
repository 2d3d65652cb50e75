"""tp and replicas of the hf engine on one multi-GPU host, through `llmlaunch` (docs/performance/hf.md, multi_gpu.sh).

    python -m benchmark.gpu.multi_gpu --model /tmp/llama-1b --gpus 2 --concurrency 1 64 128
    python -m benchmark.gpu.multi_gpu --model /tmp/llama-1b --gpus 4 --layouts tp1 tp2 tp4 rep2 rep2tp2

Each layout is a real `llmlaunch` run (one tritonserver per GPU started as
`python -m launcher.rank`, the same per-rank path as a Slurm task; NCCL between
the ranks of a tensor-parallel group; rank 0's front end when replicas > 1):
start, wait for the endpoint, check that greedy output equals the first
layout's (across tp sizes in float32 only: in bf16/fp16 a tp group sums its
all-reduce in another order, and a near-tie may then pick another token), run
`llmlaunch-bench` once per value of --concurrency (synthetic
prompts, exactly --output-len tokens each, C in flight, max(--num-prompts, 2C)
prompts after C warm-up requests, spread over --client-processes), stop with SIGINT.  Prints a table of output
tokens/s, TTFT and ITL per layout and concurrency and the ratio to the first
layout (tp=1, one replica) at the same concurrency, and writes it as JSON with
--json.

NCCL's NVLink multicast stays off (NCCL_NVLS_ENABLE=0 unless already set):
on shared hosts a program that uses it can take the GPUs out of service.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmark.servers import CHECKOUT, start_llmlaunch, stop_llmlaunch

LAYOUTS = {  # name -> llmlaunch overrides
    "tp1": ["tp=1", "replicas=1"],
    "tp2": ["tp=2", "replicas=1"],
    "tp4": ["tp=4", "replicas=1"],
    "rep2": ["tp=1", "replicas=2"],
    "rep4": ["tp=1", "replicas=4"],
    "rep2tp2": ["tp=2", "replicas=2"],
}
GPUS_NEEDED = {"tp1": 1, "tp2": 2, "tp4": 4, "rep2": 2, "rep4": 4, "rep2tp2": 4}
PROMPT = "The capital of France is"


def log(msg: str) -> None:
    print(f"[multi_gpu] {msg}", file=sys.stderr, flush=True)


def greedy_text(url: str, model: str, max_tokens: int = 48) -> str:
    from launcher.client.request import Generation
    from launcher.client.stream import generate

    rec = generate(url, model, Generation(prompt=PROMPT, max_tokens=max_tokens, stream=True, ignore_eos=True))
    if rec.error:
        raise RuntimeError(f"greedy request failed: {rec.error}")
    return rec.text


def client_processes(requested: int, concurrency: int, cpus: int) -> int:
    """Client processes for one bench: --client-processes, or by default a quarter of the host's CPUs (8 on a
    32-vCPU host; the servers, their stubs and engines keep the rest), never more than the requests in flight.
    One client process cannot keep up with 128 streams: it parses every streamed response in Python (measured
    at 128 streams: four processes were the bottleneck, eight were not)."""
    return max(1, min(concurrency, requested or cpus // 4))


def bench_argv(url: str, model: str, args, concurrency: int, out_json: Path) -> tuple[list[str], int, int]:
    """(llmlaunch-bench argv, prompts, client processes) for one concurrency: at least two waves of C requests, or a
    high C would be measured on its ramp-up and drain alone; by default four waves and at least 16 requests (C=1 then
    takes seconds, not minutes)."""
    num_prompts = max(args.num_prompts, 2 * concurrency) if args.num_prompts else max(16, 4 * concurrency)
    processes = client_processes(args.client_processes, concurrency, os.cpu_count() or 1)
    cmd = [
        sys.executable,
        "-m",
        "launcher.bench.cli",
        "--url",
        url,
        "--model",
        model,
        "--dataset-name",
        "synthetic",
        "--input-len",
        str(args.input_len),
        "--output-len",
        str(args.output_len),
        "--ignore-eos",
        "--num-prompts",
        str(num_prompts),
        "--concurrency",
        str(concurrency),
        "--processes",
        str(processes),
        "--streams",
        "1",
        "--warmup",
        str(concurrency),
        "--no-progress",
        "--result-json",
        str(out_json),
    ]
    if args.tokenizer:
        cmd += ["--tokenizer", args.tokenizer]
    return cmd, num_prompts, processes


def bench(url: str, model: str, args, concurrency: int, out_json: Path) -> dict:
    cmd, num_prompts, processes = bench_argv(url, model, args, concurrency, out_json)
    subprocess.run(cmd, check=True, cwd=CHECKOUT, stdout=subprocess.DEVNULL)
    m = json.loads(out_json.read_text())["metrics"]
    return {
        "concurrency": concurrency,
        "num_prompts": num_prompts,
        "client_processes": processes,
        "output_tokens_per_s": round(m["output_throughput"], 1),
        "completed": m["completed"],
        "failed": m["failed"],
        "ttft_ms_p50": round(m["ttft_ms"]["p50"], 2),
        "ttft_ms_p99": round(m["ttft_ms"]["p99"], 2),
        "itl_ms_p50": round(m["itl_ms"]["p50"], 3),
    }


def tp_of(layout: str) -> int:
    return int(next(o for o in LAYOUTS[layout] if o.startswith("tp=")).split("=")[1])


def verdict(texts: dict[str, str], rows: list[dict], failed: list[dict], dtype: str) -> tuple[int, list[str]]:
    """(exit status, notes) of a run, from each layout's greedy text ({layout: text}, in run order).  It fails on a
    layout that did not start, on failed requests, on no rows, and on greedy text that differs where it must not:
    from the first layout of the same tp size (replicas of tp=1 run one GPU's kernels), and in float32 from the first
    layout.  Across tp sizes in bf16/fp16 a difference is a note: a tensor-parallel all-reduce adds the shards' sums
    in another order than one GPU's matmul, so near-ties of a random model may go the other way (measured on two
    H200s: float32 equal, bf16 not)."""
    if not rows:
        return 1, []
    names = list(texts)
    strict = dtype in ("float32", "fp32")
    wrong, allowed = [], []
    for name in names[1:]:
        same_tp = next(n for n in names if tp_of(n) == tp_of(name))
        if texts[name] != texts[same_tp]:
            wrong.append(f"{name} differs from {same_tp}'s (the same tp size)")
        elif texts[name] != texts[names[0]]:
            (wrong if strict else allowed).append(
                f"{name} differs from {names[0]}'s ({dtype}, tp={tp_of(name)} against tp={tp_of(names[0])})"
            )
    notes = [f"greedy text of {w}: it must not" for w in wrong]
    notes += [f"greedy text of {a}: expected in {dtype}; --dtype float32 checks equality" for a in allowed]
    code = 0 if not failed and not any(r["failed"] for r in rows) and not wrong else 1
    return code, notes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="HF model folder")
    ap.add_argument(
        "--tokenizer", default="", help="tokenizer folder for the bench's token counts (default: the model)"
    )
    ap.add_argument("--gpus", type=int, default=2, help="GPUs of this host the layouts may use")
    ap.add_argument(
        "--layouts",
        nargs="+",
        default=None,
        choices=sorted(LAYOUTS),
        help="default: tp1 and every tp/replica layout that fits --gpus",
    )
    ap.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[64],
        help="requests in flight; one bench per value while a layout's server is up",
    )
    ap.add_argument(
        "--num-prompts",
        type=int,
        default=0,
        help="prompts per bench (at least 2 x concurrency; default: 4 x concurrency, at least 16)",
    )
    ap.add_argument(
        "--client-processes",
        type=int,
        default=0,
        metavar="N",
        help="llmlaunch-bench client processes, one stream each (default 0: a quarter of this host's CPUs, at most C)",
    )
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=128, help="engine.max_num_seqs of every replica")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda", help="engine.device (cpu: a dry run of this script without a GPU)")
    ap.add_argument("--ready-timeout", type=float, default=600)
    ap.add_argument("--workdir", default="")
    ap.add_argument("--json", default="", help="write the table here as JSON")
    ap.add_argument("--extra", nargs="*", default=[], help="more llmlaunch overrides for every layout")
    args = ap.parse_args(argv)
    args.tokenizer = args.tokenizer or args.model
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    layouts = args.layouts or [n for n in LAYOUTS if GPUS_NEEDED[n] <= args.gpus]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="llmlaunch-multigpu-"))
    work.mkdir(parents=True, exist_ok=True)
    common = [
        f"model.path={args.model}",
        "model.make=",
        f"model.dtype={args.dtype}",
        f"engine.device={args.device}",
        f"engine.max_num_seqs={args.max_num_seqs}",
        f"cluster.gpus_per_node={args.gpus}",
        f"cluster.jobs_dir={work / 'runs'}",
        *args.extra,
    ]
    rows, texts, failed = [], {}, []
    for name in layouts:
        log(f"{name}: starting llmlaunch {' '.join(LAYOUTS[name])}")
        t0 = time.monotonic()
        try:
            served = start_llmlaunch(common + LAYOUTS[name], work / f"{name}.log", args.ready_timeout)
        except (RuntimeError, TimeoutError) as exc:  # one layout that does not come up: report it, go on
            log(f"{name}: {exc}")
            failed.append({"layout": name, "error": str(exc)[-3000:]})
            continue
        url, model = served.url, served.model
        try:
            ready_s = time.monotonic() - t0
            text = texts[name] = greedy_text(url, model)
            for c in args.concurrency:
                row = {
                    "layout": name,
                    "overrides": " ".join(LAYOUTS[name]),
                    "ready_s": round(ready_s, 1),
                    "greedy_equals_first": text == next(iter(texts.values())),
                    **bench(url, model, args, c, work / f"{name}_c{c}.json"),
                }
                rows.append(row)
                log(f"{name}: {row}")
        finally:
            stop_llmlaunch(served.proc)
    code, notes = verdict(texts, rows, failed, args.dtype)
    first = rows[0]["layout"] if rows else ""
    base = {r["concurrency"]: r["output_tokens_per_s"] for r in rows if r["layout"] == first}
    for r in rows:
        r["ratio_to_first"] = round(r["output_tokens_per_s"] / base[r["concurrency"]], 3) if base else None
    rows.sort(key=lambda r: r["concurrency"])  # the layouts a ratio compares stand together (stable: run order)
    print(
        f"{'layout':8} {'overrides':20} {'C':>4} {'clients':>7} {'tok/s':>9} {'ratio':>6} {'TTFT p50':>9} {'TTFT p99':>9} "
        f"{'ITL p50':>8} greedy=first"
    )
    for r in rows:
        print(
            f"{r['layout']:8} {r['overrides']:20} {r['concurrency']:4d} {r['client_processes']:7d} "
            f"{r['output_tokens_per_s']:9.1f} "
            f"{r['ratio_to_first']:6.3f} {r['ttft_ms_p50']:9.2f} {r['ttft_ms_p99']:9.2f} {r['itl_ms_p50']:8.3f} "
            f"{r['greedy_equals_first']}"
        )
    for f in failed:
        # the whole error: its first line names the log, the lines after it say what failed and the fix
        print(f"{f['layout']:8} did not start: " + "\n    ".join((f["error"] or "").splitlines()))
    for note in notes:
        print(note)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "concurrency": args.concurrency,
                    "input_len": args.input_len,
                    "output_len": args.output_len,
                    "rows": rows,
                    "failed": failed,
                    "notes": notes,
                },
                indent=1,
            )
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
