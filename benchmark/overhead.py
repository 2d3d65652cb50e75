"""Serving overhead of the `hf` engine: the same engine driven in-process and through tritonserver + gRPC streaming.

    python benchmark/overhead.py                      # tiny model, CPU, concurrency 1 and 32
    python benchmark/overhead.py --concurrency 1 8 32 --rounds 5 --max-tokens 64
    python benchmark/overhead.py --model /path/to/hf_model --device cuda --concurrency 64

For each concurrency C both paths run the same closed loop: C requests in
flight, a new one sent as soon as one finishes, `--requests-per-stream x C`
requests in all, every request generating exactly --max-tokens tokens
(ignore_eos).  Tokens/s = output tokens / wall time from first send to last
completion.  The in-process path calls `Engine.add_request` from a driver
thread with a callback that only records the output (what the Triton model's
callback does, minus the sending); the served path streams through
tritonserver's gRPC endpoint with launcher.client.TritonStream, one response
per new piece of text.

The machine may be shared, so the two paths alternate over --rounds rounds;
reported are the ratio of the medians, the median of the per-round ratios
(each round's two runs are back to back, so they see similar load), the ratio
of the best rounds, and the load average.  The server stays up (idle) while
the in-process engine runs, and vice versa.

Prints one JSON document on stdout: per concurrency, tokens/s of both paths and
their ratio (served / in-process; the target is >= 0.97 on CPU), and CPU time
per token of the in-process run, of the server's process tree and of the client.

On a 2-vCPU machine the served path cannot be free: tritonserver, the python
stub and the client run beside the engine, and on such VMs work on one vCPU
slows the other (measured here: a busy loop on vCPU 1 cost an engine pinned to
vCPU 0 30% of its tokens/s, a memory-bound loop 60%).  --stream-interval-ms
trades streaming granularity for fewer responses (first token and end are
never delayed).

`--vs-generate` adds the engine's own yardstick: static-batch `model.generate`
on the same prompts (token ids of exactly --prompt-tokens, one wave of C
requests, greedy, exactly --max-tokens new tokens), e.g. on a GPU:

    python benchmark/overhead.py --model /tmp/llama-1b --device cuda --concurrency 1 64 \
        --prompt-tokens 128 --max-tokens 128 --vs-generate --no-served
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def log(msg: str) -> None:
    print(f"[overhead] {msg}", file=sys.stderr, flush=True)


def process_tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by a process and all its descendants (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            total += stats[p][1]
        todo.extend(c for c, (ppid, _) in stats.items() if ppid == p)
    return total


def make_prompts(tokenizer, n: int, prompt_tokens: int, seed: int = 0) -> list[str]:
    """n prompts of about `prompt_tokens` tokens, cut from the shipped corpus at random sentence starts."""
    text = (ROOT / "launcher" / "data" / "tiny_corpus.txt").read_text(encoding="utf-8")
    ids = tokenizer(text, add_special_tokens=False).input_ids
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        start = rng.randrange(0, len(ids) - prompt_tokens - 1)
        prompts.append(tokenizer.decode(ids[start:start + prompt_tokens - 1]).strip() or "Hello")
    return prompts


# ----------------------------------------------------------------------------------------- in-process
def latency_stats(per_request: list[tuple[float, float, int]]) -> dict:
    """p50/p99 time to first token and p50 inter-token latency (ms) from (ttft_s, decode_s, tokens) per request.

    Inter-token latency of a request = (last token time - first token time) / (tokens - 1): the same
    definition for both paths, whatever the number of responses carrying the tokens."""
    ttft = sorted(t for t, _, _ in per_request)
    itl = sorted(d / (n - 1) for _, d, n in per_request if n > 1)

    def pct(xs, q):
        return round(1000 * xs[min(len(xs) - 1, int(q * len(xs)))], 3) if xs else None

    return {"ttft_ms_p50": pct(ttft, 0.5), "ttft_ms_p99": pct(ttft, 0.99), "itl_ms_p50": pct(itl, 0.5)}


def run_direct(engine, prompts: list[str], concurrency: int, max_tokens: int) -> dict:
    from launcher.engines.hf_engine import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    done_q: queue.SimpleQueue = queue.SimpleQueue()
    tokens = [0]
    errors = []
    per_request: list[tuple[float, float, int]] = []

    def submit(i):
        sent = time.perf_counter()
        first = [0.0]

        def on_output(out):
            now = time.perf_counter()
            if not first[0] and out.output_tokens:
                first[0] = now
            if out.finish_reason is not None:
                if first[0]:
                    per_request.append((first[0] - sent, now - first[0], out.output_tokens))
                done_q.put(out)

        engine.add_request(f"{tag}-{i}", prompts[i], params, on_output)

    tag = f"{time.monotonic_ns()}"
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    sent = 0
    for _ in range(min(concurrency, len(prompts))):
        submit(sent)
        sent += 1
    for _ in range(len(prompts)):
        out = done_q.get()
        tokens[0] += out.output_tokens
        if out.finish_reason == "error":
            errors.append(out.error)
        if sent < len(prompts):
            submit(sent)
            sent += 1
    wall = time.perf_counter() - t0
    return {"tokens": tokens[0], "wall_s": wall, "tokens_per_s": tokens[0] / wall, "errors": len(errors),
            "cpu_s": time.process_time() - cpu0, **latency_stats(per_request)}


def run_generate(model, prompt_ids: list[list[int]], max_tokens: int) -> dict:
    """Static batch: all prompts (same length) in one `generate` call, exactly max_tokens new tokens each."""
    import torch

    ids = torch.tensor(prompt_ids, device=model.device)
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    with torch.inference_mode():
        sync()
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                             min_new_tokens=max_tokens, do_sample=False)
        sync()
        wall = time.perf_counter() - t0
    tokens = (out.shape[1] - ids.shape[1]) * ids.shape[0]
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall}


def random_prompt_ids(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


# ----------------------------------------------------------------------------------------- served
def run_served(url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int,
               server_pid: int | None = None) -> dict:
    from launcher.client import Generation, TritonStream, build_request

    done_q: queue.SimpleQueue = queue.SimpleQueue()
    requests = [build_request(model, Generation(prompt=p, max_tokens=max_tokens, stream=True, ignore_eos=True),
                              f"r{i}") for i, p in enumerate(prompts)]
    server_cpu0 = process_tree_cpu(server_pid) if server_pid else 0.0
    cpu0 = time.process_time()
    with TritonStream(url, on_done=done_q.put) as stream:
        t0 = time.perf_counter()
        sent = 0
        for _ in range(min(concurrency, len(requests))):
            stream.submit(requests[sent])
            sent += 1
        tokens, errors, responses = 0, [], 0
        per_request: list[tuple[float, float, int]] = []
        for _ in range(len(requests)):
            rec = done_q.get()
            if sent < len(requests):
                stream.submit(requests[sent])
                sent += 1
            tokens += rec.output_tokens or 0
            responses += len(rec.times)
            if rec.error:
                errors.append(rec.error)
            elif rec.times:
                # the final response may carry no text: time the tokens by the responses that carry them
                times = rec.token_times or rec.times
                per_request.append((times[0] - rec.sent, times[-1] - times[0], rec.output_tokens or 0))
        wall = time.perf_counter() - t0
    client_cpu = time.process_time() - cpu0
    server_cpu = process_tree_cpu(server_pid) - server_cpu0 if server_pid else None
    if errors:
        log(f"served errors: {errors[:3]}")
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "errors": len(errors),
            "responses_per_request": responses / max(1, len(requests)), "client_cpu_s": client_cpu,
            "server_cpu_s": server_cpu, **latency_stats(per_request)}


# ----------------------------------------------------------------------------------------- server
def hf_server(model_dir: str, workdir: Path, params: dict, model: str = "hf_model", env: dict | None = None):
    """A TritonServer (launcher.triton) serving model_repository/hf with a config built by launcher.pbtxt."""
    from launcher import pbtxt
    from launcher.triton import TritonServer, free_port, resolve_tritonserver, server_env

    repo = workdir / "model_repository"
    (repo / model / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "model_repository" / "hf" / "1" / "model.py", repo / model / "1" / "model.py")
    params = {"model_path": model_dir, **params}
    cfg = pbtxt.python_model(model, int(params.get("max_num_seqs", 64)), params)
    (repo / model / "config.pbtxt").write_text(pbtxt.to_text(cfg))
    install = resolve_tritonserver()
    port = free_port()
    prefix = f"llmovh{os.getpid()}_"
    argv = [install.binary, f"--model-repository={repo}", "--allow-http=false", "--allow-metrics=false",
            "--grpc-address=127.0.0.1", f"--grpc-port={port}",
            f"--backend-config=python,shm-region-prefix-name={prefix}"]
    if install.backend_directory:
        argv.append(f"--backend-directory={install.backend_directory}")
    return TritonServer(argv, env=server_env(install, env), log_path=workdir / "tritonserver.log",
                        grpc_url=f"127.0.0.1:{port}", model=model, ready_timeout_s=300, shm_prefix=prefix)


def vs_generate(model_dir: str, params: dict, args) -> list[dict]:
    """In-process engine vs static-batch generate, one wave of C requests each, alternating over --rounds."""
    import torch
    from transformers import AutoModelForCausalLM

    from launcher.engines.hf_engine import Engine

    engine = Engine(model_dir, max_prefill_tokens=args.prefill_chunk, **params).start()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=engine.runner.dtype).to(engine.runner.device).eval()
    rows = []
    try:
        for c in args.concurrency:
            prompts = random_prompt_ids(c, args.prompt_tokens, engine.vocab_size, seed=c)
            run_generate(model, prompts, args.max_tokens)  # warm-up: allocator, kernels, clocks
            run_direct(engine, prompts, c, args.max_tokens)
            gen, eng = [], []
            for r in range(args.rounds):
                gen.append(run_generate(model, prompts, args.max_tokens)["tokens_per_s"])
                eng.append(run_direct(engine, prompts, c, args.max_tokens)["tokens_per_s"])
                log(f"C={c} round {r + 1}: generate {gen[-1]:.0f} tok/s, engine {eng[-1]:.0f} tok/s")
            row = {"concurrency": c, "generate_tokens_per_s": round(statistics.median(gen), 1),
                   "engine_tokens_per_s": round(statistics.median(eng), 1),
                   "ratio": round(statistics.median(eng) / statistics.median(gen), 4),
                   "generate_rounds": [round(x, 1) for x in gen], "engine_rounds": [round(x, 1) for x in eng]}
            log(f"C={c}: engine / static generate = {row['ratio']}")
            rows.append(row)
    finally:
        engine.shutdown()
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="", help="HF model folder (default: the tiny random Llama)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request (ignore_eos)")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--requests-per-stream", type=int, default=4, help="requests per concurrent stream per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", default="", help="server files and log (default: a temp dir, removed)")
    ap.add_argument("--server-param", action="append", default=[], metavar="KEY=VALUE",
                    help="extra config.pbtxt parameter of the hf model (e.g. engine_process=false)")
    ap.add_argument("--stream-interval-ms", type=int, default=0,
                    help="the model's stream_interval_ms: least time between two responses of a stream (0 = one "
                         "response per engine step)")
    ap.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment variable of tritonserver (e.g. PYTHONPATH with numpy<2 first for the stub)")
    ap.add_argument("--prefill-chunk", type=int, default=512, help="engine max_prefill_tokens (prefill_chunk)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads of the engine, both paths (0 = torch's default). Default: 1 on "
                         "CPU (the tiny model runs as fast on one thread as on two, and the other core serves), "
                         "else 0")
    ap.add_argument("--vs-generate", action="store_true", help="also compare the engine with static-batch generate")
    ap.add_argument("--no-served", action="store_true", help="skip tritonserver (in-process and generate only)")
    args = ap.parse_args(argv)
    if args.threads is None:
        args.threads = 1 if args.device == "cpu" else 0

    from launcher.engines.hf_engine import Engine
    from launcher.tiny import ensure_tiny_model

    model_dir = args.model or str(ensure_tiny_model())
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="llmlaunch-overhead-"))
    params = {"device": args.device, "dtype": args.dtype, "max_num_seqs": args.max_num_seqs}
    server_params = dict(params, prefill_chunk=args.prefill_chunk, torch_threads=args.threads,
                         stream_interval_ms=args.stream_interval_ms,
                         **dict(kv.split("=", 1) for kv in args.server_param))
    params["threads"] = args.threads or None
    log(f"model {model_dir}; starting tritonserver (log {workdir / 'tritonserver.log'})")
    results = {"model": model_dir, "device": args.device, "server_params": server_params, "max_tokens": args.max_tokens,
               "prompt_tokens": args.prompt_tokens, "rounds": args.rounds, "cpus": os.cpu_count(), "runs": []}
    if args.vs_generate:
        results["vs_generate"] = vs_generate(model_dir, params, args)
    if args.no_served:
        print(json.dumps(results, indent=2))
        return 0
    server = hf_server(model_dir, workdir, server_params,
                       env=dict(kv.split("=", 1) for kv in args.server_env) or None)
    with server:
        engine = Engine(model_dir, max_prefill_tokens=args.prefill_chunk, **params).start()
        try:
            for c in args.concurrency:
                n = c * args.requests_per_stream
                prompts = make_prompts(engine.tokenizer, n, args.prompt_tokens, seed=c)
                # warm-up both paths (allocator, first-call costs)
                run_direct(engine, prompts[:c], c, 8)
                run_served(server.grpc_url, server.model, prompts[:c], c, 8)
                direct, served, cpu_direct, cpu_server, cpu_client = [], [], [], [], []
                lat = {"direct": [], "served": []}
                for r in range(args.rounds):
                    d = run_direct(engine, prompts, c, args.max_tokens)
                    s = run_served(server.grpc_url, server.model, prompts, c, args.max_tokens, server.proc.pid)
                    direct.append(d["tokens_per_s"])
                    served.append(s["tokens_per_s"])
                    lat["direct"].append(d)
                    lat["served"].append(s)
                    cpu_direct.append(d["cpu_s"] / d["tokens"] * 1e6)
                    cpu_server.append(s["server_cpu_s"] / s["tokens"] * 1e6)
                    cpu_client.append(s["client_cpu_s"] / s["tokens"] * 1e6)
                    log(f"C={c} round {r + 1}: in-process {d['tokens_per_s']:.0f} tok/s, served "
                        f"{s['tokens_per_s']:.0f} tok/s ({s['responses_per_request']:.1f} responses/request); "
                        f"CPU us/token: in-process {cpu_direct[-1]:.0f}, server {cpu_server[-1]:.0f}, "
                        f"client {cpu_client[-1]:.0f}")
                    if d["errors"] or s["errors"]:
                        log(f"errors: in-process {d['errors']}, served {s['errors']}")
                row = {
                    "concurrency": c, "requests": n,
                    "direct_tokens_per_s": round(statistics.median(direct), 1),
                    "served_tokens_per_s": round(statistics.median(served), 1),
                    "ratio": round(statistics.median(served) / statistics.median(direct), 4),
                    "paired_ratio": round(statistics.median(s_ / d_ for s_, d_ in zip(served, direct)), 4),
                    "best_ratio": round(max(served) / max(direct), 4),
                    "load_average": [round(x, 2) for x in os.getloadavg()],
                    # CPU time per generated token (median over rounds): the in-process run (engine + driver),
                    # and for the served run tritonserver with its stub and engine process, and the client
                    "cpu_us_per_token": {"in_process": round(statistics.median(cpu_direct), 1),
                                         "server": round(statistics.median(cpu_server), 1),
                                         "client": round(statistics.median(cpu_client), 1)},
                    "direct_rounds": [round(x, 1) for x in direct], "served_rounds": [round(x, 1) for x in served],
                }
                # latency: medians over rounds of each round's p50/p99 (ms)
                for path, runs in lat.items():
                    for key in ("ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50"):
                        vals = [x[key] for x in runs if x[key] is not None]
                        row[f"{path}_{key}"] = round(statistics.median(vals), 3) if vals else None
                if row["served_ttft_ms_p50"] is not None and row["direct_ttft_ms_p50"] is not None:
                    row["ttft_added_ms_p50"] = round(row["served_ttft_ms_p50"] - row["direct_ttft_ms_p50"], 3)
                gen = {g["concurrency"]: g for g in results.get("vs_generate", [])}
                if c in gen:
                    # the GPU target: streamed through the serving path vs static-batch generate, batch = C
                    row["served_vs_generate"] = round(row["served_tokens_per_s"] / gen[c]["generate_tokens_per_s"], 4)
                results["runs"].append(row)
                log(f"C={c}: TTFT p50 in-process {row['direct_ttft_ms_p50']} ms, served {row['served_ttft_ms_p50']} ms; "
                    f"ITL p50 {row['direct_itl_ms_p50']} / {row['served_itl_ms_p50']} ms"
                    + (f"; served / static generate {row['served_vs_generate']}" if "served_vs_generate" in row else ""))
                log(f"C={c}: in-process {row['direct_tokens_per_s']} tok/s, served {row['served_tokens_per_s']} "
                    f"tok/s, ratio {row['ratio']} (paired {row['paired_ratio']}, best rounds {row['best_ratio']}; "
                    f"load average {row['load_average'][0]})")
        finally:
            engine.shutdown()
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
