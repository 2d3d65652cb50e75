"""llmlaunch-logs on the local Slurm cluster: a rank killed, a bad engine path, a port taken, a rank that never
reaches the rendezvous. Each time the root cause comes first, naming its rank and node, and the archive holds every
rank's log."""

import os
import re
import signal
import subprocess
import sys
import tarfile
import time

import pytest

from launcher.cli import plan
from launcher.errors import LaunchError
from launcher.localslurm.conf import Spec
from launcher.rundir import RunDir
from tests.integration.test_slurm_launch import launch, server_pid
from tests.slurm_fixture import NOT_ROOT_REASON

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(os.geteuid() != 0, reason=NOT_ROOT_REASON),
    pytest.mark.timeout(600),
]


def logs_cli(arg):
    """`llmlaunch-logs JOB_OR_RUN_DIR` (the console script's entry point)."""
    r = subprocess.run([sys.executable, "-m", "launcher.logs", str(arg)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def archived(text):
    path = re.search(r"every rank's logs and records: (\S+)", text).group(1)
    with tarfile.open(path) as tar:
        return sorted(n.split("/", 1)[1] for n in tar.getnames())


def failed_launch(tmp_path, *overrides):
    """Submit and follow a job that fails while loading: the LaunchError's text (the triage included)."""
    from launcher.models import resolve_model
    from launcher.schedulers import slurm

    cfg, spec = plan(
        [
            "cluster=local_slurm",
            "engine=hf",
            "model=tiny",
            f"cluster.jobs_dir={tmp_path}",
            "serve.ready_timeout_s=240",
            *overrides,
        ]
    )
    spec = resolve_model(spec)
    job, run = slurm.submit(spec, str(tmp_path / f"run{time.monotonic_ns()}"))
    with pytest.raises(LaunchError) as e:
        slurm.follow(job.job_id, run, spec, 300)
    return job.job_id, RunDir(run), e.value.render()


def test_a_killed_rank_is_the_root_cause_and_the_rest_its_consequences(local_slurm, tmp_path):
    from launcher.schedulers import slurm_jobs

    spec, job_id, run, ep = launch(tmp_path, "tp=2", "nodes=2")
    os.kill(server_pid(job_id, 1), signal.SIGKILL)
    deadline = time.monotonic() + 60
    while slurm_jobs.queue_state(job_id)[0] in ("RUNNING", "COMPLETING", "PENDING") and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(2)  # the last lines of the ranks reach their logs
    text = logs_cli(job_id)
    first = text.splitlines()[0]
    assert first.startswith("root cause: rank 1 on node2 at ") and f"{job_id}_1_log.out line" in first, text
    assert "server exited with status -9 unasked: failing the job" in text.split("consequences")[0], text
    assert "consequences" in text and "srun: error:" in text.split("consequences")[1], text
    assert {f"{job_id}_0_log.out", f"{job_id}_1_log.out", "failure_rank1.json", "launch.json", "job.json"} <= set(
        archived(text)
    )


def test_a_bad_engine_path_names_the_leader_and_the_load_error(local_slurm, tmp_path):
    job_id, run, text = failed_launch(tmp_path, "model.path=/nonexistent/tiny-model")
    assert (
        "root cause: rank 0 on node1 at " in text
        and "/nonexistent/tiny-model" in text.split("root cause:")[1].split("consequences")[0]
    ), text
    assert "lines around it in" in text and f"llmlaunch-logs {job_id}" in text
    assert logs_cli(run.path).startswith("root cause: rank 0 on node1 at ")


def test_a_rank_that_never_reaches_the_rendezvous_is_named(local_slurm, tmp_path):
    """Rank 1's interpreter never starts (its node hangs before python): the others fail at the rendezvous's
    deadline naming it, without waiting for serve.ready_timeout_s."""
    wrapper = tmp_path / "python-rank1-hangs"
    wrapper.write_text(f'#!/bin/sh\nif [ "$SLURM_PROCID" = 1 ]; then sleep 300; fi\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    t0 = time.monotonic()
    job_id, run, text = failed_launch(
        tmp_path, "replicas=2", "nodes=2", f"cluster.python={wrapper}", "serve.rendezvous_timeout_s=20"
    )
    assert time.monotonic() - t0 < 120, text
    assert re.search(
        r"root cause: rank 0 on node1 at .*\n.*FAILED: rendezvous: ranks \[1\] did not arrive within 20s", text
    ), text
    assert run.failures()[0]["missing_ranks"] == [1]


# Binds and listens on each port read from stdin (one a line), holding them until killed; says "ready" first.
HOLDER = """
import socket, sys
held = []
print("ready", flush=True)
for line in sys.stdin:
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", int(line)))
        s.listen()
        held.append(s)
    except OSError as e:
        print(f"port {line.strip()}: {e}", file=sys.stderr, flush=True)
"""


def test_a_port_taken_while_the_server_loads_is_the_root_cause(local_slurm, tmp_path):
    """Something on node1 takes each gRPC port rank 0 picked before its server binds it: after its retries the
    rank fails, and the root cause is the first bind that failed."""
    from launcher.models import resolve_model
    from launcher.schedulers import slurm

    cfg, spec = plan(
        [
            "cluster=local_slurm",
            "engine=hf",
            "model=tiny",
            f"cluster.jobs_dir={tmp_path}",
            "serve.ready_timeout_s=240",
            "cluster.extra_sbatch=['--nodelist=node1']",
        ]
    )
    spec = resolve_model(spec)
    # One process in node1's network namespace, started before the job, binds each port it is sent at once: a Python
    # started per port could come up after the server bound it (the server binds a few seconds after its command
    # line is logged; a busy 2-core machine starts an interpreter in about as long).
    holder = subprocess.Popen(
        ["ip", "netns", "exec", Spec.netns("node1"), sys.executable, "-u", "-c", HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "ready"
    job, run = slurm.submit(spec, str(tmp_path / f"run{time.monotonic_ns()}"))
    log = RunDir(run).slurm_rank_log(job.job_id, 0)
    taken = set()
    try:
        deadline = time.monotonic() + 240
        while not RunDir(run).failures() and time.monotonic() < deadline:
            text = log.read_text(errors="replace") if log.exists() else ""
            for port in re.findall(r"--grpc-port=(\d+)", text):
                if port not in taken:
                    taken.add(port)
                    holder.stdin.write(f"{port}\n")
                    holder.stdin.flush()
            time.sleep(0.05)
        assert RunDir(run).failures(), f"rank 0 never failed; its log ends:\n{log.read_text()[-3000:]}"
    finally:
        subprocess.run(["scancel", job.job_id])
        holder.kill()
    time.sleep(2)
    text = logs_cli(run)
    root = text.split("consequences")[0]
    assert text.startswith("root cause: rank 0 on node1 at ") and "already in use" in root.lower(), text
