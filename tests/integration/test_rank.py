"""One rank as srun starts it (`python -m launcher.rank RUN_DIR`), on this machine without Slurm: the allocation a
requeued job runs in names the drain record the batch script looks for, so a job requeued once requeues again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from launcher.cli import plan
from launcher.handoff.rank_env import local_launcher_env
from launcher.models import resolve_model
from launcher.rundir import RunDir

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("restart_count,record", [("1", "walltime1.json"), ("", "walltime0.json")])
def test_a_rank_drained_at_the_time_limit_records_its_own_allocation(tmp_path, tiny_model_dir, restart_count, record):
    """SLURM_RESTART_COUNT is the allocation's number once Slurm requeued the job (unset in the first): rank 0's drain
    record at the time limit carries it, `walltime<N>.json`, which render.teardown_lines' `scontrol requeue` test
    reads. A record of the first allocation's name in a second allocation would end the job instead of requeueing it."""
    from launcher.ports import free_port

    ports = [f"serve.{k}={free_port()}" for k in ("grpc_port", "http_port", "metrics_port", "openai_port")]
    _, spec = plan(["model=tiny", *ports, "serve.ready_timeout_s=300", "serve.drain_timeout_s=10"])
    spec = resolve_model(spec, lambda m: None)
    run = RunDir(tmp_path / "run").write_spec(spec)
    env = {**os.environ, **local_launcher_env(0, 1, 0, "4242").to_environ()}
    env.pop("SLURM_RESTART_COUNT", None)
    if restart_count:
        env["SLURM_RESTART_COUNT"] = restart_count
    log = open(tmp_path / "rank0.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher.rank", str(run)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not run.has_endpoint():
            assert proc.poll() is None, (tmp_path / "rank0.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "rank0.log").read_text()
            time.sleep(0.5)
        proc.send_signal(signal.SIGUSR2)  # Slurm's signal serve.walltime_signal_s before the time limit
        assert proc.wait(timeout=120) == 0, (tmp_path / "rank0.log").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    assert [p.name for p in run.path.glob("walltime*.json")] == [record]
    drained = json.loads((run.path / record).read_text())
    assert drained["attempt"] == int(restart_count or 0) and drained["job_id"] == "4242"
    assert not run.has_endpoint()  # nothing new goes to the drained endpoint
    text = (tmp_path / "rank0.log").read_text()
    assert "draining at the time limit" in text and "stopped (signal 12), status 0" in text, text
