"""Starting a service (serve.router=host|job) from `llmlaunch`, and the commands that act on one later:
llmlaunch-status / llmlaunch-stop (through launcher/schedulers/cli.py) and llmlaunch-scale.

Render first, run second: `router_argv` and `router_script` are the text of what runs the router (the dry run prints
them with `service_text`); `start` writes the run dir, starts the router (a process here, or a Slurm job) and waits
until the service serves."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys
import time
from typing import List, Optional, Tuple

from launcher import jobindex
from launcher.errors import LaunchError
from launcher.handoff.registration import Refused, call
from launcher.render import setup_lines
from launcher.rundir import wait_for_endpoint
from launcher.scale_signals import SIGNALS, bounds
from launcher.service.state import ServiceDir
from launcher.spec import LaunchSpec


def say(msg: str) -> None:
    print(f"llmlaunch: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ what runs (pure)
def router_argv(spec: LaunchSpec, run_dir: str) -> List[str]:
    return [spec.python, "-u", "-m", "launcher.service", run_dir]


def router_script(spec: LaunchSpec, run_dir: str) -> str:
    """serve.router=job: the router's own batch script (one task, CPUs only), its log the router's."""
    c, q = spec.cluster, shlex.quote
    lines = ["#!/bin/bash", f"#SBATCH --job-name={spec.job_name}-router", "#SBATCH --nodes=1", "#SBATCH --ntasks=1"]
    partition = c.router_partition or c.partition
    lines += [f"#SBATCH --partition={partition}"] if partition else []
    lines += [f"#SBATCH --account={c.account}"] if c.account else []
    lines += [f"#SBATCH --time={c.router_time}"] if c.router_time else []
    lines += [f"#SBATCH --output={run_dir}/service/router.log", "#SBATCH --open-mode=append"]
    lines += setup_lines(spec, run_dir)
    lines.append("exec " + " ".join(q(a) for a in router_argv(spec, run_dir)))
    return "\n".join(lines) + "\n"


def service_text(spec: LaunchSpec, run_dir: str) -> str:
    """The dry run's part for a service: where the router runs, what each replica job is, the scaling rule."""
    serve, auto = spec.serve, spec.serve.autoscale
    out = [f"router: serve.router={serve.router}"]
    if serve.router == "host":
        out.append(
            f"  a process on this host: {' '.join(router_argv(spec, run_dir))} (log {run_dir}/service/router.log)"
        )
    else:
        out += ["  its own Slurm job (CPUs only), this batch script:", router_script(spec, run_dir).rstrip()]
    out += [
        f"  stable endpoint: gRPC {spec.host}:{serve.grpc_port}, OpenAI :{serve.openai_port}/v1, metrics "
        f":{serve.metrics_port}; control API (registration, llmlaunch-scale, /metrics) :{serve.control_port}",
        f"replica jobs: {spec.service_replicas} to start with, each the job below (replicas=1, nodes={spec.nodes}, "
        f"tp={spec.tp} pp={spec.pp}); each registers with the router when it serves (the service's token)",
        f"handover: each job's successor is submitted to serve serve.handover_margin_s={serve.handover_margin_s:g}s "
        f"before the job's time-limit signal (cluster.time={spec.cluster.time} less serve.walltime_signal_s="
        f"{serve.walltime_signal_s}), by the measured queue wait and time to READY; the old job drains once the "
        f"successor serves",
        f"replacement: a replica job that fails is replaced, serve.max_replacements={serve.max_replacements} in all",
    ]
    if auto.max_replicas:
        sig = SIGNALS[auto.signal]
        up, down = bounds(auto.signal, auto.up_at, auto.down_at)
        rule = (
            f"up above {up:g} for {auto.window_s:g}s (to load / {up:g}), down below {down:g} with one fewer for "
            f"{auto.window_s:g}s"
            if sig.shared
            else f"one up when above {up:g}, one down when below {down:g}"
        )
        out.append(
            f"scaling: {auto.min_replicas}..{auto.max_replicas} replica jobs by {auto.signal} ({sig.unit}): {rule}; "
            f"cool-downs {auto.up_cooldown_s:g}s up, {auto.down_cooldown_s:g}s down; a job PENDING "
            f"{auto.pending_deadline_s:g}s is cancelled"
        )
    else:
        out.append("scaling: by hand (llmlaunch-scale SERVICE replicas=N); serve.autoscale.max_replicas=0")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------ starting one
def start(spec: LaunchSpec, run_dir: str, record: Optional[dict]) -> int:
    """Write the service's run dir, start its router, wait until a replica serves; print what the user needs."""
    from launcher.models import resolve_model
    from launcher.schedulers.slurm_jobs import slurm_env

    slurm_env(spec.cluster.slurm_conf)
    spec = resolve_model(spec, say)
    t0 = time.monotonic()
    sdir = ServiceDir(run_dir)
    sdir.run.write_spec(spec)
    if record is not None:
        sdir.run.write_record(record)
    sdir.make_token()
    service_id = f"svc-{secrets.token_hex(3)}"
    sdir.write_json(sdir.service_file, {"id": service_id, "router": spec.serve.router, "created": time.time()})
    if spec.serve.router == "host":
        _check_ports(spec)
        with open(sdir.log, "ab") as out:
            proc = subprocess.Popen(
                router_argv(spec, run_dir), stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=_env()
            )
        where = f"router pid {proc.pid} on this host"
    else:
        script = sdir.dir / "router.sbatch"
        script.write_text(router_script(spec, run_dir))
        done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, env=_env())
        if done.returncode:
            raise LaunchError(
                (
                    f"serve.router=job (partition {spec.cluster.router_partition or spec.cluster.partition or 'default'})",
                    f"Slurm refused the router's job: {done.stderr.strip()}",
                    "fix cluster.router_partition / cluster.router_time; no replica job was submitted",
                )
            )
        router_job = done.stdout.strip().split(";")[0]
        sdir.write_json(sdir.service_file, {**sdir.service(), "router_job": router_job})
        where = f"router job {router_job}"
    jobindex.add(
        {
            "job_id": service_id,
            "run_dir": run_dir,
            "kind": "service",
            "scheduler": "slurm",
            "slurm_conf": spec.cluster.slurm_conf,
            "submitted": time.time(),
            "model": spec.model_name,
        }
    )
    say(f"service {service_id}: {where}; {spec.service_replicas} replica job(s); run dir {run_dir}")
    ep = wait_for_endpoint(
        sdir.run,
        timeout_s=float(spec.serve.ready_timeout_s) + 600,
        on_timeout=lambda s: LaunchError(
            (
                f"service {service_id}",
                f"no replica served after {s:.0f}s",
                f"read {sdir.log}; llmlaunch-status {service_id}; llmlaunch-stop {service_id}",
            )
        ),
        check=lambda: _check_router(sdir, service_id),
        progress=lambda: _progress(sdir),
        say=say,
    )
    print(f"service: {service_id}")
    print(f"endpoint: {ep.url}")
    print(f"openai: {ep.openai_url}")
    print(f"model: {ep.model}")
    print(f"router log: {sdir.log}")
    print(f"status: llmlaunch-status {service_id}")
    print(f"scale: llmlaunch-scale {service_id} replicas=N")
    print(f"stop: llmlaunch-stop {service_id}")
    say(f"READY {time.monotonic() - t0:.1f}s after the start")
    return 0


def _env() -> dict:
    from launcher.paths import PACKAGE_ROOT

    env = dict(os.environ)
    env["PYTHONPATH"] = str(PACKAGE_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _check_ports(spec: LaunchSpec) -> None:
    from launcher.ports import in_use_text, port_free

    serve = spec.serve
    for key in ("grpc_port", "metrics_port", "openai_port", "control_port"):
        port = int(getattr(serve, key))
        if not port_free(spec.host, port):
            raise LaunchError(
                (f"serve.{key}={port}", in_use_text(spec.host, port), f"give serve.{key} a free port; nothing started")
            )


def _check_router(sdir: ServiceDir, service_id: str) -> None:
    """The router is still there (a process here, or its job): else the launch failed, with its log's end."""
    from launcher.logtext import log_excerpt
    from launcher.schedulers.slurm_jobs import queue_state

    router = sdir.router() or {}
    pid, job = router.get("pid"), sdir.service().get("router_job")
    gone = pid and router.get("host") == os.uname().nodename and not _alive(pid)
    if job and queue_state(job)[0] not in ("PENDING", "RUNNING", "CONFIGURING"):
        gone = f"its job {job} is {queue_state(job)[0]}"
    if gone:
        raise LaunchError(
            (f"service {service_id}", f"its router exited:\n{log_excerpt(sdir.log, 20)}", f"read {sdir.log}")
        )
    for d in sdir.read_decisions(last=5):
        if d.get("action") == "not_replaced":
            raise LaunchError(
                (f"service {service_id}", d["reason"], f"read the replica jobs' logs under {sdir.path}/replicas")
            )


def _alive(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _progress(sdir: ServiceDir) -> str:
    st = sdir.status()
    if st is None:
        return "router starting"
    jobs = ", ".join(f"{j['name']} {j.get('job_id', '')} {j['state']}" for j in st["jobs"]) or "none yet"
    return f"replica jobs: {jobs}"


# ------------------------------------------------------------------------------------------ acting on one
def status(service_id: str) -> Tuple[int, str]:
    rec = jobindex.find(service_id)
    sdir = ServiceDir(rec["run_dir"])
    st, router, ep = sdir.status(), sdir.router() or {}, sdir.run.read_endpoint()
    lines = [
        f"service {service_id}: router {router.get('control_url', '?')} (pid {router.get('pid', '?')}"
        + (f", job {router['job_id']}" if router.get("job_id") else "")
        + f"); run dir {sdir.path}"
    ]
    if st is None:
        return 1, "\n".join(lines + ["no status yet: the router has not started (see " + str(sdir.log) + ")"])
    age = time.time() - st["time"]
    state = "SERVING" if ep is not None else "STOPPED" if st.get("stopping") else "STARTING"
    if age > 10:
        state += f" (the router's last word was {age:.0f}s ago: it may be gone; {sdir.log})"
    lines.append(
        f"state: {state}; replicas: {st['serving']} serving, target {st['target']}; "
        f"in flight {st.get('in_flight', 0):g}; replacements {st['replacements']}"
    )
    if ep is not None:
        lines.append(f"endpoint: {ep.url}  openai: {ep.openai_url}  metrics: {ep.metrics_url}")
    if st.get("autoscale"):
        a = st["autoscale"]
        lines.append(
            f"autoscale: {a['min']}..{a['max']} by {a['signal']}, up above {a['up_at']:g}, down below "
            f"{a['down_at']:g}, window {a['window_s']:g}s"
            + (f"; now {a['value']:.2f}" if a.get("value") is not None else "")
        )
    lines.append("replica jobs:")
    for j in st["jobs"]:
        if j["state"] == "ended" and j.get("asked_to_end"):
            continue
        end = f", ends {time.strftime('%H:%M:%S', time.localtime(j['end_time']))}" if j.get("end_time") else ""
        slot = f", slot {j['slot']}" if "slot" in j else ""
        lines.append(
            f"  {j['name']} job {j['job_id']}: {j['state']}{slot}{end}, in flight {j.get('in_flight', 0)}"
            f" ({j['why']})" + (f"; {j['ended_as']}" if j.get("ended_as") else "")
        )
    lines.append("last decisions:")
    for d in sdir.read_decisions(last=8):
        lines.append(f"  {time.strftime('%H:%M:%S', time.localtime(d['time']))} {d['action']}: {d['reason']}")
    return 0, "\n".join(lines)


def stop(service_id: str, timeout_s: float = 180.0) -> Tuple[int, str]:
    """SIGTERM to the router: it drains every replica, stops their jobs and exits."""
    from launcher.schedulers.slurm_jobs import run_quiet, slurm_env

    rec = jobindex.find(service_id)
    slurm_env(rec.get("slurm_conf", ""))
    sdir = ServiceDir(rec["run_dir"])
    router = sdir.router() or {}
    t0 = time.monotonic()
    if router.get("job_id"):
        run_quiet(["scancel", "--signal=TERM", "--batch", router["job_id"]])
    elif router.get("pid") and _alive(router["pid"]):
        os.kill(int(router["pid"]), 15)
    else:
        return 0, f"service {service_id}: its router is not running; run dir {sdir.path}"
    while time.monotonic() - t0 < timeout_s:
        pid = router.get("pid")
        if not router.get("job_id") and not _alive(pid):
            return 0, f"service {service_id} stopped: replicas drained, their jobs ended ({time.monotonic() - t0:.1f}s)"
        if router.get("job_id") and not run_quiet(["squeue", "-h", "-j", router["job_id"]])[1].strip():
            return 0, f"service {service_id} stopped ({time.monotonic() - t0:.1f}s)"
        time.sleep(0.5)
    return 1, f"service {service_id}: the router is still stopping after {timeout_s:.0f}s; {sdir.log}"


def scale_main(argv: Optional[List[str]] = None) -> None:
    """llmlaunch-scale SERVICE replicas=N: the service's replica jobs, by hand."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or not argv[1].startswith("replicas="):
        print("usage: llmlaunch-scale <service id> replicas=N", file=sys.stderr)
        raise SystemExit(2)
    try:
        rec = jobindex.find(argv[0])
        if rec.get("kind") != "service":
            raise LaunchError(
                (
                    f"job {argv[0]}",
                    "not a service (serve.router=host|job): its replicas are fixed",
                    "give a service id (svc-...) that llmlaunch printed",
                )
            )
        sdir = ServiceDir(rec["run_dir"])
        router = sdir.router() or {}
        answer = call(
            router["control_url"],
            sdir.token_file.read_text().strip(),
            "/scale",
            {"replicas": argv[1].partition("=")[2]},
        )
    except LaunchError as e:
        print(e.render(), file=sys.stderr)
        raise SystemExit(2) from None
    except Refused as e:
        print(f"llmlaunch-scale: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except (OSError, KeyError) as e:
        print(
            f"llmlaunch-scale: the router of {argv[0]} cannot be reached ({e}); llmlaunch-status {argv[0]}",
            file=sys.stderr,
        )
        raise SystemExit(1) from None
    print(json.dumps(answer))
