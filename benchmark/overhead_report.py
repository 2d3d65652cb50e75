"""benchmark/overhead.py's report: one load's rounds of every path made into a row (medians over rounds, each path
against direct, where a served token's CPU and first-token time went), the table of those rows, the JSON document.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmark.overhead_paths import LATENCY_KEYS, log, make_prompts
from launcher.bench.loads import Load, draw_output_lengths
from launcher.python_backend.timings import PARTS
from launcher.testing.processes import SERVER_ROLES


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
            # a part a round could not split (outside_server None: the model counted other requests) is left out
            row["served_first_token_ms"] = {
                k: round(statistics.median(vals), 3) if vals else None
                for k in split[0]
                for vals in [[x[k] for x in split if x.get(k) is not None]]
            }
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


def write_json(doc: dict, path: str) -> None:
    """The JSON document on stdout, and to `path` too where one is given."""
    text = json.dumps(doc, indent=2)
    if path:
        Path(path).write_text(text + "\n")
    print(text, flush=True)
