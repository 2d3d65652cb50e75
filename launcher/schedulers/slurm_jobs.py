"""Slurm's side of a submitted job: its queue state and times, `llmlaunch-status` (what the job is doing, from Slurm
and the run dir) and `llmlaunch-stop` (drain its serving step, so it ends COMPLETED, or cancel it).

Read-only towards the run dir; only `stop` changes the job (scancel)."""

from __future__ import annotations

import os
import subprocess
import time
from typing import Dict, List, Optional, Sequence, Tuple

from launcher import jobindex
from launcher.readiness import format_breakdown, slurm_time
from launcher.record import join_record
from launcher.rundir import RunDir
from launcher.triage import describe_failure, describe_lost, describe_restart, describe_walltime, task_deaths


def slurm_env(slurm_conf: str) -> None:
    """Point Slurm's commands at `slurm_conf` (a profile's cluster.slurm_conf; "" keeps the site default)."""
    if slurm_conf:
        os.environ["SLURM_CONF"] = slurm_conf


def run_quiet(argv: List[str], timeout: float = 30) -> Tuple[int, str, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} timed out"
    return p.returncode, p.stdout, p.stderr


def queue_state(job_id: str) -> Tuple[str, str, str]:
    """(state, reason, nodelist) from squeue; falls back to sacct once the job left the queue."""
    rc, out, _ = run_quiet(["squeue", "-h", "-j", job_id, "-o", "%T|%r|%N"])
    line = out.strip().splitlines()[0] if rc == 0 and out.strip() else ""
    if line:
        state, reason, nodes = (line.split("|") + ["", ""])[:3]
        return state, reason, nodes
    rc, out, _ = run_quiet(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,Reason,NodeList"])
    line = out.strip().splitlines()[0] if rc == 0 and out.strip() else ""
    if line:
        state, reason, nodes = (line.split("|") + ["", ""])[:3]
        return state.split()[0], reason, nodes
    return "UNKNOWN", "", ""


def job_times(job_id: str) -> Tuple[Optional[float], Optional[float]]:
    """(Submit, Start) of the job as Slurm recorded them (whole seconds), from squeue, else sacct; None where
    Slurm does not say."""
    rc, out, _ = run_quiet(["squeue", "-h", "-j", job_id, "-o", "%V|%S"])
    line = out.strip().splitlines()[0] if rc == 0 and out.strip() else ""
    if not line:
        rc, out, _ = run_quiet(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "Submit,Start"])
        line = out.strip().splitlines()[0] if rc == 0 and out.strip() else ""
    submit, _, start = line.partition("|")
    return slurm_time(submit), slurm_time(start)


def _record(job_id: str) -> Dict:
    """The job's index entry (launcher.jobindex), Slurm's commands pointed at the cluster it was submitted to."""
    rec = jobindex.find(job_id)
    slurm_env(rec.get("slurm_conf", ""))
    return rec


# Slurm states in which a task srun reported dead is not why the job ended: it was cancelled, preempted or timed
# out (its ranks killed on purpose), or it is queued again
_NOT_A_DEATH = ("CANCELLED", "PENDING", "REQUEUED", "PREEMPTED", "TIMEOUT")


def job_state(
    slurm_state: str, reason: str, fails: List[Dict], deaths: Sequence[Tuple[int, str, str]] = ()
) -> Tuple[str, str]:
    """The one (state, reason) llmlaunch-status reports. A rank's failure record wins over Slurm's
    word: Slurm says RUNNING while srun is still ending the other ranks, CANCELLED when `llmlaunch`
    cancelled a job that failed while loading, and a job's final state is its batch script's exit
    status (COMPLETED whenever the script's last command succeeded), which no rank controls.
    `deaths` (launcher.triage.task_deaths: rank, node, what srun said) name a rank whose own process died
    without writing a record (SIGKILL, the OOM killer): srun ends the step for it and the job fails."""
    if fails:
        ranks = sorted({f["rank"] for f in fails})
        return "FAILED", f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} failed"
    if deaths and slurm_state.split()[0] not in _NOT_A_DEATH:
        rank, node, what = deaths[0]
        return "FAILED", f"rank {rank} on {node}: {what}, says srun"
    return slurm_state, "" if reason in ("None", "") else reason


def rank_deaths(run: RunDir) -> List[Tuple[int, str, str]]:
    """The ranks srun reported ended badly, from the run's logs (launcher.triage.task_deaths)."""
    return task_deaths(text for _path, _rank, text in run.log_texts())


def ready_lines(run: RunDir, job: Dict) -> List[str]:
    """llmlaunch-status's time to READY: from the run record, or, when nobody completed it (llmlaunch was gone
    at READY), from what rank 0 wrote."""
    rec = run.read_record()
    if (rec is None or "time_to_ready" not in rec) and run.read_startup() is not None:
        rec = join_record(rec, run.read_startup(), marks={"submitted": job.get("submitted")})
    if rec is None or "time_to_ready" not in rec:
        return []
    return [format_breakdown(rec["time_to_ready"]), f"record: {run.record_path}"]


def status(job_id: str) -> Tuple[int, str]:
    rec = _record(job_id)
    run = RunDir(rec["run_dir"])
    slurm_state, slurm_reason, nodes = queue_state(job_id)
    fails = run.failures()
    deaths = [] if fails else rank_deaths(run)
    state, reason = job_state(slurm_state, slurm_reason, fails, deaths)
    lines = [
        f"job: {job_id}",
        f"state: {state}" + (f" ({reason})" if reason else ""),
        f"nodes: {nodes or '-'}",
        f"run dir: {run}",
    ]
    e = run.read_endpoint()
    if e is not None:
        lines += [f"endpoint: {e.url}", f"model: {e.model}"]
    lines.append(f"ready leaders: {run.ready_count()}")
    lines += ready_lines(run, rec)
    for w in run.walltime_records():
        lines.append(describe_walltime(w, e is not None))
    lost = run.lost_replicas()
    try:
        replicas = int((run.read_launch() or {})["replicas"])
    except (KeyError, TypeError, ValueError):
        replicas = 0
    if replicas > 1 and state == "RUNNING" and e is not None:
        lines.append(f"replicas: {replicas - len(lost)} of {replicas} serving")
    elif replicas > 1:
        lines.append(f"replicas: {replicas}" + (f", {len(lost)} lost" if lost else ""))
    for r in run.restarts():
        lines.append(describe_restart(r))
    for r in lost:
        # A lost replica is not a failed job: the front end serves with the others (status stays 0).
        lines.append(describe_lost(r))
    for f in fails:
        lines.append("FAILED " + describe_failure(f))
    if not fails and state == "FAILED" and deaths:
        r, node, what = deaths[0]  # the first srun reported; the others ended with the step
        lines.append(
            f"FAILED rank {r} on node {node}: srun reports its task {what}; the rank's own process died, so it wrote no failure record"
        )
    if fails or (state == "FAILED" and deaths):
        lines.append(f"triage: llmlaunch-logs {job_id} (every rank's logs in one archive, the root cause first)")
    # 0 only while the job serves: a failed job (and one that ended or has not started) exits 1
    ok = state == "RUNNING" and e is not None
    return (0 if ok else 1), "\n".join(lines)


# The steps a batch job always has; any other is a step its batch script started (the serving srun).
BOOKKEEPING_STEPS = ("batch", "extern", "interactive")
DRAIN_MARGIN_S = 30.0  # after serve.drain_timeout_s: a rank's grace to end its server (drain + 15 s), the teardown step
LOADING_WINDOW_S = (
    20.0  # a job not serving yet has nothing to drain: its ranks end their servers in seconds, or ignore SIGTERM
)
DEFAULT_DRAIN_TIMEOUT_S = (
    30.0  # launcher/schema.py's serve.drain_timeout_s, for a run dir without a readable launch.json
)


def drain_argv(job_id: str) -> List[str]:
    """SIGTERM to the job's steps only: Slurm signals the batch step (the script) with anything but
    SIGKILL only when --batch or --full is given, so the script goes on to its teardown."""
    return ["scancel", "--signal=TERM", job_id]


def cancel_argv(job_id: str) -> List[str]:
    """The whole job, batch script included: it ends CANCELLED, its teardown step never runs."""
    return ["scancel", job_id]


def drain_window_s(launch: Optional[Dict], serving: bool) -> float:
    """How long a stop waits after the drain signal before it cancels the job. A serving job drains its
    requests for up to serve.drain_timeout_s (from the run dir's launch.json) and then needs a margin to
    end its servers and run the teardown; one not serving yet has no requests to drain."""
    if not serving:
        return LOADING_WINDOW_S
    try:
        drain = float(launch["serve"]["drain_timeout_s"])  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        drain = DEFAULT_DRAIN_TIMEOUT_S
    return max(drain, 0.0) + DRAIN_MARGIN_S


def serving_steps(step_ids: List[str]) -> List[str]:
    """Of `squeue -s` step ids ("12.0", "12.batch", "12.extern"), the ones the batch script started."""
    return [s for s in step_ids if s.strip() and s.strip().rsplit(".", 1)[-1] not in BOOKKEEPING_STEPS]


def stop_action(state: str, steps: List[str]) -> str:
    """What a stop does with a job in `state` (squeue's, "" once it left the queue) running `steps`:
    "gone" (nothing to do), "wait" (COMPLETING: it is ending), "drain" (a running serving step:
    SIGTERM to it) or "cancel" (no serving step to signal: PENDING, or its batch script still before
    the srun; a plain scancel, the job ends CANCELLED)."""
    if not state:
        return "gone"
    if state == "COMPLETING":
        return "wait"
    if state == "RUNNING" and serving_steps(steps):
        return "drain"
    return "cancel"


def _queued(job_id: str) -> str:
    """The job's squeue state, "" once it left the queue (squeue fails for a job Slurm has forgotten)."""
    rc, out, _ = run_quiet(["squeue", "-h", "-j", job_id, "-o", "%T"])
    return out.strip().splitlines()[0] if rc == 0 and out.strip() else ""


def _wait_gone(job_id: str, timeout_s: float) -> str:
    """Until the job left the queue or `timeout_s` passed; its last state ("" when gone)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = _queued(job_id)
        if not state or time.monotonic() >= deadline:
            return state
        time.sleep(0.5)


def stop(job_id: str, timeout_s: float = 90, drain_s: Optional[float] = None) -> Tuple[int, str]:
    """llmlaunch-stop: drain the job's serving step so that the job ends COMPLETED 0:0, not CANCELLED.

    `scancel --signal=TERM JOB` signals the job's steps but not its batch script: each rank forwards
    SIGTERM to its server, Triton drains for up to serve.drain_timeout_s, the ranks exit 0, and the
    batch script runs its shm teardown step and exits with the serving step's status (0). A plain
    `scancel` also kills the batch shell: no teardown, and Slurm records CANCELLED.

    Fallback to a plain `scancel` (the job then ends CANCELLED, and the returned text says so):
    - at once when there is no serving step to signal (the job is PENDING, or its batch script has
      not started the srun yet);
    - when the job is still queued `drain_s` after the signal. A rank ignores SIGTERM until it has
      installed its own handlers (submitit's process bypasses it through start-up and the
      rendezvous), so a job stopped while loading may never end on the signal alone. The window is
      serve.drain_timeout_s (the run dir's launch.json) + 30 s for a serving job, 20 s for one not
      serving yet: a stop takes at most that window plus `timeout_s` for Slurm to end the job.
    """
    rec = _record(job_id)
    run = RunDir(rec["run_dir"])
    t0 = time.monotonic()
    where = f"run dir {run}"
    state = _queued(job_id)
    rc, out, _ = run_quiet(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"]) if state == "RUNNING" else (0, "", "")
    action = stop_action(state, out.split())
    if action == "gone":
        return 0, f"job {job_id} is not in the queue (it ended {queue_state(job_id)[0]}); {where}"
    why = ""
    if action == "drain":
        if drain_s is None:
            # a job draining at its time limit has withdrawn its endpoint but still has requests to finish
            drain_s = drain_window_s(run.read_launch(), serving=run.has_endpoint() or bool(run.walltime_records()))
        rc, _, err = run_quiet(drain_argv(job_id))
        left = _wait_gone(job_id, drain_s) if rc == 0 else _queued(job_id)
        if left == "COMPLETING":  # the batch script has ended the job: Slurm is cleaning up after it
            left = _wait_gone(job_id, timeout_s)
        if not left:
            return (
                0,
                f"job {job_id} stopped: its ranks drained and exited, the batch script ended it ({time.monotonic() - t0:.1f}s); {where}",
            )
        if left == "COMPLETING":
            return 1, f"job {job_id} drained, still COMPLETING after {time.monotonic() - t0:.0f}s"
        why = (
            f"still {left} {drain_s:.0f}s after SIGTERM to its steps (a rank still starting ignores it)"
            if rc == 0
            else f"`{' '.join(drain_argv(job_id))}` failed: {err.strip()}"
        )
    elif action == "cancel":
        why = (
            "its batch script had not started the serving step yet"
            if state == "RUNNING"
            else f"it was {state}, nothing to drain"
        )
    if action != "wait":
        rc, _, err = run_quiet(cancel_argv(job_id))
        if rc != 0 and _queued(job_id):
            return 1, f"job {job_id}: {why}; scancel {job_id} failed: {err.strip()}"
    left = _wait_gone(job_id, timeout_s)
    cancelled = f"{why}: cancelled (scancel), Slurm records it CANCELLED" if why else "it was already ending"
    if left:
        return 1, f"job {job_id} {cancelled}; still in the queue (state {left}) after {time.monotonic() - t0:.0f}s"
    return 0, f"job {job_id} stopped: {cancelled} ({time.monotonic() - t0:.1f}s); {where}"
