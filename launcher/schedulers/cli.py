"""`llmlaunch-status <job>` and `llmlaunch-stop <job>`: the job index (launcher.jobindex) names the scheduler that
launched the job, and that scheduler answers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

from launcher import jobindex
from launcher.errors import LaunchError
from launcher.schedulers.base import Scheduler
from launcher.schedulers.registry import get


def job_scheduler(job_id: str) -> Scheduler:
    """The backend that launched a recorded job (records without the field are Slurm's)."""
    return get(jobindex.find(job_id).get("scheduler", "slurm"))


def _cli(action: str, argv: Optional[List[str]]) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print(f"usage: {Path(sys.argv[0]).name} <job id>", file=sys.stderr)
        raise SystemExit(2)
    try:
        if jobindex.find(argv[0]).get("kind") == "service":  # serve.router=host|job: the router answers
            from launcher.service import launch as service

            code, text = {"status": service.status, "stop_job": service.stop}[action](argv[0])
        else:
            code, text = getattr(job_scheduler(argv[0]), action)(argv[0])
    except LaunchError as e:
        print(e.render(), file=sys.stderr)
        raise SystemExit(2) from None
    print(text)
    raise SystemExit(code)


def status_main(argv: Optional[List[str]] = None) -> None:
    """llmlaunch-status <job>: state, endpoint, ready leaders, lost replicas, failed ranks with their log tails."""
    _cli("status", argv)


def stop_main(argv: Optional[List[str]] = None) -> None:
    """llmlaunch-stop <job>: drain and end the job, wait until it is gone."""
    _cli("stop_job", argv)
