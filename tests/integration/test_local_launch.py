"""`llmlaunch` with one rank on this machine (cluster=local, what a new user runs first) takes the rank path every
launch takes (`python -m launcher.rank`, launcher/rank/rank.py): its server is handed the rank's variables, its
endpoint.json is the Slurm one's, the user sees the rank's progress, and it ends the three ways it should: Ctrl-C
while serving or while loading (exit 0, nothing left) and a server that dies (its log, exit non-zero)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from launcher.handoff.endpoint import RankEntry
from launcher.handoff.rank_env import RankEnv
from tests.integration.test_frontend import LocalLaunch
from tests.integration.test_slurm_launch import server_pid

pytestmark = pytest.mark.timeout(600)


def said(job: LocalLaunch) -> str:
    return "".join(job.err)


def wait_said(job: LocalLaunch, text: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while text not in said(job):
        assert job.proc.poll() is None, f"llmlaunch ended before saying {text!r}:\n" + job.tail()
        assert time.monotonic() < deadline, f"llmlaunch did not say {text!r}:\n" + job.tail()
        time.sleep(0.2)


def nothing_of(run: Path) -> None:
    """No rank, no tritonserver (their argv names the run dir) within the drain deadline."""
    deadline = time.monotonic() + 60
    while str(run) in subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline, f"processes of {run} left"
        time.sleep(0.5)


def test_one_rank_serves_through_the_rank_path_and_ctrl_c_drains_it(tmp_path, tiny_model_dir):
    from launcher.client.request import Generation
    from launcher.client.stream import generate

    job = LocalLaunch(tmp_path, "replicas=1")
    try:
        ep = job.wait_endpoint()
        # endpoint.json as a Slurm job's rank 0 writes it
        assert job.url == ep.url == f"grpc://127.0.0.1:{job.grpc_port}" and ep.grpc_port == job.grpc_port
        assert ep.metrics_url == f"http://127.0.0.1:{job.metrics_port}/metrics" and len(ep.token) == 16
        assert ep.ranks == (RankEntry(0, "127.0.0.1"),) and ep.frontend is None and ep.http_port
        assert [(r.replica, r.grpc_port, r.metrics_url) for r in ep.replicas] == [(0, job.grpc_port, ep.metrics_url)]
        # the server was handed the rank's place and model copy (launcher.rank.topology.rank_environment)
        environ = Path(f"/proc/{server_pid(ep.job_id, 0)}/environ").read_bytes().decode().split("\0")
        env = RankEnv.from_environ(dict(v.split("=", 1) for v in environ if "=" in v))
        assert (env.rank, env.world_size, env.replica, env.group_rank, env.group_size) == (0, 1, 0, 0, 1)
        assert env.job_id == ep.job_id and env.leader_addr == "127.0.0.1" and env.dist_port > 0
        assert env.run_dir == str(job.run) and env.root and env.python
        # what the user saw while it loaded: the rank's own lines, as they came
        assert "llmlaunch: started 1 rank (" in said(job) and f"log: {job.run}/logs/rank0.log" in said(job)
        assert "llmlaunch: leader of replica 0, gpus" in said(job) and "llmlaunch: READY in " in said(job)
        rec = generate(ep.url, ep.model, Generation("The capital of France is", max_tokens=4, ignore_eos=True))
        assert not rec.error and rec.output_tokens == 4, rec.error
        job.proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert job.proc.wait(90) == 0, job.tail()
        assert "llmlaunch: stopped (signal 15), status 0\n" in said(job), job.tail()  # the rank drained its server
    finally:
        job.kill()
    job.assert_nothing_left(ep)


def test_ctrl_c_while_the_model_loads_stops_it_and_exits_0(tmp_path, tiny_model_dir):
    job = LocalLaunch(tmp_path, "replicas=1")
    try:
        wait_said(job, "llmlaunch: leader of replica 0")  # its tritonserver started
        job.proc.send_signal(signal.SIGINT)
        assert job.proc.wait(90) == 0, job.tail()
    finally:
        job.kill()
    (run,) = [p.parent for p in tmp_path.rglob("launch.json")]
    assert "SIGINT: draining in-flight requests and stopping" in said(job)
    assert "FAILED" not in said(job) and not (run / "endpoint.json").exists(), job.tail()
    nothing_of(run)


def test_a_server_that_dies_shows_its_log_and_exits_non_zero(tmp_path, tiny_model_dir):
    """cluster.tritonserver points at a script that fails as a server failing to load its model does."""
    wrapper = tmp_path / "tritonserver"
    wrapper.write_text(
        "#!/bin/bash\n"
        "echo \"E1202 01:02:03.456789 $$ model_lifecycle.cc:654] failed to load 'hf_model': staged for the test\"\n"
        "exit 1\n"
    )
    wrapper.chmod(0o755)
    job = LocalLaunch(tmp_path, "replicas=1", f"cluster.tritonserver={wrapper}")
    try:
        assert job.proc.wait(120) == 1, job.tail()
    finally:
        job.kill()
    (run,) = [p.parent for p in tmp_path.rglob("launch.json")]
    text = said(job)
    assert f"llmlaunch: rank 0 exited with status 1. Its log, {run}/logs/rank0.log:" in text, job.tail()
    assert "failed to load 'hf_model': staged for the test" in text and "stopping the others" not in text
    failure = json.loads((run / "failure_rank0.json").read_text())
    assert failure["rank"] == 0 and failure["reason"] == "server exited with status 1 unasked", failure
    assert "llmlaunch: FAILED: tritonserver exited with status 1 while starting" in text  # what the rank said
    nothing_of(run)
