"""The table of benchmark/overhead.py's runs: per open-loop rate (--request-rate; `load` the rate in req/s) what
concurrency it made, and per closed loop (--concurrency; `load` C=N) the same columns: TTFT in-process / served and
what serving adds, where the served first token's time goes, the engines' steps with prompts and the requests the
served engine took in one hand-over, ITL, tokens/s against in-process, and the server's CPU
a token by role (tritonserver, its python stubs, the engine process: which one a CPU-poor server runs out of).  With
several --client-processes counts a load has a row per count, `load` then ending in xN (N client processes).

    python benchmark/gpu/open_loop_table.py overhead_open.json

With the served_alt path (a second server set up otherwise, e.g. --alt-response-processes 4) each load has a
second line, `alt`, against the same in-process runs; with the pinned path (the served server, its engine process
on cores of its own: --paths ... pinned --pin-engine N --split-cpus) a line `pinned`.
"""

import json
import sys


def cpu_by_role(row: dict, path: str) -> str:
    """The path's server CPU a token (us) by role, "61+29+198" (tritonserver + stubs + engine process); "-" where the
    run has none (the pinned path shares the served server, whose figures are on its line)."""
    roles = (row.get("cpu_us_per_token") or {}).get({"served": "server_by_role",
                                                      "served_alt": "served_alt_server_by_role"}.get(path, ""))
    if not roles:
        return "-"
    return "+".join(f"{roles[k]:.0f}" for k in ("tritonserver", "stubs", "engine"))


def engine_figure(row: dict, path: str, key: str, scale: float, digits: int) -> str:
    """One figure of the path's engine step split (`<path>_engine_steps`), times `scale`; "-" where the run has none.
    Used for `prompt` (the share of steps with prompt tokens, in %: served requests that arrive spread out make more
    and smaller prompt steps than the in-process driver's bursts), `mixed` (the share of steps that took prompts
    beside the decode rows through a mixed graph, in %) and `per_intake` (requests the engine process took in one
    hand-over, one tokenizer call)."""
    value = (row.get(f"{path}_engine_steps") or {}).get(key)
    return "-" if value is None else f"{scale * value:.{digits}f}"


def table(doc: dict) -> str:
    head = (f"{'load':>9} {'in flight in/served':>20} {'TTFT p50 in/served ms':>22} {'+ms':>6} {'TTFT mean in/served':>20} "
            f"{'+ms':>6} {'parse':>6} {'add':>6} {'engine':>7} {'back':>6} {'respond':>7} {'send':>6} {'outside':>7} "
            f"{'prompt steps % in/served':>24} {'mixed %':>7} {'req/hand-over':>13} {'ITL p50 in/served ms':>21} {'tok/s ratio':>11} {'server CPU us/tok: triton+stubs+engine':>38}")
    lines = [head]
    alt = doc.get("served_alt")
    if alt:  # what the second server was set up with, where it differs from the first
        base = {"response_processes": doc["response_processes"], **doc["server_params"]}
        mine = {"response_processes": alt["response_processes"], **alt["server_params"]}
        base.update(doc.get("server_env") or {})  # environment variables too
        mine.update(alt.get("server_env") or {})
        # and request parameters (final_counts_only), named as sent
        base.update({f"request {k}": v for k, v in (doc.get("request_params") or {}).items()})
        mine.update({f"request {k}": v for k, v in (alt.get("request_params") or {}).items()})
        lines[0] += "   (alt: " + ", ".join(f"{k}={v}" for k, v in sorted(mine.items()) if base.get(k) != v) + ")"
    # several --client-processes counts: each load has a row per count, labelled `load xN` (N client processes)
    several = len({r.get("client_processes") for r in doc["runs"]}) > 1
    for r in doc["runs"]:
        load = f"{r['request_rate']:g}" if r.get("request_rate") else f"C={r['concurrency']}"
        load += f" x{r['client_processes']}" if several else ""
        for path, prefix, label in (("served", "", load), ("served_alt", "served_alt_", "alt"),
                                   ("pinned", "pinned_", "pinned")):
            if f"{path}_ttft_ms_p50" not in r:
                continue
            ft = r.get(f"{path}_first_token_ms") or {}
            mean_added = r[f"{path}_ttft_ms_mean"] - r["direct_ttft_ms_mean"]
            lines.append(
                f"{label:>9} {r['direct_in_flight_mean']:>9.1f} / {r[f'{path}_in_flight_mean']:<8.1f} "
                f"{r['direct_ttft_ms_p50']:>10.2f} / {r[f'{path}_ttft_ms_p50']:<9.2f} {r[f'{prefix}ttft_added_ms_p50']:>6.2f} "
                f"{r['direct_ttft_ms_mean']:>9.2f} / {r[f'{path}_ttft_ms_mean']:<8.2f} {mean_added:>6.2f} "
                + " ".join(f"{ft.get(k, float('nan')):>{w}.2f}" for k, w in
                           (("parse", 6), ("add", 6), ("engine", 7), ("back", 6), ("respond", 7), ("send", 6),
                            ("outside_server", 7)))
                + f" {engine_figure(r, 'direct', 'prompt', 100, 1):>11} / {engine_figure(r, path, 'prompt', 100, 1):<10}"
                + f" {engine_figure(r, path, 'mixed', 100, 1):>7} {engine_figure(r, path, 'per_intake', 1, 2):>13}"
                + f" {r['direct_itl_ms_p50']:>9.3f} / {r[f'{path}_itl_ms_p50']:<9.3f} {r[f'{prefix}ratio']:>11.3f}"
                + f" {cpu_by_role(r, path):>38}")
    return "\n".join(lines)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(table(json.load(f)))
