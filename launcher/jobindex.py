"""The index of the jobs llmlaunch submitted from this account: `<cache>/jobs/<job id>.json`, one small file a job
(its run dir, the scheduler that launched it, its SLURM_CONF), so that llmlaunch-status, llmlaunch-stop and
llmlaunch-logs find a job from its id alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict

from launcher.errors import LaunchError
from launcher.paths import cache_root


def index_dir() -> Path:
    return cache_root() / "jobs"


def add(entry: Dict) -> None:
    """Record a submitted job; `entry` has at least job_id and run_dir."""
    index_dir().mkdir(parents=True, exist_ok=True)
    (index_dir() / f"{entry['job_id']}.json").write_text(json.dumps(entry))


def find(job_id: str) -> Dict:
    """The entry of `job_id`; LaunchError when llmlaunch did not launch it from this account."""
    f = index_dir() / f"{job_id}.json"
    if not f.exists():
        raise LaunchError(
            (
                f"job {job_id}",
                f"not launched by llmlaunch from this account (no {f})",
                "give a job id that llmlaunch printed",
            )
        )
    return json.loads(f.read_text())
