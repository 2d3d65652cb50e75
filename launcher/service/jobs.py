"""The service's replica jobs: what the router knows of each (`ReplicaJob`), how one is submitted (its own run dir
under the service's, its spec linked to the router), and what Slurm says of all of them in one squeue call."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, Iterable, Optional, Tuple

from launcher.readiness import slurm_time
from launcher.schedulers.slurm import submit
from launcher.schedulers.slurm_jobs import queue_state, run_quiet
from launcher.spec import LaunchSpec, ServiceLink

# Where a replica job stands, as the router sees it:
#   pending   submitted, Slurm has not started it
#   starting  running, not registered yet (loading)
#   serving   registered: the front end routes to it
#   draining  no new requests (handed over, scaled down, stopping): it is cancelled once its requests are done
#   ended     gone from the queue (done, cancelled or failed)
LIVE = ("pending", "starting", "serving")


@dataclass
class ReplicaJob:
    """One replica job of the service."""

    name: str  # r<K>, K counting every job the service submitted
    job_id: str
    run_dir: str
    submitted: float  # when the router submitted it (time.time())
    why: str  # what it was submitted for: start, scale up, handover of rK, replacement of rK
    state: str = "pending"
    started: Optional[float] = None  # when Slurm started it (first seen RUNNING)
    registered: Optional[float] = None  # when it registered (it serves)
    end_time: Optional[float] = None  # Slurm's EndTime: its time limit
    slot: int = -1  # its place in the front end's members file while it is a member
    host: str = ""
    grpc_port: int = 0
    metrics_url: str = ""
    kv_events: str = ""
    successor: str = ""  # the job handed this one's place (handover)
    ending: str = ""  # its time-limit signal came (what its rank 0 said): it serves on until it must drain
    draining_since: Optional[float] = None
    drain_why: str = ""
    ended_as: str = ""  # Slurm's last state, once it ended
    asked_to_end: bool = False  # the router (or the user, through it) ended it: not a failure to replace
    stop_sent: bool = False  # the router stopped its job (SIGTERM to its steps, then scancel)
    in_flight: int = 0  # requests running on it, by the front end's count
    facts: Dict = field(default_factory=dict)  # what it registered with (ready_s, its OpenAI port, ...)

    @property
    def queue_wait_s(self) -> Optional[float]:
        return None if self.started is None else self.started - self.submitted

    @property
    def ready_s(self) -> Optional[float]:
        """From Slurm's start to its registration: its time to READY in the allocation."""
        return None if self.started is None or self.registered is None else self.registered - self.started

    def view(self) -> Dict:
        """What status.json and llmlaunch-status show of it."""
        return {
            k: v
            for k, v in dataclasses.asdict(self).items()
            if k not in ("facts", "kv_events") and v not in (None, "", -1)
        }


def submit_replica(template: LaunchSpec, run_dir: str, link: ServiceLink, record: Optional[Dict] = None) -> str:
    """Submit one replica job: `template` (the service's replica spec) linked to the router, in `run_dir`; its job
    id. Raises LaunchError with Slurm's reason where sbatch refuses."""
    # its own ports are any free ones (port 0): the service's public ports are the router's, and replica jobs may
    # share a node
    serve = dataclasses.replace(template.serve, grpc_port=0, http_port=0, metrics_port=0, openai_port=0)
    spec = dataclasses.replace(template, serve=serve, service=link, job_name=f"{template.job_name}-{link.name}")
    job, _ = submit(spec, run_dir, record)
    return str(job.job_id)


def queue(job_ids: Iterable[str]) -> Dict[str, Tuple[str, Optional[float], str]]:
    """job id -> (state, EndTime, reason) of each of `job_ids` Slurm still lists; a job it does not list has left
    the queue."""
    ids = [j for j in job_ids if j]
    if not ids:
        return {}
    rc, out, _ = run_quiet(["squeue", "-h", "-j", ",".join(ids), "-o", "%i|%T|%e|%r"])
    if rc != 0 and not out.strip():
        # squeue fails outright when none of the ids is known any more
        return {}
    found = {}
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 4:
            found[parts[0]] = (parts[1], slurm_time(parts[2]), parts[3])
    return found


def last_state(job_id: str) -> str:
    """Slurm's word on a job that left the queue (sacct), "" where it keeps none."""
    state = queue_state(job_id)[0]
    return "" if state == "UNKNOWN" else state
