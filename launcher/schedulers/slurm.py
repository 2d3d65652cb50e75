"""Slurm: submit through submitit, follow the job to READY, report, stop.

`launch` is the only function here that submits. It writes the run dir,
submits `RankProgram(run_dir)` with the parameters `launcher.render` computed
(the dry run printed the same sbatch text), then follows the job: queue state
and Slurm's reason while PENDING, each leader's readiness while RUNNING, and a
failing rank's name, node and log tail if one dies. It returns once rank 0
serves, leaving the job running; `llmlaunch-status` / `llmlaunch-stop` take over.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import Dict, List, Optional, Tuple

from launcher import jobindex
from launcher.errors import LaunchError
from launcher.rundir import RunDir, wait_for_endpoint
from launcher.schedulers.base import Endpoint, Request, Scheduler, bench_command, ready_report
from launcher.schedulers.slurm_jobs import job_times, queue_state, run_quiet, slurm_env, status, stop
from launcher.spec import LaunchSpec
from launcher.triage import describe_failure


def say(msg: str) -> None:
    print(f"llmlaunch: {msg}", file=sys.stderr, flush=True)


def _rank_log_tails(run: RunDir, job_id: str, lines: int = 12) -> str:
    from launcher.logtext import log_excerpt

    parts = []
    for log in run.slurm_rank_logs(job_id):
        parts.append(f"--- {log.name}\n{log_excerpt(log, lines)}")
    return "\n".join(parts) or "(no rank logs yet)"


def triage_text(run: RunDir, settle_s: float = 2.0) -> str:
    """llmlaunch-logs' report for a job that failed, after `settle_s` for the other ranks' last lines to reach
    their logs; "" if it cannot be made (the failure itself is still reported)."""
    from launcher.logs import report

    time.sleep(settle_s)
    try:
        return "\n" + report(run)[0]
    except Exception as e:  # a report that fails must not hide the failure it was for
        return f"\n(llmlaunch-logs failed: {e})"


class RankProgram:
    """What submitit pickles and every Slurm task runs: `python -m launcher.rank RUN_DIR`, inside the task's own
    process. The launch layer starts a rank as a program, by its module and the run dir, as the local launcher does,
    and imports nothing of it; a rank's non-zero exit raises SystemExit, which srun (--kill-on-bad-exit) turns into
    the whole job stopping."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir

    def __call__(self) -> int:
        import runpy

        sys.argv = ["python -m launcher.rank", self.run_dir]
        try:
            runpy.run_module("launcher.rank", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            if e.code:
                raise
        return 0


def submit(spec: LaunchSpec, run_dir: str, record: Optional[Dict] = None):
    """Write the run dir and submit. Nothing is left half-submitted: if sbatch refuses, the
    run dir is removed and Slurm's reason is raised as a LaunchError."""
    import submitit

    from launcher.render import submitit_parameters

    if shutil.which("sbatch") is None:
        raise LaunchError(
            (
                f"cluster={spec.cluster.name}",
                "sbatch is not on PATH: this is not a Slurm login node",
                "run on the cluster's login node, or use cluster=local (or cluster=local_slurm after `llmlaunch-localslurm up`)",
            )
        )
    run = RunDir(run_dir).write_spec(spec).path
    if record is not None:
        RunDir(run).write_record(record)
    executor = submitit.SlurmExecutor(folder=str(run), python=spec.python)
    executor.update_parameters(**submitit_parameters(spec, str(run)))
    try:
        job = executor.submit(RankProgram(str(run)))
    except Exception as e:  # sbatch refused: bad partition, too many GPUs, ...
        reason = getattr(e, "stderr", None) or getattr(e, "output", None) or str(e)
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        shutil.rmtree(run, ignore_errors=True)
        raise LaunchError(
            (
                f"cluster={spec.cluster.name} (partition={spec.cluster.partition or 'default'}, gpus_per_node={spec.gpus_per_node_used})",
                f"Slurm refused the job: {str(reason).strip()}",
                "fix the profile value Slurm names (sinfo shows partitions and GRES); nothing was submitted",
            )
        ) from None
    record = {
        "job_id": job.job_id,
        "run_dir": str(run),
        "slurm_conf": spec.cluster.slurm_conf,
        "model": spec.model_name,
        "world_size": spec.world_size,
        "submitted": time.time(),
        "scheduler": "slurm",
    }
    jobindex.add(record)
    RunDir(run).write_job(record)
    return job, run


def follow(job_id: str, run_dir, spec: LaunchSpec, deadline_s: float, reasons: Optional[List[str]] = None) -> Dict:
    """Until rank 0 serves: print queue state, rank readiness; raise on failure. Slurm's reasons while the job
    was PENDING are appended to `reasons`."""
    run = RunDir(run_dir)
    reasons = [] if reasons is None else reasons
    leaders = sum(1 for r in spec.ranks if r.role == "leader")
    seen = {"state": "UNKNOWN"}  # the last queue state, for the timeout's message

    def check() -> None:
        fails = run.failures()
        if fails:
            run_quiet(["scancel", job_id])
            raise LaunchError(
                (
                    f"job {job_id}",
                    "a rank failed: " + describe_failure(fails[0]) + triage_text(run),
                    f"read the rank logs in {run}; `llmlaunch-status {job_id}` shows them, `llmlaunch-logs {job_id}` triages them",
                )
            )

    def progress() -> str:
        state, reason, nodes = queue_state(job_id)
        if state in (
            "FAILED",
            "CANCELLED",
            "TIMEOUT",
            "COMPLETED",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
            "BOOT_FAIL",
            "DEADLINE",
            "PREEMPTED",
        ):
            fails = run.failures()
            detail = (describe_failure(fails[0]) if fails else _rank_log_tails(run, job_id)) + triage_text(run)
            raise LaunchError(
                (
                    f"job {job_id}",
                    f"ended {state} before serving{(' (' + reason + ')') if reason and reason != 'None' else ''}:\n{detail}",
                    f"read the rank logs in {run}; `llmlaunch-logs {job_id}` triages them",
                )
            )
        seen["state"] = state
        if state == "PENDING":
            reasons.append(reason)
            return f"job {job_id} PENDING ({reason})"
        if state == "RUNNING":
            return f"job {job_id} RUNNING on {nodes}: loading, {run.ready_count()}/{leaders} leaders ready"
        return f"job {job_id} {state}"

    def timeout(_elapsed: float) -> LaunchError:
        return LaunchError(
            (
                f"job {job_id}",
                f"not serving after {deadline_s:.0f}s (state {seen['state']})",
                f"raise serve.ready_timeout_s, or look at the rank logs in {run}; the job is still queued/running: llmlaunch-stop {job_id}",
            )
        )

    return wait_for_endpoint(run, timeout_s=deadline_s, on_timeout=timeout, check=check, progress=progress, say=say)


def slurm_ready_facts(job_id: str, run: RunDir, reasons: List[str]) -> Dict:
    """What the launching side knows of a Slurm job's start: its Submit and Start times (Start: the allocation),
    the reasons it was PENDING, its nodes. The record's own submission time (llmlaunch's) wins over Slurm's."""
    from launcher.readiness import queue_reasons

    submit, start = job_times(job_id)
    job = run.read_job() or {}
    return {
        "marks": {"submitted": submit or job.get("submitted"), "allocated": start},
        "job_id": job_id,
        "queue_reason": queue_reasons(reasons),
        "nodes": queue_state(job_id)[2],
    }


class SlurmScheduler(Scheduler):
    """cluster.scheduler=slurm: submitit submits the rendered sbatch script; the job outlives `llmlaunch`."""

    name = "slurm"
    job_placeholder = "${SLURM_JOB_ID}"
    time_limit = True
    starts_mpi_world = True
    replica_jobs = True

    def dryrun(self, spec: LaunchSpec, run_dir: str) -> Request:
        from launcher.render import sbatch_script

        return Request(
            self.name,
            spec,
            run_dir,
            sbatch_script(spec, run_dir),
            title=f"sbatch script ({run_dir}/submission.sh, submitted through submitit)",
        )

    def launch(self, request: Request, leave_running: bool = False) -> Endpoint:
        """Submit and follow the job until rank 0 serves. A job that does not get there is stopped, unless
        `leave_running` (`llmlaunch` itself: its message names llmlaunch-stop for a job still loading)."""
        from launcher.models import resolve_model

        slurm_env(request.spec.cluster.slurm_conf)
        spec = resolve_model(request.spec, say)
        job, run = submit(spec, request.run_dir, request.record)
        say(f"submitted job {job.job_id} ({spec.world_size} ranks on {spec.nodes} node(s)); run dir {run}")
        reasons: List[str] = []
        try:
            ep = follow(job.job_id, run, spec, float(spec.serve.ready_timeout_s) + 600, reasons)
        except BaseException:
            if not leave_running:
                say(stop(job.job_id)[1])
            raise
        ready_report(RunDir(run), say, **slurm_ready_facts(job.job_id, RunDir(run), reasons))
        return Endpoint(ep.url, ep.model, job.job_id, RunDir(run), spec, ep)

    def serve(self, request: Request) -> int:
        t0 = time.monotonic()
        ep = self.launch(request, leave_running=True)
        url, job_id = ep.url, ep.job_id
        exe = sys.executable
        print(f"job: {job_id}")
        print(f"endpoint: {url}")
        print(f"model: {ep.model}")
        print(f"logs: {ep.run}/{job_id}_<rank>_log.out")
        print(f'stream: {exe} -m launcher.client --url {url} --prompt "The capital of France is" --max-tokens 32')
        print(f"bench: {bench_command(url, ep.model)}")
        rec = ep.run.read_record() or {}
        if rec.get("time_to_ready"):
            from launcher.readiness import format_breakdown

            print(f"ready: {format_breakdown(rec['time_to_ready'])}")
            print(f"record: {ep.run.record_path}")
        print(f"status: llmlaunch-status {job_id}")
        print(f"stop: llmlaunch-stop {job_id}")
        say(f"READY {time.monotonic() - t0:.1f}s after submission")
        return 0

    def alive(self, endpoint: Endpoint) -> bool:
        return queue_state(endpoint.job_id)[0] == "RUNNING" and not endpoint.run.failures()

    def stop(self, endpoint: Endpoint) -> None:
        if endpoint.job_id:
            code, msg = stop(endpoint.job_id)
            say(msg)

    def client_argv(self, endpoint: Endpoint, bench_args) -> List[str]:
        """One task on the job's first node (the one rank 0 serves from), sharing its allocation."""
        from launcher.render import client_argv, srun_args

        container = [a for a in srun_args(endpoint.spec) if a.startswith("--container")]
        return client_argv(endpoint.spec.python, bench_args, job_id=endpoint.job_id, container_args=container)

    def status(self, job_id: str) -> Tuple[int, str]:
        return status(job_id)

    def stop_job(self, job_id: str) -> Tuple[int, str]:
        return stop(job_id)
