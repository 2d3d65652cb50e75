"""Routing by prefix against routing by load (`serve.routing`, launcher/frontend/routing.py), and what choosing costs.

    python -m benchmark.routing                                   # tiny model, replicas=2, both workloads
    python -m benchmark.routing --workloads multiturn --rounds 3
    python -m benchmark.routing --pick-only                       # only the cost of one routing decision
    python -m benchmark.routing model=llama engine.device=cuda     # overrides go to every llmlaunch

Two parts:
1. The cost of one routing decision, in-process, on prompts of 512 B to 64 KiB of text (128 to 16 K tokens of
   English): `least_outstanding` and `prefix` picking among 4 replicas whose index already holds 64 prefixes.
2. The same served load under each policy: `llmlaunch replicas=N serve.routing=P` (the hf engine with its prefix
   cache), then llmlaunch-bench on a shared-prefix workload (`--dataset-name prefix`: G groups, a P-token shared
   prefix, an S-token suffix) and a multi-turn one (each turn sends the whole history), the policies alternated
   over --rounds.  Per run: output tokens/s, TTFT p50/p90, failed requests, and the share of prompt tokens the
   replicas' engines served from their prefix caches (their own counters, summed over the replicas).

Prints a table on stderr and one JSON document on stdout (--json FILE writes it too).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmark.servers import CHECKOUT, llmlaunch

POLICIES = ("least_outstanding", "prefix")


def pick_cost(repeats: int = 2000) -> list[dict]:
    """Microseconds a pick takes, by policy and prompt size (in-process; replicas need no server for it)."""
    from launcher.frontend.replica import Replica
    from launcher.frontend.routing import make_routing

    words = b"The quick brown fox jumps over the lazy dog while the careful assistant answers. "
    rows = []
    for size in (512, 8192, 65536):
        for name in POLICIES:
            policy = make_routing(name)
            reps = [Replica(i, "127.0.0.1", 9000 + i) for i in range(4)]
            prompts = [(f"group {g} ".encode() + words * (size // len(words) + 1))[:size] for g in range(64)]
            for p in prompts:  # the index holds every prefix
                policy.pick(reps, (), p)
            t0 = time.perf_counter()
            for k in range(repeats):
                policy.pick(reps, (), prompts[k % 64])
            rows.append({"policy": name, "prompt_bytes": size, "us": (time.perf_counter() - t0) / repeats * 1e6})
    return rows


def engine_counts(jobs_dir: Path, model: str) -> dict:
    """Prompt tokens admitted and served from cache, summed over the replicas' engines (the replica leaders' metrics
    URLs in the endpoint.json of the one run under jobs_dir)."""
    from launcher.python_backend.timings import settled_engine_metrics

    (endpoint,) = jobs_dir.rglob("endpoint.json")
    urls = ",".join(r["metrics_url"] for r in json.loads(endpoint.read_text())["replicas"])
    m = settled_engine_metrics(urls, model, wait_s=10)
    return {k: m[k] for k in ("prompt_tokens", "cached_prompt_tokens")}


def served_run(policy: str, workload: list[str], args, overrides: list[str], tmp: Path, tag: str) -> dict:
    jobs = tmp / f"jobs_{tag}"
    ov = [f"replicas={args.replicas}", f"serve.routing={policy}", f"cluster.jobs_dir={jobs}", *overrides]
    with llmlaunch(ov, tmp / f"llmlaunch_{tag}.log") as s:
        before = engine_counts(jobs, s.model)
        out = tmp / f"bench_{tag}.json"
        argv = [sys.executable, "-m", "launcher.bench.cli", "--url", s.url, "--model", s.model, "--no-progress"]
        argv += [*workload, "--result-json", str(out)]
        r = subprocess.run(argv, capture_output=True, text=True, cwd=CHECKOUT)
        if r.returncode != 0:
            raise SystemExit(f"llmlaunch-bench failed ({r.returncode}):\n{r.stderr[-3000:]}")
        after = engine_counts(jobs, s.model)
    m = json.loads(out.read_text())["metrics"]
    prompt = after["prompt_tokens"] - before["prompt_tokens"]
    cached = after["cached_prompt_tokens"] - before["cached_prompt_tokens"]
    return {
        "policy": policy,
        "tok_s": m["output_throughput"],
        "ttft_p50_ms": m["ttft_ms"]["p50"],
        "ttft_p90_ms": m["ttft_ms"]["p90"],
        "failed": m["failed"] + m.get("errors", 0),
        "hit_rate": cached / prompt if prompt else 0.0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*", help="llmlaunch overrides for every run (default: model=tiny)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--workloads", default="prefix,multiturn", help="prefix, multiturn (comma-separated)")
    p.add_argument("--prefix-groups", type=int, default=16)
    p.add_argument("--prefix-len", type=int, default=1024)
    p.add_argument("--input-len", type=int, default=128, help="suffix (prefix) or user message (multiturn) tokens")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--num-prompts", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of the policies")
    p.add_argument("--pick-only", action="store_true", help="only the cost of a routing decision")
    p.add_argument("--json", help="also write the JSON document here")
    args = p.parse_args()
    overrides = args.overrides or ["model=tiny"]
    doc: dict = {"pick_cost": pick_cost(), "served": []}
    print("one routing decision, 4 replicas, 64 prefixes indexed (microseconds):", file=sys.stderr)
    for row in doc["pick_cost"]:
        print(f"  {row['policy']:<18} {row['prompt_bytes']:>6} B prompt  {row['us']:8.1f} us", file=sys.stderr)
    if not args.pick_only:
        common = ["--output-len", str(args.output_len), "--ignore-eos", "--concurrency", str(args.concurrency)]
        common += ["--num-prompts", str(args.num_prompts), "--input-len", str(args.input_len)]
        loads = {
            "prefix": ["--dataset-name", "prefix", "--prefix-groups", str(args.prefix_groups)]
            + ["--prefix-len", str(args.prefix_len)],
            "multiturn": ["--dataset-name", "multiturn", "--turns", str(args.turns)],
        }
        with tempfile.TemporaryDirectory(prefix="llmlaunch-routing-") as tmp:
            for name in args.workloads.split(","):
                for rnd in range(args.rounds):
                    for policy in POLICIES:
                        workload = [*loads[name], *common, "--seed", str(10 + rnd)]
                        row = served_run(policy, workload, args, overrides, Path(tmp), f"{name}_{policy}_{rnd}")
                        row.update(workload=name, round=rnd)
                        doc["served"].append(row)
                        print(
                            f"  {name:<9} round {rnd} {policy:<18} {row['tok_s']:8.1f} tok/s  TTFT p50 "
                            f"{row['ttft_p50_ms']:8.1f} p90 {row['ttft_p90_ms']:8.1f} ms  hit {row['hit_rate']:.1%}  "
                            f"failed {row['failed']}",
                            file=sys.stderr,
                            flush=True,
                        )
        for name in args.workloads.split(","):
            med = {
                pol: {
                    k: statistics.median(r[k] for r in doc["served"] if r["workload"] == name and r["policy"] == pol)
                    for k in ("tok_s", "ttft_p50_ms")
                }
                for pol in POLICIES
            }
            a, b = med["prefix"], med["least_outstanding"]
            print(
                f"{name}: prefix against least_outstanding, medians: tok/s {a['tok_s'] / b['tok_s']:.2f}x, "
                f"TTFT p50 {b['ttft_p50_ms'] / a['ttft_p50_ms']:.2f}x lower",
                file=sys.stderr,
            )
    text = json.dumps(doc, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
