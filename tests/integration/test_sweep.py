"""Real sweeps (`llmlaunch -m ... bench=<profile>`, launcher/sweep/) on the local Slurm cluster and on this
machine (cluster=local). The pure planning functions and the dry run: tests/unit/test_sweep_planning.py."""

from __future__ import annotations

import csv
import glob
import json
from pathlib import Path

import pytest

from launcher.rundir import RunDir
from tests.slurm_fixture import requires_slurm
from tests.unit.test_sweep_planning import TINY_LOAD, llmlaunch


# ----------------------------------------------------------------------------- real sweeps
def _points(sweep_dir: Path):
    return {p.parent.name: json.loads(p.read_text()) for p in sweep_dir.glob("*/point.json")}


@requires_slurm
@pytest.mark.timeout(900)
def test_slurm_2x2_sweep_reuses_servers_then_resumes(local_slurm, tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = [
        "cluster=local_slurm",
        "engine=hf",
        "replicas=1,2",
        "bench.concurrency=1,4",
        *TINY_LOAD,
        f"cluster.jobs_dir={tmp_path / 'jobs'}",
        "serve.ready_timeout_s=240",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    r = llmlaunch(tmp_path, *args)
    assert r.returncode == 0, r.stderr[-4000:]
    rows = list(csv.DictReader(open(sweep_dir / "summary.csv")))
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}, rows
    assert {(r["config"], r["concurrency"]) for r in rows} == {(f"replicas={n}", c) for n in "12" for c in "14"}
    assert all(float(r["output_throughput"]) > 0 for r in rows)
    # one replica: the split from rank 0's tritonserver; two: summed over both replica leaders' own servers (the
    # front end owns the public metrics port)
    assert {r["config"]: bool(r["ttft_engine_ms"]) for r in rows} == {"replicas=1": True, "replicas=2": True}
    for png in ("throughput_vs_concurrency.png", "latency_throughput.png"):
        assert (sweep_dir / png).stat().st_size > 1000
    points = _points(sweep_dir)
    jobs = {name: p["server"]["job_id"] for name, p in points.items()}
    assert jobs["bench.concurrency=1,replicas=1"] == jobs["bench.concurrency=4,replicas=1"]  # reused
    assert jobs["bench.concurrency=1,replicas=2"] == jobs["bench.concurrency=4,replicas=2"]
    assert len(set(jobs.values())) == 2 and r.stderr.count(": launching slurm server") == 2
    # the client ran inside the server's allocation, against its endpoint
    log = (sweep_dir / "bench.concurrency=4,replicas=2" / "bench.log").read_text()
    assert log.startswith(f"$ srun --jobid={jobs['bench.concurrency=4,replicas=2']} --overlap")
    from launcher.schedulers import slurm_jobs

    for job in set(jobs.values()):
        assert slurm_jobs.queue_state(job)[0] not in ("RUNNING", "PENDING")  # torn down
    # resume: everything is skipped, nothing is launched, the report is written again
    (sweep_dir / "summary.csv").unlink()
    r = llmlaunch(tmp_path, *args)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stderr.count("skipped, result.json exists") == 4 and "launching" not in r.stderr
    assert len(list(csv.DictReader(open(sweep_dir / "summary.csv")))) == 4


@requires_slurm
@pytest.mark.timeout(600)
def test_slurm_failed_points_leave_failure_json_and_the_others_complete(local_slurm, tmp_path):
    """replicas=8 does not fit one node (validation); output_len=5000 makes every request fail on the
    server (context 2048). The one good point is measured on the server the failed one left running."""
    sweep_dir = tmp_path / "sweep"
    r = llmlaunch(
        tmp_path,
        "cluster=local_slurm",
        "engine=hf",
        "replicas=8,1",
        "bench.output_len=5000,4",
        *TINY_LOAD[:2],
        "bench.warmup=1",
        "bench.concurrency=2",
        f"cluster.jobs_dir={tmp_path / 'jobs'}",
        "serve.ready_timeout_s=240",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert r.returncode == 0, r.stderr[-4000:]
    rows = {r["point"]: r for r in csv.DictReader(open(sweep_dir / "summary.csv"))}
    assert len(rows) == 4
    assert rows["bench.output_len=4,replicas=1"]["status"] == "ok"
    for point, stage, needle in (
        ("bench.output_len=4,replicas=8", "validate", "needs 8 GPUs"),
        ("bench.output_len=5000,replicas=8", "validate", "needs 8 GPUs"),
        ("bench.output_len=5000,replicas=1", "bench", "no request completed"),
    ):
        assert rows[point]["status"] == "failed"
        f = json.loads((sweep_dir / point / "failure.json").read_text())
        assert f["stage"] == stage and needle in f["error"], f
        assert (
            "bench.output_len=" + point.split(",")[0].split("=")[1] in f["overrides"]
            and "cluster=local_slurm" in f["overrides"]
        )
    assert (sweep_dir / "bench.output_len=5000,replicas=1" / "result.failed.json").exists()
    assert r.stderr.count(": launching slurm server") == 1


@pytest.mark.triton
@pytest.mark.timeout(600)
def test_local_sweep_one_server_two_points(tmp_path):
    from launcher.ports import free_port

    sweep_dir = tmp_path / "sweep"
    ports = [
        f"serve.grpc_port={free_port()}",
        f"serve.http_port={free_port()}",
        f"serve.metrics_port={free_port()}",
        f"serve.openai_port={free_port()}",
    ]
    r = llmlaunch(
        tmp_path,
        "cluster=local",
        "engine=hf",
        "bench.concurrency=1,2",
        *TINY_LOAD,
        "bench.eval=[arithmetic,arithmetic_choice]",  # then the answers: lm-eval through the OpenAI API
        "bench.eval_limit=4",
        *ports,
        f"cluster.jobs_dir={tmp_path / 'jobs'}",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert r.returncode == 0, r.stderr[-4000:]
    rows = list(csv.DictReader(open(sweep_dir / "summary.csv")))
    assert [(r["concurrency"], r["status"]) for r in rows] == [("1", "ok"), ("2", "ok")]
    # the default model answers every item (wrongly: it restates the sum) and scores its choices
    assert all(
        r["eval"].startswith("arithmetic exact_match=") and "4/4; arithmetic_choice acc=" in r["eval"] for r in rows
    ), rows
    # the hf model's first-token split came from rank 0's metrics port (llmlaunch-bench --server-metrics)
    assert all(float(r["ttft_engine_ms"]) > 0 and r["ttft_outside_ms"] for r in rows), rows
    assert all(float(r["engine_step_ms"]) > 0 for r in rows), rows  # ... and its engine's time per step
    assert r.stderr.count(": launching local server") == 1 and "stopped local server" in r.stderr
    pid = int(_points(sweep_dir)["bench.concurrency=1"]["server"]["job_id"])
    assert not Path(f"/proc/{pid}").exists()
    # the one server's time to READY in both rows, and both points in its run record
    assert all(
        float(r["ready_total_s"]) > 0 and float(r["ready_load_s"]) > 0 and r["ready_queue_s"] == "0" for r in rows
    ), rows
    assert all(r["ready_load_phases"].startswith("weights=") for r in rows), rows
    record = json.loads(
        (Path(_points(sweep_dir)["bench.concurrency=1"]["server"]["run_dir"]) / "record.json").read_text()
    )
    assert [Path(b["point"]).name for b in record["bench"]] == ["bench.concurrency=1", "bench.concurrency=2"]
    assert (
        all(
            b["completed"] == b["requests"] > 0 and set(b["eval"]) == {"arithmetic", "arithmetic_choice"}
            for b in record["bench"]
        )
        and record["config"]["bench"]["concurrency"] == 1
    )


@requires_slurm
@pytest.mark.timeout(600)
def test_submitit_launcher_runs_each_point_in_its_own_allocation(local_slurm, tmp_path):
    """hydra/launcher=submitit_slurm: an array job, one allocation per point; the ranks start inside it.
    The replicas=2 point does not fit the 1-GPU allocations asked for: its failure names the fix."""
    sweep_dir = tmp_path / "sweep"
    r = llmlaunch(
        tmp_path,
        "hydra/launcher=submitit_slurm",
        "hydra.launcher.partition=local",
        "hydra.launcher.gpus_per_node=1",
        "hydra.launcher.timeout_min=10",
        "cluster=local_slurm",
        "engine=hf",
        "replicas=1,2",
        *TINY_LOAD,
        "bench.concurrency=2",
        f"cluster.jobs_dir={tmp_path / 'jobs'}",
        "serve.ready_timeout_s=240",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert r.returncode == 0, r.stderr[-4000:]
    rows = {r["point"]: r for r in csv.DictReader(open(sweep_dir / "summary.csv"))}
    assert rows["replicas=1"]["status"] == "ok" and float(rows["replicas=1"]["output_throughput"]) > 0
    f = json.loads((sweep_dir / "replicas=2" / "failure.json").read_text())
    assert f["stage"] == "serve" and "set hydra.launcher.gpus_per_node=2" in f["error"]
    server = _points(sweep_dir)["replicas=1"]["server"]
    assert server["kind"] == "allocation" and (Path(server["run_dir"]) / "step.sh").exists()
    assert float(rows["replicas=1"]["ready_load_s"]) > 0 and float(rows["replicas=1"]["ready_ranks_s"]) > 0, rows[
        "replicas=1"
    ]
    # the point's step ended on the stop's signal; its script removed the shm regions the ranks may not have
    job = RunDir(server["run_dir"]).read_endpoint().job_id
    assert not glob.glob(f"/dev/shm/llm{job}r*"), glob.glob(f"/dev/shm/llm{job}r*")


@requires_slurm
@pytest.mark.timeout(300)
def test_a_server_that_cannot_start_fails_its_points_once(local_slurm, tmp_path):
    """Slurm refuses the job (no such partition): the first point records Slurm's reason, the second
    point of the same server is not submitted again."""
    sweep_dir = tmp_path / "sweep"
    r = llmlaunch(
        tmp_path,
        "cluster=local_slurm",
        "cluster.partition=nope",
        "bench.concurrency=1,2",
        *TINY_LOAD,
        f"cluster.jobs_dir={tmp_path / 'jobs'}",
        f"hydra.sweep.dir={sweep_dir}",
    )
    assert r.returncode == 0, r.stderr[-4000:]
    first = json.loads((sweep_dir / "bench.concurrency=1" / "failure.json").read_text())
    second = json.loads((sweep_dir / "bench.concurrency=2" / "failure.json").read_text())
    assert first["stage"] == second["stage"] == "serve"
    assert "invalid partition" in first["error"].lower() and "failed to start for an earlier point" in second["error"]
    assert r.stderr.count(": launching slurm server") == 1
