"""The rule for a rank whose child ends unasked (launcher/rank/ decide_exit), and how the loss of a
replica is recorded and shown, without Slurm. The real thing on the local Slurm cluster:
tests/integration/test_slurm_launch.py::test_losing_replica_1_keeps_the_job_serving_on_replica_0."""

import json
import signal
import time

import pytest

from launcher.rank.supervise import Outcome, decide_exit
from launcher.rundir import RunDir, record_once
from tests.endpoints import endpoint_record


def outcome(ended, replicas=2, replica=1, serving=True, code=-9, lost=(), frontend="none"):
    return decide_exit(
        ended, replicas=replicas, replica=replica, serving=serving, code=code, lost=lost, frontend=frontend
    )


FAIL, LOSE_AND_EXIT, LOSE_KEEP_FRONTEND = (False, True, True), (True, False, True), (True, False, False)


@pytest.mark.parametrize(
    "case,kwargs,expect,status",
    [
        # one copy: fail fast, as always (exit status: the server's, or 1 when it exited 0)
        ("replicas=1, server killed", dict(replicas=1, replica=0, code=-9), FAIL, -9),
        ("replicas=1, server exited 0 unasked", dict(replicas=1, replica=0, code=0), FAIL, 1),
        ("replicas=1, rank 0 (no front end then)", dict(replicas=1, replica=0, code=3), FAIL, 3),
        # start-up: a job that never served fails whole, replicas or not
        ("replicas=2, before READY", dict(serving=False), FAIL, -9),
        ("replicas=2, rank 0 before READY", dict(replica=0, serving=False, frontend="running"), FAIL, -9),
        # serving: the replica is lost, the job goes on
        ("replicas=2, leader of replica 1", dict(), LOSE_AND_EXIT, 0),
        (
            "replicas=4, a worker of replica 2 after replica 1 was lost",
            dict(replicas=4, replica=2, lost=(1,)),
            LOSE_AND_EXIT,
            0,
        ),
        (
            "replicas=2, rank 0's own server: the front end stays",
            dict(replica=0, frontend="running"),
            LOSE_KEEP_FRONTEND,
            0,
        ),
        # rank 0 whose front end is gone too: nothing serves the endpoint, the job fails
        ("replicas=2, rank 0 whose front end exited as well", dict(replica=0, frontend="exited"), FAIL, -9),
        # the last replica: the job fails (and the replica is recorded lost too)
        ("replicas=2, replica 1 after replica 0", dict(lost=(0,)), (True, True, True), -9),
        ("replicas=2, rank 0 after replica 1", dict(replica=0, lost=(1,), frontend="running"), (True, True, True), -9),
        ("replicas=3, all three", dict(replicas=3, replica=2, lost=(0, 1), code=0), (True, True, True), 1),
    ],
)
def test_server_ended(case, kwargs, expect, status):
    out = outcome("server", **kwargs)
    assert (out.replica_lost, out.failure, out.exits) == expect, case
    assert out.status == status, case


def test_a_rank_told_by_its_replica_exits_0_with_the_record():
    # a worker whose leader died (or a leader whose worker died): same as its own server dying
    out = outcome("replica", replicas=2, replica=1, code=-signal.SIGTERM)
    assert out == Outcome(True, False, True, 0, out.reason) and "replica 1 lost" in out.reason
    # rank 0 serving the front end alone, when the others are gone too: no replica left
    out = outcome("replica", replicas=2, replica=0, code=None, lost=(0, 1))
    assert out.failure and out.status == 1 and out.reason == "no replica is left (replicas [0, 1] lost)"


@pytest.mark.parametrize("replicas,serving", [(1, True), (2, True), (2, False)])
def test_the_front_end_dying_always_fails_the_job(replicas, serving):
    out = outcome("frontend", replicas=replicas, replica=0, serving=serving, code=-9)
    assert (out.replica_lost, out.failure, out.exits, out.status) == (False, True, True, -9)
    assert out.reason == "front end exited with status -9 unasked"


@pytest.mark.parametrize("replicas,serving", [(1, True), (2, True), (2, False)])
def test_the_openai_api_dying_fails_the_job_naming_it(replicas, serving):
    out = outcome("api", replicas=replicas, replica=0, serving=serving, code=-9)
    assert (out.replica_lost, out.failure, out.exits, out.status) == (False, True, True, -9)
    assert out.reason == "OpenAI API exited with status -9 unasked"


def test_record_once_writes_one_record_per_replica(tmp_path):
    path = tmp_path / "replica_lost1.json"
    assert record_once(path, {"rank": 1}) is True
    assert record_once(path, {"rank": 3}) is False
    assert json.loads(path.read_text()) == {"rank": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["replica_lost1.json"]  # no temporary file left


def test_job_serving_only_for_this_runs_endpoint(tmp_path):
    """endpoint.json counts only when it carries this rendezvous's token: not an earlier run's (a requeued job's
    directory), nor for a rank that has none; a file that is no record of this llmlaunch's is refused."""
    from launcher.errors import LaunchError

    run = RunDir(tmp_path)
    assert not run.serving("5f3a")  # no endpoint.json yet
    run.write_endpoint(endpoint_record(token="77c1"))
    assert not run.serving("5f3a")  # an earlier run's
    run.write_endpoint(endpoint_record(token="5f3a"))
    assert run.serving("5f3a") and not run.serving("")
    doc = json.loads(run.endpoint_path.read_text())
    del doc["token"]
    run.endpoint_path.write_text(json.dumps(doc))
    with pytest.raises(LaunchError, match=r"missing fields \['token'\]"):
        run.serving("5f3a")


def test_status_shows_the_lost_replica_and_the_job_still_serving(tmp_path, monkeypatch):
    from launcher.schedulers import slurm_jobs as slurm

    (tmp_path / "launch.json").write_text(json.dumps({"replicas": 2}))
    RunDir(tmp_path).write_endpoint(endpoint_record())
    t = time.mktime((2030, 1, 2, 3, 4, 5, 0, 0, -1))
    (tmp_path / "replica_lost1.json").write_text(
        json.dumps(
            {
                "replica": 1,
                "ranks": [1],
                "rank": 1,
                "host": "node2",
                "node": 1,
                "time": t,
                "log": "/run/7_1_log.out",
                "reason": "the server of rank 1 (leader) exited with status -9 (SIGKILL) unasked",
            }
        )
    )
    monkeypatch.setattr(slurm, "_record", lambda job_id: {"run_dir": str(tmp_path)})
    monkeypatch.setattr(slurm, "queue_state", lambda job_id: ("RUNNING", "None", "node[1-2]"))
    code, text = slurm.status("7")
    assert code == 0, text
    assert "state: RUNNING" in text and "replicas: 1 of 2 serving" in text
    assert (
        "replica 1 lost at 2030-01-02 03:04:05 on node2: the server of rank 1 (leader) exited with status -9 (SIGKILL) unasked"
        in text
    )


def test_srun_waits_for_every_task_only_with_replicas():
    """A lost replica's ranks exit 0 early: with replicas > 1 srun must not end the others after a
    site's WaitTime (--wait=0); one copy keeps Slurm's default."""
    from launcher.cli import plan
    from launcher.render import srun_args

    _, one = plan(["cluster=local_slurm"])
    _, two = plan(["cluster=local_slurm", "replicas=2", "nodes=2"])
    assert "--wait=0" not in srun_args(one) and "--kill-on-bad-exit=1" in srun_args(one)
    assert "--wait=0" in srun_args(two) and "--kill-on-bad-exit=1" in srun_args(two)


def test_status_of_an_ended_job_does_not_claim_replicas_serve(tmp_path, monkeypatch):
    from launcher.schedulers import slurm_jobs as slurm

    (tmp_path / "launch.json").write_text(json.dumps({"replicas": 2}))
    RunDir(tmp_path).write_endpoint(endpoint_record())
    for r in (0, 1):
        (tmp_path / f"replica_lost{r}.json").write_text(
            json.dumps({"replica": r, "ranks": [r], "host": f"node{r + 1}", "time": 0, "log": "l", "reason": "killed"})
        )
    (tmp_path / "failure_rank1.json").write_text(
        json.dumps(
            {
                "rank": 1,
                "node": 1,
                "host": "node2",
                "exit_code": -9,
                "log": "l",
                "log_tail": "",
                "reason": "no replica is left (replicas [0, 1] lost)",
            }
        )
    )
    monkeypatch.setattr(slurm, "_record", lambda job_id: {"run_dir": str(tmp_path)})
    monkeypatch.setattr(slurm, "queue_state", lambda job_id: ("FAILED", "NonZeroExitCode", "node[1-2]"))
    code, text = slurm.status("7")
    assert code == 1 and "replicas: 2, 2 lost" in text and "serving" not in text
    assert "FAILED rank 1 on node node2 (node index 1) failed: no replica is left (replicas [0, 1] lost)" in text


def test_rank_0_waits_for_each_leaders_ready_file_of_this_run_and_takes_the_ports_it_bound(tmp_path):
    """launcher.rank.frontend.wait_leaders_ready: a leader counts once its ready file carries this rendezvous's token (an
    earlier run's file, or one without a token, does not), and the ports the front end and endpoint.json get are the
    ones in that file: a leader whose port was taken between the rendezvous and its server's bind retried on others.
    A failure file or the deadline ends the wait with the rank named."""
    import threading

    from launcher.rank.frontend import wait_leaders_ready

    (tmp_path / "ready_rank1.json").write_text(json.dumps({"ports": {"grpc_port": 40001}, "token": "old"}))
    (tmp_path / "ready_rank2.json").write_text(json.dumps({"ports": {"grpc_port": 40002}}))

    def later():
        time.sleep(0.4)
        (tmp_path / "ready_rank1.json").write_text(json.dumps({"ports": {"grpc_port": 45001}, "token": "new"}))
        (tmp_path / "ready_rank2.json").write_text(json.dumps({"ports": {"grpc_port": 45002}, "token": "new"}))

    t = threading.Thread(target=later)
    t.start()
    waited, bound = wait_leaders_ready(tmp_path, [1, 2], "new", 30)
    t.join()
    assert waited >= 0.3 and bound == {1: {"grpc_port": 45001}, 2: {"grpc_port": 45002}}
    with pytest.raises(TimeoutError, match=r"ranks \[1, 2\]"):
        wait_leaders_ready(tmp_path, [1, 2], "newer", 0.5)
    (tmp_path / "failure_rank2.json").write_text("{}")
    with pytest.raises(RuntimeError, match="rank2 failed before every replica was ready"):
        wait_leaders_ready(tmp_path, [1, 2], "newer", 30)
