"""llmlaunch-status reports one state: a rank's failure record makes it FAILED whatever Slurm says, and a
failed job exits non-zero."""

import json

import pytest

from launcher.rundir import RunDir
from launcher.schedulers import slurm_jobs as slurm
from launcher.schedulers.slurm_jobs import job_state
from tests.endpoints import endpoint_record

FAIL1 = {
    "rank": 1,
    "node": 1,
    "host": "node2",
    "exit_code": -9,
    "log": "/run/7_1_log.out",
    "log_tail": "tail",
    "reason": "server exited with status -9 unasked",
}


@pytest.mark.parametrize("slurm_state", ["RUNNING", "COMPLETING", "COMPLETED", "CANCELLED", "FAILED"])
def test_a_failure_record_makes_the_job_failed_whatever_slurm_says(slurm_state):
    assert job_state(slurm_state, "None", [FAIL1]) == ("FAILED", "rank 1 failed")


def test_every_failed_rank_is_named_once():
    assert job_state("RUNNING", "None", [FAIL1, {**FAIL1, "rank": 3}, FAIL1]) == ("FAILED", "ranks 1, 3 failed")


@pytest.mark.parametrize(
    "slurm,expect",
    [
        (("RUNNING", "None"), ("RUNNING", "")),
        (("PENDING", "Resources"), ("PENDING", "Resources")),
        (("CANCELLED", ""), ("CANCELLED", "")),
        (("NODE_FAIL", "None"), ("NODE_FAIL", "")),
    ],
)
def test_without_a_failure_record_slurms_state_stands(slurm, expect):
    assert job_state(*slurm, []) == expect


def test_status_of_a_failed_job_says_failed_once_and_exits_1(tmp_path, monkeypatch):
    """Slurm may still say RUNNING (srun ending the other ranks) or COMPLETED: the state line is FAILED."""
    (tmp_path / "launch.json").write_text(json.dumps({"replicas": 1}))
    RunDir(tmp_path).write_endpoint(endpoint_record())
    (tmp_path / "failure_rank1.json").write_text(json.dumps(FAIL1))
    monkeypatch.setattr(slurm, "_record", lambda job_id: {"run_dir": str(tmp_path)})
    for slurm_state in ("RUNNING", "COMPLETED"):
        monkeypatch.setattr(slurm, "queue_state", lambda job_id, s=slurm_state: (s, "None", "node[1-2]"))
        code, text = slurm.status("7")
        assert code == 1, text
        assert "state: FAILED (rank 1 failed)" in text and slurm_state not in text, text
        assert "FAILED rank 1 on node node2 (node index 1) failed: server exited with status -9 unasked" in text


@pytest.mark.parametrize(
    "slurm_state,expect",
    [
        ("FAILED", "FAILED"),
        ("RUNNING", "FAILED"),
        ("COMPLETING", "FAILED"),
        ("CANCELLED", "CANCELLED"),
        ("TIMEOUT", "TIMEOUT"),
    ],
)
def test_a_rank_srun_reports_killed_fails_the_job_unless_it_was_ended_on_purpose(slurm_state, expect):
    state, reason = job_state(slurm_state, "None", [], [(14, "node15", "Killed")])
    assert state == expect and (reason == "rank 14 on node15: Killed, says srun") == (expect == "FAILED"), reason


def test_status_names_a_rank_whose_own_process_was_killed(tmp_path, monkeypatch):
    """No failure record (the rank's process died outright): the state and a FAILED line name it from srun's word."""
    (tmp_path / "launch.json").write_text(json.dumps({"replicas": 16}))
    (tmp_path / "7_0_log.out").write_text(
        "[llmlaunch rank 0 node1 2026-11-27 21:00:00.000] READY\nsrun: error: node15: task 14: Killed\n"
        "srun: error: node1: tasks 0-13,15: Terminated\n"
    )
    monkeypatch.setattr(slurm, "_record", lambda job_id: {"run_dir": str(tmp_path)})
    monkeypatch.setattr(slurm, "queue_state", lambda job_id: ("FAILED", "NonZeroExitCode", "node[1-16]"))
    code, text = slurm.status("7")
    assert code == 1 and "state: FAILED (rank 14 on node15: Killed, says srun)" in text, text
    assert (
        "FAILED rank 14 on node node15: srun reports its task Killed" in text and "triage: llmlaunch-logs 7" in text
    ), text


def test_status_of_a_serving_job_exits_0(tmp_path, monkeypatch):
    (tmp_path / "launch.json").write_text(json.dumps({"replicas": 1}))
    RunDir(tmp_path).write_endpoint(endpoint_record())
    monkeypatch.setattr(slurm, "_record", lambda job_id: {"run_dir": str(tmp_path)})
    monkeypatch.setattr(slurm, "queue_state", lambda job_id: ("RUNNING", "None", "node1"))
    code, text = slurm.status("7")
    assert code == 0 and "state: RUNNING\n" in text, text


# ----------------------------------------------------------------------------- llmlaunch-stop
def test_stop_drains_with_sigterm_to_the_steps_and_falls_back_to_a_plain_scancel():
    assert slurm.drain_argv("7") == ["scancel", "--signal=TERM", "7"]  # steps only: no --batch, no --full
    assert slurm.cancel_argv("7") == ["scancel", "7"]


@pytest.mark.parametrize(
    "launch,serving,window",
    [
        ({"serve": {"drain_timeout_s": 10}}, True, 40.0),
        ({"serve": {"drain_timeout_s": 30.0}}, True, 60.0),
        (None, True, 60.0),
        ({"serve": {}}, True, 60.0),
        ({"serve": {"drain_timeout_s": 300}}, False, 20.0),
    ],
)
def test_the_drain_window_is_the_specs_drain_timeout_plus_a_margin_or_short_while_loading(launch, serving, window):
    assert slurm.drain_window_s(launch, serving) == window


@pytest.mark.parametrize(
    "state,steps,action",
    [
        ("", [], "gone"),
        ("COMPLETING", ["7.0", "7.batch"], "wait"),
        ("RUNNING", ["7.0", "7.batch", "7.extern"], "drain"),
        ("RUNNING", ["7.1", "7.batch"], "drain"),
        ("RUNNING", ["7.batch", "7.extern"], "cancel"),
        ("RUNNING", [], "cancel"),
        ("PENDING", [], "cancel"),
        ("CONFIGURING", ["7.batch"], "cancel"),
        ("SUSPENDED", ["7.0"], "cancel"),
    ],
)
def test_only_a_running_serving_step_is_drained(state, steps, action):
    assert slurm.stop_action(state, steps) == action


def test_status_follows_a_requeued_job_to_its_new_endpoint(tmp_path, monkeypatch):
    """Allocation 0 drained at its time limit (no endpoint while the job waits in the queue again); once the new
    allocation's rank 0 serves, its endpoint is the one shown."""
    run = RunDir(tmp_path)
    (tmp_path / "launch.json").write_text(json.dumps({"replicas": 1}))
    run.write_walltime("", {"attempt": 0, "time": 1893553445.0, "requeue": True, "host": "node1"})
    monkeypatch.setattr(slurm, "_record", lambda job_id: {"run_dir": str(tmp_path)})
    monkeypatch.setattr(slurm, "queue_state", lambda job_id: ("PENDING", "BeginTime", ""))
    code, text = slurm.status("7")
    assert code == 1 and "endpoint:" not in text, text
    assert (
        "allocation 0 drained at its time limit at " in text
        and "requeued; the endpoint follows once it serves again" in text
    ), text
    run.write_endpoint(endpoint_record(url="grpc://10.0.0.2:8001"))
    monkeypatch.setattr(slurm, "queue_state", lambda job_id: ("RUNNING", "None", "node2"))
    code, text = slurm.status("7")
    assert (
        code == 0
        and "endpoint: grpc://10.0.0.2:8001" in text
        and "requeued; serving again at the endpoint above" in text
    ), text


def test_the_drain_reason_names_the_job_and_what_follows():
    from launcher.procs.drain import walltime_reason

    assert walltime_reason("7", True).startswith(
        "job 7 is draining at its Slurm time limit: requests in flight finish, new ones are refused; it is requeued"
    )
    assert walltime_reason("7", False).endswith("it then ends (launch it again for more time)")
