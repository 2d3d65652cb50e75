"""The launcher's own start-up time on a Slurm cluster, by node count (re-run on a new cluster).

Seconds from `llmlaunch` to READY, minus the server's own start+load time, for 1, 2 and 4 nodes (one hf replica
per node, the tiny model), on the local Slurm cluster.

    python -m benchmark.launch_time [--nodes 1 2 4] [--repeat 2]

Needs root and `llmlaunch-localslurm up` (it brings the cluster up if it is down). Prints a table:
total = llmlaunch start -> READY printed; server = slowest leader's tritonserver start -> first request
answered (from ready_rank<N>.json); overhead = total - server (submission, scheduling, srun, Python
start-up, rendezvous, following the job).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from benchmark.servers import launch_to_ready, stop_job


def one(nodes: int, jobs_dir: Path) -> dict:
    """One launch of `nodes` nodes to READY, then stopped: its total time, its slowest server's own, the rest."""
    launched = launch_to_ready(
        [
            "cluster=local_slurm",
            "engine=hf",
            "model=tiny",
            f"replicas={nodes}",
            f"nodes={nodes}",
            f"cluster.jobs_dir={jobs_dir}",
        ]
    )
    server = max(r["ready_s"] for r in launched.run.ready_records())
    stop_job(launched.job)
    total = launched.seconds
    return {"nodes": nodes, "total_s": total, "server_s": server, "overhead_s": total - server}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    from launcher.localslurm import cluster as localslurm

    cluster = localslurm.up()
    os.environ.update(cluster.env())
    rows = []
    with tempfile.TemporaryDirectory() as d:
        one(1, Path(d))  # warm-up: first sbatch after a cold start waits for slurmctld's first scheduling pass
        for n in args.nodes:
            runs = [one(n, Path(d)) for _ in range(args.repeat)]
            best = min(runs, key=lambda x: x["overhead_s"])
            rows.append((n, best, runs))
    print(f"{'nodes':>5} {'total s':>8} {'server s':>9} {'overhead s':>11}  (best of {args.repeat}; all overheads)")
    for n, best, runs in rows:
        print(
            f"{n:>5} {best['total_s']:>8.1f} {best['server_s']:>9.1f} {best['overhead_s']:>11.2f}  {', '.join('%.2f' % r['overhead_s'] for r in runs)}"
        )
    print(f"growth 1 -> {rows[-1][0]} nodes: {rows[-1][1]['overhead_s'] - rows[0][1]['overhead_s']:+.2f} s")


if __name__ == "__main__":
    main()
