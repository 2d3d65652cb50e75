"""The schedulers llmlaunch launches with, by name: one class per `cluster.scheduler` value (those whose
`profile_choice` is true: the names a cluster profile may give), and "allocation" for a sweep point that is its own
Slurm allocation. Adding a scheduler is one class (launcher/schedulers/base.py says what it answers and which facts
it states) and its entry here."""

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
    """The scheduler of a spec's (or a typed config's) cluster.scheduler, validated against `choices()`."""
    return get(spec.cluster.scheduler)


def choices() -> Dict[str, Type[Scheduler]]:
    """cluster.scheduler's choices: the schedulers a cluster profile may name."""
    return {name: cls for name, cls in SCHEDULERS.items() if cls.profile_choice}


def validated(cfg):
    """A composed config -> the validated spec (launcher.validate.build_spec), against these schedulers' facts."""
    from launcher.validate import build_spec

    return build_spec(cfg, choices())


def names() -> List[str]:
    return sorted(SCHEDULERS)
