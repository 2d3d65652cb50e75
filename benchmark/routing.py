"""Routing by prefix (where prompts were sent, or where the engines' KV-cache events say they are) against routing by
load (`serve.routing`, launcher/frontend/routing.py), and what choosing costs.

    python -m benchmark.routing                                   # tiny model, replicas=2, both workloads
    python -m benchmark.routing --workloads multiturn --rounds 3
    python -m benchmark.routing --pick-only                       # only the cost of one routing decision
    python -m benchmark.routing model=llama engine.device=cuda     # overrides go to every llmlaunch

Two parts:
1. The cost of one routing decision, in-process, on prompts of 512 B to 64 KiB of text (128 to 16 K tokens of
   English): `least_outstanding`, `prefix` and `kv` (which tokenizes the prompt with --tokenizer, the tiny model's by
   default) picking among 4 replicas whose index already holds 64 prefixes; and with `kv`, what its subscriber
   thread spends on an engine step's KV-cache events (decoding and applying them), the work it takes from the front
   end's event loop.
2. The same served load under each policy (--policies): one `llmlaunch replicas=N serve.routing=P` each (the hf
   engine with its prefix cache by default), then llmlaunch-bench on it at each --concurrency on a shared-prefix
   workload (`--dataset-name prefix`: G groups, a P-token shared prefix, an S-token suffix) and a multi-turn one
   (each turn sends the whole history), the policies alternated over --rounds.  Per run: output tokens/s, TTFT p50/p90, failed requests, and the share of prompt tokens the
   replicas' engines served from their prefix caches (their own counters, summed over the replicas); with `kv`, the
   prompt tokens the front end credited the engines with as it routed beside what they found.

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
from launcher.handoff.endpoint import EndpointRecord
from launcher.rundir import RunDir

POLICIES = ("least_outstanding", "prefix", "kv")


def pick_cost(policies, tokenizer: str, repeats: int = 2000) -> list[dict]:
    """Microseconds a pick takes, by policy and prompt size (in-process; replicas need no server for it).  `kv`
    tokenizes every prompt with `tokenizer` (a folder with tokenizer.json) and looks its token blocks up in an index
    that holds them all, as the engines' events would have filled it."""
    from launcher.frontend.replica import Replica
    from launcher.frontend.routing import make_routing
    from launcher.kv_events import chain_keys, stored

    words = b"The quick brown fox jumps over the lazy dog while the careful assistant answers. "
    rows = []
    for size in (512, 8192, 65536):
        for name in policies:
            reps = [Replica(i, "127.0.0.1", 9000 + i) for i in range(4)]
            policy = make_routing(name, [""] * len(reps), tokenizer)
            prompts = [(f"group {g} ".encode() + words * (size // len(words) + 1))[:size] for g in range(64)]
            for g, p in enumerate(prompts):  # the index holds every prefix
                if name == "kv":
                    ids = policy.blocks.tokenizer.encode(p.decode()).ids
                    ids = ids[: len(ids) // 16 * 16]
                    policy.kv.apply(g % 4, policy.kv.seq[g % 4] + 1, [0, [stored(chain_keys(ids, 16), None, ids, 16)]])
                policy.pick(reps, (), p)
            t0 = time.perf_counter()
            for k in range(repeats):
                policy.pick(reps, (), prompts[k % 64])
            rows.append({"policy": name, "prompt_bytes": size, "us": (time.perf_counter() - t0) / repeats * 1e6})
    return rows


def event_cost(per_batch: int = 10, batches: int = 3000) -> dict:
    """Microseconds `kv`'s subscriber spends on one engine step's batch of KV-cache events (msgpack decode and the
    index update), the batches an engine under load sends (benchmark.servers.churn_batches: `per_batch` blocks
    stored, as many evicted), in-process: the work that thread takes from the front end's event loop."""
    import itertools

    import msgspec

    from benchmark.servers import churn_batches
    from launcher.frontend.kv_index import KvIndex

    encode, decode = msgspec.msgpack.Encoder().encode, msgspec.msgpack.Decoder().decode
    payloads = [encode([0.0, ev, None]) for ev in itertools.islice(churn_batches(per_batch), batches)]
    index = KvIndex(1)
    t0 = time.perf_counter()
    for seq, payload in enumerate(payloads):
        index.apply(0, seq, decode(payload))
    us = (time.perf_counter() - t0) / batches * 1e6
    return {"blocks_per_batch": per_batch, "us_per_batch": us, "us_per_block": us / per_batch}


def the_endpoint(jobs_dir: Path) -> EndpointRecord:
    """The endpoint.json of the one run under jobs_dir."""
    (endpoint,) = jobs_dir.rglob("endpoint.json")
    return RunDir(endpoint.parent).read_endpoint()


def engine_counts(jobs_dir: Path, model: str) -> dict:
    """Prompt tokens admitted and served from cache, summed over the replicas' engines (the replica leaders' metrics
    URLs in the endpoint.json of the one run under jobs_dir)."""
    from launcher.python_backend.timings import settled_engine_metrics

    urls = ",".join(r.metrics_url for r in the_endpoint(jobs_dir).replicas)
    m = settled_engine_metrics(urls, model, wait_s=10)
    return {k: m[k] for k in ("prompt_tokens", "cached_prompt_tokens")}


def frontend_counts(jobs_dir: Path) -> tuple:
    """(the prompt blocks the front end predicted its replicas' engines held, summed; the requests it routed to each
    replica), from its /metrics."""
    from launcher.python_backend.timings import fetch_metrics_text

    text = fetch_metrics_text(the_endpoint(jobs_dir).metrics_url)

    def values(name: str) -> list:
        return [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name + "{")]

    return sum(values("llmlaunch_frontend_predicted_cached_blocks_total")), values("llmlaunch_frontend_requests_total")


def served_runs(policy: str, runs: list[tuple], args, overrides: list[str], tmp: Path, tag: str) -> list[dict]:
    """One `llmlaunch replicas=N serve.routing=policy`, and llmlaunch-bench on it for each (workload name,
    concurrency, bench arguments) of `runs` in turn; a row each, its counters the run's own (the engines' and the
    front end's, before and after)."""
    jobs = tmp / f"jobs_{tag}"
    ov = [f"replicas={args.replicas}", f"serve.routing={policy}", f"cluster.jobs_dir={jobs}", *overrides]
    rows = []
    with llmlaunch(ov, tmp / f"llmlaunch_{tag}.log", timeout_s=args.ready_timeout) as s:
        for name, concurrency, workload in runs:
            before, (predicted, routed) = engine_counts(jobs, s.model), frontend_counts(jobs)
            out = tmp / f"bench_{tag}_{name}_{concurrency}.json"
            argv = [sys.executable, "-m", "launcher.bench.cli", "--url", s.url, "--model", s.model, "--no-progress"]
            argv += [*workload, "--result-json", str(out)]
            r = subprocess.run(argv, capture_output=True, text=True, cwd=CHECKOUT)
            if r.returncode != 0:
                raise SystemExit(f"llmlaunch-bench failed ({r.returncode}):\n{r.stderr[-3000:]}")
            after, (now, routed_now) = engine_counts(jobs, s.model), frontend_counts(jobs)
            predicted = now - predicted
            m = json.loads(out.read_text())["metrics"]
            prompt = after["prompt_tokens"] - before["prompt_tokens"]
            cached = after["cached_prompt_tokens"] - before["cached_prompt_tokens"]
            rows.append(
                {
                    "policy": policy,
                    "workload": name,
                    "concurrency": concurrency,
                    "tok_s": m["output_throughput"],
                    "ttft_p50_ms": m["ttft_ms"]["p50"],
                    "ttft_p90_ms": m["ttft_ms"]["p90"],
                    "failed": m["failed"] + m.get("errors", 0),
                    "hit_rate": cached / prompt if prompt else 0.0,
                    # kv: the prompt tokens the front end credited the engines with as it routed (whole blocks of
                    # --block-size), against what they found; prefix credits text blocks, not comparable
                    "predicted_tokens": predicted * args.block_size if policy == "kv" else None,
                    "cached_tokens": cached,
                    "routed": [int(b - a) for a, b in zip(routed, routed_now)],  # requests each replica got
                }
            )
            row = rows[-1]
            print(
                f"  {name:<9} C={concurrency:<4} {tag.rsplit('_', 1)[-1]:>2} {policy:<18} {row['tok_s']:8.1f} tok/s  "
                f"TTFT p50 {row['ttft_p50_ms']:8.1f} p90 {row['ttft_p90_ms']:8.1f} ms  hit {row['hit_rate']:.1%}  "
                f"failed {row['failed']}  routed {row['routed']}"
                + (
                    f"  predicted {row['predicted_tokens']:.0f} of {cached} cached tokens"
                    if row["predicted_tokens"] is not None
                    else ""
                ),
                file=sys.stderr,
                flush=True,
            )
    return rows


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
    p.add_argument("--concurrency", default="8", help="concurrencies, comma-separated (each a bench run)")
    p.add_argument("--num-prompts", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of the policies")
    p.add_argument("--ready-timeout", type=float, default=600.0, help="seconds each llmlaunch may take to READY")
    p.add_argument("--policies", default=",".join(POLICIES), help="serve.routing policies, comma-separated")
    p.add_argument(
        "--tokenizer", default="", help="kv's tokenizer folder for the pick cost (default: the tiny model's)"
    )
    p.add_argument(
        "--block-size", type=int, default=16, help="the engines' KV-cache block size (kv's predicted tokens)"
    )
    p.add_argument("--pick-only", action="store_true", help="only the cost of a routing decision")
    p.add_argument("--json", help="also write the JSON document here")
    args = p.parse_args()
    overrides = args.overrides or ["model=tiny"]
    policies = args.policies.split(",")
    if not args.tokenizer:
        from launcher.tiny import ensure_tiny_model

        args.tokenizer = ensure_tiny_model()
    doc: dict = {"pick_cost": pick_cost(policies, args.tokenizer), "served": []}
    print("one routing decision, 4 replicas, 64 prefixes indexed (microseconds):", file=sys.stderr)
    for row in doc["pick_cost"]:
        print(f"  {row['policy']:<18} {row['prompt_bytes']:>6} B prompt  {row['us']:8.1f} us", file=sys.stderr)
    if "kv" in policies:
        ev = doc["event_cost"] = event_cost()
        print(
            f"kv's subscriber: {ev['us_per_batch']:.1f} us a batch of {ev['blocks_per_batch']} blocks stored and as "
            f"many evicted ({ev['us_per_block']:.2f} us a block stored and evicted): 1,000 blocks/s from each of 4 "
            f"replicas take {4000 * ev['us_per_block'] / 1e4:.2f}% of a core",
            file=sys.stderr,
        )
    if not args.pick_only:
        common = ["--output-len", str(args.output_len), "--ignore-eos", "--num-prompts", str(args.num_prompts)]
        common += ["--input-len", str(args.input_len)]
        loads = {
            "prefix": ["--dataset-name", "prefix", "--prefix-groups", str(args.prefix_groups)]
            + ["--prefix-len", str(args.prefix_len)],
            "multiturn": ["--dataset-name", "multiturn", "--turns", str(args.turns)],
        }
        names = args.workloads.split(",")
        concurrencies = [int(c) for c in str(args.concurrency).split(",")]
        with tempfile.TemporaryDirectory(prefix="llmlaunch-routing-") as tmp:
            for rnd in range(args.rounds):
                for policy in policies:
                    runs = [
                        (name, c, [*loads[name], *common, "--concurrency", str(c), "--seed", str(10 + rnd)])
                        for name in names
                        for c in concurrencies
                    ]
                    for row in served_runs(policy, runs, args, overrides, Path(tmp), f"{policy}_{rnd}"):
                        row.update(round=rnd)
                        doc["served"].append(row)
        for name in names:
            for c in concurrencies:
                med = {
                    pol: {
                        k: statistics.median(
                            r[k]
                            for r in doc["served"]
                            if r["workload"] == name and r["policy"] == pol and r["concurrency"] == c
                        )
                        for k in ("tok_s", "ttft_p50_ms")
                    }
                    for pol in policies
                }
                if "least_outstanding" not in med:
                    continue
                b = med["least_outstanding"]
                for pol, a in med.items():
                    if pol != "least_outstanding":
                        print(
                            f"{name} C={c}: {pol} against least_outstanding, medians: tok/s "
                            f"{a['tok_s'] / b['tok_s']:.2f}x, TTFT p50 {b['ttft_p50_ms'] / a['ttft_p50_ms']:.2f}x lower",
                            file=sys.stderr,
                        )
    text = json.dumps(doc, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
