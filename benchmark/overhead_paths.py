"""How benchmark/overhead.py drives each path and what it reads from one run of a load.

direct and process: `run_direct`, a driver thread adding requests to an `Engine` (in-process) or an `EngineProcess`
(the engine in a child process, as the served hf model runs it) and recording each output as its callback gets it.
served: `run_served`, llmlaunch-bench's load generator (launcher.bench.runner) against tritonserver's gRPC endpoint,
plus the server's CPU by role and the hf model's own first-token split from its metrics.  The same latency
statistics are computed for every path, so their ratios compare like with like.  `vs_generate`: the engine against
static-batch `model.generate`, the yardstick of what batching itself gives.  `cpu_halves` / `on_cpus`: the server
and the served path's clients on separate physical cores, as with remote clients.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import statistics
import sys
import time
from pathlib import Path

from launcher.bench.loads import Load
from launcher.paths import PACKAGE_ROOT
from launcher.python_backend.timings import engine_step_split, settle
from launcher.testing.processes import SERVER_ROLES, server_cpu_by_role


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
    text = (PACKAGE_ROOT / "launcher" / "data" / "tiny_corpus.txt").read_text(encoding="utf-8")
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
    (tokens - 1), the same for every path whatever the number of responses, p50 over requests (what vLLM's and
    llmlaunch-bench's tables call TPOT); `gap_itl_ms_p50`: the p50 over every gap between two outputs of a request
    (their ITL), which tells a steady step from one whose requests wait long steps now and then at the same mean;
    the mean number of requests in flight (Little's law: what concurrency an open loop's rate made)."""
    ttft = sorted(t for t, _, _ in per_request)
    itl = sorted((ts[-1] - ts[0]) / (n - 1) for _, ts, n in per_request if n > 1 and len(ts) > 1)
    gaps = sorted(b - a for _, ts, _ in per_request for a, b in zip(ts, ts[1:]))
    return {
        "ttft_ms_p50": pct_ms(ttft, 0.5),
        "ttft_ms_p99": pct_ms(ttft, 0.99),
        "ttft_ms_mean": round(1000 * sum(ttft) / len(ttft), 3) if ttft else None,
        "itl_ms_p50": pct_ms(itl, 0.5),
        "gap_itl_ms_p50": pct_ms(gaps, 0.5),
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
    from launcher.client.request import Generation
    from launcher.python_backend.timings import engine_splits_after, first_token_split, settled_server_metrics

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
        # over the requests the client has a TTFT of, as the model counts them
        "first_token_ms": first_token_split(metrics_url, model, before, len(per_request), stats["ttft_ms_mean"]),
        "engine_steps": engine_splits_after(metrics_url, model, engine_before)[0],
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

    from launcher.engines.hf.config import HFEngineArgs
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
