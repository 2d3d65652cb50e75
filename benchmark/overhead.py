"""What serving costs the `hf` engine (the hf figures of docs/performance/hf.md; benchmark/gpu/one_gpu.sh steps 3-4).

The same engine in-process, in its own process, and served through tritonserver + gRPC, on the same requests.

    python -m benchmark.overhead                                    # tiny model, CPU, concurrency 1 and 32
    python -m benchmark.overhead --concurrency 1 8 32 --rounds 5 --paths direct process served
    python -m benchmark.overhead --concurrency 1 --request-rate 5 20           # + open loops at 5 and 20 req/s
    python -m benchmark.overhead --model /tmp/llama-1b --device cuda --dtype bfloat16 --max-num-seqs 128
        --concurrency 1 64 128 --prompt-tokens 128 --max-tokens 128 --client-processes 8 --split-cpus --vs-generate

The paths (direct always runs: every ratio is to it):

  direct   `Engine.add_request` from a driver thread whose callback only records the output.
  process  the same driver on `EngineProcess`: the engine in a child process, as the served model runs it.
  served   tritonserver's gRPC endpoint through llmlaunch-bench's load generator (launcher.bench.runner).

process / direct is what the process hop costs; served / process what the stub, tritonserver and gRPC add.
Each load is a closed loop (--concurrency C: C requests in flight, --requests-per-stream x C in all) or, with
--request-rate R, an open loop (R x --open-seconds Poisson arrivals, the same times on every path).  Every request
generates exactly --max-tokens tokens (or, with --max-tokens-min, a drawn length, the same on every path).  The
paths run back to back in each of --rounds rounds; medians over rounds are reported.  --vs-generate adds the
engine against static-batch `model.generate` on the same prompt lengths.

Prints a table on stderr and one JSON document on stdout (--json FILE: there too).  A run stopped by SIGTERM
(timeout(1)) or Ctrl-C stops its servers, still prints the loads it finished ("interrupted" says where it stopped)
and exits 128 + the signal.

This module starts the engines and the server and runs the loads; how each path is driven and measured is
benchmark/overhead_paths.py, the rows, table and JSON benchmark/overhead_report.py.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from benchmark.overhead_paths import cpu_halves, log, on_cpus, run_direct, run_served, vs_generate
from benchmark.overhead_report import compare, table, write_json
from launcher.bench.loads import add_open_loop_args, check_open_loop_args, make_loads
from launcher.testing.sigterm import stop_on_sigterm

PATHS = ("direct", "process", "served")  # run in this order in every round


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="", help="HF model folder (default: the tiny random Llama)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument(
        "--paths",
        nargs="+",
        default=["direct", "served"],
        choices=PATHS,
        help="paths to compare, back to back in the order direct, process, served (direct always runs)",
    )
    ap.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=None,
        help="closed loops: requests in flight (default 1 32; none with --request-rate alone)",
    )
    add_open_loop_args(ap, "every path at the same times (the served path's client processes' arrivals)")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request (ignore_eos)")
    ap.add_argument(
        "--max-tokens-min",
        type=int,
        default=0,
        metavar="N",
        help="each request generates a length drawn from [N, --max-tokens] instead (seeded, the same "
        "for every path and round): requests end apart, as in real traffic, not in waves",
    )
    ap.add_argument("--requests-per-stream", type=int, default=4, help="closed loops: requests per stream a round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--warmup-tokens",
        type=int,
        default=0,
        help="tokens per request of the warm-up wave before each load's rounds (default --max-tokens)",
    )
    ap.add_argument("--prefill-chunk", type=int, default=0, help="engine max_prefill_tokens (0: the engine's default)")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads of every path's engine (0: torch's default; default 1 on CPU, "
        "where the other core serves, else 0)",
    )
    ap.add_argument(
        "--stream-interval-ms",
        type=int,
        default=0,
        help="the served model's stream_interval_ms and the process path's output interval: least time "
        "between two responses of a stream (0: one response per engine step)",
    )
    ap.add_argument(
        "--server-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another engine argument of the served hf model (model.json), e.g. engine_process=false",
    )
    ap.add_argument(
        "--request-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Triton request parameter the served path's clients send with every request, as "
        "llmlaunch-bench --request-param (e.g. final_counts_only=true)",
    )
    ap.add_argument(
        "--client-processes",
        type=int,
        default=1,
        metavar="N",
        help="served path: client processes sharing the requests (a closed loop: at most C)",
    )
    ap.add_argument("--client-streams", type=int, default=1, help="served path: gRPC streams per client process")
    ap.add_argument(
        "--split-cpus",
        action="store_true",
        help="served path: tritonserver and its engine on one half of the physical cores, its client "
        "processes on the other, as with remote clients",
    )
    ap.add_argument("--vs-generate", action="store_true", help="also compare the engine with static-batch generate")
    ap.add_argument("--no-served", action="store_true", help="skip the paths (with --vs-generate: that alone)")
    ap.add_argument("--workdir", default="", help="server files and log (default: a temp dir, removed)")
    ap.add_argument("--json", default="", help="also write the JSON document here")
    args = ap.parse_args(argv)
    if args.max_tokens_min and not 1 <= args.max_tokens_min <= args.max_tokens:
        ap.error(f"--max-tokens-min {args.max_tokens_min} must be between 1 and --max-tokens ({args.max_tokens})")
    if args.client_processes < 1:
        ap.error(f"--client-processes {args.client_processes}: a count of processes is 1 or more")
    for kv in args.server_param + args.request_param:
        if "=" not in kv:
            ap.error(f"{kv!r}: write KEY=VALUE")
    if args.threads is None:
        args.threads = 1 if args.device == "cpu" else 0
    if args.concurrency is None:
        args.concurrency = [] if args.request_rate else [1, 32]
    check_open_loop_args(ap, args)
    return args


def start_paths(
    stack: contextlib.ExitStack,
    args,
    paths: list[str],
    model_dir: str,
    workdir: Path,
    params: dict,
    server_params: dict,
    request_params: dict,
    results: dict,
) -> tuple[dict, object]:
    """Every path's engine, ready: the server first (it compiles while the in-process engine loads), the in-process
    engine, the engine process, each stopped when `stack` closes.  Returns (path -> run(prompts, load, max_tokens),
    the in-process engine, whose tokenizer makes the prompts)."""
    from launcher.engines.hf.config import HFEngineArgs
    from launcher.hf.client import EngineProcess
    from launcher.hf.engine import Engine
    from launcher.hf.reporting import describe_features
    from launcher.testing.serve import hf_server  # metrics on: the first-token split is read there

    client_cpus = None
    if "served" in paths:
        log(f"starting tritonserver (log {workdir / 'tritonserver.log'})")
        server_cpus, client_cpus = cpu_halves() if args.split_cpus else (None, None)
        if server_cpus:
            log(f"CPUs: server {sorted(server_cpus)}, served-path clients {sorted(client_cpus)}")
            results["cpu_split"] = {"server": sorted(server_cpus), "clients": sorted(client_cpus)}
        with on_cpus(server_cpus):  # the server compiles while the in-process engine loads
            server = hf_server(model_dir, workdir, server_params).start()
        stack.callback(server.stop)
    engine = Engine.from_args(HFEngineArgs(model_path=model_dir, prefill_chunk=args.prefill_chunk, **params)).start()
    stack.callback(engine.shutdown)
    results["features"] = describe_features(engine.features)  # decode graphs, torch.compile, cuDNN attention
    log(f"in-process engine: {results['features']}")
    run = {
        "direct": lambda prompts, load, tokens: run_direct(engine, prompts, load.concurrency, tokens, load.arrivals())
    }
    if "process" in paths:  # the engine process as the served model starts it, without the stub and tritonserver
        process = EngineProcess(
            HFEngineArgs(
                model_path=model_dir,
                prefill_chunk=args.prefill_chunk,
                stream_interval_ms=args.stream_interval_ms,
                **params,
            )
        ).start()
        stack.callback(process.shutdown)
        run["process"] = lambda prompts, load, tokens: run_direct(
            process, prompts, load.concurrency, tokens, load.arrivals()
        )
    if "served" in paths:
        server.wait_ready()

        def served(prompts, load, tokens):
            with on_cpus(client_cpus):
                return run_served(
                    server.grpc_url,
                    server.model,
                    prompts,
                    load,
                    tokens,
                    server.proc.pid,
                    server.metrics_url,
                    args.client_streams,
                    request_params,
                )

        run["served"] = served
    return run, engine


def main(argv=None) -> int:
    args = parse_args(argv)
    paths = [p for p in PATHS if p in args.paths or p == "direct"]

    from launcher.bench.cli import request_param  # KEY=VALUE read as `llmlaunch-bench --request-param` reads it
    from launcher.tiny import ensure_tiny_model

    model_dir = args.model or str(ensure_tiny_model())
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="llmlaunch-overhead-"))
    params = {"device": args.device, "dtype": args.dtype, "max_num_seqs": args.max_num_seqs}
    server_params = dict(
        params,
        prefill_chunk=args.prefill_chunk,
        torch_threads=args.threads,
        stream_interval_ms=args.stream_interval_ms,
        **dict(kv.split("=", 1) for kv in args.server_param),
    )
    params["torch_threads"] = args.threads
    request_params = dict(request_param(kv) for kv in args.request_param)
    log(f"model {model_dir}; paths {' '.join(paths)}")
    results = {
        "model": model_dir,
        "device": args.device,
        "server_params": server_params,
        "request_params": request_params,
        "max_tokens": args.max_tokens,
        "max_tokens_min": args.max_tokens_min or args.max_tokens,
        "prompt_tokens": args.prompt_tokens,
        "rounds": args.rounds,
        "paths": paths,
        "cpus": os.cpu_count(),
        "runs": [],
    }
    if args.vs_generate:
        results["vs_generate"] = vs_generate(model_dir, params, args)
    if args.no_served:
        write_json(results, args.json)
        return 0
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    stopped = None  # the signal that cut the loads short
    with contextlib.ExitStack() as stack:
        run, engine = start_paths(
            stack, args, paths, model_dir, workdir, params, server_params, request_params, results
        )
        generate = {g["concurrency"]: g for g in results.get("vs_generate", [])}
        loads = make_loads(args, [args.client_processes])
        try:
            for load in loads:
                results["runs"].append(compare(run, engine.tokenizer, load, args, generate))
        except KeyboardInterrupt as stop:
            stopped = signal.Signals(stop.args[0] if stop.args else signal.SIGINT)
            results["interrupted"] = f"{stopped.name} after {len(results['runs'])} of {len(loads)} loads"
            log(f"interrupted: {results['interrupted']}; stopping the servers and printing the loads measured")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    if results["runs"]:
        print(table(results), file=sys.stderr, flush=True)
    write_json(results, args.json)
    return 128 + stopped if stopped else 0


if __name__ == "__main__":
    code = main()
    if code:
        # Interrupted: out at once.  The servers are stopped and everything is printed, and the interpreter's teardown
        # (seconds with torch loaded) runs with the default handlers back, so timeout(1)'s second SIGTERM could end it
        # there with -15 instead of this status.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(0)
