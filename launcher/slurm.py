"""Slurm: submit through submitit, follow the job to READY, report, stop.

`launch` is the only function here that submits. It writes the run dir,
submits `RankMain(run_dir)` with the parameters `launcher.render` computed
(the dry run printed the same sbatch text), then follows the job: queue state
and Slurm's reason while PENDING, each leader's readiness while RUNNING, and a
failing rank's name, node and log tail if one dies. It returns once rank 0
serves, leaving the job running; `llmlaunch-status` / `llmlaunch-stop` take over.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from launcher.errors import LaunchError
from launcher.rundir import RunDir, wait_for_endpoint
from launcher.scheduler import Endpoint, Request, Scheduler, bench_command, ready_report
from launcher.spec import LaunchSpec

INDEX_DIR = Path(os.environ.get("LLMLAUNCH_CACHE") or Path.home() / ".cache" / "llmlaunch") / "jobs"


def say(msg: str) -> None:
    print(f"llmlaunch: {msg}", file=sys.stderr, flush=True)


def _slurm_env(slurm_conf: str) -> None:
    if slurm_conf:
        os.environ["SLURM_CONF"] = slurm_conf


def _run(argv: List[str], timeout: float = 30) -> Tuple[int, str, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} timed out"
    return p.returncode, p.stdout, p.stderr


def queue_state(job_id: str) -> Tuple[str, str, str]:
    """(state, reason, nodelist) from squeue; falls back to sacct once the job left the queue."""
    rc, out, _ = _run(["squeue", "-h", "-j", job_id, "-o", "%T|%r|%N"])
    line = out.strip().splitlines()[0] if rc == 0 and out.strip() else ""
    if line:
        state, reason, nodes = (line.split("|") + ["", ""])[:3]
        return state, reason, nodes
    rc, out, _ = _run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,Reason,NodeList"])
    line = out.strip().splitlines()[0] if rc == 0 and out.strip() else ""
    if line:
        state, reason, nodes = (line.split("|") + ["", ""])[:3]
        return state.split()[0], reason, nodes
    return "UNKNOWN", "", ""


def job_times(job_id: str) -> Tuple[Optional[float], Optional[float]]:
    """(Submit, Start) of the job as Slurm recorded them (whole seconds), from squeue, else sacct; None where
    Slurm does not say."""
    from launcher.readiness import slurm_time

    rc, out, _ = _run(["squeue", "-h", "-j", job_id, "-o", "%V|%S"])
    line = out.strip().splitlines()[0] if rc == 0 and out.strip() else ""
    if not line:
        rc, out, _ = _run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "Submit,Start"])
        line = out.strip().splitlines()[0] if rc == 0 and out.strip() else ""
    submit, _, start = line.partition("|")
    return slurm_time(submit), slurm_time(start)


def describe_failure(f: Dict) -> str:
    # "reason" (why the rank failed the job) is absent from records of older versions
    what = f"failed: {f['reason']}" if f.get("reason") else f"exited with status {f['exit_code']}"
    return f"rank {f['rank']} on node {f['host']} (node index {f['node']}) {what}; {f['log']}:\n{f['log_tail']}"


def describe_lost(r: Dict) -> str:
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"]))
    return f"replica {r['replica']} lost at {at} on {r['host']}: {r['reason']} (ranks {', '.join(map(str, r['ranks']))}; log {r['log']})"


def describe_walltime(w: Dict, serving_again: bool) -> str:
    """One allocation's drain at its time limit, and what came of it."""
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(w["time"]))
    then = ("requeued; serving again at the endpoint above" if serving_again else "requeued; the endpoint follows once it serves again") if w.get("requeue") else "ended"
    return f"allocation {w.get('attempt', 0)} drained at its time limit at {at} on {w.get('host', '?')}: {then}"


def _rank_log_tails(run: RunDir, job_id: str, lines: int = 12) -> str:
    from launcher.triton import log_excerpt

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


def submit(spec: LaunchSpec, run_dir: str, record: Optional[Dict] = None):
    """Write the run dir and submit. Nothing is left half-submitted: if sbatch refuses, the
    run dir is removed and Slurm's reason is raised as a LaunchError."""
    import submitit

    from launcher.rank import RankMain
    from launcher.render import python_for, submitit_parameters

    if shutil.which("sbatch") is None:
        raise LaunchError((f"cluster={spec.cluster.name}", "sbatch is not on PATH: this is not a Slurm login node", "run on the cluster's login node, or use cluster=local (or cluster=local_slurm after `llmlaunch-localslurm up`)"))
    run = RunDir(run_dir).write_spec(spec).path
    if record is not None:
        RunDir(run).write_record(record)
    executor = submitit.SlurmExecutor(folder=str(run), python=python_for(spec))
    executor.update_parameters(**submitit_parameters(spec, str(run)))
    try:
        job = executor.submit(RankMain(str(run)))
    except Exception as e:  # sbatch refused: bad partition, too many GPUs, ...
        reason = getattr(e, "stderr", None) or getattr(e, "output", None) or str(e)
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        shutil.rmtree(run, ignore_errors=True)
        raise LaunchError(
            (f"cluster={spec.cluster.name} (partition={spec.cluster.partition or 'default'}, gpus_per_node={spec.gpus_per_node_used})", f"Slurm refused the job: {str(reason).strip()}", "fix the profile value Slurm names (sinfo shows partitions and GRES); nothing was submitted")
        ) from None
    INDEX_DIR.mkdir(parents=True, exist_ok=True)
    record = {"job_id": job.job_id, "run_dir": str(run), "slurm_conf": spec.cluster.slurm_conf, "model": spec.model_name, "world_size": spec.world_size,
              "submitted": time.time(), "scheduler": "slurm"}
    (INDEX_DIR / f"{job.job_id}.json").write_text(json.dumps(record))
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
            _run(["scancel", job_id])
            raise LaunchError((f"job {job_id}", "a rank failed: " + describe_failure(fails[0]) + triage_text(run),
                               f"read the rank logs in {run}; `llmlaunch-status {job_id}` shows them, `llmlaunch-logs {job_id}` triages them"))

    def progress() -> str:
        state, reason, nodes = queue_state(job_id)
        if state in ("FAILED", "CANCELLED", "TIMEOUT", "COMPLETED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"):
            fails = run.failures()
            detail = (describe_failure(fails[0]) if fails else _rank_log_tails(run, job_id)) + triage_text(run)
            raise LaunchError((f"job {job_id}", f"ended {state} before serving{(' (' + reason + ')') if reason and reason != 'None' else ''}:\n{detail}",
                               f"read the rank logs in {run}; `llmlaunch-logs {job_id}` triages them"))
        seen["state"] = state
        if state == "PENDING":
            reasons.append(reason)
            return f"job {job_id} PENDING ({reason})"
        if state == "RUNNING":
            return f"job {job_id} RUNNING on {nodes}: loading, {run.ready_count()}/{leaders} leaders ready"
        return f"job {job_id} {state}"

    def timeout(_elapsed: float) -> LaunchError:
        return LaunchError((f"job {job_id}", f"not serving after {deadline_s:.0f}s (state {seen['state']})", f"raise serve.ready_timeout_s, or look at the rank logs in {run}; the job is still queued/running: llmlaunch-stop {job_id}"))

    return wait_for_endpoint(run, timeout_s=deadline_s, on_timeout=timeout, check=check, progress=progress, say=say)


def slurm_ready_facts(job_id: str, run: RunDir, reasons: List[str]) -> Dict:
    """What the launching side knows of a Slurm job's start: its Submit and Start times (Start: the allocation),
    the reasons it was PENDING, its nodes. The record's own submission time (llmlaunch's) wins over Slurm's."""
    from launcher.readiness import queue_reasons

    submit, start = job_times(job_id)
    job = run.read_job() or {}
    return {"marks": {"submitted": submit or job.get("submitted"), "allocated": start}, "job_id": job_id,
            "queue_reason": queue_reasons(reasons), "nodes": queue_state(job_id)[2]}


class SlurmScheduler(Scheduler):
    """cluster.scheduler=slurm: submitit submits the rendered sbatch script; the job outlives `llmlaunch`."""

    name = "slurm"
    job_placeholder = "${SLURM_JOB_ID}"

    def dryrun(self, spec: LaunchSpec, run_dir: str) -> Request:
        from launcher.render import sbatch_script

        return Request(self.name, spec, run_dir, sbatch_script(spec, run_dir), title=f"sbatch script ({run_dir}/submission.sh, submitted through submitit)")

    def launch(self, request: Request, leave_running: bool = False) -> Endpoint:
        """Submit and follow the job until rank 0 serves. A job that does not get there is stopped, unless
        `leave_running` (`llmlaunch` itself: its message names llmlaunch-stop for a job still loading)."""
        from launcher.models import resolve_model

        _slurm_env(request.spec.cluster.slurm_conf)
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
        return Endpoint(ep["url"], ep["model"], job.job_id, RunDir(run), spec, ep)

    def serve(self, request: Request) -> int:
        t0 = time.monotonic()
        ep = self.launch(request, leave_running=True)
        url, job_id = ep.url, ep.job_id
        exe = sys.executable
        print(f"job: {job_id}")
        print(f"endpoint: {url}")
        print(f"model: {ep.model}")
        print(f"logs: {ep.run}/{job_id}_<rank>_log.out")
        print(f"stream: {exe} -m launcher.client --url {url} --prompt \"The capital of France is\" --max-tokens 32")
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
        from launcher.render import client_argv, python_for, srun_args

        container = [a for a in srun_args(endpoint.spec) if a.startswith("--container")]
        return client_argv(python_for(endpoint.spec), bench_args, job_id=endpoint.job_id, container_args=container)

    def status(self, job_id: str) -> Tuple[int, str]:
        return status(job_id)

    def stop_job(self, job_id: str) -> Tuple[int, str]:
        return stop(job_id)


# ----------------------------------------------------------------------------- status / stop
def _record(job_id: str) -> Dict:
    f = INDEX_DIR / f"{job_id}.json"
    if not f.exists():
        raise LaunchError((f"job {job_id}", f"not launched by llmlaunch from this account (no {f})", "give a job id that llmlaunch printed"))
    rec = json.loads(f.read_text())
    _slurm_env(rec.get("slurm_conf", ""))
    return rec


# Slurm states in which a task srun reported dead is not why the job ended: it was cancelled, preempted or timed
# out (its ranks killed on purpose), or it is queued again
_NOT_A_DEATH = ("CANCELLED", "PENDING", "REQUEUED", "PREEMPTED", "TIMEOUT")


def job_state(slurm_state: str, reason: str, fails: List[Dict], deaths: Sequence[Tuple[int, str, str]] = ()) -> Tuple[str, str]:
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
    from launcher.triage import task_deaths

    return task_deaths(text for _path, _rank, text in run.log_texts())


def ready_lines(run: RunDir, job: Dict) -> List[str]:
    """llmlaunch-status's time to READY: from the run record, or, when nobody completed it (llmlaunch was gone
    at READY), from what rank 0 wrote."""
    from launcher.readiness import format_breakdown
    from launcher.record import join_record

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
    lines = [f"job: {job_id}", f"state: {state}" + (f" ({reason})" if reason else ""), f"nodes: {nodes or '-'}", f"run dir: {run}"]
    e = run.read_endpoint()
    if e is not None:
        lines += [f"endpoint: {e['url']}", f"model: {e['model']}"]
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
    for r in lost:
        # A lost replica is not a failed job: the front end serves with the others (status stays 0).
        lines.append(describe_lost(r))
    for f in fails:
        lines.append("FAILED " + describe_failure(f))
    if not fails and state == "FAILED" and deaths:
        r, node, what = deaths[0]  # the first srun reported; the others ended with the step
        lines.append(f"FAILED rank {r} on node {node}: srun reports its task {what}; the rank's own process died, so it wrote no failure record")
    if fails or (state == "FAILED" and deaths):
        lines.append(f"triage: llmlaunch-logs {job_id} (every rank's logs in one archive, the root cause first)")
    # 0 only while the job serves: a failed job (and one that ended or has not started) exits 1
    ok = state == "RUNNING" and e is not None
    return (0 if ok else 1), "\n".join(lines)


# The steps a batch job always has; any other is a step its batch script started (the serving srun).
BOOKKEEPING_STEPS = ("batch", "extern", "interactive")
DRAIN_MARGIN_S = 30.0  # after serve.drain_timeout_s: a rank's grace to end its server (drain + 15 s), the teardown step
LOADING_WINDOW_S = 20.0  # a job not serving yet has nothing to drain: its ranks end their servers in seconds, or ignore SIGTERM
DEFAULT_DRAIN_TIMEOUT_S = 30.0  # launcher/schema.py's serve.drain_timeout_s, for a run dir without a readable launch.json


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
    rc, out, _ = _run(["squeue", "-h", "-j", job_id, "-o", "%T"])
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
    rc, out, _ = _run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"]) if state == "RUNNING" else (0, "", "")
    action = stop_action(state, out.split())
    if action == "gone":
        return 0, f"job {job_id} is not in the queue (it ended {queue_state(job_id)[0]}); {where}"
    why = ""
    if action == "drain":
        if drain_s is None:
            # a job draining at its time limit has withdrawn its endpoint but still has requests to finish
            drain_s = drain_window_s(run.read_launch(), serving=run.has_endpoint() or bool(run.walltime_records()))
        rc, _, err = _run(drain_argv(job_id))
        left = _wait_gone(job_id, drain_s) if rc == 0 else _queued(job_id)
        if left == "COMPLETING":  # the batch script has ended the job: Slurm is cleaning up after it
            left = _wait_gone(job_id, timeout_s)
        if not left:
            return 0, f"job {job_id} stopped: its ranks drained and exited, the batch script ended it ({time.monotonic() - t0:.1f}s); {where}"
        if left == "COMPLETING":
            return 1, f"job {job_id} drained, still COMPLETING after {time.monotonic() - t0:.0f}s"
        why = (f"still {left} {drain_s:.0f}s after SIGTERM to its steps (a rank still starting ignores it)" if rc == 0
               else f"`{' '.join(drain_argv(job_id))}` failed: {err.strip()}")
    elif action == "cancel":
        why = "its batch script had not started the serving step yet" if state == "RUNNING" else f"it was {state}, nothing to drain"
    if action != "wait":
        rc, _, err = _run(cancel_argv(job_id))
        if rc != 0 and _queued(job_id):
            return 1, f"job {job_id}: {why}; scancel {job_id} failed: {err.strip()}"
    left = _wait_gone(job_id, timeout_s)
    cancelled = f"{why}: cancelled (scancel), Slurm records it CANCELLED" if why else "it was already ending"
    if left:
        return 1, f"job {job_id} {cancelled}; still in the queue (state {left}) after {time.monotonic() - t0:.0f}s"
    return 0, f"job {job_id} stopped: {cancelled} ({time.monotonic() - t0:.1f}s); {where}"


def job_scheduler(job_id: str) -> Scheduler:
    """The backend that launched a recorded job (records without the field are Slurm's)."""
    from launcher import scheduler

    return scheduler.get(_record(job_id).get("scheduler", "slurm"))


def _cli(action: str, argv: Optional[List[str]]) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print(f"usage: {Path(sys.argv[0]).name} <job id>", file=sys.stderr)
        raise SystemExit(2)
    try:
        backend = job_scheduler(argv[0])
        code, text = getattr(backend, action)(argv[0])
    except LaunchError as e:
        print(e.render(), file=sys.stderr)
        raise SystemExit(2)
    print(text)
    raise SystemExit(code)


def status_main(argv: Optional[List[str]] = None) -> None:
    """llmlaunch-status <job>: state, endpoint, ready leaders, lost replicas, failed ranks with their log tails."""
    _cli("status", argv)


def stop_main(argv: Optional[List[str]] = None) -> None:
    """llmlaunch-stop <job>: drain and end the job, wait until it is gone."""
    _cli("stop_job", argv)
