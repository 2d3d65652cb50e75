"""The schedulers llmlaunch launches with, by name: one class per `cluster.scheduler` value (launcher.domains.
SCHEDULERS lists the names a profile may give), and "allocation" for a sweep point that is its own Slurm
allocation. Adding a scheduler is one class (launcher/schedulers/base.py says what it answers and which facts it
states) and its entry here."""

from __future__ import annotations

from typing import Dict, List, Type

from launcher.schedulers.allocation import AllocationScheduler
from launcher.schedulers.base import Scheduler
from launcher.schedulers.local import LocalScheduler
from launcher.schedulers.slurm import SlurmScheduler

SCHEDULERS: Dict[str, Type[Scheduler]] = {
    cls.name: cls for cls in (LocalScheduler, SlurmScheduler, AllocationScheduler)
}
_INSTANCES: Dict[str, Scheduler] = {}


def get(name: str) -> Scheduler:
    """The scheduler registered as `name` (one instance each)."""
    if name not in _INSTANCES:
        _INSTANCES[name] = SCHEDULERS[name]()
    return _INSTANCES[name]


def for_spec(spec) -> Scheduler:
    """The scheduler of a spec's (or a typed config's) cluster.scheduler, validated against launcher.domains.SCHEDULERS."""
    return get(spec.cluster.scheduler)


def names() -> List[str]:
    return sorted(SCHEDULERS)
