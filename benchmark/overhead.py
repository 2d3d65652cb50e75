"""What serving costs the `hf` engine (the hf figures of docs/performance.md; benchmark/gpu/one_gpu.sh steps 3-4).

The same engine in-process, in its own process, and served through tritonserver + gRPC, on the same requests.

    python benchmark/overhead.py                                    # tiny model, CPU, concurrency 1 and 32
    python benchmark/overhead.py --concurrency 1 8 32 --rounds 5 --paths direct process served
    python benchmark/overhead.py --concurrency 1 --request-rate 5 20           # + open loops at 5 and 20 req/s
    python benchmark/overhead.py --model /tmp/llama-1b --device cuda --dtype bfloat16 --max-num-seqs 128
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
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from launcher.bench.loads import (  # noqa: E402  (after ROOT)
    Load,
    add_open_loop_args,
    check_open_loop_args,
    draw_output_lengths,
    make_loads,
)
from launcher.python_backend.timings import PARTS, engine_step_split, settle  # noqa: E402
from launcher.testing.processes import SERVER_ROLES, server_cpu_by_role  # noqa: E402
from launcher.testing.sigterm import stop_on_sigterm  # noqa: E402

PATHS = ("direct", "process", "served")  # run in this order in every round


def log(msg: str) -> None:
    print(f"[overhead] {msg}", file=sys.stderr, flush=True)


def cpu_halves() -> tuple[set[int], set[int]]:
    """The CPUs this process may use in two halves by physical core (SMT siblings stay together): the server's and
    the served path's clients', so the load generator's CPU does not slow the engine's host work, as with remote
    clients (on a 16-core H100 host at 128 streams the generator burns about 7 cores)."""
    cores: dict[str, list[int]] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        try:
            key = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            key = str(cpu)
        cores.setdefault(key, []).append(cpu)
    groups = list(cores.values())
    if len(groups) < 2:
        raise SystemExit("--split-cpus needs at least two physical cores")
    half = len(groups) // 2
    return {c for g in groups[:half] for c in g}, {c for g in groups[half:] for c in g}


@contextlib.contextmanager
def on_cpus(cpus: set[int] | None):
    """Processes started from this thread inside the block run on `cpus` (children inherit the affinity)."""
    if not cpus:
        yield
        return
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, saved)


def make_prompts(tokenizer, n: int, prompt_tokens: int, seed: int = 0) -> list[str]:
    """n prompts of about `prompt_tokens` tokens, cut from the shipped corpus at random starts."""
    text = (ROOT / "launcher" / "data" / "tiny_corpus.txt").read_text(encoding="utf-8")
    ids = tokenizer(text, add_special_tokens=False).input_ids
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        start = rng.randrange(0, len(ids) - prompt_tokens - 1)
        prompts.append(tokenizer.decode(ids[start : start + prompt_tokens - 1]).strip() or "Hello")
    return prompts


# ----------------------------------------------------------------------------------------- measuring one run
def pct_ms(xs: list[float], q: float) -> float | None:
    """The q-quantile (0.5, 0.99) of sorted seconds, in ms to the microsecond; None when there are none."""
    return round(1000 * xs[min(len(xs) - 1, int(q * len(xs)))], 3) if xs else None


def latency_stats(per_request: list[tuple[float, list[float], int]], wall: float) -> dict:
    """Latency (ms) from (ttft_s, receive times of the outputs carrying tokens, tokens) per request, over a run of
    `wall` seconds: TTFT p50/p99/mean; inter-token latency of a request = (last token time - first token time) /
    (tokens - 1), the same for every path whatever the number of responses, p50 over requests; the mean number of
    requests in flight (Little's law: what concurrency an open loop's rate made)."""
    ttft = sorted(t for t, _, _ in per_request)
    itl = sorted((ts[-1] - ts[0]) / (n - 1) for _, ts, n in per_request if n > 1 and len(ts) > 1)
    return {
        "ttft_ms_p50": pct_ms(ttft, 0.5),
        "ttft_ms_p99": pct_ms(ttft, 0.99),
        "ttft_ms_mean": round(1000 * sum(ttft) / len(ttft), 3) if ttft else None,
        "itl_ms_p50": pct_ms(itl, 0.5),
        "in_flight_mean": round(sum(t + ts[-1] - ts[0] for t, ts, _ in per_request) / wall, 2) if wall > 0 else None,
    }


LATENCY_KEYS = ("ttft_ms_p50", "ttft_ms_p99", "ttft_ms_mean", "itl_ms_p50", "in_flight_mean")


def output_lengths(max_tokens: int | list[int], n: int) -> list[int]:
    """Each of n requests' exact output length: one for all, or one each (--max-tokens-min)."""
    return list(max_tokens) if isinstance(max_tokens, list) else [max_tokens] * n


def settled_stats(engine) -> dict:
    """The engine's EngineStats dict once unchanged for 0.1 s: the last step's totals are counted after its outputs
    went out, and an engine process sends them when it goes idle."""
    return settle(engine.stats_dict, 0.1, 3.0)


def run_direct(
    engine, prompts: list[str], concurrency: int, max_tokens: int | list[int], arrivals: list[float] | None = None
) -> dict:
    """The closed loop in-process (an Engine or an EngineProcess): `concurrency` requests added at once, each
    finished one's successor added as soon as its last output is in.  With `arrivals` (s after the start; request i
    at arrivals[i]) an open loop instead: request i is added at its time whatever is in flight."""
    from launcher.hf.engine import SamplingParams

    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in output_lengths(max_tokens, len(prompts))]
    done_q: queue.SimpleQueue = queue.SimpleQueue()
    per_request: list[tuple[float, list[float], int]] = []
    tag = f"{time.monotonic_ns()}"

    def submit(i):
        sent = time.perf_counter()
        times: list[float] = []

        def on_output(out):
            now = time.perf_counter()
            if out.token_ids:
                times.append(now)
            if out.finish_reason is not None:
                if times:
                    per_request.append((times[0] - sent, times, out.output_tokens))
                done_q.put(out)

        engine.add_request(f"{tag}-{i}", prompts[i], params[i], on_output)

    before = settled_stats(engine)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    # (when, which) of an open loop's requests not yet added, earliest first
    due = sorted((t0 + a, i) for i, a in enumerate(arrivals)) if arrivals is not None else []
    sent = 0
    for _ in range(0 if arrivals is not None else min(concurrency, len(prompts))):
        submit(sent)
        sent += 1
    finished, tokens, errors = 0, 0, 0
    while finished < len(prompts):
        if due and due[0][0] <= time.perf_counter():
            submit(due.pop(0)[1])
            continue
        try:
            out = done_q.get(timeout=max(0.0, due[0][0] - time.perf_counter()) if due else None)
        except queue.Empty:
            continue  # the next arrival is due
        finished += 1
        tokens += out.output_tokens
        errors += out.finish_reason == "error"
        if arrivals is None and sent < len(prompts):
            submit(sent)
            sent += 1
    wall = time.perf_counter() - t0
    result = {
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "errors": errors,
        "cpu_s": time.process_time() - cpu0,
        **latency_stats(per_request, wall),
    }
    after = settled_stats(engine)
    if after.get("steps", 0) > before.get("steps", 0):
        # the model call of a step (forward + sampling), and how the engine's loop spent its steps
        result["step_ms"] = (
            1000 * (after["busy_s"] - before.get("busy_s", 0)) / (after["steps"] - before.get("steps", 0))
        )
        result["engine_steps"] = engine_step_split(before, after)
    return result


def run_served(
    url: str,
    model: str,
    prompts: list[str],
    load: Load,
    max_tokens: int | list[int],
    server_pid: int,
    metrics_url: str,
    streams: int,
    parameters: dict,
) -> dict:
    """The load through tritonserver with llmlaunch-bench's load generator (launcher.bench.runner): load.processes
    client processes, each spreading its requests over `streams` gRPC streams.  Also the server's CPU by role, the
    client's CPU, and from the hf model's metrics where its first tokens' time went and how its engine ran."""
    import resource

    from launcher.bench.runner import Job, LoadSpec, run_load
    from launcher.client import Generation
    from launcher.python_backend.timings import engine_split_after, first_token_split, settled_server_metrics

    gens = [
        Generation(prompt=p, max_tokens=m, stream=True, ignore_eos=True)
        for p, m in zip(prompts, output_lengths(max_tokens, len(prompts)))
    ]
    spec = (
        load.open_spec(streams)
        if load.rate
        else LoadSpec(
            concurrency=load.concurrency,
            num_requests=len(gens),
            processes=max(1, min(load.processes, load.concurrency)),
            streams=streams,
        )
    )
    server_cpu0 = server_cpu_by_role(server_pid)
    before, engine_before = settled_server_metrics(metrics_url, model)

    def client_cpu() -> float:  # this process and its waited-for children (the client processes)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + kids.ru_utime + kids.ru_stime

    cpu0 = client_cpu()
    t_start = time.perf_counter()
    out = run_load(Job(url, model, gens, spec, parameters=parameters))
    t_end = time.perf_counter()
    client_cpu_s = client_cpu() - cpu0
    after = server_cpu_by_role(server_pid)
    by_role = {role: after[role] - server_cpu0[role] for role in SERVER_ROLES}
    tokens, errors, responses = 0, [], 0
    per_request: list[tuple[float, list[float], int]] = []
    last = out.t0
    for _, rec in out.records:
        tokens += rec.output_tokens or 0
        responses += len(rec.times)
        if rec.error:
            errors.append(rec.error)
        elif rec.times:
            times = rec.token_times or rec.times  # the final response may carry no text
            per_request.append((times[0] - rec.sent, times, rec.output_tokens or 0))
            last = max(last, rec.times[-1])
    # first send to last completion (with several processes, their shared start instant), as the direct path
    wall = (last - out.t0) if per_request else (t_end - t_start)
    if errors:
        log(f"served errors: {errors[:3]}")
    stats = latency_stats(per_request, wall)
    return {
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "errors": len(errors),
        "responses_per_request": responses / max(1, len(gens)),
        "client_cpu_s": client_cpu_s,
        "server_cpu_s": sum(by_role.values()),
        "server_cpu_by_role_s": by_role,
        "first_token_ms": first_token_split(metrics_url, model, before, len(gens), stats["ttft_ms_mean"]),
        "engine_steps": engine_split_after(metrics_url, model, engine_before),
        **stats,
    }


def run_generate(model, prompt_ids: list[list[int]], max_tokens: int) -> float:
    """Static batch: all prompts (same length) in one `generate` call, exactly max_tokens new tokens each: tokens/s."""
    import torch

    ids = torch.tensor(prompt_ids, device=model.device)
    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    with torch.inference_mode():
        sync()
        t0 = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens,
            do_sample=False,
        )
        sync()
    return (out.shape[1] - ids.shape[1]) * ids.shape[0] / (time.perf_counter() - t0)


def random_prompt_ids(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """n prompts of `length` random token ids (benchmark/gpu/tp_graphs.py's too)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def vs_generate(model_dir: str, params: dict, args) -> list[dict]:
    """The in-process engine against static-batch generate, one wave of C requests of random token ids each,
    alternating over --rounds."""
    import torch
    from transformers import AutoModelForCausalLM

    from launcher.hf.args import HFEngineArgs
    from launcher.hf.engine import Engine

    engine = Engine.from_args(HFEngineArgs(model_path=model_dir, prefill_chunk=args.prefill_chunk, **params)).start()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=engine.runner.dtype).to(engine.runner.device).eval()
    rows = []
    try:
        for c in args.concurrency:
            prompts = random_prompt_ids(c, args.prompt_tokens, engine.vocab_size, seed=c)
            run_generate(model, prompts, args.max_tokens)  # warm-up: allocator, kernels, clocks
            run_direct(engine, prompts, c, args.max_tokens)
            gen, eng = [], []
            for r in range(args.rounds):
                gen.append(run_generate(model, prompts, args.max_tokens))
                eng.append(run_direct(engine, prompts, c, args.max_tokens)["tokens_per_s"])
                log(f"C={c} round {r + 1}: generate {gen[-1]:.0f} tok/s, engine {eng[-1]:.0f} tok/s")
            rows.append(
                {
                    "concurrency": c,
                    "generate_tokens_per_s": round(statistics.median(gen), 1),
                    "engine_tokens_per_s": round(statistics.median(eng), 1),
                    "ratio": round(statistics.median(eng) / statistics.median(gen), 4),
                }
            )
    finally:
        engine.shutdown()
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


# ----------------------------------------------------------------------------------------- one load, all paths
def compare(run: dict, tokenizer, load: Load, args, generate: dict) -> dict:
    """One load (a concurrency or a request rate): every path of `run` (name -> run(prompts, load, max_tokens)) once
    per round, after a warm-up; medians over rounds, and each path against direct."""
    c, n, label = load.concurrency, load.requests, load.label()
    prompts = make_prompts(tokenizer, n, args.prompt_tokens, seed=load.seed)
    lengths = args.max_tokens
    if args.max_tokens_min:  # drawn once: the same for every path and round, so requests end apart
        lengths = draw_output_lengths(n, args.max_tokens_min, args.max_tokens, seed=load.seed)
    warm = load.warmup(args.max_num_seqs)  # one wave at full length
    for fn in run.values():
        fn(prompts[: warm.requests], warm, args.warmup_tokens or args.max_tokens)
    runs: dict = {path: [] for path in run}
    for r in range(args.rounds):
        for path, fn in run.items():
            runs[path].append(fn(prompts, load, lengths))
        log(
            f"{label} round {r + 1}: "
            + ", ".join(f"{path} {rs[-1]['tokens_per_s']:.0f} tok/s" for path, rs in runs.items())
        )
        if any(rs[-1]["errors"] for rs in runs.values()):
            log("errors: " + ", ".join(f"{path} {rs[-1]['errors']}" for path, rs in runs.items()))

    tps = {path: [x["tokens_per_s"] for x in rs] for path, rs in runs.items()}
    med = {path: statistics.median(v) for path, v in tps.items()}
    row = {
        "concurrency": c or None,
        "request_rate": load.rate or None,
        "requests": n,
        "client_processes": load.processes,
    }
    for path, rs in runs.items():
        row[f"{path}_tokens_per_s"] = round(med[path], 1)
        row[f"{path}_rounds"] = [round(x, 1) for x in tps[path]]
        row[f"{path}_round_tokens"] = [x["tokens"] for x in rs]
        for key in LATENCY_KEYS:
            vals = [x[key] for x in rs if x[key] is not None]
            row[f"{path}_{key}"] = round(statistics.median(vals), 3) if vals else None
        splits = [x["engine_steps"] for x in rs if x.get("engine_steps")]
        if splits:  # how the path's engine spent a step (medians over rounds of the keys every round has)
            row[f"{path}_engine_steps"] = {
                k: round(statistics.median(x[k] for x in splits), 4) for k in splits[0] if all(k in x for x in splits)
            }
        if path != "direct":
            # the ratio of the medians, and the median of the rounds' ratios (a round's runs are back to back)
            prefix = "" if path == "served" else f"{path}_"
            row[f"{prefix}ratio"] = round(med[path] / med["direct"], 4)
            row[f"{prefix}paired_ratio"] = round(statistics.median(x / y for x, y in zip(tps[path], tps["direct"])), 4)
    step_ms = [x["step_ms"] for x in runs["direct"] if "step_ms" in x]
    row["direct_step_ms"] = round(statistics.median(step_ms), 3) if step_ms else None
    row["cpu_us_per_token"] = {
        "in_process": round(statistics.median(x["cpu_s"] / x["tokens"] * 1e6 for x in runs["direct"]), 1)
    }
    if "served" in run:
        served = runs["served"]
        if None not in (row["served_ttft_ms_p50"], row["direct_ttft_ms_p50"]):
            row["ttft_added_ms_p50"] = round(row["served_ttft_ms_p50"] - row["direct_ttft_ms_p50"], 3)
        # CPU a token: the server's process tree (in all and by role) and the client's
        row["cpu_us_per_token"].update(
            server=round(statistics.median(x["server_cpu_s"] / x["tokens"] * 1e6 for x in served), 1),
            client=round(statistics.median(x["client_cpu_s"] / x["tokens"] * 1e6 for x in served), 1),
            server_by_role={
                role: round(statistics.median(x["server_cpu_by_role_s"][role] / x["tokens"] * 1e6 for x in served), 1)
                for role in SERVER_ROLES
            },
        )
        row["served_responses_per_request"] = round(statistics.median(x["responses_per_request"] for x in served), 2)
        split = [x["first_token_ms"] for x in served if x.get("first_token_ms")]
        if split:  # where the served first token's time went (means): inside the hf model, and outside it
            row["served_first_token_ms"] = {k: round(statistics.median(x[k] for x in split), 3) for k in split[0]}
        if c and c in generate:  # streamed through the serving path against static-batch generate, batch = C
            row["served_vs_generate"] = round(med["served"] / generate[c]["generate_tokens_per_s"], 4)
    log(
        f"{label}: "
        + ", ".join(
            f"{path} {row[f'{path}_tokens_per_s']} tok/s, TTFT p50 {row[f'{path}_ttft_ms_p50']} ms" for path in run
        )
    )
    return row


def table(doc: dict) -> str:
    """The runs as a table, a line per load: tokens/s of each path and its ratio to in-process, TTFT p50 in-process
    / served and what serving adds, the served first token's parts inside the hf model (means, ms), ITL p50, the
    requests in flight (what an open loop's rate made), served against static generate, and the server's CPU a token
    by role (tritonserver + its stubs + the engine process, us)."""
    paths = doc["paths"]
    head = [f"{'load':>10}"] + [f"{p + ' tok/s':>15}" for p in paths] + [f"{p + '/in':>10}" for p in paths[1:]]
    served = "served" in paths
    if served:
        head += [f"{'TTFT p50 in/served':>19}", f"{'+ms':>6}"] + [f"{k:>7}" for k in PARTS] + [f"{'outside':>7}"]
    last = paths[-1]  # ITL and requests in flight: in-process / the last path
    head += [f"{'ITL p50 in/' + last:>20}", f"{'in flight in/' + last:>22}"]
    if served:
        head += [f"{'served/gen':>10}", f"{'CPU us/tok triton+stubs+engine':>30}"]
    lines = [" ".join(head)]
    for r in doc["runs"]:
        load = f"{r['request_rate']:g}/s" if r.get("request_rate") else f"C={r['concurrency']}"
        cells = [f"{load:>10}"]
        cells += [f"{r[f'{p}_tokens_per_s']:>15.1f}" for p in paths]
        cells += [f"{r['ratio' if p == 'served' else f'{p}_ratio']:>10.3f}" for p in paths[1:]]
        if served:
            ft = r.get("served_first_token_ms") or {}
            cells += [
                f"{_num(r['direct_ttft_ms_p50'], 2):>8} / {_num(r['served_ttft_ms_p50'], 2):<8}",
                f"{_num(r.get('ttft_added_ms_p50'), 2):>6}",
            ]
            cells += [f"{_num(ft.get(k), 2):>7}" for k in (*PARTS, "outside_server")]
        cells += [
            f"{_num(r['direct_itl_ms_p50'], 3):>9} / {_num(r[f'{last}_itl_ms_p50'], 3):<8}",
            f"{_num(r['direct_in_flight_mean'], 1):>10} / {_num(r[f'{last}_in_flight_mean'], 1):<9}",
        ]
        if served:
            roles = r["cpu_us_per_token"]["server_by_role"]
            cells += [
                f"{_num(r.get('served_vs_generate'), 3):>10}",
                f"{'+'.join(f'{roles[k]:.0f}' for k in ('tritonserver', 'stubs', 'engine')):>30}",
            ]
        lines.append(" ".join(cells))
    return "\n".join(lines)


def _num(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv=None) -> int:
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
    paths = [p for p in PATHS if p in args.paths or p == "direct"]

    from launcher.bench.cli import request_param  # KEY=VALUE read as `llmlaunch-bench --request-param` reads it
    from launcher.hf.args import HFEngineArgs
    from launcher.hf.client import EngineProcess
    from launcher.hf.engine import Engine, describe_features
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
        client_cpus = None
        if "served" in paths:
            log(f"starting tritonserver (log {workdir / 'tritonserver.log'})")
            from launcher.testing.serve import hf_server  # metrics on: the first-token split is read there

            server_cpus, client_cpus = cpu_halves() if args.split_cpus else (None, None)
            if server_cpus:
                log(f"CPUs: server {sorted(server_cpus)}, served-path clients {sorted(client_cpus)}")
                results["cpu_split"] = {"server": sorted(server_cpus), "clients": sorted(client_cpus)}
            with on_cpus(server_cpus):  # the server compiles while the in-process engine loads
                server = hf_server(model_dir, workdir, server_params).start()
            stack.callback(server.stop)
        engine = Engine.from_args(
            HFEngineArgs(model_path=model_dir, prefill_chunk=args.prefill_chunk, **params)
        ).start()
        stack.callback(engine.shutdown)
        results["features"] = describe_features(engine.features)  # decode graphs, torch.compile, cuDNN attention
        log(f"in-process engine: {results['features']}")
        run = {
            "direct": lambda prompts, load, tokens: run_direct(
                engine, prompts, load.concurrency, tokens, load.arrivals()
            )
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


def write_json(doc: dict, path: str) -> None:
    """The JSON document on stdout, and to `path` too where one is given."""
    text = json.dumps(doc, indent=2)
    if path:
        Path(path).write_text(text + "\n")
    print(text, flush=True)


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
