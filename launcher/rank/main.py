"""The per-rank entry points: one of these per Slurm task (or per local rank).

python -m launcher.rank <run_dir>    # what every Slurm task (launcher.schedulers.slurm.RankProgram) and every local
                                     # rank runs
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Mapping, Optional

from launcher.handoff.rank_env import RankEnv
from launcher.procs.child import die_with_parent
from launcher.rank.rank import Rank
from launcher.rank.topology import Topology, read_topology
from launcher.rundir import RunDir
from launcher.triage import log_time


def own_log(run: RunDir, topo: Topology) -> Path:
    """The file this rank's stdout goes to (submitit's per-task log), for the failure tail."""
    if topo.launcher == "slurm":
        return run.slurm_rank_log(topo.job_id, topo.rank)
    return run.local_rank_log(topo.rank)


def run_rank(run_dir: str, environ: Optional[Mapping[str, str]] = None, log_path: Optional[str] = None) -> int:
    """Run this process's rank to the end; returns the exit status. `log_path`: where the server's output goes
    (default: this process's own output, which the launcher sends to the rank's log)."""
    environ = dict(os.environ if environ is None else environ)
    run = RunDir(run_dir)
    spec = run.read_spec()
    topo = read_topology(environ)

    def say(msg: str) -> None:
        # the time on every line: llmlaunch-logs orders errors across ranks by it (launcher/triage.py reads it back)
        print(f"[llmlaunch rank {topo.rank} {topo.hostname} {log_time()}] {msg}", flush=True)

    log = Path(log_path) if log_path else own_log(run, topo)
    return Rank(run, spec, topo, environ, log, say, inherit_output=log_path is None).run()


def main(argv: Optional[List[str]] = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m launcher.rank <run_dir>", file=sys.stderr)
        raise SystemExit(2)
    if RankEnv.from_environ(os.environ).die_with_launcher:
        # its own session keeps it from Ctrl-C's signal (llmlaunch stops it in order); this keeps it from outliving
        # an llmlaunch that is killed: the parent's death arrives as SIGTERM, which the rank turns into a drain
        die_with_parent(f"rank of {argv[0]}")
    raise SystemExit(run_rank(argv[0]))
