"""Serve one configuration with `llmlaunch` and measure it with `llmlaunch-bench`, as a user would.

    python -m benchmark.gpu.serve_bench --label vllm --out DIR --tokenizer M -- engine=vllm model.path=M

Starts `llmlaunch <overrides>` (cluster=local), waits for its endpoint (time to READY is recorded), then
for each --concurrency C:N runs `llmlaunch-bench` over gRPC: C requests in flight, C warm-up requests,
then N counted, --input-len-token synthetic prompts (the tokenizer's, the same on every path), exactly
--output-len new tokens each (ignore_eos). --check first runs the real-engine contract tests
(tests/gpu/test_served_engine.py) against the same server; --identity FILE collects its greedy answers
(benchmark/gpu/identity.py) for comparison with another serving. Stops llmlaunch with Ctrl-C's signal.
Each bench reads every replica's metrics (--server-metrics): the first-token split, the prefix cache, and with
disaggregated serving the keys and values the decode replicas moved (transfers, bytes, time).
Prints one row per concurrency and writes DIR/<label>.json (the rows, READY time, each bench's JSON
path).  --workload NAME=ARGS (repeatable) runs each load again with more llmlaunch-bench arguments while the same
server is up (a shared-prefix dataset beside the synthetic one); its rows carry the workload's name.

--server-command CMD serves with another program instead of llmlaunch: the yardstick a user would otherwise
start, e.g. vLLM's own OpenAI server (`vllm serve`), measured by the same client over OpenAI completions:

    python -m benchmark.gpu.serve_bench --label vllm_serve --out DIR --tokenizer M --server-url http://127.0.0.1:8100 \
        --server-command "python -m vllm.entrypoints.openai.api_server --model M --port 8100 --api-server-count 4"
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from benchmark import host_pulse
from benchmark.gpu.identity import collect
from benchmark.openai_logprobs import collect as logprobs_collect
from benchmark.openai_structured import main as structured_main
from benchmark.servers import CHECKOUT, start_llmlaunch, stop_llmlaunch
from benchmark.yardstick_loop import load_seed
from launcher.engines.vllm import LOAD_PHASES as STARTUP
from launcher.python_backend.cache_splits import format_kv_transfer
from launcher.python_backend.timings import PARTS
from launcher.rundir import RunDir


def startup_breakdown(run_dir: str) -> dict:
    """The first of each STARTUP figure found in the run's rank logs (rank 0's first): what vLLM's start is made of,
    as its own log lines say, read with the product's table (which also puts these phases into the run record's
    time to READY: launcher/readiness.py)."""
    found: dict = {}
    for log in sorted(glob.glob(os.path.join(run_dir, "logs", "*.log"))):
        text = open(log, errors="replace").read()
        for key, pattern in STARTUP.items():
            m = re.search(pattern, text)
            if m and key not in found:
                found[key] = float(m.group(1))
    return found


def start_command(command: str, health_url: str, log_path: str, timeout_s: float) -> subprocess.Popen:
    """`command` (split as a shell would, run without one) in a session of its own, returned once `health_url`
    answers 200; one that exits first or is not healthy after `timeout_s` raises with its log's last lines."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(shlex.split(command), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.monotonic()
    while True:
        try:
            with urllib.request.urlopen(health_url, timeout=5) as r:
                if r.status == 200:
                    return proc
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() - t0 > timeout_s:
            stop_llmlaunch(proc)
            tail = "\n".join(Path(log_path).read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"{command!r} did not answer {health_url} (exit {proc.returncode}):\n{tail}")
        time.sleep(1)


def replica_metrics(run_dir: str) -> tuple[str, str]:
    """Every replica leader's tritonserver metrics URL of a served llmlaunch run, comma-separated (what
    llmlaunch-bench --server-metrics sums: the first-token split, engine totals, keys and values moved), and those
    of them that are prefill replicas' (--prefill-metrics: their first-token split beside the decode replicas')."""
    from launcher.sweep.plan import prefill_metrics_url

    run = RunDir(run_dir)
    ep = run.read_endpoint()
    every = ",".join(r.metrics_url for r in (ep.replicas if ep else ()) if r.metrics_url)
    return every, prefill_metrics_url(run.read_spec(), ep) if every else ""


# a workload's seeds sit this far from the one before it: its loads send prompts of their own, never the first
# workload's again (which the server's prefix cache would still hold), and stay below the next pass's (+ 10000)
WORKLOAD_SEED_STEP = 1000


def bench(url: str, c: int, n: int, args, out_json: str, extra: str = "", run: int = 0, workload: int = 0) -> dict:
    """llmlaunch-bench at concurrency C, N requests counted, its metrics.  The prompts are new to the server at every
    load, pass and workload: seed 2C (+ 1 for the warm-up), + 10000 a pass (`run`, --rounds), + 1000 a workload (its
    index in --workload, the loads without one 0)."""
    processes = 1 if c == 1 else min(c, args.processes)
    argv = [
        sys.executable,
        "-m",
        "launcher.bench.cli",
        "--url",
        url,
        "--concurrency",
        str(c),
        "--num-prompts",
        str(n),
        "--warmup",
        str(c),
        "--input-len",
        str(args.input_len),
        "--output-len",
        str(args.output_len),
        "--ignore-eos",
        "--tokenizer",
        args.tokenizer,
        "--processes",
        str(processes),
        "--no-progress",
        "--seed",
        str(load_seed(c, run) + WORKLOAD_SEED_STEP * workload),
        "--result-json",
        out_json,
        "--label",
        f"{args.label} C={c}",
        *(["--backend", "openai-completions"] if args.server_command else []),
        *(["--server-metrics", args.metrics] if args.metrics and "--server-metrics" not in args.bench_args else []),
        *(["--prefill-metrics", args.prefill_metrics] if args.prefill_metrics and args.metrics else []),
        *shlex.split(args.bench_args),
        *shlex.split(extra),
    ]
    done = subprocess.run(argv, cwd=CHECKOUT, capture_output=True, text=True)
    if done.returncode != 0 or not os.path.exists(out_json):
        raise RuntimeError(f"llmlaunch-bench C={c} failed ({done.returncode}): {done.stderr[-2000:]}")
    with open(out_json) as f:
        return json.load(f)["metrics"]


def openai_url(args, run_dir: str) -> str:
    """The served OpenAI base URL (…/v1): the yardstick's, or llmlaunch's from its endpoint.json."""
    if args.server_command:
        return args.server_url.rstrip("/") + "/v1"
    return RunDir(run_dir).read_endpoint().openai_url


def server_splits(out_json: str) -> tuple[dict | None, dict | None, dict | None]:
    """A bench run's (first-token split, prefix cache, keys and values moved) read from the served model's metrics
    (with --server-metrics), each None where the model has none."""
    with open(out_json) as f:
        doc = json.load(f)
    return doc.get("server_first_token_ms"), doc.get("server_prefix_cache"), doc.get("server_kv_transfer")


def split_text(split: dict | None) -> str:
    """'  first token: parse 0.21 engine 9.80 respond 0.12 send 0.08 outside 2.10 ms' (mean ms; '' without); disagg:
    the decode replicas' parts, then the prefill replicas' inside as 'prefill'."""
    if not split:
        return ""
    parts = [(k, split.get(k)) for k in PARTS]
    parts.append(("prefill", (split.get("prefill") or {}).get("inside_server")))  # disagg: the prefill replica's
    parts.append(("outside", split.get("outside_server")))
    return "  first token: " + " ".join(f"{k.split('_')[0]} {v:.2f}" for k, v in parts if v) + " ms"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--label", required=True, help="name of this configuration in the tables")
    p.add_argument("--out", required=True, help="folder for the results and logs")
    p.add_argument("--tokenizer", required=True, help="tokenizer folder for the prompts (the model's)")
    p.add_argument(
        "--concurrency", nargs="*", default=["1:32", "64:1000", "128:1000"], help="C:N pairs (none: no load)"
    )
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--processes", type=int, default=8, help="llmlaunch-bench client processes at C > 1")
    p.add_argument("--ready-timeout", type=float, default=900.0)
    p.add_argument("--check", action="store_true", help="run tests/gpu/test_served_engine.py against the server first")
    p.add_argument("--identity", metavar="FILE", help="write the server's greedy answers (identity.py collect) here")
    p.add_argument(
        "--identity-prompts",
        default="32:8",
        metavar="N:C",
        help="with --identity: N prompts, C at a time (C=1: no batch can decide a near-tie; 64 new tokens each)",
    )
    p.add_argument(
        "--logprobs",
        metavar="FILE",
        help="write the server's log probabilities of fixed prompts here (benchmark/openai_logprobs.py collect)",
    )
    p.add_argument(
        "--structured",
        metavar="FILE",
        help="check structured output and time n=4 through the OpenAI API, results here (benchmark/openai_structured.py)",
    )
    p.add_argument(
        "--bench-args",
        default="",
        help="more llmlaunch-bench arguments, e.g. '--dataset-name prefix --prefix-groups 8 --prefix-len 1024 "
        "--server-metrics http://127.0.0.1:8002/metrics' (--input-len is then each request's own suffix)",
    )
    p.add_argument(
        "--workload",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="after the loads, each load again with these llmlaunch-bench arguments added (repeatable)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="passes over the loads (and workloads) on the same server, each with prompts of its own: two runs of a "
        "configuration in one lease show their spread",
    )
    p.add_argument(
        "--pulse",
        metavar="FILE",
        default="",
        help="the host's pulse (host_pulse.py's file): each row says how fast the host ran during its load",
    )
    p.add_argument("--server-command", default="", help="serve with this command instead of llmlaunch")
    p.add_argument("--server-url", default="", help="with --server-command: its OpenAI base URL (/health is polled)")
    args = p.parse_args(argv)
    args.metrics = args.prefill_metrics = ""  # the served replicas' metrics URLs (all, prefill), once llmlaunch serves
    if args.server_command and not args.server_url:
        p.error("--server-command needs --server-url, the base URL it serves (e.g. http://127.0.0.1:8100)")
    workloads = [("", "")] + [tuple(w.split("=", 1)) if "=" in w else (w, "") for w in args.workload]
    # `timeout` (engines.sh) ends this with SIGTERM: leave through `finally`, which stops llmlaunch and its server
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    os.makedirs(args.out, exist_ok=True)
    t0 = time.monotonic()
    run_dir = os.path.abspath(os.path.join(args.out, f"{args.label}.run"))
    log_path = os.path.join(args.out, f"{args.label}.log")
    if args.server_command:
        proc = start_command(args.server_command, args.server_url + "/health", log_path, args.ready_timeout)
        url, overrides = args.server_url, [args.server_command]
    else:
        served = start_llmlaunch([*overrides, f"run_dir={run_dir}"], Path(log_path), args.ready_timeout)
        proc, url = served.proc, served.url
        args.metrics, args.prefill_metrics = replica_metrics(run_dir)
    ready_s = time.monotonic() - t0
    startup = {} if args.server_command else startup_breakdown(run_dir)
    print(
        f"{args.label}: READY in {ready_s:.1f} s at {url} ({' '.join(overrides)}); "
        + ", ".join(f"{k} {v:.1f}" for k, v in startup.items()),
        flush=True,
    )
    doc = {
        "label": args.label,
        "overrides": overrides,
        "ready_s": ready_s,
        "startup": startup,
        "rows": [],
        "check": None,
    }
    try:
        if args.check:
            env = dict(os.environ, LLMLAUNCH_TEST_URL=url, LLMLAUNCH_TEST_TOKENIZER=args.tokenizer)
            check = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    "-rA",
                    "tests/gpu/test_served_engine.py",
                ],
                cwd=CHECKOUT,
                env=env,
                capture_output=True,
                text=True,
            )
            doc["check"] = {"returncode": check.returncode, "output": check.stdout[-6000:]}
            print(check.stdout[-4000:], flush=True)
        if args.identity:
            with open(args.identity, "w") as f:
                n, _, c = args.identity_prompts.partition(":")
                json.dump(collect(url, int(n), 64, int(c or 8)), f, indent=1)
            print(f"{args.label}: greedy answers in {args.identity}", flush=True)
        if args.logprobs:
            with open(args.logprobs, "w") as f:
                json.dump(logprobs_collect(openai_url(args, run_dir), 32, 32, 5), f)
            print(f"{args.label}: log probabilities in {args.logprobs}", flush=True)
        if args.structured:
            code = structured_main(["--url", openai_url(args, run_dir), "--json", args.structured])
            print(
                f"{args.label}: structured output {'kept' if code == 0 else 'NOT kept'}: {args.structured}", flush=True
            )
        loads = ((r, k, i) for r in range(args.rounds) for k in range(len(workloads)) for i in args.concurrency)
        for run, k, item in loads:
            workload, extra = workloads[k]
            c, _, n = item.partition(":")
            c, n = int(c), int(n or 10 * int(c))
            name = f"{args.label}{'_' + workload if workload else ''}_c{c}{f'_r{run + 1}' if run else ''}"
            out_json = os.path.join(args.out, f"{name}.json")
            wall = [time.time()]
            try:
                m = bench(url, c, n, args, out_json, extra, run, k)
            except RuntimeError as exc:
                print(f"{args.label} {workload} C={c}: {exc}", flush=True)
                continue
            wall.append(time.time())
            first_token, prefix, moved = server_splits(out_json)
            row = {
                "round": run + 1,
                "workload": workload,
                "concurrency": c,
                "requests": n,
                "output_throughput": m["output_throughput"],
                "ttft_ms_p50": m["ttft_ms"]["p50"],
                "ttft_ms_p99": m["ttft_ms"]["p99"],
                "itl_ms_p50": m["itl_ms"]["p50"],
                "tpot_ms_p50": m["tpot_ms"]["p50"],
                "tokens_per_response": m.get("tokens_per_response"),
                "prefix_hit_rate": (prefix or {}).get("prefix_hit_rate"),
                "kv_transfer": moved,
                "first_token_ms": first_token,
                "failed": m["failed"],
                "json": out_json,
                "wall": wall,  # the load's start and end (time.time()): where it sits in the host's pulse
                "host": host_pulse.window(args.pulse, *wall) if args.pulse else None,
            }
            doc["rows"].append(row)
            print(
                f"{args.label + (' ' + workload if workload else '') + (f' r{run + 1}' if run else ''):<16} C={c:>4} n={n:>5}: {row['output_throughput']:>10.1f} tok/s  TTFT p50 "
                f"{row['ttft_ms_p50']:.2f} ms  ITL p50 {row['itl_ms_p50']:.2f} ms  tok/resp "
                f"{row['tokens_per_response'] or 0:.2f}  failed {row['failed']}"
                + (f"  prefix hits {100 * row['prefix_hit_rate']:.1f}%" if row["prefix_hit_rate"] is not None else "")
                + split_text(first_token)
                + (f"  moved: {format_kv_transfer(moved)}" if moved else "")
                + host_pulse.text(row["host"]),
                flush=True,
            )
    finally:
        doc["exit"] = stop_llmlaunch(proc)
        with open(os.path.join(args.out, f"{args.label}.json"), "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
