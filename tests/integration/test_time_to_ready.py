"""A real local launch (tritonserver, the tiny model) prints its time to READY broken down and leaves a run record
with it; `llmlaunch --from-record` launches the recorded run again with an override. The Slurm launch's
breakdown: tests/integration/test_slurm_launch.py. The pure parts: tests/unit/test_run_record.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.ports import free_port
from tests.integration.test_default_model import ROOT, Served

PHASES = ("queue_s", "ranks_s", "server_s", "load_s", "endpoint_s", "first_token_s", "frontend_s")


def _ports():
    """The port Served leaves to its default (it picks the gRPC, HTTP and metrics ports)."""
    return [f"serve.openai_port={free_port()}"]


def _check_record(rec: dict, run_dir: Path) -> dict:
    """The record of a READY local launch: every phase measured, the hf engine's own load phases, versions as the
    ranks saw them, and the breakdown's total no more than the wall time from submission to serving."""
    b = rec["time_to_ready"]
    assert all(b[k] >= 0 for k in PHASES), b
    assert b["queue_s"] == 0 and b["load_s"] > 0 and b["first_token_s"] > 0, b
    assert [name for name, _ in b["load_phases"]] == ["weights", "compile", "graphs"] and b["load_phases"][0][1] > 0
    assert abs(sum(b[k] for k in PHASES) - b["total_s"]) < 0.05, b
    assert rec["marks"]["serving"] - rec["marks"]["submitted"] == pytest.approx(b["total_s"], abs=0.01)
    v = rec["versions"]
    assert v["tritonserver"] and v["torch"] and v["transformers"], (
        v
    )  # torch and transformers: as the engine imported them
    assert rec["llmlaunch"]["version"] and len(rec["llmlaunch"]["commit"]) == 40
    assert rec["environment"]["packages_sha256"] and rec["nodes"] and rec["run_dir"] == str(run_dir)
    assert rec["config"]["model"]["name"] == "tiny" and rec["scheduler"] == "local"
    return b


@pytest.mark.timeout(600)
def test_local_launch_prints_its_time_to_ready_and_relaunches_from_its_record(tmp_path):
    first = Served(tmp_path, "model=tiny", "serve.ready_timeout_s=300", "engine.max_num_seqs=8", *_ports())
    try:
        said = first.ready(timeout=360)
    finally:
        assert first.stop() == 0, "".join(first.err[-20:])
    line, _, where = said["ready"].rpartition(" (record ")
    record_path = Path(where.rstrip(")"))
    assert (
        line.startswith("time to READY ")
        and "model/engine load" in line
        and "(weights " in line
        and "first real token" in line
    )
    assert any(ln.startswith("llmlaunch: time to READY") for ln in first.err)
    rec = json.loads(record_path.read_text())
    _check_record(rec, record_path.parent)
    assert "engine.max_num_seqs=8" in rec["overrides"] and rec["config"]["engine"]["max_num_seqs"] == 8

    # the same launch again, with replicas=2 and new ports on top: every other value is the record's
    env = {"PYTHONPATH": str(ROOT)}
    dry = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "--from-record", str(record_path), "replicas=2", "dry_run=true"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**__import__("os").environ, **env},
        timeout=120,
    )
    assert dry.returncode == 0 and "replicas=2" in dry.stdout.splitlines()[2] and "max_num_seqs: 8" in dry.stdout, (
        dry.stderr
    )
    again = Served(tmp_path, "--from-record", str(record_path), "replicas=2", *_ports())
    try:
        said = again.ready(timeout=360)
        from launcher.client.request import Generation
        from launcher.client.stream import generate

        out = generate(said["endpoint"], said["model"], Generation("Hello", max_tokens=4, ignore_eos=True))
        assert not out.error and out.output_tokens == 4
    finally:
        assert again.stop() == 0, "".join(again.err[-20:])
    second_path = Path(said["ready"].rpartition(" (record ")[2].rstrip(")"))
    second = json.loads(second_path.read_text())
    _check_record(second, second_path.parent)
    assert second["from_record"] == str(record_path)
    assert {"model=tiny", "engine.max_num_seqs=8", "replicas=2"} <= set(second["overrides"])  # what relaunches it again
    assert second["config"]["replicas"] == 2 and len(second["nodes"]) == 2
    same = {k: v for k, v in rec["config"].items() if k not in ("replicas", "serve")}
    assert {k: second["config"][k] for k in same} == same
