"""The run directory (launcher/rundir.py): each file's writer and reader agree, records of an earlier run or
half-written files are not taken for this run's, and wait_for_endpoint waits, reports and gives up as asked.
The scheduler registry (launcher/schedulers/base.py): every cluster profile's scheduler renders the request the
dry run prints."""

from __future__ import annotations

import threading
import time

import pytest

from launcher.rundir import RunDir, Stopped, wait_for_endpoint
from tests.endpoints import endpoint_record


def test_each_record_reads_back_what_its_writer_wrote(tmp_path):
    run = RunDir(tmp_path)
    assert run.read_endpoint() is None and not run.has_endpoint() and run.failures() == [] and run.lost_replicas() == []
    run.write_endpoint(endpoint_record(token="t1"))
    assert run.read_endpoint() == endpoint_record(token="t1") and run.serving("t1") and not run.serving("t0")
    run.write_ready(2, {"rank": 2, "ports": {"grpc_port": 5}, "ready_s": 1.5})
    run.write_ready(0, {"rank": 0, "ports": {"grpc_port": 4}, "ready_s": 2.5})
    assert run.ready_count() == 2 and run.read_ready(2)["ports"] == {"grpc_port": 5} and run.read_ready(1) is None
    assert [r["rank"] for r in run.ready_records()] == [0, 2]
    run.write_failure(3, {"rank": 3})
    run.write_failure(1, {"rank": 1})
    run.failure_path(5).write_text("{half")  # a record being written by hand: skipped, not a crash
    assert [f["rank"] for f in run.failures()] == [1, 3]
    assert run.record_lost(1, {"replica": 1, "rank": 1}) and not run.record_lost(1, {"replica": 1, "rank": 2})
    run.record_lost(0, {"replica": 0})
    assert run.lost_replica_ids(3) == (0, 1) and [r["replica"] for r in run.lost_replicas()] == [0, 1]
    assert run.read_lost(1)["rank"] == 1
    run.clear_lost()
    assert run.lost_replica_ids(3) == () and run.read_lost(1) is None
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # writes leave no temporary file


def test_the_spec_round_trips_through_launch_json(tmp_path):
    from launcher.cli import plan

    _, spec = plan(["cluster=local_slurm", "engine=hf"])
    run = RunDir(tmp_path / "run").write_spec(spec)
    assert run.read_spec() == spec and run.read_launch()["replicas"] == spec.replicas
    assert (run.repository / "hf_model" / "config.pbtxt").exists() and run.logs.is_dir()


def test_wait_for_endpoint_reports_progress_and_returns_the_endpoint(tmp_path):
    run = RunDir(tmp_path)
    said = []

    def later():
        time.sleep(0.5)
        run.write_endpoint(endpoint_record(url="grpc://h:1"))

    t = threading.Thread(target=later)
    t.start()
    ep = wait_for_endpoint(
        run,
        timeout_s=30,
        on_timeout=lambda s: AssertionError("timed out"),
        progress=lambda: "loading",
        say=said.append,
        interval_s=0.05,
    )
    t.join()
    assert ep == endpoint_record(url="grpc://h:1")
    assert said and said[0].startswith("loading (") and len(said) == 1  # unchanged: said once within repeat_s


def test_wait_for_endpoint_gives_up_and_check_ends_it(tmp_path):
    run = RunDir(tmp_path)
    with pytest.raises(TimeoutError, match="after"):
        wait_for_endpoint(run, timeout_s=0.2, on_timeout=lambda s: TimeoutError(f"after {s:.1f}s"), interval_s=0.05)

    def check():
        raise Stopped()

    with pytest.raises(Stopped):
        wait_for_endpoint(run, timeout_s=30, on_timeout=lambda s: AssertionError("timed out"), check=check)


@pytest.mark.parametrize("cluster", ["local", "local_slurm", "luna", "slurm"])
def test_every_cluster_has_a_scheduler_whose_request_the_dry_run_prints(cluster):
    from launcher.cli import plan
    from launcher.plan import plan_text
    from launcher.schedulers import registry as scheduler

    _, spec = plan([f"cluster={cluster}", "engine=hf"])
    backend = scheduler.for_spec(spec)
    assert backend.name == spec.cluster.scheduler
    request = backend.dryrun(spec, "/jobs/run")
    assert request.scheduler == backend.name and request.text.strip()
    assert request.text.rstrip() in plan_text(spec, "/jobs/run")
