"""Scale rehearsal on the local Slurm cluster: time to READY by node count, a rank killed at the largest count,
and rank 0's front end routing across every replica.

    flock /tmp/llmlaunch-pytest.lock python -m benchmark.scale_rehearsal [--nodes 1 2 4 8 16] [--tasks-per-node 8]

Every launch is `llmlaunch cluster=local_slurm engine=hf model=tiny nodes=N replicas=N*T` with T tasks (one
tritonserver each, `cluster.gpus_per_node=T` fake GPUs) per node: the lightest real launch there is (a 4-layer
random Llama on CPU). Needs root; brings the cluster up with max(--nodes) nodes x T GPUs (reshaping a running
one) and leaves it up.

What it measures, and where from:
- time to READY: `llmlaunch` started -> it printed READY (this script's clock); the model's own load = the slowest
  replica's tritonserver start -> first request answered (`ready_s` of ready_rank<N>.json); overhead = total -
  that. The run record's marks (record.json) split the overhead: queue wait (Slurm's), allocation -> every rank
  started and met (srun, Python start-up, the rendezvous), -> the slowest replica's tritonserver started, the
  slowest replica answered -> front end and OpenAI API up (endpoint.json), -> `llmlaunch` printed READY. Each
  node count runs --repeat times: the best run's columns, the median overhead and the median less the queue wait.
- projection: when the largest count has fewer ranks than --project-ranks (128), a least-squares line of the
  median overhead against ranks, read at --project-ranks, and the memory that many ranks would take.
- memory: MemAvailable before the launch and its lowest point up to READY (/proc/meminfo, sampled every 0.2 s); a
  launch that takes it below --min-free-gib is cancelled (`scancel --name`) before the machine runs out.
- routing (at --route-nodes): as many concurrent streams as replicas x --route-per-replica through rank 0's
  front end, then `llmlaunch_frontend_requests_total` per replica from its metrics.
- kills (at --kill-nodes): SIGKILL one tritonserver of a replica on the last node while the job serves (with
  serve.max_restarts=0 the replica is lost, the job serves on: seconds to its replica_lost record, and whether it
  names rank and node);
  then, in a job of its own, SIGKILL the process of the last rank on the node before (seconds until the job has left the queue, and whether
  `llmlaunch-logs` names that rank and node as the root cause); with --kill-while-starting, also a tritonserver
  killed before the job serves (fail fast: seconds until the job has failed, and what names the rank).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Dict, List

from benchmark.servers import launch_to_ready, run_dir_of, stop_job, submit
from launcher.handoff.endpoint import EndpointRecord

JOB_NAME = "scale-rehearsal"
ACTIVE = ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING")


def mem_available_gib() -> float:
    with open("/proc/meminfo") as f:
        kb = next(int(ln.split()[1]) for ln in f if ln.startswith("MemAvailable:"))
    return kb / 2**20


class MemWatch:
    """The lowest MemAvailable while it runs; below `floor_gib` it cancels this script's jobs (by name)."""

    def __init__(self, floor_gib: float):
        self.floor, self.low, self.tripped = floor_gib, mem_available_gib(), False
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            now = mem_available_gib()
            self.low = min(self.low, now)
            if now < self.floor and not self.tripped:
                self.tripped = True
                subprocess.run(["scancel", "--name", JOB_NAME], capture_output=True)
                print(f"  MemAvailable {now:.1f} GiB < {self.floor} GiB: job cancelled", flush=True)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def launch_overrides(nodes: int, tasks: int, jobs_dir: Path, extra=()) -> List[str]:
    return [
        "cluster=local_slurm",
        "engine=hf",
        "model=tiny",
        f"cluster.gpus_per_node={tasks}",
        f"nodes={nodes}",
        f"replicas={nodes * tasks}",
        f"cluster.jobs_dir={jobs_dir}",
        f"job_name={JOB_NAME}",
        "serve.ready_timeout_s=900",
        "cluster.time=00:40:00",
        # a killed server's replica is lost, not restarted in place: the rule the kills below rehearse at scale
        "serve.max_restarts=0",
        *extra,
    ]


def launch(nodes: int, tasks: int, jobs_dir: Path, floor_gib: float) -> Dict:
    before = mem_available_gib()
    with MemWatch(floor_gib) as mem:
        launched = launch_to_ready(launch_overrides(nodes, tasks, jobs_dir))
    job, run, total = launched.job, launched.run, launched.seconds
    ready = run.ready_records()
    server = max(x["ready_s"] for x in ready)
    rec = run.read_record() or {}
    b, marks = rec.get("time_to_ready") or {}, rec.get("marks") or {}
    last_ready = max(x["time"] for x in ready)
    # the parts of the overhead after the slowest replica answered: rank 0 starting its front end and OpenAI API,
    # then `llmlaunch` noticing endpoint.json
    tail = marks["serving"] - last_ready if marks.get("serving") else None
    # every rank met -> the slowest replica's tritonserver started (its rank's set-up before its server)
    slowest = max(ready, key=lambda x: x["ready_s"])
    late = slowest["time"] - slowest["ready_s"] - marks["ranks_started"] if marks.get("ranks_started") else None
    follow = (
        total - (marks["serving"] - marks["submitted"]) if marks.get("serving") and marks.get("submitted") else None
    )
    return {
        "nodes": nodes,
        "ranks": nodes * tasks,
        "job": job,
        "run": run,
        "total_s": total,
        "server_s": server,
        "overhead_s": total - server,
        "ranks_phase_s": b.get("ranks_s"),
        "frontend_s": b.get("frontend_s"),
        "queue_s": b.get("queue_s"),
        "load_s": b.get("load_s"),
        "tail_s": tail,
        "follow_s": follow,
        "late_s": late,
        "mem_gib": before - mem.low,
        "per_rank_mib": (before - mem.low) * 1024 / (nodes * tasks),
        "endpoint": run.read_endpoint(),
    }


def frontend_counts(metrics_url: str) -> Dict[int, float]:
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    out = {}
    for ln in text.splitlines():
        m = re.match(r'llmlaunch_frontend_requests_total\{replica="(\d+)"', ln)
        if m:
            out[int(m.group(1))] = float(ln.rsplit(" ", 1)[1])
    return out


def route(ep: EndpointRecord, per_replica: int, max_tokens: int) -> Dict:
    """replicas x per_replica streams at once through rank 0's front end; requests per replica after."""
    from launcher.client.request import Generation, build_request
    from launcher.client.stream import TritonStream

    n = len(ep.replicas) * per_replica
    before = frontend_counts(ep.metrics_url)
    t0 = time.monotonic()
    with TritonStream(ep.url) as s:
        recs = [
            s.submit(
                build_request(
                    ep.model,
                    Generation(f"Request {i}: once upon a time", max_tokens=max_tokens, ignore_eos=True),
                    f"r{i}",
                )
            )
            for i in range(n)
        ]
        for rec in recs:
            s.wait(rec, timeout=600)
    took = time.monotonic() - t0
    after = frontend_counts(ep.metrics_url)
    per = {k: after[k] - before.get(k, 0) for k in after}
    return {
        "requests": n,
        "errors": sum(1 for r in recs if r.error),
        "seconds": took,
        "per_replica": per,
        "replicas_reached": sum(1 for v in per.values() if v > 0),
        "replicas": len(ep.replicas),
    }


def pids_of(job: str, rank: int):
    """(tritonserver pid, its parent: the rank's process) of one rank: its server's argv names job and rank."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
    for ln in out.splitlines():
        if f"shm-region-prefix-name=llm{job}r{rank}_" in ln and "bin/tritonserver" in ln:
            pid, ppid = ln.split()[:2]
            return int(pid), int(ppid)
    raise SystemExit(f"no tritonserver of rank {rank} of job {job}")


def queue_state(job: str) -> str:
    from launcher.schedulers import slurm_jobs

    return slurm_jobs.queue_state(job)[0]


def kill_server_serving(job: str, run, rank: int, node: str, replica: int, limit_s: float = 120) -> Dict:
    pid, _ = pids_of(job, rank)
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    while not run.replica_lost(replica) and time.monotonic() - t0 < limit_s:
        time.sleep(0.1)
    took = time.monotonic() - t0
    lost = run.read_lost(replica) or {}
    return {
        "what": f"tritonserver of rank {rank} (replica {replica}, {node}) while serving",
        "seconds": took,
        "outcome": f"replica {replica} lost, job {queue_state(job)}",
        "names": rank in lost.get("ranks", []) and lost.get("host") == node,
        "said": lost.get("reason", ""),
    }


def wait_gone(job: str, limit_s: float):
    t0 = time.monotonic()
    while queue_state(job) in ACTIVE and time.monotonic() - t0 < limit_s:
        time.sleep(0.2)
    return time.monotonic() - t0, queue_state(job)


def named(job: str, run, rank: int, node: str) -> Dict:
    """Whether `llmlaunch-logs`'s root cause and `llmlaunch-status` name the rank and its node."""
    from launcher import logs
    from launcher.schedulers import slurm_jobs

    text, _ = logs.report(run)
    root = text.splitlines()[0] if text else ""
    _, status = slurm_jobs.status(job)
    return {
        "root": root,
        "root_names": f"rank {rank} on {node}" in root,
        "status_names": f"rank {rank}" in status and node in status,
        "status": next((ln for ln in status.splitlines() if "FAILED" in ln), ""),
    }


def kill_rank_process(job: str, run, rank: int, node: str, limit_s: float = 120) -> Dict:
    _, ppid = pids_of(job, rank)
    os.kill(ppid, signal.SIGKILL)
    took, state = wait_gone(job, limit_s)
    time.sleep(3)  # srun's and the other ranks' last lines reach their logs
    return {
        "what": f"rank {rank}'s process ({node}) while serving",
        "seconds": took,
        "outcome": f"job {state}",
        **named(job, run, rank, node),
    }


def kill_while_starting(nodes: int, tasks: int, jobs_dir: Path, floor_gib: float, limit_s: float = 120) -> Dict:
    """Launch, and once some ranks have answered (ready_rank files) but before the job serves, SIGKILL the last
    rank's tritonserver: the job fails fast."""
    rank, node = nodes * tasks - 1, f"node{nodes}"
    with MemWatch(floor_gib):
        p, job = submit(launch_overrides(nodes, tasks, jobs_dir))
        run = run_dir_of(job)
        while True:
            if run.has_endpoint():
                p.kill()
                stop_job(job)
                return {
                    "what": "while starting",
                    "seconds": float("nan"),
                    "outcome": "job served before a kill",
                    "root_names": False,
                    "status_names": False,
                }
            try:
                if run.ready_count() >= 1:
                    pid, _ = pids_of(job, rank)
                    break
            except SystemExit:
                pass
            time.sleep(0.2)
        os.kill(pid, signal.SIGKILL)
        took, state = wait_gone(job, limit_s)
        p.communicate(timeout=120)
    time.sleep(3)
    return {
        "what": f"tritonserver of rank {rank} ({node}) while starting ({run.ready_count()} ranks ready)",
        "seconds": took,
        "outcome": f"job {state}",
        **named(job, run, rank, node),
    }


def fit(xs, ys):
    """Least squares y = a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--tasks-per-node", type=int, default=8, help="tritonservers per node (one replica each)")
    ap.add_argument(
        "--cluster-nodes", type=int, default=0, help="nodes to bring the cluster up with (default: max of --nodes)"
    )
    ap.add_argument(
        "--cluster-gpus", type=int, default=0, help="fake GPUs per node to bring it up with (default: --tasks-per-node)"
    )
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--jobs-dir", default="", help="where the run dirs go (kept; default: a new folder under $TMPDIR)")
    ap.add_argument(
        "--route-nodes", type=int, default=0, help="node count to check routing at (default: the largest measured)"
    )
    ap.add_argument("--route-per-replica", type=int, default=2)
    ap.add_argument("--route-tokens", type=int, default=16)
    ap.add_argument(
        "--kill-nodes",
        type=int,
        default=0,
        help="node count to kill a rank at (default: the largest measured); 0 with --no-kill",
    )
    ap.add_argument("--no-kill", action="store_true")
    ap.add_argument("--kill-while-starting", action="store_true")
    ap.add_argument(
        "--min-free-gib", type=float, default=2.0, help="cancel a launch that takes MemAvailable below this"
    )
    ap.add_argument("--project-ranks", type=int, default=128)
    args = ap.parse_args()
    from launcher.localslurm import cluster as localslurm

    t = args.tasks_per_node
    cluster = localslurm.up(nodes=args.cluster_nodes or max(args.nodes), gpus_per_node=max(t, args.cluster_gpus))
    os.environ.update(cluster.env())
    print(
        f"machine: {os.cpu_count()} cores, MemAvailable {mem_available_gib():.1f} GiB; cluster: {len(cluster.nodes)} nodes",
        flush=True,
    )
    rows, kills, routing = [], [], None
    route_at = args.route_nodes or max(args.nodes)
    kill_at = 0 if args.no_kill else (args.kill_nodes or max(args.nodes))
    jobs = Path(args.jobs_dir or tempfile.mkdtemp(prefix="llmlaunch-scale-"))
    print(f"run dirs under {jobs}", flush=True)
    w = launch(1, 1, jobs, args.min_free_gib)  # warm-up: slurmctld's first scheduling pass, the tiny model's cache
    stop_job(w["job"])
    for n in args.nodes:
        runs = []
        for i in range(args.repeat):
            r = launch(n, t, jobs, args.min_free_gib)
            print(
                f"  {n} nodes x {t}: total {r['total_s']:.1f}s server {r['server_s']:.1f}s overhead {r['overhead_s']:.2f}s "
                f"(ranks {r['ranks_phase_s']}s, front end {r['frontend_s']}s) memory {r['mem_gib']:.1f} GiB "
                f"({r['per_rank_mib']:.0f} MiB/rank)",
                flush=True,
            )
            last = i == args.repeat - 1
            if last and n == route_at:
                routing = route(r["endpoint"], args.route_per_replica, args.route_tokens)
                print(f"  routing: {routing}", flush=True)
            if last and n == kill_at and n * t > 1:
                k = n * t - 1  # the last rank: the last node
                kills.append(kill_server_serving(r["job"], r["run"], k, f"node{n}", k))
                print(f"  kill: {kills[-1]}", flush=True)
            stop_job(r["job"])
            if last and n == kill_at and n * t > 1:
                # a job of its own: the replica lost above would be the earliest error of this one
                again = launch(n, t, jobs, args.min_free_gib)
                k = (n - 1) * t - 1 if n > 1 else 1  # the last rank of the node before the last
                kills.append(kill_rank_process(again["job"], again["run"], k, f"node{k // t + 1}"))
                print(f"  kill: {kills[-1]}", flush=True)
                stop_job(again["job"])
            runs.append(r)
        best = dict(min(runs, key=lambda x: x["overhead_s"]))
        best["median_overhead_s"] = statistics.median(x["overhead_s"] for x in runs)
        best["median_net_s"] = statistics.median(x["overhead_s"] - (x["queue_s"] or 0) for x in runs)
        rows.append(best)
    if kill_at and args.kill_while_starting:
        kills.append(kill_while_starting(kill_at, t, jobs, args.min_free_gib))
        print(f"  kill: {kills[-1]}", flush=True)
    print(
        f"\nbest of {args.repeat} by overhead; median overhead, and median less the queue wait, over the {args.repeat}"
    )
    print(
        "overhead = total - server; of it: queue = llmlaunch started -> Slurm allocated, ranks met = allocated -> every rank "
        "started and met, to server = -> the slowest replica's tritonserver started, after last = slowest replica answered -> front end and API up, follow = -> llmlaunch printed READY"
    )
    print(
        f"{'nodes':>5} {'ranks':>5} {'total s':>8} {'server s':>9} {'overhead s':>11} {'queue s':>8} {'ranks met s':>12} {'to server s':>12} {'after last s':>13} "
        f"{'follow s':>9} {'GiB':>5} {'MiB/rank':>9} {'median s':>9} {'less queue s':>13}"
    )
    for r in rows:
        print(
            f"{r['nodes']:>5} {r['ranks']:>5} {r['total_s']:>8.1f} {r['server_s']:>9.1f} {r['overhead_s']:>11.2f} {r['queue_s'] or 0:>8.2f} "
            f"{r['ranks_phase_s'] or 0:>12.2f} {r['late_s'] or 0:>12.2f} {r['tail_s'] or 0:>13.2f} {r['follow_s'] or 0:>9.2f} {r['mem_gib']:>5.1f} {r['per_rank_mib']:>9.0f} "
            f"{r['median_overhead_s']:>9.2f} {r['median_net_s']:>13.2f}"
        )
    growth = rows[-1]["median_overhead_s"] - rows[0]["median_overhead_s"]
    net = rows[-1]["median_net_s"] - rows[0]["median_net_s"]
    print(
        f"overhead growth {rows[0]['nodes']} -> {rows[-1]['nodes']} nodes ({rows[0]['ranks']} -> {rows[-1]['ranks']} ranks), medians: "
        f"{growth:+.2f} s ({net:+.2f} s less the queue wait)"
    )
    if len(rows) >= 2 and rows[-1]["ranks"] < args.project_ranks:
        a, b = fit([r["ranks"] for r in rows], [r["median_overhead_s"] for r in rows])
        m = sum(r["per_rank_mib"] for r in rows[1:]) / len(rows[1:])
        print(
            f"projection (least squares, overhead = {a:.2f} + {b * 1000:.1f} ms x ranks): {args.project_ranks} ranks -> "
            f"{a + b * args.project_ranks:.2f} s, growth from {rows[0]['ranks']} ranks {b * (args.project_ranks - rows[0]['ranks']):+.2f} s; "
            f"memory {m:.0f} MiB/rank x {args.project_ranks} = {m * args.project_ranks / 1024:.1f} GiB"
        )
    if routing:
        print(
            f"routing at {routing['replicas']} replicas: {routing['requests']} requests, {routing['errors']} errors, "
            f"{routing['replicas_reached']} of {routing['replicas']} replicas reached; per replica {sorted(routing['per_replica'].items())}"
        )
    for k in kills:
        print(
            f"kill {k['what']}: {k['outcome']} after {k['seconds']:.1f} s; names rank and node: "
            f"{k.get('names', k.get('root_names'))} / status {k.get('status_names', '-')}; {k.get('root') or k.get('said')}"
        )


if __name__ == "__main__":
    main()
