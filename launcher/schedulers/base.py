"""What every scheduler is: how a rendered job is started, followed until rank 0 serves, and stopped.

One class per `cluster.scheduler` value, and one for a sweep point that is its own Slurm allocation
(hydra/launcher=submitit_slurm), listed in launcher/schedulers/registry.py; callers look them up by name and
never branch on it. Each answers, as methods:

    dryrun(spec, run_dir) -> Request    pure: what would be submitted or run (`request.text`, which
                                        `dry_run=true` prints in the plan)
    launch(request) -> Endpoint         start it; return once rank 0 serves (LaunchError if it does not)
    serve(request) -> int               what `llmlaunch` does (local: serve in the foreground until a
                                        signal; slurm: launch, print the endpoint, leave the job running)
    alive(endpoint), stop(endpoint)     a server a sweep launched and measures against
    client_argv(endpoint, args)         a sweep's load generator, next to that server
    status(job_id), stop_job(job_id)    llmlaunch-status / llmlaunch-stop, where the backend has jobs

and states its facts as class attributes, which validation, the host check and the rendering read instead of the
scheduler's name (`Scheduler` below says what each means).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from launcher.handoff.endpoint import EndpointRecord
from launcher.rundir import RunDir


@dataclass(frozen=True)
class Request:
    """One launch, rendered before anything happens."""

    scheduler: str  # the registry name of the backend that runs it
    spec: Any  # launcher.spec.LaunchSpec: the validated plan
    run_dir: str  # where the run's files go (launcher/rundir.py)
    text: str  # exactly what is submitted or run (sbatch script, srun step, per-rank commands)
    title: str = ""  # its section heading in the dry run's plan; "" when the plan shows it elsewhere
    # the run record's launching part (launcher/record.py base_record), written into the run dir with the spec;
    # None: no record.json before READY (a launch not started from a composed config)
    record: Optional[Dict[str, Any]] = None


@dataclass
class Endpoint:
    """A server that answers requests, and what following or stopping it needs."""

    url: str  # grpc://host:port of rank 0 (its front end with replicas > 1)
    model: str  # the model name requests go to
    job_id: str  # Slurm job id, or the local server's pid
    run: RunDir  # its run directory
    spec: Any  # the LaunchSpec it serves (model path resolved)
    doc: Optional[EndpointRecord] = None  # endpoint.json as rank 0 wrote it; None until it serves (or in a plan)
    proc: Optional[subprocess.Popen] = None  # the process group this machine started (local, allocation)


class Scheduler:
    """The interface every registry entry implements; what a backend lacks raises NotImplementedError."""

    name = "?"
    job_placeholder = "<job>"  # how the dry run writes the job id in per-rank commands
    # Facts. Every rank runs on this machine: one node, internal servers bind and are reached on 127.0.0.1, rank 0
    # binds 127.0.0.1 unless serve.host says otherwise, and the paths and GPUs the ranks use are this host's.
    on_this_machine = False
    # Jobs have a time limit (cluster.time): signalled serve.walltime_signal_s ahead, drained, requeued when asked.
    time_limit = False
    # The ranks are one MPI world that the scheduler's launcher starts (srun --mpi=...): cluster.mpi may not be
    # none, and an engine whose server is the MPI program (TensorRT-LLM's trtllm-llmapi-launch) can run on it.
    starts_mpi_world = False
    # its jobs can be submitted one a replica by a router apart from them (serve.router=host|job, launcher/service/)
    replica_jobs = False
    # A cluster profile may name it as cluster.scheduler (a sweep point's own allocation is chosen by llmlaunch, not
    # by a profile).
    profile_choice = True

    def dryrun(self, spec, run_dir: str) -> Request:
        raise NotImplementedError

    def launch(self, request: Request) -> Endpoint:
        raise NotImplementedError

    def serve(self, request: Request) -> int:
        raise NotImplementedError(f"cluster.scheduler={self.name} cannot serve from the command line")

    def alive(self, endpoint: Endpoint) -> bool:
        return endpoint.proc is not None and endpoint.proc.poll() is None

    def stop(self, endpoint: Endpoint) -> None:
        raise NotImplementedError

    def client_argv(self, endpoint: Endpoint, bench_args: Sequence[str]) -> List[str]:
        """The load generator's command: here, against the endpoint."""
        import sys

        return [sys.executable, "-m", "launcher.bench.cli", *bench_args]

    def status(self, job_id: str) -> Tuple[int, str]:
        raise NotImplementedError(f"{self.name} has no llmlaunch-status")

    def stop_job(self, job_id: str) -> Tuple[int, str]:
        raise NotImplementedError(f"{self.name} has no llmlaunch-stop")


# The load of the `bench:` line printed at READY: short, and in the served model's tokens (the bench reads the
# tokenizer from the model's config), so it can be pasted as it is.
READY_BENCH_ARGS = (
    "--dataset-name",
    "synthetic",
    "--input-len",
    "128",
    "--output-len",
    "128",
    "--num-prompts",
    "64",
    "--concurrency",
    "8",
)


def bench_command(url: str, model: str) -> str:
    """The `bench:` line printed at READY: llmlaunch-bench run by this interpreter (on PATH or not) at the endpoint."""
    import shlex
    import sys

    return shlex.join([sys.executable, "-m", "launcher.bench", "--url", url, "--model", model, *READY_BENCH_ARGS])


def ready_report(run: RunDir, say, **known) -> Dict[str, Any]:
    """At READY, on the launching side: complete the run record (launcher/record.py) with what rank 0 wrote and
    what the launching side `known`s (marks such as submitted and allocated, queue_reason, job_id, nodes), and
    say its time to READY."""
    from launcher.readiness import format_breakdown
    from launcher.record import complete_record

    try:
        rec = complete_record(run, **known)
    except (OSError, ValueError, TypeError) as e:  # the job serves all the same
        say(f"the run record {run.record_path} was not completed: {type(e).__name__}: {e}")
        return {"time_to_ready": {}}
    say(f"{format_breakdown(rec['time_to_ready'])}; record {run.record_path}")
    return rec
