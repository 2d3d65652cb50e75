"""A service (serve.router=host) under load through its stable endpoint while its replica jobs are handed over at
their time limits, scaled, or killed: what the clients lose, and whether a second passes without an answer.

    python -m benchmark.service --minutes 12                      # handovers: 3-minute replica jobs, C=8 + 1/s probe
    python -m benchmark.service --minutes 4 --kill-at 60          # also kill -9 one replica's server at 60 s
    python -m benchmark.service --steps 2,32,2 --step-s 200 serve.autoscale.max_replicas=4   # scaling by load

The service runs on the local Slurm cluster (`llmlaunch-localslurm up`), the tiny model, `cluster.time` 00:03:00 by
default; the overrides given go to llmlaunch after ours. Two clients run the whole time:
- the load: --concurrency streams (or, with --steps, that many in turn), each sending greedy requests of
  --output-len tokens one after another over gRPC;
- the probe: one OpenAI completion (4 tokens) a second.
Reported: requests and failures of each, the probe's latency p50/p99/max, the longest time without a completed
request (either client) and without a token (the load), the router's decisions by action (handovers, scaling,
replacements) and, with --steps, TTFT p90 of each step, the router's scaling signal over it (serve.autoscale.signal,
as status.json shows it each second) and the time from each scale-up decision to its replica serving, split into the
decision's wait, the job's queue wait and its time to READY.
Prints a table on stderr and one JSON document on stdout (--json FILE writes it too).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from benchmark.servers import checkout_env

BIN = Path(sys.executable).parent


def launch(overrides: list[str], log: Path) -> dict:
    """`llmlaunch ...` until it prints the service's id (or, --fixed, the job's) and endpoint."""
    argv = [str(BIN / "llmlaunch"), *overrides]
    out = subprocess.run(argv, capture_output=True, text=True, env=checkout_env(), timeout=900)
    log.write_text(out.stdout + out.stderr)
    found = dict(re.findall(r"^(service|job|endpoint|openai): (\S+)$", out.stdout, re.M))
    if out.returncode or not {"service", "job"} & set(found):
        raise SystemExit(f"llmlaunch failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return found


class Load:
    """Closed-loop gRPC streams, `workers` of them at a time (changed with `resize`), until `stop`."""

    def __init__(self, url: str, model: str, output_len: int):
        self.url, self.model, self.output_len = url.removeprefix("grpc://"), model, output_len
        self.records: list = []  # (start, end, ok, error, first token time, token times)
        self.stop = threading.Event()
        self.wanted = 0
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def resize(self, n: int) -> None:
        self.wanted = n
        while len(self.threads) < n:
            t = threading.Thread(target=self.worker, args=(len(self.threads),), daemon=True)
            self.threads.append(t)
            t.start()

    def worker(self, k: int) -> None:
        from launcher.client.request import Generation
        from launcher.client.stream import generate

        i = 0
        while not self.stop.is_set():
            if k >= self.wanted:
                time.sleep(0.1)
                continue
            gen = Generation(
                f"Client {k} request {i}: the river carries light",
                max_tokens=self.output_len,
                ignore_eos=True,
                temperature=0.0,
            )
            t0 = time.time()
            try:
                rec = generate(self.url, self.model, gen, timeout=300)
                err = rec.error
                times = [t - time.perf_counter() + time.time() for t in rec.token_times]
            except Exception as e:  # a client error is a failed request, never the end of the run
                err, times = str(e), []
            with self.lock:
                self.records.append((t0, time.time(), not err, err or "", times[0] if times else None, times))
            i += 1


def probe(openai_url: str, model: str, stop: threading.Event, out: list) -> None:
    """One 4-token completion a second through the OpenAI API: (sent, latency s or None, error)."""
    body = json.dumps({"model": model, "prompt": "The capital of France is", "max_tokens": 4}).encode()
    while not stop.is_set():
        t0 = time.time()
        try:
            req = urllib.request.Request(f"{openai_url}/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                json.loads(r.read())
            out.append((t0, time.time() - t0, ""))
        except Exception as e:
            out.append((t0, None, str(e)[:200]))
        stop.wait(max(0.0, 1.0 - (time.time() - t0)))


def longest_gap(times: list[float], t0: float, t1: float) -> float:
    """The longest stretch of [t0, t1] with none of `times` in it."""
    pts = sorted([t0, *(t for t in times if t0 <= t <= t1), t1])
    return max(b - a for a, b in zip(pts, pts[1:]))


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) >= 2 else (values[0] if values else float("nan"))


def scale_timings(decisions: list[dict], jobs: list[dict]) -> list[dict]:
    """For each scale-up: decision -> job submitted -> Slurm started it -> it served (registered)."""
    out = []
    for d in decisions:
        if d["action"] != "scale_up":
            continue
        subs = [
            x for x in decisions if x["action"] == "submit" and x["time"] >= d["time"] and x["reason"] == "scale up"
        ]
        for s in subs[: max(0, d.get("replicas", 0))]:
            job = next((j for j in jobs if j["name"] == s.get("job")), None)
            if job and job.get("registered") and job.get("started"):
                out.append(
                    {
                        "job": job["name"],
                        "decision_s": round(s["time"] - d["time"], 2),
                        "queue_s": round(job["started"] - job["submitted"], 2),
                        "ready_s": round(job["registered"] - job["started"], 2),
                    }
                )
    return out


def run(args, overrides: list[str]) -> dict:
    from launcher import jobindex
    from launcher.service.state import ServiceDir

    ours = [
        "cluster=local_slurm",
        "model=tiny",
        "serve.router=host",
        f"replicas={args.replicas}",
        f"nodes={args.replicas}",
        f"cluster.time={args.time}",
        "serve.walltime_signal_s=45",
        "serve.drain_timeout_s=30",
        "serve.ready_timeout_s=70",
    ]
    log = Path(args.log)
    svc = launch(ours + overrides, log)
    sdir = ServiceDir(jobindex.find(svc["service"])["run_dir"])
    model = sdir.run.read_endpoint().model
    load, probes, stop = Load(svc["endpoint"], model, args.output_len), [], threading.Event()
    steps = [int(s) for s in args.steps.split(",")] if args.steps else [args.concurrency]
    step_s = args.step_s if args.steps else args.minutes * 60
    print(f"service {svc['service']}: {len(steps)} step(s) of {step_s:.0f}s at concurrency {steps}", file=sys.stderr)
    threading.Thread(target=probe, args=(svc["openai"], model, stop, probes), daemon=True).start()
    t0 = time.time()
    marks = []
    series: list = []  # (time, replica jobs serving, serve.autoscale's signal as the router measured it), each second
    killed = None
    try:
        for c in steps:
            marks.append((time.time(), c))
            load.resize(c)
            end = time.time() + step_s
            while time.time() < end:
                if args.kill_at and killed is None and time.time() - t0 >= args.kill_at:
                    killed = kill_one(sdir)
                time.sleep(1)
                st = sdir.status() or {}
                serving, signal_now = st.get("serving", args.replicas), (st.get("autoscale") or {}).get("value")
                series.append((time.time(), serving, signal_now))
                seen = (
                    f"  {(st.get('autoscale') or {}).get('signal')} {signal_now:.2f}" if signal_now is not None else ""
                )
                print(f"  {time.time() - t0:5.0f}s  C={c}  {serving} serving{seen}", file=sys.stderr)
    finally:
        stop.set()
        load.stop.set()
        t1 = time.time()
        time.sleep(2)
        subprocess.run([str(BIN / "llmlaunch-stop"), svc["service"]], env=checkout_env())
    return report(args, load, probes, sdir, t0, t1, marks, killed, series)


def kill_one(sdir) -> dict:
    """kill -9 the tritonserver of the serving replica job registered first."""
    st = sdir.status()
    job = min((j for j in st["jobs"] if j["state"] == "serving"), key=lambda j: j["registered"])
    out = subprocess.run(["ps", "-ww", "-eo", "pid,args"], capture_output=True, text=True).stdout
    pid = next(
        int(ln.split()[0]) for ln in out.splitlines() if f"llm{job['job_id']}r0_" in ln and "bin/tritonserver" in ln
    )
    os.kill(pid, signal.SIGKILL)
    print(f"killed the server of {job['name']} (job {job['job_id']}, pid {pid})", file=sys.stderr)
    return {"job": job["name"], "job_id": job["job_id"], "time": time.time()}


def replacement(killed: dict, decisions: list[dict], jobs: list[dict]) -> dict:
    """The kill, its job's end as the router saw it, and its replacement (or the successor that covered it): when it
    was submitted, started and served, against the kill."""
    out = dict(killed)
    ended = next((d for d in decisions if d["action"] == "ended" and d["reason"].startswith(killed["job"])), None)
    sub = next(
        (d for d in decisions if d["action"] == "submit" and d["reason"].startswith(f"replacement of {killed['job']}")),
        None,
    )
    if ended:
        out["ended_seen_s"] = round(ended["time"] - killed["time"], 2)
    job = next((j for j in jobs if sub and j["name"] == sub.get("job")), None)
    if job and job.get("registered"):
        out.update(
            replacement=job["name"],
            submitted_s=round(job["submitted"] - killed["time"], 2),
            queue_s=round(job["started"] - job["submitted"], 2),
            ready_s=round(job["registered"] - job["started"], 2),
            serving_s=round(job["registered"] - killed["time"], 2),
        )
    return out


def report(args, load, probes, sdir, t0, t1, marks, killed, series) -> dict:
    recs = load.records
    done = [r[1] for r in recs if r[2]] + [p[0] + p[1] for p in probes if p[1] is not None]
    tokens = [t for r in recs for t in r[5]]
    lat = [p[1] for p in probes if p[1] is not None]
    decisions = sdir.read_decisions()
    actions: dict = {}
    for d in decisions:
        actions[d["action"]] = actions.get(d["action"], 0) + 1
    handovers = sum(1 for d in decisions if d["action"] == "drain" and "handed over" in d["reason"])
    steps = []
    for i, (ts, c) in enumerate(marks):
        te = marks[i + 1][0] if i + 1 < len(marks) else t1
        ttft = [r[4] - r[0] for r in recs if r[2] and r[4] and ts + 30 <= r[0] < te]
        done_in = [r for r in recs if r[2] and ts + 30 <= r[1] < te]  # completed after the step's first 30 s
        counts = [(t, n) for t, n, _ in series if ts <= t < te]
        signal = [v for t, _, v in series if ts + 30 <= t < te and v is not None]
        peak = max((n for _, n in counts), default=0)
        scaled = next((t for t, n in counts if n == peak), ts)  # when the step's most replicas first served
        after = [r[4] - r[0] for r in recs if r[2] and r[4] and scaled <= r[0] < te]
        steps.append(
            {
                "concurrency": c,
                "seconds": round(te - ts),
                "ttft_p50_ms": round(pct(ttft, 50) * 1e3, 1) if ttft else None,
                "ttft_p90_ms": round(pct(ttft, 90) * 1e3, 1) if ttft else None,
                "requests": sum(1 for r in recs if ts <= r[0] < te),
                "requests_per_s": round(len(done_in) / max(1.0, te - ts - 30), 2),
                "replicas_at_most": peak,
                "serving_all_after_s": round(scaled - ts, 1),
                "ttft_p90_ms_once_scaled": round(pct(after, 90) * 1e3, 1) if after else None,
                # the router's signal from the step's first 30 s on (ttft_p90: the front end's, from each request's
                # arrival there; the client's TTFT above adds its own connection and queue)
                "signal_p50": round(pct(signal, 50), 2) if signal else None,
                "signal_max": round(max(signal), 2) if signal else None,
            }
        )
    doc = {
        "seconds": round(t1 - t0),
        "load": {
            "requests": len(recs),
            "failed": sum(1 for r in recs if not r[2]),
            "errors": sorted({r[3][:160] for r in recs if not r[2]})[:5],
        },
        "probe": {
            "requests": len(probes),
            "failed": sum(1 for p in probes if p[1] is None),
            "errors": sorted({p[2] for p in probes if p[1] is None})[:5],
            "p50_ms": round(pct(lat, 50) * 1e3, 1),
            "p99_ms": round(pct(lat, 99) * 1e3, 1),
            "max_ms": round(max(lat) * 1e3, 1) if lat else None,
        },
        "longest_without_an_answer_s": round(longest_gap(done, t0 + 5, t1), 2),
        "longest_without_a_token_s": round(longest_gap(tokens, t0 + 5, t1), 2),
        "handovers": handovers,
        "decisions": actions,
        "steps": steps,
        "scale_ups": scale_timings(decisions, (sdir.status() or {}).get("jobs", [])),
        "killed": replacement(killed, decisions, (sdir.status() or {}).get("jobs", [])) if killed else None,
    }
    print(json.dumps(doc, indent=1), file=sys.stderr)
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=12.0, help="length of the run without --steps")
    ap.add_argument("--replicas", type=int, default=2, help="replica jobs to start with")
    ap.add_argument("--time", default="00:03:00", help="each replica job's cluster.time")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--steps", default="", help="concurrencies in turn, e.g. 2,32,2 (scaling)")
    ap.add_argument("--step-s", type=float, default=200.0, help="seconds of each step")
    ap.add_argument("--kill-at", type=float, default=0.0, help="kill -9 one replica's server this many s in")
    ap.add_argument("--fixed", action="store_true", help="one job of --replicas (serve.router=in_job), to compare")
    ap.add_argument("--log", default="/tmp/llmlaunch-service-bench.log", help="llmlaunch's output")
    ap.add_argument("--json", default="", help="also write the JSON document here")
    args, overrides = ap.parse_known_args()
    doc = run(args, overrides)
    text = json.dumps(doc, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
