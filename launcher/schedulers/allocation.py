"""A sweep point that is its own Slurm allocation (hydra/launcher=submitit_slurm): the ranks start in it.

The Hydra job of such a point IS a Slurm allocation; `AllocationScheduler` (the registry entry
"allocation", launcher/schedulers/base.py) starts the ranks in it with one `srun` step, the script
`launcher.render.allocation_step` renders (what the sbatch script llmlaunch submits would run), and
stops them with SIGTERM. Nothing carries over between points: each allocation is the point's own.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import List, Mapping, Tuple

from launcher.domains import PUBLIC_PORTS as PORT_KEYS  # every port rank 0 offers: each task shifts them all
from launcher.rundir import RunDir, wait_for_endpoint
from launcher.schedulers.base import Endpoint, Request, Scheduler, ready_report


def say(msg: str) -> None:
    print(f"llmlaunch sweep: {msg}", file=sys.stderr, flush=True)


def allocation_problems(
    nodes: int, tasks_per_node: int, cpus_per_task: int, gpus_per_node: int, env: Mapping[str, str]
) -> List[Tuple[str, str, str]]:
    """Does this allocation (its SLURM_* variables) hold the point's ranks? (what, why, fix) for each
    shortfall; the fix names the hydra.launcher.* value to raise."""
    out = []
    have = int(env.get("SLURM_JOB_NUM_NODES") or 1)
    if have < nodes:
        out.append(
            (f"{have} node(s) in the allocation", f"the server needs {nodes}", f"set hydra.launcher.nodes={nodes}")
        )
    have = int(env.get("SLURM_CPUS_ON_NODE") or 1)
    if have < tasks_per_node * cpus_per_task:
        out.append(
            (
                f"{have} CPU(s) per node in the allocation",
                f"the server runs {tasks_per_node} rank(s) x {cpus_per_task} CPU(s) per node",
                f"set hydra.launcher.cpus_per_task={tasks_per_node * cpus_per_task}",
            )
        )
    have = int(env.get("SLURM_GPUS_ON_NODE") or 0)
    if have < gpus_per_node:
        out.append(
            (
                f"{have} GPU(s) per node in the allocation",
                f"the server needs {gpus_per_node}",
                f"set hydra.launcher.gpus_per_node={gpus_per_node}",
            )
        )
    return out


def task_ports(spec, array_task_id: int):
    """Array tasks of one sweep start together and may share a node; rank 0 keeps a configured port
    when it looks free, and two of them checking at once would both take 8001. Each task gets its own
    preferred ports (rank 0 still moves to free ones when these are taken)."""
    shift = len(PORT_KEYS) * (array_task_id % 1000)
    shift = shift if max(int(getattr(spec.serve, k)) for k in PORT_KEYS) + shift <= 65535 else 0
    return dataclasses.replace(
        spec, serve=dataclasses.replace(spec.serve, **{k: int(getattr(spec.serve, k)) + shift for k in PORT_KEYS})
    )


class AllocationScheduler(Scheduler):
    """The ranks of a sweep point as one srun step inside the allocation this process runs in."""

    name = "allocation"
    job_placeholder = "${SLURM_JOB_ID}"
    profile_choice = False  # a sweep point's own allocation (launcher/sweep/point.py), which no profile names
    time_limit = True
    starts_mpi_world = True

    def dryrun(self, spec, run_dir: str) -> Request:
        """The step for this array task's ports (SLURM_ARRAY_TASK_ID)."""
        from launcher.render import allocation_step

        spec = task_ports(spec, int(os.environ.get("SLURM_ARRAY_TASK_ID") or 0))
        return Request(
            self.name,
            spec,
            run_dir,
            allocation_step(spec, run_dir),
            title=f"srun step ({run_dir}/step.sh, run inside the allocation)",
        )

    def launch(self, request: Request) -> Endpoint:
        from launcher.errors import LaunchError
        from launcher.logtext import log_excerpt
        from launcher.models import resolve_model
        from launcher.render import allocation_sizes

        cpus, gpus = allocation_sizes(request.spec)
        problems = allocation_problems(request.spec.nodes, request.spec.tasks_per_node, cpus, gpus, os.environ)
        if problems:
            raise LaunchError(problems)
        spec = resolve_model(request.spec, say)
        run = RunDir(request.run_dir).write_spec(spec)
        if request.record is not None:
            run.write_record(request.record)
        run.step_script.write_text(request.text)
        log = run.step_log
        say(
            f"starting the ranks in allocation {os.environ['SLURM_JOB_ID']}: {request.text.splitlines()[-1][len('exec ') :]}; log {log}"
        )
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                ["bash", str(run.step_script)], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        endpoint = Endpoint("", "", os.environ["SLURM_JOB_ID"], run, spec, proc=proc)

        def not_serving(_elapsed: float = 0.0) -> LaunchError:
            self.stop(endpoint)
            return LaunchError(
                ("ranks", f"not serving (srun status {proc.returncode}); {log}:\n{log_excerpt(log, 15)}", f"read {log}")
            )

        def check() -> None:
            if proc.poll() is not None:
                raise not_serving()

        ep = wait_for_endpoint(
            run, timeout_s=float(spec.serve.ready_timeout_s) + 60, on_timeout=not_serving, check=check, interval_s=0.2
        )
        # the allocation was there before the point began: no queue wait of its own
        ready_report(run, say, job_id=os.environ["SLURM_JOB_ID"])
        endpoint.url, endpoint.model, endpoint.doc = ep.url, ep.model, ep
        return endpoint

    def stop(self, endpoint: Endpoint) -> None:
        """SIGTERM to the step script's process group: srun ends the step on it (SIGKILL after Slurm's KillWait),
        then the script removes the shm regions the ranks left (render.allocation_step)."""
        from launcher.procs.group import stop_group

        proc = endpoint.proc
        if proc is None or proc.poll() is not None:
            return
        stop_group(proc, float(endpoint.spec.serve.drain_timeout_s) + 30)
        say(f"stopped the ranks (srun status {proc.returncode})")
