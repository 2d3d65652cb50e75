"""Time to READY (launcher/readiness.py) and the run record (launcher/record.py), their pure parts: marks to phases,
the times and phases read from logs, the record joined at READY, a record refused or replayed by --from-record, and
the sweep's summary.csv columns. Real launches: tests/integration/test_time_to_ready.py (local) and
tests/integration/test_slurm_launch.py (the local Slurm cluster)."""

from __future__ import annotations

import calendar
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.compose import config_from_record
from launcher.errors import LaunchError
from launcher.readiness import (
    CSV_COLUMNS,
    breakdown,
    csv_columns,
    format_breakdown,
    process_start_time,
    queue_reasons,
    reported_phases,
    reported_versions,
    slurm_time,
    triton_log_marks,
)
from launcher.record import RECORD_SCHEMA, base_record, join_record, read_record
from launcher.replay import pinned_values
from launcher.rundir import RunDir
from tests.endpoints import endpoint_record

ROOT = Path(__file__).resolve().parents[2]
MARKS = {
    "submitted": 100.0,
    "allocated": 130.0,
    "ranks_started": 131.5,
    "load_start": 132.0,
    "model_ready": 140.0,
    "server_live": 140.2,
    "first_token": 140.5,
    "serving": 142.0,
}


def test_marks_become_phases_in_order_with_the_engines_load_phases_and_the_queue_reason():
    b = breakdown(MARKS, {"weights": 3.0, "compile": 4.0, "graphs": 1.0}, "Resources")
    assert (
        b["queue_s"],
        b["ranks_s"],
        b["server_s"],
        b["load_s"],
        b["endpoint_s"],
        b["first_token_s"],
        b["frontend_s"],
    ) == (30.0, 1.5, 0.5, 8.0, 0.2, 0.3, 1.5)
    assert b["total_s"] == 42.0 and b["load_phases"] == [["weights", 3.0], ["compile", 4.0], ["graphs", 1.0]]
    line = format_breakdown(b)
    assert line.startswith("time to READY 42.0s: queue wait 30.00s (Resources), allocation to ranks started 1.50s")
    assert (
        "model/engine load 8.00s (weights 3.00s, compile 4.00s, graphs 1.00s)" in line
        and "first real token 0.30s" in line
    )
    row = csv_columns(b)
    assert (
        list(row) == list(CSV_COLUMNS)
        and row["ready_queue_s"] == 30.0
        and row["ready_load_phases"] == "weights=3.0 compile=4.0 graphs=1.0"
    )


def test_a_missing_mark_leaves_its_phases_out_and_a_clock_step_back_is_not_negative():
    b = breakdown({"submitted": 10.0, "allocated": 9.5, "model_ready": 20.0})
    assert b["queue_s"] == 0.0 and "load_s" not in b and "ranks_s" not in b and b["total_s"] == 10.0
    assert format_breakdown({}) == "time to READY: no marks recorded" and csv_columns(None)["ready_total_s"] is None


def test_tritonservers_log_times_are_read_for_this_start_only():
    since = calendar.timegm((2026, 11, 27, 21, 1, 30, 0, 0, 0))
    log = "\n".join(
        [
            'I1127 20:00:00.000000 11 model_lifecycle.cc:472] "loading: m:1"',  # an earlier run, appended to the same log
            'I1127 21:01:36.500000 21 model_lifecycle.cc:472] "loading: m:1"',
            "llmlaunch-phase: weights 1.250",
            "llmlaunch-phase: compile 0.000",
            "llmlaunch-version: torch 2.13.0+cpu",
            "I1127 21:01:40.250000 21 model_lifecycle.cc:839] \"successfully loaded 'm'\"",
            'I1127 21:01:40.750000 21 grpc_server.cc:2558] "Started GRPCInferenceService at 0.0.0.0:8001"',
            "I1127 21:01:41.000000 21 model_lifecycle.cc:839] \"successfully loaded 'other'\"",
        ]
    )
    assert triton_log_marks(log, "m", since) == {
        "load_start": since + 6.5,
        "model_ready": since + 10.25,
        "server_live": since + 10.75,
    }
    assert reported_phases(log) == {"weights": 1.25, "compile": 0.0} and reported_versions(log) == {
        "torch": "2.13.0+cpu"
    }


def test_each_engine_reports_its_load_phases_through_its_registry_entry():
    from launcher.engines.registry import ENGINES

    vllm_log = (
        "Loading weights took 12.50 seconds\nModel loading took 15.2 GiB and 13.1 seconds\n"
        "torch.compile took 40.5 s in total\nGraph capturing finished in 7 secs, took 0.5 GiB\n"
    )
    assert ENGINES["vllm"].load_phases(vllm_log) == {
        "weights_s": 12.5,
        "model_load_s": 13.1,
        "compile_s": 40.5,
        "cuda_graphs_s": 7.0,
    }
    assert ENGINES["hf"].load_phases("llmlaunch-phase: weights 2.000\nllmlaunch-phase: graphs 3.500\n") == {
        "weights": 2.0,
        "graphs": 3.5,
    }
    assert ENGINES["sglang"].load_phases("nothing reported") == {}


def test_slurm_times_and_reasons():
    assert slurm_time("Unknown") is None and slurm_time("N/A") is None
    assert abs(slurm_time("2026-11-27T21:30:00") - calendar.timegm((2026, 11, 27, 21, 30, 0, 0, 0, 0))) <= 14 * 3600
    assert queue_reasons(["None", "Priority", "Priority", "Resources", ""]) == "Priority, Resources"
    assert queue_reasons([]) == ""
    assert 0 < process_start_time() <= __import__("time").time()


def test_the_record_joins_the_launching_sides_part_with_what_rank_0_saw(tmp_path):
    run = RunDir(tmp_path)
    base = base_record(
        {"tp": 1},
        ["model=tiny"],
        "slurm",
        str(tmp_path),
        identity={"version": "0.1.0", "commit": "abc", "dirty": False},
        submitted=99.0,
    )
    run.write_record(base)
    run.write_startup(
        {
            "marks": {k: v for k, v in MARKS.items() if k not in ("submitted", "allocated")},
            "load_phases": [["weights", 2.0]],
            "versions": {"tritonserver": "2.51.0", "torch": "2.13.0"},
            "nodes": ["n1", "n2"],
            "gpus": {"n1": ["0, H100"]},
            "environment": {"python": "3.11"},
        }
    )
    run.write_endpoint(endpoint_record(url="grpc://n1:8001", model="m", openai_url="http://n1:8003/v1"))
    from launcher.record import complete_record

    # Slurm's Submit (whole seconds, after llmlaunch's own start) does not replace the command's time
    rec = complete_record(run, marks={"submitted": 100.0, "allocated": 130.0}, queue_reason="Resources", job_id="42")
    assert run.read_record() == rec and rec["schema"] == RECORD_SCHEMA and rec["config"] == {"tp": 1}
    assert rec["marks"]["submitted"] == 99.0 and rec["time_to_ready"]["queue_s"] == 31.0
    assert rec["time_to_ready"]["queue_reason"] == "Resources" and rec["time_to_ready"]["load_phases"] == [
        ["weights", 2.0]
    ]
    assert (
        rec["versions"]["tritonserver"] == "2.51.0"
        and rec["nodes"] == ["n1", "n2"]
        and rec["gpus"] == {"n1": ["0, H100"]}
    )
    assert rec["job_id"] == "42" and rec["endpoint"] == {
        "url": "grpc://n1:8001",
        "model": "m",
        "openai_url": "http://n1:8003/v1",
    }
    # locally nothing queues: allocated is the submission
    bare = join_record(None, {"marks": {"ranks_started": 5.0}}, marks={"submitted": 4.0}, nodes="a,b")
    assert (
        bare["time_to_ready"]["queue_s"] == 0.0
        and bare["time_to_ready"]["ranks_s"] == 1.0
        and bare["nodes"] == ["a", "b"]
    )


def _record(tmp_path, **changes) -> Path:
    from omegaconf import OmegaConf

    from launcher.compose import composed

    overrides = ["model=tiny", "engine.max_num_seqs=16"]
    rec = base_record(
        OmegaConf.to_container(composed(overrides), resolve=True),
        overrides,
        "local",
        "/x",
        identity={"version": "0.1.0"},
    )
    rec.update(changes)
    path = tmp_path / "record.json"
    path.write_text(json.dumps(rec))
    return path


def test_a_record_from_a_newer_llmlaunch_or_not_a_record_is_refused_with_the_fix(tmp_path):
    newer = _record(tmp_path, schema=RECORD_SCHEMA + 1, llmlaunch={"version": "9.0.0"})
    with pytest.raises(LaunchError) as e:
        read_record(str(newer))
    assert "written by a newer llmlaunch (9.0.0, record schema 2)" in str(
        e.value
    ) and "model=tiny engine.max_num_seqs=16" in str(e.value)
    (tmp_path / "junk.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "noconfig.json").write_text(json.dumps({"schema": 1, "overrides": ["tp=2"]}))
    for name, why in (
        ("junk.json", "not a JSON record"),
        ("list.json", "no record schema version"),
        ("missing.json", "cannot read it"),
        ("noconfig.json", "holds no composed config"),
    ):
        with pytest.raises(LaunchError, match=why):
            read_record(str(tmp_path / name))
    (tmp_path / "run").mkdir()
    assert read_record(str(_record(tmp_path / "run").parent))["schema"] == RECORD_SCHEMA  # RUN_DIR works too


def test_llmlaunch_exits_2_on_a_newer_record_before_anything_runs(tmp_path):
    newer = _record(tmp_path, schema=RECORD_SCHEMA + 1)
    r = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "--from-record", str(newer)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 2 and "newer llmlaunch" in r.stderr and "fix:" in r.stderr and not r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "--from-record", str(_record(tmp_path)), "-m", "tp=1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 2 and "only key=value overrides" in r.stderr


def test_the_records_values_are_pinned_except_where_the_new_overrides_reach():
    config = {
        "tp": 1,
        "run_dir": "/old",
        "dry_run": False,
        "engine": {"name": "hf", "max_num_seqs": 7},
        "serve": {"grpc_port": 1},
    }
    assert pinned_values(config, ["serve.grpc_port=5"]) == [
        ("tp", 1),
        ("engine.name", "hf"),
        ("engine.max_num_seqs", 7),
    ]
    assert pinned_values(config, ["engine=vllm", "++tp=2"]) == [("serve.grpc_port", 1)]


def test_from_record_composes_the_same_config_with_the_override_on_top(tmp_path):
    from omegaconf import OmegaConf

    rec = json.loads(_record(tmp_path).read_text())
    rec["config"]["engine"]["stream_interval_ms"] = 3  # a value conf/ no longer gives: the record's wins
    rec["config"]["engine"]["gone_setting"] = 1  # a setting this llmlaunch no longer has: left out, named
    cfg, line, gone = config_from_record(rec, ["replicas=2"])
    got = OmegaConf.to_container(cfg, resolve=True)
    assert line == ["model=tiny", "engine.max_num_seqs=16", "replicas=2"] and gone == ["engine.gone_setting"]
    # a key given again replaces the record's
    assert config_from_record(rec, ["engine.max_num_seqs=4"])[1] == ["model=tiny", "engine.max_num_seqs=4"]
    assert got["replicas"] == 2 and got["engine"]["stream_interval_ms"] == 3 and got["engine"]["max_num_seqs"] == 16
    want = dict(rec["config"], replicas=2)
    want["engine"] = {k: v for k, v in rec["config"]["engine"].items() if k != "gone_setting"}
    assert got == want


def test_from_record_dry_run_shows_the_plan_and_names_the_record(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "--from-record", str(_record(tmp_path)), "replicas=2", "dry_run=true"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(
        f"from record: {tmp_path / 'record.json'}\noverrides: model=tiny engine.max_num_seqs=16 replicas=2 dry_run=true\n"
    )
    assert "llmlaunch plan: cluster=local engine=hf model=tiny tp=1 pp=1 nodes=1 replicas=2" in r.stdout
    assert "max_num_seqs: 16" in r.stdout


def test_summary_csv_has_the_points_servers_time_to_ready(tmp_path):
    from launcher.bench.report import load_points, write_summary

    point = tmp_path / "bench.concurrency=1"
    point.mkdir()
    (point / "result.json").write_text(
        json.dumps({"metrics": {"requests": 2, "completed": 2}, "config": {"load": {"concurrency": 1}}})
    )
    (point / "overrides.yaml").write_text("bench.concurrency: 1\n")
    (point / "point.json").write_text(
        json.dumps({"server": {"time_to_ready": breakdown(MARKS, {"weights": 3.0}, "Priority")}})
    )
    write_summary(load_points(tmp_path), tmp_path / "summary.csv", tmp_path)
    row = next(csv.DictReader((tmp_path / "summary.csv").open()))
    assert row["ready_total_s"] == "42" and row["ready_queue_s"] == "30" and row["ready_load_s"] == "8"
    assert row["ready_queue_reason"] == "Priority" and row["ready_load_phases"] == "weights=3.0"


def test_rank_0s_lines_are_told_apart_in_a_log_all_ranks_share():
    from launcher.readiness import own_lines

    shared = "\n".join(
        [
            'I1127 21:01:36.000000 200 model_lifecycle.cc:472] "loading: m:1"',  # rank 1's server
            'I1127 21:01:37.000000 100 model_lifecycle.cc:472] "loading: m:1"',
            "llmlaunch-phase: weights 9.000 rank 1",
            "llmlaunch-phase: weights 2.000 rank 0",
            "Loading weights took 3.0 seconds",
        ]
    )
    mine = own_lines(shared, 0, server_pid=100)
    assert mine.splitlines() == [shared.splitlines()[i] for i in (1, 3, 4)] and reported_phases(mine) == {
        "weights": 2.0
    }
    assert own_lines(shared, 0, server_pid=300).count("loading: m:1") == 2  # no line of that process: none dropped


def test_startup_facts_that_cannot_be_read_still_leave_rank_0s_marks(tmp_path):
    from types import SimpleNamespace

    from launcher.record import write_startup

    run = RunDir(tmp_path)
    broken = SimpleNamespace(model_name="m", engine=SimpleNamespace(name="no-such-engine"))
    write_startup(
        run,
        broken,
        log_path=tmp_path / "absent.log",
        marks={"ranks_started": 5.0, "serving": 9.0},
        server_url="127.0.0.1:1",
        nodes=["n1"],
        gpus={},
        token="t",
    )
    doc = run.read_startup()
    assert (
        doc["marks"] == {"ranks_started": 5.0, "serving": 9.0} and doc["nodes"] == ["n1"] and "KeyError" in doc["error"]
    )
    assert join_record(None, doc)["time_to_ready"]["total_s"] == 4.0
