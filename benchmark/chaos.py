"""A replica killed under load, twice: what the clients lose, how long the replica is gone, what a moved stream waits.

    python -m benchmark.chaos                                  # tiny model, replicas=2, 200 x 600 tokens at C=8
    python -m benchmark.chaos --requests 40 --output-len 300   # shorter
    python -m benchmark.chaos engine.device=cuda model=...     # overrides go to llmlaunch

One `llmlaunch replicas=2` (cluster=local; serve.max_restarts >= 2) and three passes of the same greedy requests
(distinct prompts of about --input-len tokens, --output-len tokens each, --concurrency in flight, over one gRPC
stream through the front end):

1. undisturbed: each request's text, and the output tokens/s;
2. chaos: replica 1's tritonserver is SIGKILLed once --kill-at of the undisturbed pass's time has gone, and again
   once it serves again (restarted in place), each time halfway through a request it runs; per request whether it failed and whether its text is the
   undisturbed one; per kill, how long replica 1 was out of the front end's routing (kill to its UP again) against
   its launch's time to READY; for the streams that moved (the front end's count of them, the ones in flight at
   the kill whose longest wait between two tokens was longest), that wait, p50 and max, beside a re-prefill of
   that length alone (a prompt of --input-len plus half the output, one token);
3. after: as many requests again, of new prompts (the first ones' are in the prefix caches now), output tokens/s
   against the undisturbed pass.
With --repeat the undisturbed pass runs twice first: the texts the two share are the floor for the chaos pass's.

Prints a table on stderr and one JSON document on stdout (--json FILE writes it too).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from benchmark.servers import llmlaunch
from launcher.rundir import RunDir

WORDS = "the river carries light past quiet stone while birds argue over bread and the town wakes slowly".split()


def prompts(n: int, words: int, first: int = 0) -> list[str]:
    """n distinct prompts of about `words` words (the tiny model's tokenizer: about a token a word), numbered from
    `first`: prompts of other numbers share no prefix-cache block with them."""
    return [
        f"Request {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(words)) for i in range(first, first + n)
    ]


def counter(metrics_url: str, name: str, replica: int) -> float:
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    return next(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(f'{name}{{replica="{replica}"'))


def server_pid(job_id: str, rank: int) -> int:
    """The pid of one rank's tritonserver: its argv names the job's and rank's shm prefix."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return next(
        int(ln.split()[0])
        for ln in out.splitlines()
        if f"shm-region-prefix-name=llm{job_id}r{rank}_" in ln and "bin/tritonserver" in ln
    )


def run_pass(url: str, model: str, texts: list[str], output_len: int, concurrency: int) -> tuple[list, float, float]:
    """Every prompt, greedy, --concurrency at a time over one stream: (records, start, end) in perf_counter time."""
    from launcher.client.request import Generation
    from launcher.client.stream import generate_many

    gens = [Generation(t, max_tokens=output_len, ignore_eos=True, temperature=0.0) for t in texts]
    t0 = time.perf_counter()
    records = generate_many(url, model, gens, concurrency=concurrency)
    return records, t0, time.perf_counter()


def tok_s(records, t0: float, t1: float) -> float:
    return sum(r.output_tokens or 0 for r in records if not r.error) / (t1 - t0)


def longest_gap_ms(rec) -> float:
    times = rec.token_times
    return max((b - a for a, b in zip(times, times[1:])), default=0.0) * 1e3


def wait_up(metrics_url: str, recoveries: float, timeout_s: float) -> float:
    """perf_counter time at which replica 1's recoveries count passed `recoveries` (the front end marked it up)."""
    deadline = time.monotonic() + timeout_s
    while counter(metrics_url, "llmlaunch_frontend_replica_recoveries_total", 1) <= recoveries:
        if time.monotonic() > deadline:
            raise SystemExit(f"replica 1 did not serve again within {timeout_s:.0f} s")
        time.sleep(0.05)
    return time.perf_counter()


def chaos_pass(served, ep, texts, args, undisturbed_s: float) -> dict:
    """The chaos pass: the load in a thread, the two kills and the waits for the restarts here."""
    out: dict = {}
    load = threading.Thread(
        target=lambda: out.update(
            zip(("records", "t0", "t1"), run_pass(served.url, served.model, texts, args.output_len, args.concurrency))
        ),
        daemon=True,
    )
    url = ep.metrics_url
    migrated0 = counter(url, "llmlaunch_frontend_migrated_total", 1)
    retried0 = counter(url, "llmlaunch_frontend_retried_total", 1)
    load.start()
    time.sleep(args.kill_at * undisturbed_s)
    # requests of one length start and end in waves: kill halfway through one of replica 1's requests, not at the
    # turn of a wave, when its new requests have streamed nothing yet (they would be sent again whole, not moved)
    per_request_s = undisturbed_s * args.concurrency / args.requests
    kills = []
    for k in range(2):
        routed = counter(url, "llmlaunch_frontend_requests_total", 1)
        while counter(url, "llmlaunch_frontend_requests_total", 1) == routed and load.is_alive():
            time.sleep(0.02)
        time.sleep(per_request_s / 2)
        recoveries = counter(url, "llmlaunch_frontend_replica_recoveries_total", 1)
        os.kill(server_pid(ep.job_id, 1), signal.SIGKILL)
        killed, during = time.perf_counter(), load.is_alive()
        up = wait_up(url, recoveries, args.ready_timeout)
        kills.append({"at": killed, "out_s": up - killed, "during_load": during})
        print(f"  kill {k + 1}: replica 1 out of routing for {up - killed:.1f} s", file=sys.stderr, flush=True)
    load.join()
    out["kills"] = kills
    out["migrated"] = counter(url, "llmlaunch_frontend_migrated_total", 1) - migrated0
    out["retried"] = counter(url, "llmlaunch_frontend_retried_total", 1) - retried0
    return out


def gaps_at_kills(records, kills: list, migrated: int) -> tuple[list[float], list[float]]:
    """The longest wait between two tokens of each request in flight at a kill: (those of the streams that moved,
    the others').  The moved ones are the `migrated` longest (the front end counts the moves, not which streams
    they were); the others, on the replica that lived, say what the same moment cost a stream that did not move."""
    at_kill = sorted(
        (longest_gap_ms(r) for r in records if any(r.sent < k["at"] < (r.times[-1] if r.times else 0) for k in kills)),
        reverse=True,
    )
    return at_kill[: int(migrated)], at_kill[int(migrated) :]


def p50_max(values: list[float]) -> dict:
    return {
        "p50": round(statistics.median(values), 1) if values else None,
        "max": round(max(values), 1) if values else None,
        "n": len(values),
    }


def reprefill_ms(url: str, model: str, words: int) -> float:
    """The first token of a prompt of `words` words alone, on the idle job: what a moved stream's re-prefill costs."""
    from launcher.client.request import Generation
    from launcher.client.stream import generate

    best = []
    for _ in range(3):
        rec = generate(url, model, Generation(prompts(1, words)[0], max_tokens=1, ignore_eos=True))
        best.append((rec.times[0] - rec.sent) * 1e3)
    return min(best)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--input-len", type=int, default=64, help="prompt words (about a token each)")
    ap.add_argument("--output-len", type=int, default=600)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--kill-at", type=float, default=0.2, help="the first kill, as a share of the undisturbed pass")
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    ap.add_argument(
        "--repeat",
        action="store_true",
        help="run the undisturbed pass twice: the texts the two share are the floor the chaos pass's are judged by "
        "(an engine whose greedy text depends on the batch, bf16 on random weights, differs with no kill at all)",
    )
    ap.add_argument("--json", help="also write the JSON document here")
    ap.add_argument("overrides", nargs="*", help="more llmlaunch overrides")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="llmlaunch-chaos-"))
    jobs = tmp / "jobs"
    overrides = ["model=tiny", "replicas=2", "serve.max_restarts=2", f"cluster.jobs_dir={jobs}", *args.overrides]
    texts = prompts(args.requests, args.input_len)
    with llmlaunch(overrides, tmp / "llmlaunch.log", timeout_s=args.ready_timeout) as served:
        (endpoint,) = jobs.rglob("endpoint.json")
        run = RunDir(endpoint.parent)
        ep = run.read_endpoint()
        ready_s = float((run.read_record() or {}).get("time_to_ready", {}).get("total_s", 0.0))
        print(f"llmlaunch {' '.join(overrides)}: serving, time to READY {ready_s:.1f} s", file=sys.stderr, flush=True)
        base, t0, t1 = run_pass(served.url, served.model, texts, args.output_len, args.concurrency)
        want = [r.text for r in base]
        before = tok_s(base, t0, t1)
        print(f"  undisturbed: {before:.0f} tok/s, {t1 - t0:.1f} s", file=sys.stderr, flush=True)
        floor = None
        if args.repeat:
            again, _, _ = run_pass(served.url, served.model, texts, args.output_len, args.concurrency)
            floor = sum(r.text == w for r, w in zip(again, want))
            print(f"  undisturbed again: same text {floor} of {args.requests}", file=sys.stderr, flush=True)
        chaos = chaos_pass(served, ep, texts, args, t1 - t0)
        records = chaos["records"]
        failed = [r.error for r in records if r.error]
        same = sum(r.text == w for r, w in zip(records, want))
        gaps, stayed = gaps_at_kills(records, chaos["kills"], chaos["migrated"])
        # new prompts: the engines' prefix caches hold the first ones' blocks, which would make this pass the faster
        fresh = prompts(args.requests, args.input_len, first=args.requests)
        after_recs, a0, a1 = run_pass(served.url, served.model, fresh, args.output_len, args.concurrency)
        after = tok_s(after_recs, a0, a1)
        prefill = reprefill_ms(served.url, served.model, args.input_len + args.output_len // 2)
        restarts = [r.get("ready_s") for r in run.restarts()]
    doc = {
        "overrides": overrides,
        "requests": args.requests,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "concurrency": args.concurrency,
        "time_to_ready_s": ready_s,
        "failed": len(failed),
        "errors": failed[:5],
        "same_text": same,
        "same_text_undisturbed_again": floor,
        "migrated": chaos["migrated"],
        "retried": chaos["retried"],
        "out_of_routing_s": [round(k["out_s"], 2) for k in chaos["kills"]],
        "kills_during_load": [k["during_load"] for k in chaos["kills"]],
        "restart_ready_s": restarts,
        "moved_longest_gap_ms": p50_max(gaps),
        "stayed_longest_gap_ms": p50_max(stayed),
        "reprefill_ms": round(prefill, 1),
        "tok_s_before": round(before, 1),
        "tok_s_after": round(after, 1),
        "after_vs_before": round(after / before - 1, 4),
    }
    print(
        f"failed {doc['failed']} of {args.requests}; same text {same} of {args.requests}"
        + (f" (undisturbed twice: {floor})" if floor is not None else "")
        + f"; migrated {doc['migrated']:.0f}, "
        f"sent again whole {doc['retried']:.0f}; replica 1 out of routing {doc['out_of_routing_s']} s (restarts READY "
        f"in {restarts} s; launch time to READY {ready_s:.1f} s); moved streams' longest wait p50 "
        f"{doc['moved_longest_gap_ms']['p50']} ms, max {doc['moved_longest_gap_ms']['max']} ms (streams in flight that "
        f"did not move: p50 {doc['stayed_longest_gap_ms']['p50']} ms; re-prefill of "
        f"{args.input_len + args.output_len // 2} words alone {doc['reprefill_ms']} ms); tok/s before {before:.0f}, "
        f"after {after:.0f} ({doc['after_vs_before']:+.1%})",
        file=sys.stderr,
    )
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
