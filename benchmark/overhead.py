"""Serving overhead of the `hf` engine: the same engine driven in-process, in its own process, and through
tritonserver + gRPC streaming.

    python benchmark/overhead.py                      # tiny model, CPU, concurrency 1 and 32
    python benchmark/overhead.py --concurrency 1 8 32 --rounds 5 --max-tokens 64 --paths direct process served
    python benchmark/overhead.py --model /path/to/hf_model --device cuda --concurrency 64
    python benchmark/overhead.py --concurrency 1 --request-rate 5 20 --paths direct served   # + open loops

For each concurrency C every path of --paths runs the same closed loop: C
requests in flight, a new one sent as soon as one finishes,
`--requests-per-stream x C` requests in all, every request generating exactly
--max-tokens tokens (ignore_eos), or with --max-tokens-min a length of its own
drawn from that range (the same ones on every path and in every round: requests
then end apart, not in waves).  On every path a finished request is followed by
the next one not yet sent (the served path's client processes share one queue of
requests: launcher.bench.runner).  Tokens/s = output tokens / wall time from
first send to last completion.
The served path's clients send the request parameters of --request-param and no
others (llmlaunch-bench asks for final_counts_only by itself where the model
honours it; here it is asked for explicitly, so that two servers can differ by it).

--request-rate R adds open loops: R x --open-seconds requests a round, each
sent at its arrival time (Poisson, mean R/s) whatever is in flight, the same
times on every path: those the served path's load generator keeps
(launcher.bench.runner.arrival_times: one schedule, whatever the number of
client processes, so --client-processes 8 16 compares client counts on the
same arrivals).
In a closed loop a served request's successor leaves only once the last piece
has crossed tritonserver and gRPC, so the paths' engines see different arrival
patterns and the TTFT difference mixes that in with the serving path's cost;
with the same arrivals it is the serving path's alone.  Tokens/s there is set
by the rate (the ratio should be ~1); the mean number of requests in flight
(`<path>_in_flight_mean`, Little's law) says what concurrency a rate made.

The paths:

  direct   `Engine.add_request` from a driver thread with a callback that only
           records the output (what the Triton model's callback does, minus
           the sending).
  delayed  the direct path's engine and driver (alternating rounds), each
           finished request's successor added --resend-ms later, as a remote
           client sends it only once the last piece has reached it: how much
           of the served path's TTFT under load is the closed loop's arrival
           pattern rather than the server's own cost.
  process  the same driver on `EngineProcess`: the engine in a child process,
           as the served path runs it (same engine parameters, output_interval
           = --stream-interval-ms), outputs coming back over a socketpair.
  served   tritonserver's gRPC endpoint through the benchmark's load generator
           (launcher.bench.runner), one response per new piece of text;
           --client-processes / --client-streams spread the requests over
           several client processes and gRPC streams.
  pinned   the served path's server (same compile, alternating rounds) with
           its engine process on --pin-engine physical cores of the server's
           CPUs and tritonserver + its stubs on the rest (needs --split-cpus):
           whether the stubs' response work and the engine's scheduling loop
           slow each other down by sharing cores.
  served_alt
           a second tritonserver beside the first, its hf model set up with
           --alt-response-processes, --alt-server-param and --alt-server-env
           on top of the served path's, its clients sending --alt-request-param
           on top of --request-param: two serving set-ups against the same in-process
           engine, arrivals and rounds, in one run (their start-up and
           compile paid once; two runs differ by a compile's spread).
  direct_awake, served_awake
           the direct and served paths (same engines, same rounds) with every
           CPU kept from sleeping while they run (launcher/awake.py,
           serve.keep_cpus_awake): on a virtual machine an idle vCPU halts and
           waking a thread there is slow.  Their ratio and TTFT added are
           served_awake against direct_awake.

`process` exists to split the serving cost: process / direct is what running
the engine in a child process costs, served / process what the python stub,
tritonserver and gRPC add on top.  For the in-process engine the mean time of
an engine step's model call (forward + sampling, `EngineStats.busy_s / steps`
over the run's steps, prefill steps included) comes with it, so that
inter-token latency can be set against it.

The machine may be shared, so the paths run back to back in each of --rounds
rounds; reported per path against direct are the ratio of the medians, the
median of the per-round ratios (each round's runs are back to back, so they see
similar load), the ratio of the best rounds, and the load average.  The other
paths' engines stay up (idle) while one path runs; each holds its own weights
and KV cache, so on a GPU all of them must fit at once.

The served path also says where its TTFT goes: the hf model's first-token metrics
(launcher.serving.timings, read from tritonserver's metrics port before and after
each run) give the mean time a streamed request spent inside the model — `add`
(to the engine process), `engine` (tokenize, queue, prefill, first token: the
in-process TTFT's counterpart), `back` (to the stub), `respond` (the response built) and
`send` (the send call, a round trip to tritonserver), with `parse` (reading the request) before them — and the client's mean
TTFT minus those is tritonserver, gRPC and the client (`served_first_token_ms`).

Every path also says how its engine spent a step (`<path>_engine_steps`, from
EngineStats; the served engine's from its llmlaunch_engine_* metrics): wall time =
launch + wait (for the tokens) + host work, and on a GPU each step's span on the
stream and the GPU's idle time before it (the host late).  Same code, same load,
so a path whose GPU time per step differs runs other kernels: the CUDA libraries
each path's engine has mapped are listed at the end (`cuda_libraries`).

Prints one JSON document on stdout: per concurrency, tokens/s, TTFT and ITL of
every path, the ratios (`ratio` = served / in-process, the target is >= 0.97 on
CPU; `process_ratio` = process / in-process), and CPU time per token of the
in-process run, of the server's process tree (also by role: tritonserver, its
python stubs, the hf engine process) and of the client.  A run stopped by
SIGTERM (timeout(1)) or Ctrl-C stops its servers and still prints the loads it
finished, with "interrupted" saying where it stopped, and exits 128 + the signal.

On a 2-vCPU machine the served path cannot be free: tritonserver, the python
stub and the client run beside the engine, and on such VMs work on one vCPU
slows the other (measured here: a busy loop on vCPU 1 cost an engine pinned to
vCPU 0 30% of its tokens/s, a memory-bound loop 60%).  --stream-interval-ms
trades streaming granularity for fewer responses (first token and end are
never delayed).  On bigger machines --split-cpus keeps the served path's client
processes off the server's cores, as remote clients would be (on a 16-core H100
host at 128 streams the generator burns about 7 cores and cost the served engine
0.88 -> 0.95 of in-process).  Each engine's features
(torch.compile, decode graphs, where attention may use cuDNN) are logged first.

`--vs-generate` adds the engine's own yardstick: static-batch `model.generate`
on the same prompts (token ids of exactly --prompt-tokens, one wave of C
requests, greedy, exactly --max-tokens new tokens), e.g. on a GPU:

    python benchmark/overhead.py --model /tmp/llama-1b --device cuda --concurrency 1 64 \
        --prompt-tokens 128 --max-tokens 128 --vs-generate --no-served
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

from launcher.bench.loads import (Load, add_open_loop_args, check_open_loop_args,  # noqa: E402  (after ROOT)
                                  draw_output_lengths, make_loads)
from launcher.serving.timings import PARTS, SPLIT_KEYS, engine_step_split, format_engine_split, settle  # noqa: E402
from launcher.testing.processes import (SERVER_ROLES, descendants, engine_pids, server_cpu_by_role,  # noqa: E402
                                        stub_pids)
from launcher.testing.sigterm import stop_on_sigterm  # noqa: E402

PATHS = ("direct", "delayed", "process", "served", "served_alt", "pinned", "direct_awake",
         "served_awake")  # run in this order
# key prefix of each path's ratios to direct: served keeps the unprefixed names of the two-path version
RATIO_PREFIX = {"delayed": "delayed_", "process": "process_", "served": "", "served_alt": "served_alt_", "pinned": "pinned_",
                "direct_awake": "direct_awake_", "served_awake": "served_awake_"}
# the paths through tritonserver, each with the in-process path it is measured against (the TTFT it adds, where its
# first token's time goes) and the prefix of its `ttft_added_ms_p50`
SERVED_PATHS = (("served", "direct", ""), ("served_alt", "direct", "served_alt_"), ("pinned", "direct", "pinned_"),
                ("served_awake", "direct_awake", "awake_"))


def log(msg: str) -> None:
    print(f"[overhead] {msg}", file=sys.stderr, flush=True)


CUDA_LIBS = ("cublas", "cublasLt", "cudnn", "cudart", "nccl", "nvrtc", "nvJitLink", "cuda", "cusparseLt", "cufft")


def physical_cores(cpus) -> list[list[int]]:
    """`cpus` grouped by physical core (SMT siblings in one group), in CPU order."""
    cores: dict[str, list[int]] = {}
    for cpu in sorted(cpus):
        try:
            key = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            key = str(cpu)
        cores.setdefault(key, []).append(cpu)
    return list(cores.values())


def cpu_halves() -> tuple[set[int], set[int]]:
    """The CPUs this process may use, in two halves by physical core (SMT siblings, where there are any, stay in
    one half)."""
    groups = physical_cores(os.sched_getaffinity(0))
    if len(groups) < 2:
        raise SystemExit("--split-cpus needs at least two physical cores")
    half = len(groups) // 2
    return {c for g in groups[:half] for c in g}, {c for g in groups[half:] for c in g}


def set_process_affinity(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` onto `cpus` (sched_setaffinity on a pid moves one thread; threads started later
    inherit their creator's set, so moving them all once is enough)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, OSError):
            continue  # a thread that ended meanwhile


def pin_engine(server_pid: int, server_cpus: set[int], cores: int) -> dict:
    """Give the served hf engine process `cores` physical cores of the server's CPUs to itself and move
    tritonserver and its stubs onto the rest, so the stubs' response work never shares a core with the engine's
    scheduling loop (the engine's host time per step grew with more stub processes on the same 8 cores)."""
    groups = physical_cores(server_cpus)
    if not 1 <= cores < len(groups):
        raise SystemExit(f"--pin-engine {cores}: the server has {len(groups)} physical cores; leave it at least one")
    engine_cpus = {c for g in groups[:cores] for c in g}
    rest = set(server_cpus) - engine_cpus
    engines = set(engine_pids(server_pid))
    if not engines:
        raise SystemExit("--pin-engine: no hf engine process under tritonserver (engine_process=false?)")
    for pid in [server_pid, *descendants(server_pid)]:
        set_process_affinity(pid, engine_cpus if pid in engines else rest)
    return {"engine": sorted(engine_cpus), "server_and_stubs": sorted(rest), "engine_pids": sorted(engines)}


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


def served_features(server_log: Path) -> str:
    """The served engine's features, from the hf model's 'ready:' line in the server log ('' if not found)."""
    try:
        lines = [ln for ln in server_log.read_text(errors="replace").splitlines() if "ready:" in ln and "torch_compile" in ln]
    except OSError:
        return ""
    # the line ends with describe_features' text: '..., response_threads=4, torch_compile on (...), ...'
    return lines[-1].split("response_threads=", 1)[-1].split(", ", 1)[-1].rstrip('"') if lines else ""


def cuda_libraries(pid: int) -> list[str]:
    """The CUDA libraries a process has mapped (paths), to compare the paths' engines: a library path can make an
    engine load another copy of cuBLAS or cuDNN, whose kernels then differ."""
    from launcher.engines.torch_libs import mapped_files

    return mapped_files(lambda name: name.startswith("lib") and ".so" in name
                        and name[3:].split(".so")[0].split("-")[0].split("_")[0] in CUDA_LIBS, pid)


def server_cpu_text(run: dict) -> str:
    """A served run's server CPU a token, in all and by role: "160 (tritonserver 50, stubs 70, engine 40)" (us)."""
    per = 1e6 / run["tokens"]
    parts = ", ".join(f"{role} {v * per:.0f}" for role, v in run["server_cpu_by_role_s"].items()
                      if role != "other" or v * per >= 0.5)
    return f"{run['server_cpu_s'] * per:.0f} ({parts})"


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
def pct_ms(xs: list[float], q: float) -> float | None:
    """The q-quantile (0.5, 0.99) of sorted seconds, in ms to the microsecond; None when there are none."""
    return round(1000 * xs[min(len(xs) - 1, int(q * len(xs)))], 3) if xs else None


def latency_stats(per_request: list[tuple[float, list[float], int]], wall: float) -> dict:
    """Latency (ms) from (ttft_s, receive times of the outputs carrying tokens, tokens) per request, over a run of
    `wall` seconds.

    TTFT p50/p99; inter-token latency of a request = (last token time - first token time) / (tokens - 1),
    the same definition for every path whatever the number of responses carrying the tokens, p50 over
    requests.  To see *where* a path loses time: the median gap between consecutive outputs, and the
    median of each request's last gap (a slow final response shows there, not in the median gap).  And the mean
    number of requests in flight (sent to last token, summed over requests, / wall: Little's law), which under an
    open loop says what concurrency an arrival rate made."""
    ttft = sorted(t for t, _, _ in per_request)
    itl = sorted((ts[-1] - ts[0]) / (n - 1) for _, ts, n in per_request if n > 1 and len(ts) > 1)
    gaps = sorted(b - a for _, ts, _ in per_request for a, b in zip(ts, ts[1:]))
    last = sorted(ts[-1] - ts[-2] for _, ts, _ in per_request if len(ts) > 1)
    return {"ttft_ms_p50": pct_ms(ttft, 0.5), "ttft_ms_p99": pct_ms(ttft, 0.99),
            "ttft_ms_mean": round(1000 * sum(ttft) / len(ttft), 3) if ttft else None, "itl_ms_p50": pct_ms(itl, 0.5),
            "gap_ms_p50": pct_ms(gaps, 0.5), "gap_ms_p99": pct_ms(gaps, 0.99), "last_gap_ms_p50": pct_ms(last, 0.5),
            "in_flight_mean": round(sum(t + ts[-1] - ts[0] for t, ts, _ in per_request) / wall, 2) if wall > 0 else None}


def output_lengths(max_tokens: int | list[int], n: int) -> list[int]:
    """Each of n requests' exact output length: one for all, or one each (--max-tokens-min)."""
    return list(max_tokens) if isinstance(max_tokens, list) else [max_tokens] * n


def add_side_by_side_args(ap: argparse.ArgumentParser, max_tokens: int, max_tokens_min: int) -> None:
    """The options of the scripts that run engines side by side on one GPU under this closed loop
    (benchmark/gpu/prompts_alone.py, benchmark/gpu/intake.py); check them with `check_side_by_side_args`."""
    ap.add_argument("--model", default="", help="HF model folder (default: the tiny random Llama)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=max_tokens)
    ap.add_argument("--max-tokens-min", type=int, default=max_tokens_min,
                    help="draw each request's exact output length from [this, --max-tokens] (0, where allowed: "
                         "every request --max-tokens)")
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="", help="also write the JSON document here")


def check_side_by_side_args(ap: argparse.ArgumentParser, args, lowest_min: int) -> None:
    """--max-tokens-min within [lowest_min, --max-tokens]; no more streams than cache slots."""
    if not lowest_min <= args.max_tokens_min <= args.max_tokens:
        ap.error(f"--max-tokens-min {args.max_tokens_min} must be between {lowest_min} and --max-tokens "
                 f"({args.max_tokens})")
    if max(args.concurrency) > args.max_num_seqs:
        ap.error(f"--concurrency {max(args.concurrency)} is more than --max-num-seqs {args.max_num_seqs}: requests "
                 f"would queue for a slot; raise --max-num-seqs")


def side_by_side(engines: dict, prompts: list, c: int, lengths, rounds: int, warmup_tokens: int, say,
                 arrivals: list[float] | None = None) -> dict:
    """{name: run_direct results, one per round} of engines taking turns round by round, so that they all see the
    machine alike, after one warm-up wave each at full length (allocator, first-call costs).  say(c, r, runs) logs
    each round.  With `arrivals` (Load.arrivals) the rounds are open loops at those times, and c is only the
    warm-up's concurrency."""
    for eng in engines.values():
        run_direct(eng, prompts[:c], c, warmup_tokens)
    runs: dict = {name: [] for name in engines}
    for r in range(rounds):
        for name, eng in engines.items():
            runs[name].append(run_direct(eng, prompts, c, lengths, arrivals=arrivals))
        say(c, r, runs)
    return runs


def side_by_side_summary(rounds: list[dict], keys) -> dict:
    """Medians over rounds of one engine's `side_by_side` runs: tokens/s (and each round's, with its tokens), the
    latency figures of `keys`, the engine's step split."""
    out = {"tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in rounds), 1),
           "rounds": [round(r["tokens_per_s"], 1) for r in rounds], "round_tokens": [r["tokens"] for r in rounds],
           **median_latency(rounds, keys)}
    steps = median_engine_steps(rounds)
    if steps:
        out["engine_steps"] = steps
    return out


def write_json(out: dict, path: str) -> None:
    """The JSON document on stdout, and to `path` too where one is given."""
    text = json.dumps(out, indent=2)
    if path:
        Path(path).write_text(text + "\n")
    print(text)


def with_cpus_awake(fn, board: str = "", pause_at: int = 0):
    """A path's run with idle-priority spinners on every CPU meanwhile (launcher/awake.py); with a board and
    pause_at > 0 they pause while an engine posts pause_at requests or more there."""
    from launcher.awake import KeepAwake

    def run(prompts, load, tokens):
        with KeepAwake(range(os.cpu_count() or 1), board, pause_at) as spinners:
            t0, c0 = time.perf_counter(), spinners.cpu_seconds()
            out = fn(prompts, load, tokens)
            # the share of their CPUs the spinners kept over the round: ~1 spinning, ~0 paused (or crowded out)
            out["spinner_share"] = (spinners.cpu_seconds() - c0) / ((time.perf_counter() - t0) * len(spinners.cpus))
            return out

    return run


def run_direct(engine, prompts: list[str], concurrency: int, max_tokens: int | list[int], resend_s: float = 0.0,
               arrivals: list[float] | None = None) -> dict:
    """The closed loop in-process: `concurrency` requests added at once, each finished one's successor added from
    the driver as soon as its last output is in, or `resend_s` later (the delayed path: a remote client sends the
    successor only once the last piece has crossed tritonserver and gRPC; here every successor is late by the
    same amount, so a wave that ends together still arrives together, later).  With `arrivals` (s after the start;
    request i at arrivals[i]) an open loop instead: request i is added at its time whatever is in flight."""
    from launcher.engines.hf_engine import SamplingParams

    params = [SamplingParams(max_tokens=m, ignore_eos=True) for m in output_lengths(max_tokens, len(prompts))]
    done_q: queue.SimpleQueue = queue.SimpleQueue()
    tokens = [0]
    errors = []
    per_request: list[tuple[float, list[float], int]] = []
    adds: list[float] = []  # an engine process's: add_request -> its child received the request (s)

    def submit(i):
        sent, sent_mono = time.perf_counter(), time.monotonic()
        times: list[float] = []

        def on_output(out):
            now = time.perf_counter()
            if out.times is not None:  # (received, first output made) on the child's clock, CLOCK_MONOTONIC
                adds.append(out.times[0] - sent_mono)
            if out.token_ids:
                times.append(now)
            if out.finish_reason is not None:
                if times:
                    per_request.append((times[0] - sent, times, out.output_tokens))
                done_q.put(out)

        engine.add_request(f"{tag}-{i}", prompts[i], params[i], on_output)

    tag = f"{time.monotonic_ns()}"
    # the engine's step statistics (an EngineProcess's as its child last sent them)
    before = settled_stats(engine)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    sent = 0
    # (when, which) of the requests not yet added, earliest first: the delayed path's successors (resend_s > 0: the
    # next in order), or every request of an open loop (with several client processes its arrival times are not in
    # the requests' order)
    due: list[tuple[float, int]] = sorted((t0 + a, i) for i, a in enumerate(arrivals)) if arrivals is not None else []
    for _ in range(0 if arrivals is not None else min(concurrency, len(prompts))):
        submit(sent)
        sent += 1
    finished = 0
    while finished < len(prompts):
        if due and due[0][0] <= time.perf_counter():
            submit(due.pop(0)[1])
            sent += 1
            continue
        try:
            out = done_q.get(timeout=max(0.0, due[0][0] - time.perf_counter()) if due else None)
        except queue.Empty:
            continue  # a successor is due
        finished += 1
        tokens[0] += out.output_tokens
        if out.finish_reason == "error":
            errors.append(out.error)
        if arrivals is None and sent + len(due) < len(prompts):
            if resend_s > 0:
                due.append((time.perf_counter() + resend_s, sent + len(due)))  # constant delay: in due order
            else:
                submit(sent)
                sent += 1
    wall = time.perf_counter() - t0
    result = {"tokens": tokens[0], "wall_s": wall, "tokens_per_s": tokens[0] / wall, "errors": len(errors),
              "cpu_s": time.process_time() - cpu0, **latency_stats(per_request, wall)}
    if adds:  # the hand-off into an engine process (the served model's "add"), without tritonserver
        adds.sort()
        result.update(add_ms_mean=round(1000 * sum(adds) / len(adds), 3), add_ms_p50=pct_ms(adds, 0.5),
                      add_ms_p99=pct_ms(adds, 0.99))
    after = settled_stats(engine)
    if after.get("steps", 0) > before.get("steps", 0):
        # the model call of a step (forward + sampling; with overlap, launch to tokens on the host), without
        # scheduling and output handling
        result["step_ms"] = 1000 * (after["busy_s"] - before.get("busy_s", 0)) / (after["steps"] - before.get("steps", 0))
        # how the engine ran this load (timings.engine_step_split): the loop's time per step as launch + wait +
        # host work, GPU busy and idle per step, decode rows and prompt tokens per step, share queued ahead
        result["engine_steps"] = engine_step_split(before, after)
    return result


ADD_KEYS = ("add_ms_mean", "add_ms_p50", "add_ms_p99")
HANDOFF_KEYS = ("handoff_ms_p50", "handoff_ms_p99")  # a served path's client hand-off (run_served), outside TTFT
LATENCY_KEYS = ("ttft_ms_p50", "ttft_ms_p99", "ttft_ms_mean", "itl_ms_p50", "gap_ms_p50", "gap_ms_p99",
                "last_gap_ms_p50", "in_flight_mean")


def median_latency(rounds: list[dict], keys=LATENCY_KEYS) -> dict:
    """Medians over rounds (run_direct / run_served results) of each round's latency figures (ms; None if none)."""
    out = {}
    for key in keys:
        vals = [x[key] for x in rounds if x[key] is not None]
        out[key] = round(statistics.median(vals), 3) if vals else None
    return out


def median_engine_steps(rounds: list[dict]) -> dict | None:
    """Medians over rounds of their engines' step splits (`engine_steps`; the keys every round has), or None."""
    splits = [x["engine_steps"] for x in rounds if x.get("engine_steps")]
    if not splits:
        return None
    keys = [k for k in splits[0] if all(k in x for x in splits)]
    return {k: round(statistics.median(x[k] for x in splits), 4) for k in keys}


def settled_stats(engine) -> dict:
    """The engine's EngineStats dict once unchanged for 0.1 s: the last step's totals are counted after its outputs
    went out, and an engine process sends them when it goes idle."""
    return settle(engine.stats_dict, 0.1, 3.0)


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
def run_served(url: str, model: str, prompts: list[str], concurrency: int, max_tokens: int | list[int],
               server_pid: int | None = None, metrics_url: str = "", processes: int = 1, streams: int = 1,
               spec=None, parameters: dict | None = None) -> dict:
    """The closed loop through tritonserver with the benchmark's load generator (launcher.bench.runner):
    `processes` client processes, each spreading its requests over `streams` gRPC streams, so that at high
    concurrency the client is not what is measured (one process and one stream carry every response).  `spec` (a
    LoadSpec: Load.open_spec) replaces the closed loop: an open loop at a request rate.  `parameters`: Triton
    request parameters sent with every request (e.g. final_counts_only)."""
    import resource

    from launcher.bench.runner import Job, LoadSpec, run_load
    from launcher.client import Generation
    from launcher.serving.timings import engine_split_after, first_token_split, settled_server_metrics

    gens = [Generation(prompt=p, max_tokens=m, stream=True, ignore_eos=True)
            for p, m in zip(prompts, output_lengths(max_tokens, len(prompts)))]
    if spec is None:
        processes = max(1, min(processes, concurrency))
        spec = LoadSpec(concurrency=concurrency, num_requests=len(gens), processes=processes, streams=streams)
    server_cpu0 = server_cpu_by_role(server_pid) if server_pid else None
    before, engine_before = settled_server_metrics(metrics_url, model) if metrics_url else (None, None)

    def client_cpu() -> float:  # this process and its waited-for children (the client processes)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + kids.ru_utime + kids.ru_stime

    cpu0 = client_cpu()
    t_start = time.perf_counter()
    out = run_load(Job(url, model, gens, spec, parameters=parameters or {}))
    t_end = time.perf_counter()
    client_cpu_s = client_cpu() - cpu0
    by_role = None
    if server_pid:
        after = server_cpu_by_role(server_pid)
        by_role = {role: after[role] - server_cpu0[role] for role in SERVER_ROLES}
    server_cpu = sum(by_role.values()) if by_role is not None else None
    tokens, errors, responses = 0, [], 0
    per_request: list[tuple[float, list[float], int]] = []
    handoffs: list[float] = []  # the client's own hand-off to gRPC's sending thread (s), outside TTFT
    last = out.t0
    for _, rec in out.records:
        tokens += rec.output_tokens or 0
        responses += len(rec.times)
        if rec.error:
            errors.append(rec.error)
        elif rec.times:
            handoffs.append(rec.sent - rec.queued)
            # the final response may carry no text: time the tokens by the responses that carry them
            times = rec.token_times or rec.times
            per_request.append((times[0] - rec.sent, times, rec.output_tokens or 0))
            last = max(last, rec.times[-1])
    handoffs.sort()
    # first send to last completion (with several processes, their shared start instant), as the direct path
    wall = (last - out.t0) if per_request else (t_end - t_start)
    if errors:
        log(f"served errors: {errors[:3]}")
    stats = latency_stats(per_request, wall)
    first_token = None
    if before is not None:  # the model's split of this run's first tokens (it pushes its sums once a second)
        first_token = first_token_split(metrics_url, model, before, len(gens), stats["ttft_ms_mean"])
    steps = engine_split_after(metrics_url, model, engine_before) if engine_before is not None else None
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "errors": len(errors),
            "responses_per_request": responses / max(1, len(gens)), "client_cpu_s": client_cpu_s,
            "server_cpu_s": server_cpu, "server_cpu_by_role_s": by_role, "first_token_ms": first_token,
            "engine_steps": steps, **stats,
            "handoff_ms_p50": pct_ms(handoffs, 0.5), "handoff_ms_p99": pct_ms(handoffs, 0.99)}


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


def compare(run: dict, tokenizer, load: Load, args, generate: dict) -> dict:
    """One load (a concurrency or a request rate): every path of `run` (name -> run(prompts, load, max_tokens)) once
    per round."""
    c, n, label = load.concurrency, load.requests, load.label()
    prompts = make_prompts(tokenizer, n, args.prompt_tokens, seed=load.seed)
    # exact output lengths: all --max-tokens, or drawn once from [--max-tokens-min, --max-tokens] (the same for
    # every path and round), so that requests end at different steps and their successors arrive one by one
    lengths = args.max_tokens
    if args.max_tokens_min:
        lengths = draw_output_lengths(n, args.max_tokens_min, args.max_tokens, seed=load.seed)
    warm = load.warmup(args.max_num_seqs)  # one wave at full length
    for fn in run.values():
        fn(prompts[:warm.requests], warm, args.warmup_tokens or args.max_tokens)
    runs = {path: [] for path in run}
    for r in range(args.rounds):
        for path, fn in run.items():
            runs[path].append(fn(prompts, load, lengths))
        last = {path: rs[-1] for path, rs in runs.items()}
        d = last["direct"]
        msg = ", ".join(f"{path} {x['tokens_per_s']:.0f} tok/s" for path, x in last.items())
        msg += f"; in-process step {d['step_ms']:.3f} ms {d.get('engine_steps')}" if "step_ms" in d else ""
        msg += "".join(f"; {path} add {x['add_ms_mean']:.2f} ms mean, p50 {x['add_ms_p50']:.2f}"
                       for path, x in last.items() if "add_ms_mean" in x)
        msg += f"; CPU us/token: in-process {d['cpu_s'] / d['tokens'] * 1e6:.0f}"
        if "served" in last:
            s = last["served"]
            msg += (f", server {server_cpu_text(s)}, client "
                    f"{s['client_cpu_s'] / s['tokens'] * 1e6:.0f} ({s['responses_per_request']:.1f} "
                    f"responses/request)")
        if "served_alt" in last:
            s = last["served_alt"]
            msg += f"; served_alt server {server_cpu_text(s)} ({s['responses_per_request']:.1f} responses/request)"
        log(f"{label} round {r + 1}: {msg}")
        if any(x["errors"] for x in last.values()):
            log("errors: " + ", ".join(f"{path} {x['errors']}" for path, x in last.items()))

    tps = {path: [x["tokens_per_s"] for x in rs] for path, rs in runs.items()}
    med = {path: statistics.median(v) for path, v in tps.items()}
    row = {"concurrency": c or None, "request_rate": load.rate or None, "requests": n,
           "client_processes": load.processes}
    row.update({f"{path}_tokens_per_s": round(med[path], 1) for path in run})
    for path, prefix in RATIO_PREFIX.items():
        if path in run:
            row[f"{prefix}ratio"] = round(med[path] / med["direct"], 4)
            row[f"{prefix}paired_ratio"] = round(statistics.median(
                x / y for x, y in zip(tps[path], tps["direct"])), 4)
            row[f"{prefix}best_ratio"] = round(max(tps[path]) / max(tps["direct"]), 4)
    if "process" in run and "served" in run:
        row["served_vs_process"] = round(med["served"] / med["process"], 4)  # stub + tritonserver + gRPC alone
    row["load_average"] = [round(x, 2) for x in os.getloadavg()]

    def per_token_us(path: str, key: str) -> float:
        return round(statistics.median(x[key] / x["tokens"] * 1e6 for x in runs[path]), 1)

    # CPU time per generated token (median over rounds): the in-process run (engine + driver), and for the
    # served run tritonserver with its stubs and engine process (in all and by role), and the client
    row["cpu_us_per_token"] = {"in_process": per_token_us("direct", "cpu_s")}

    def by_role_us(path: str) -> dict:  # the server's, split as server_cpu_by_role does (medians over rounds)
        return {role: round(statistics.median(x["server_cpu_by_role_s"][role] / x["tokens"] * 1e6
                                              for x in runs[path]), 1) for role in SERVER_ROLES}

    if "served" in run:
        row["cpu_us_per_token"].update(server=per_token_us("served", "server_cpu_s"),
                                       client=per_token_us("served", "client_cpu_s"),
                                       server_by_role=by_role_us("served"))
    if "served_alt" in run:
        row["cpu_us_per_token"].update(served_alt_server=per_token_us("served_alt", "server_cpu_s"),
                                       served_alt_server_by_role=by_role_us("served_alt"))
    row.update({f"{path}_rounds": [round(x, 1) for x in v] for path, v in tps.items()})
    row.update({f"{path}_round_tokens": [x["tokens"] for x in rs] for path, rs in runs.items()})
    step_ms = [x["step_ms"] for x in runs["direct"] if "step_ms" in x]
    row["direct_step_ms"] = round(statistics.median(step_ms), 3) if step_ms else None
    # latency: medians over rounds of each round's p50/p99 (ms)
    for path, rs in runs.items():
        row.update({f"{path}_{key}": v for key, v in median_latency(rs).items()})
        if all("add_ms_mean" in x for x in rs):  # the process path: the hand-off into the engine process
            row.update({f"{path}_{key}": v for key, v in median_latency(rs, ADD_KEYS).items()})
        if all("handoff_ms_p50" in x for x in rs):  # served paths: the client's hand-off before its send
            row.update({f"{path}_{key}": v for key, v in median_latency(rs, HANDOFF_KEYS).items()})
        if all("spinner_share" in x for x in rs):  # the *_awake paths: how much the spinners ran
            row[f"{path}_spinner_share"] = round(statistics.median(x["spinner_share"] for x in rs), 3)
    if "served_awake" in run and "direct_awake" in run:  # both with the CPUs kept awake
        row["awake_ratio"] = round(med["served_awake"] / med["direct_awake"], 4)
        row["awake_paired_ratio"] = round(statistics.median(
            x / y for x, y in zip(tps["served_awake"], tps["direct_awake"])), 4)
    # the TTFT (p50) each served path adds to the in-process path it is measured against
    for served, direct, prefix in SERVED_PATHS:
        if served in run and direct in run and None not in (row[f"{served}_ttft_ms_p50"], row[f"{direct}_ttft_ms_p50"]):
            row[f"{prefix}ttft_added_ms_p50"] = round(row[f"{served}_ttft_ms_p50"] - row[f"{direct}_ttft_ms_p50"], 3)
    for served, direct, _ in SERVED_PATHS:
        split = [x["first_token_ms"] for x in runs.get(served, []) if x.get("first_token_ms")]
        if not split:
            continue
        # where the served TTFT goes (means, medians over rounds): inside the model (parse / add / engine / back /
        # respond / send, from its metrics) and outside it (client TTFT - inside: tritonserver, gRPC and the client)
        ft = {k: round(statistics.median(x[k] for x in split), 3) for k in SPLIT_KEYS}
        row[f"{served}_first_token_ms"] = ft
        log(f"{label}: {served} TTFT mean {row[f'{served}_ttft_ms_mean']} ms = "
            + " + ".join(f"{k} {ft[k]}" for k in PARTS) + f" (inside the model) + "
            f"{ft['outside_server']} (tritonserver, gRPC, client); {direct} TTFT mean {row[f'{direct}_ttft_ms_mean']} ms")
    for path, rs in runs.items():
        # how each path's engine spent a step (medians over rounds): is the served engine host-late where the
        # in-process one is not?
        es = median_engine_steps(rs)
        if es:
            row[f"{path}_engine_steps"] = es
            log(f"{label}: {path} engine: {format_engine_split(es)}")
    if "served" in run and c and c in generate:
        # the GPU target: streamed through the serving path vs static-batch generate, batch = C
        row["served_vs_generate"] = round(row["served_tokens_per_s"] / generate[c]["generate_tokens_per_s"], 4)

    log(f"{label}: TTFT p50 " + ", ".join(f"{path} {row[f'{path}_ttft_ms_p50']}" for path in run)
        + " ms; ITL p50 " + ", ".join(f"{path} {row[f'{path}_itl_ms_p50']}" for path in run)
        + " ms; gap p50 / last gap " + ", ".join(f"{path} {row[f'{path}_gap_ms_p50']} / {row[f'{path}_last_gap_ms_p50']}"
                                                  for path in run)
        + f" ms; in-process step {row['direct_step_ms']} ms; requests in flight (mean) "
        + ", ".join(f"{path} {row[f'{path}_in_flight_mean']}" for path in run)
        + (f"; served / static generate {row['served_vs_generate']}" if "served_vs_generate" in row else "")
        + "".join(f"; {path}'s spinners ran {row[f'{path}_spinner_share']:.0%} of their CPUs' time" for path in run
                  if f"{path}_spinner_share" in row))
    ratios = [f"{path} {row[f'{prefix}ratio']} (paired {row[f'{prefix}paired_ratio']}, best rounds "
              f"{row[f'{prefix}best_ratio']})" for path, prefix in RATIO_PREFIX.items() if path in run]
    log(f"{label}: " + ", ".join(f"{path} {row[f'{path}_tokens_per_s']} tok/s" for path in run)
        + (f"; / in-process: {', '.join(ratios)}" if ratios else "")
        + f"; load average {row['load_average'][0]}")
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="", help="HF model folder (default: the tiny random Llama)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--concurrency", type=int, nargs="+", default=None,
                    help="closed loops: requests in flight (default 1 32; none with --request-rate alone)")
    add_open_loop_args(ap, "every path at the same times (the served path's client processes' arrivals)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request (ignore_eos)")
    ap.add_argument("--max-tokens-min", type=int, default=0, metavar="N",
                    help="each request generates a length drawn from [N, --max-tokens] instead (seeded, the same "
                         "for every path and round): requests end apart, as in real traffic, not in waves")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--requests-per-stream", type=int, default=4, help="requests per concurrent stream per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup-tokens", type=int, default=0,
                    help="tokens per request of the warm-up wave before each concurrency's rounds (default: "
                         "--max-tokens, so the rounds meet no sequence length, graph or kernel for the first time)")
    ap.add_argument("--paths", nargs="+", default=["direct", "served"], choices=PATHS,
                    help="paths to compare, run back to back in the order direct, delayed, process, served, pinned in each round "
                         "(direct always runs: the ratios are to it)")
    ap.add_argument("--process-env", default="own", choices=["own", "server"],
                    help="environment of the process path's engine: this one, or the one tritonserver's stub gives "
                         "the served engine (its PATH, LD_LIBRARY_PATH, PYTHONPATH): tells the stack from the env")
    ap.add_argument("--process-env-keys", default="",
                    help="with --process-env server: only these variables (comma-separated, e.g. LD_LIBRARY_PATH) "
                         "take the server's value; the rest stay this process's (to find which one matters)")
    ap.add_argument("--process-env-pad", type=int, default=0, metavar="N",
                    help="add a variable of N characters to the process path's environment: an environment of "
                         "another size moves the initial stack, which can change speed by itself")
    ap.add_argument("--workdir", default="", help="server files and log (default: a temp dir, removed)")
    ap.add_argument("--server-param", action="append", default=[], metavar="KEY=VALUE",
                    help="extra config.pbtxt parameter of the hf model (e.g. engine_process=false); served path only")
    ap.add_argument("--stream-interval-ms", type=int, default=0,
                    help="the model's stream_interval_ms: least time between two responses of a stream (0 = one "
                         "response per engine step); the process path's output_interval")
    ap.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment variable of tritonserver (e.g. PYTHONPATH with numpy<2 first for the stub)")
    ap.add_argument("--prefill-chunk", type=int, default=0,
                    help="engine max_prefill_tokens (prefill_chunk; 0: the engine's default, 512 on CPU, 2048 on a GPU)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch intra-op threads of the engine, every path (0 = torch's default). Default: 1 on "
                         "CPU (the tiny model runs as fast on one thread as on two, and the other core serves), "
                         "else 0")
    ap.add_argument("--client-processes", type=int, nargs="+", default=[1], metavar="N",
                    help="served path: client processes sharing the streams (launcher.bench.runner --processes); "
                         "several counts (8 16) measure every load once per count, each against its own in-process "
                         "runs: how much of the added time is the benchmark's own client")
    ap.add_argument("--client-streams", type=int, default=1,
                    help="served path: gRPC streams per client process (each carries its share of the requests)")
    ap.add_argument("--split-cpus", action="store_true",
                    help="served path: tritonserver (and its engine) on one half of the physical cores, the client "
                         "processes on the other, as with remote clients: the load generator's CPU (several cores at "
                         "128 streams) then does not slow the engine's host work by sharing its cores")
    ap.add_argument("--response-processes", type=int, default=1, metavar="N",
                    help="served path: N hf model instances (stub processes) share the engine process and send its "
                         "responses (engine.response_processes; default 1)")
    ap.add_argument("--alt-response-processes", type=int, default=0, metavar="N",
                    help="the served_alt path: its response processes (default: --response-processes)")
    ap.add_argument("--alt-server-param", action="append", default=[], metavar="KEY=VALUE",
                    help="the served_alt path: a config.pbtxt parameter of its hf model on top of --server-param's "
                         "(e.g. response_threads=2)")
    ap.add_argument("--alt-server-env", action="append", default=[], metavar="KEY=VALUE",
                    help="the served_alt path: an environment variable of its tritonserver on top of --server-env's "
                         "(e.g. OMP_NUM_THREADS=1)")
    ap.add_argument("--request-param", action="append", default=[], metavar="KEY=VALUE",
                    help="served paths: a Triton request parameter sent with every request (e.g. "
                         "final_counts_only=true)")
    ap.add_argument("--alt-request-param", action="append", default=[], metavar="KEY=VALUE",
                    help="the served_alt path: a request parameter on top of --request-param's (e.g. "
                         "final_counts_only=true: text alone on every response but the last, side by side with "
                         "all four outputs on each)")
    ap.add_argument("--resend-ms", type=float, default=10.0, metavar="MS",
                    help="the delayed path: each finished request's successor is added MS later (default 10, about "
                         "the served client's last-piece gap at 128 streams on an H100 host)")
    ap.add_argument("--pin-engine", type=int, default=2, metavar="N",
                    help="the pinned path: the served engine process gets N physical cores of the server's half to "
                         "itself for its rounds, tritonserver and its stubs the rest (default 2)")
    ap.add_argument("--awake-pause-at", type=int, default=0, metavar="N",
                    help="the *_awake paths' spinners pause while an engine holds N or more requests, as "
                         "serve.awake_pause_at does (the served and the in-process engine post their load on one "
                         "board); 0 (default): they never pause")
    ap.add_argument("--vs-generate", action="store_true", help="also compare the engine with static-batch generate")
    ap.add_argument("--no-served", action="store_true", help="skip the comparison of --paths (--vs-generate only)")
    args = ap.parse_args(argv)
    if args.max_tokens_min and not 1 <= args.max_tokens_min <= args.max_tokens:
        ap.error(f"--max-tokens-min {args.max_tokens_min} must be between 1 and --max-tokens ({args.max_tokens})")
    if args.threads is None:
        args.threads = 1 if args.device == "cpu" else 0
    if args.concurrency is None:
        args.concurrency = [] if args.request_rate else [1, 32]
    check_open_loop_args(ap, args)
    bad = [p for p in args.client_processes if p < 1]
    if bad or len(set(args.client_processes)) != len(args.client_processes):
        ap.error(f"--client-processes {bad[0]}: a count of processes is 1 or more" if bad else
                 f"--client-processes {' '.join(map(str, args.client_processes))}: each count once")
    if "delayed" in args.paths and args.request_rate:
        ap.error("the delayed path delays a closed loop's successors; an open loop (--request-rate) has none: "
                 "drop delayed from --paths or --request-rate")
    if "delayed" in args.paths and not args.resend_ms > 0:
        ap.error(f"--resend-ms {args.resend_ms}: the delayed path needs a delay above 0 (the direct path has none)")
    if "pinned" in args.paths and not ("served" in args.paths and args.split_cpus):
        ap.error("the pinned path is the served path's server with its CPUs divided: add served to --paths and "
                 "--split-cpus")
    if "served_alt" in args.paths and "served" not in args.paths:
        ap.error("the served_alt path is measured against the served one: add served to --paths")
    if (args.alt_response_processes or args.alt_server_param or args.alt_server_env or args.alt_request_param) \
            and "served_alt" not in args.paths:
        ap.error("--alt-response-processes / --alt-server-param / --alt-server-env / --alt-request-param set up the "
                 "served_alt path: add served_alt to --paths")
    for kv in args.server_param + args.alt_server_param + args.server_env + args.alt_server_env \
            + args.request_param + args.alt_request_param:
        if "=" not in kv:
            ap.error(f"{kv!r}: write KEY=VALUE")
    if args.awake_pause_at < 0:
        ap.error(f"--awake-pause-at {args.awake_pause_at}: a number of requests, 0 for never")
    if args.awake_pause_at and not any(p.endswith("_awake") for p in args.paths):
        ap.error("--awake-pause-at sets up the direct_awake / served_awake paths' spinners: add them to --paths")
    extra_env = dict(kv.split("=", 1) for kv in args.server_env) or None  # tritonserver's (and the process path's)
    paths = [p for p in PATHS if p in args.paths or p == "direct"]

    from launcher.engines.hf_engine import Engine, describe_features
    from launcher.engines.hf_process import EngineProcess
    from launcher.tiny import ensure_tiny_model

    model_dir = args.model or str(ensure_tiny_model())
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="llmlaunch-overhead-"))
    board = ""
    if args.awake_pause_at:  # the engines post their load here (made by the first), the spinners read it
        from launcher.awake import BOARD_ENV, board_path

        board = board_path(str(workdir))
        extra_env = dict(extra_env or {}, **{BOARD_ENV: board})
    params = {"device": args.device, "dtype": args.dtype, "max_num_seqs": args.max_num_seqs}
    server_params = dict(params, prefill_chunk=args.prefill_chunk, torch_threads=args.threads,
                         stream_interval_ms=args.stream_interval_ms,
                         **dict(kv.split("=", 1) for kv in args.server_param))
    params["threads"] = args.threads or None
    log(f"model {model_dir}; paths {' '.join(paths)}")
    results = {"model": model_dir, "device": args.device, "server_params": server_params,
               "response_processes": args.response_processes, "max_tokens": args.max_tokens,
               "max_tokens_min": args.max_tokens_min or args.max_tokens,
               "prompt_tokens": args.prompt_tokens, "rounds": args.rounds, "paths": paths, "cpus": os.cpu_count(),
               "runs": []}
    alt_params = dict(server_params, **dict(kv.split("=", 1) for kv in args.alt_server_param))
    alt_processes = args.alt_response_processes or args.response_processes
    alt_env = dict(extra_env or {}, **dict(kv.split("=", 1) for kv in args.alt_server_env)) or None
    from launcher.bench.cli import request_param  # KEY=VALUE read as `llmlaunch-bench --request-param` reads it

    request_params = dict(request_param(kv) for kv in args.request_param)
    alt_request_params = dict(request_params, **dict(request_param(kv) for kv in args.alt_request_param))
    if extra_env:
        results["server_env"] = extra_env
    if request_params:
        results["request_params"] = request_params
    if "served_alt" in paths:
        results["served_alt"] = {"server_params": alt_params, "response_processes": alt_processes,
                                 "server_env": alt_env or {}, "request_params": alt_request_params}
    if args.vs_generate:
        results["vs_generate"] = vs_generate(model_dir, params, args)
    if args.no_served:
        print(json.dumps(results, indent=2))
        return 0
    signal.signal(signal.SIGTERM, stop_on_sigterm)
    stopped = None  # the signal that cut the loads short
    with contextlib.ExitStack() as stack:
        if board:
            stack.callback(lambda: os.path.exists(board) and os.unlink(board))
            results["awake_pause_at"] = args.awake_pause_at
        if "served" in paths:
            log(f"starting tritonserver (log {workdir / 'tritonserver.log'})")
            from launcher.testing.serve import hf_server  # metrics on: the first-token split is read there

            server_cpus, client_cpus = cpu_halves() if args.split_cpus else (None, None)
            if server_cpus:
                log(f"CPUs: server {sorted(server_cpus)}, served-path clients {sorted(client_cpus)}")
                results["cpu_split"] = {"server": sorted(server_cpus), "clients": sorted(client_cpus)}
            servers = {"served": (workdir, server_params, args.response_processes, extra_env)}
            if "served_alt" in paths:
                servers["served_alt"] = (workdir / "alt", alt_params, alt_processes, alt_env)
            started = {}
            with on_cpus(server_cpus):  # every server starts (and compiles) at once, then each is waited for
                for name, (wd, sp, instances, env) in servers.items():
                    started[name] = hf_server(model_dir, wd, sp, instances=instances, env=env).start()
                    stack.callback(started[name].stop)
            for srv in started.values():
                srv.wait_ready()
            server = started["served"]
        # the in-process engine posts its load in a slot of its own (the served ones in slot 0)
        engine = Engine(model_dir, max_prefill_tokens=args.prefill_chunk, awake_board=board or None, awake_slot=1,
                        **params).start()
        stack.callback(engine.shutdown)
        # what each engine runs with (decode graphs captured or failed, cuDNN attention): the paths compare alike
        results["features"] = {"direct": describe_features(engine.features)}
        if "served" in paths:
            for name, (wd, *_) in servers.items():
                results["features"][name] = served_features(wd / "tritonserver.log")
        for path, text in results["features"].items():
            log(f"{path} engine: {text}")
        run = {"direct": lambda prompts, load, tokens: run_direct(engine, prompts, load.concurrency, tokens,
                                                                  arrivals=load.arrivals())}
        if "delayed" in paths:
            run["delayed"] = lambda prompts, load, tokens: run_direct(engine, prompts, load.concurrency, tokens,
                                                                      args.resend_ms / 1000)
        if "process" in paths:
            # the engine process as the served hf model starts it, without the stub, tritonserver and gRPC
            process = EngineProcess(model_dir, max_prefill_tokens=args.prefill_chunk,
                                    output_interval=args.stream_interval_ms / 1000.0, **params)
            env = {}
            if args.process_env == "server":  # the environment the served engine process inherits from the stub
                from launcher.triton import resolve_tritonserver, server_env

                env = server_env(resolve_tritonserver(), extra_env)
                keys = [k for k in args.process_env_keys.split(",") if k]
                if keys:
                    env = {k: env[k] for k in keys if k in env}
            if args.process_env_pad:  # the same variables, a bigger environment: the stack moves
                env["LLMLAUNCH_ENV_PAD"] = "x" * args.process_env_pad
            saved = dict(os.environ)
            if env:
                log("process path environment, where it differs: " + ", ".join(
                    f"{k}={v}" for k, v in sorted(env.items()) if saved.get(k) != v))
            os.environ.update(env)
            try:
                process.start()
            finally:
                os.environ.clear()
                os.environ.update(saved)
            stack.callback(process.shutdown)
            run["process"] = lambda prompts, load, tokens: run_direct(process, prompts, load.concurrency, tokens,
                                                                      arrivals=load.arrivals())
        if "served" in paths:
            def served_by(srv, parameters):
                def served(prompts, load, tokens):
                    with on_cpus(client_cpus):
                        return run_served(srv.grpc_url, srv.model, prompts, load.concurrency, tokens, srv.proc.pid,
                                          srv.metrics_url, load.processes, args.client_streams,
                                          spec=load.open_spec(args.client_streams) if load.rate else None,
                                          parameters=parameters)
                return served

            served = served_by(server, request_params)
            run["served"] = served
            if "served_alt" in paths:
                run["served_alt"] = served_by(started["served_alt"], alt_request_params)
        for base in ("direct", "served"):  # the same path with every CPU kept from sleeping while it runs
            if f"{base}_awake" in paths:
                run[f"{base}_awake"] = with_cpus_awake(run[base], board, args.awake_pause_at)
        if "pinned" in paths:
            # the same server, its engine process on cores of its own for this path's rounds only: pinned and
            # unpinned alternate round by round on one compile of one engine (compiles differ by up to 10%)
            def pinned(prompts, load, tokens):
                results["cpu_split"]["pinned"] = pin_engine(server.proc.pid, server_cpus, args.pin_engine)
                try:
                    return served(prompts, load, tokens)
                finally:
                    for pid in [server.proc.pid, *descendants(server.proc.pid)]:
                        set_process_affinity(pid, server_cpus)

            run["pinned"] = pinned
        generate = {g["concurrency"]: g for g in results.get("vs_generate", [])}
        loads = make_loads(args, args.client_processes)
        try:
            for load in loads:
                results["runs"].append(compare(run, engine.tokenizer, load, args, generate))
        except KeyboardInterrupt as stop:
            stopped = signal.Signals(stop.args[0] if stop.args else signal.SIGINT)
            results["interrupted"] = f"{stopped.name} after {len(results['runs'])} of {len(loads)} loads"
            log(f"interrupted: {results['interrupted']}; stopping the servers and printing the loads measured")
        # which CUDA libraries each path's engine runs on (after the runs: cuBLAS and friends load lazily)
        libs = {"direct": cuda_libraries(os.getpid())}
        if "process" in run:
            libs["process"] = cuda_libraries(process.info.get("pid", 0))
        for path in ("served", "served_alt"):
            if path in run:
                srv = server if path == "served" else started["served_alt"]
                # engine_process=false: the engine runs in the python stub, so its libraries are the stub's
                pids, host = engine_pids(srv.proc.pid), "engine process"
                if not pids:
                    pids, host = stub_pids(srv.proc.pid), "stub (engine_process=false)"
                log(f"{path} {host}: pid {' '.join(map(str, pids)) or '(not found)'}")
                libs[path] = sorted({lib for pid in pids for lib in cuda_libraries(pid)})
        results["cuda_libraries"] = libs
        for path, found in libs.items():
            log(f"{path} engine's CUDA libraries: {' '.join(found) or '(none found)'}")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(results, indent=2))
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
