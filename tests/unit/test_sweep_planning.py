"""Sweeps (`llmlaunch -m ... bench=<profile>`, launcher/sweep/): the pure planning functions (launcher/sweep/plan.py)
and the dry
run (no cluster, nothing started). The real sweeps on the local Slurm cluster and on this machine:
tests/integration/test_sweep.py."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli import plan
from launcher.compose import compose
from launcher.render import client_argv
from launcher.schedulers.allocation import allocation_problems
from launcher.sweep import plan as sweep
from tests.endpoints import endpoint_record

ROOT = Path(__file__).resolve().parents[2]
# A tiny load: 4 measured requests of 4 tokens after one warm-up request.
TINY_LOAD = ["bench=sharegpt_small", "bench.num_prompts=4", "bench.output_len=4", "bench.warmup=1"]


def plain(*overrides):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(compose(list(overrides)), resolve=True)


# ----------------------------------------------------------------------------- pure planning
def test_client_overrides_are_the_bench_ones():
    assert sweep.is_client_override("bench.concurrency=8") and sweep.is_client_override("bench=sharegpt_small")
    assert sweep.is_client_override("+bench.seed=3")
    assert not sweep.is_client_override("benchmark=1") and not sweep.is_client_override("replicas=2")
    assert sweep.server_overrides(
        ["engine=hf", "bench=x", "bench.concurrency=1", "dry_run=true", "run_dir=/r", "replicas=2"]
    ) == ["engine=hf", "replicas=2"]


def test_server_key_ignores_client_side_and_bookkeeping_values():
    base = sweep.server_key(plain("cluster=local_slurm", "bench=sharegpt_small"))
    assert sweep.server_key(plain("cluster=local_slurm", "bench=sharegpt_small", "bench.concurrency=32")) == base
    assert (
        sweep.server_key(
            plain("cluster=local_slurm", "bench=none", "dry_run=true", "run_dir=/x", "serve.ready_timeout_s=5")
        )
        == base
    )
    assert sweep.server_key(plain("cluster=local_slurm", "cluster.jobs_dir=/elsewhere")) == base
    for changed in (
        "replicas=2",
        "engine.max_num_seqs=8",
        "cluster=local",
        "serve.grpc_port=9001",
        "model.dtype=float32",
    ):
        assert sweep.server_key(plain("cluster=local_slurm", changed)) != base, changed


def test_measure_key_sees_the_load_but_not_where_files_go():
    base = plain("bench=sharegpt_small")
    assert sweep.measure_key(plain("bench=sharegpt_small", "dry_run=true", "cluster.jobs_dir=/j")) == sweep.measure_key(
        base
    )
    other = plain("bench=sharegpt_small", "bench.num_prompts=5")
    assert sweep.measure_key(other) != sweep.measure_key(base)
    assert sweep.config_changes(base, other) == ["bench.num_prompts: 32 -> 5"]


def test_sweep_axes_and_point_count_from_the_command_line():
    assert sweep.parse_sweep(
        ["cluster=local_slurm", "replicas=1,2", "bench.concurrency=1,8,32", "bench=sharegpt_small"]
    ) == (["replicas", "bench.concurrency"], 6)
    assert sweep.parse_sweep(["+bench.seed=range(0,3)", "engine=hf"]) == (["bench.seed"], 3)
    assert sweep.parse_sweep(["engine=hf"]) == ([], 1)


def test_order_advice_when_a_client_axis_comes_first():
    assert sweep.order_advice(["replicas=1,2", "bench.concurrency=1,8"], ["replicas", "bench.concurrency"]) is None
    advice = sweep.order_advice(
        ["bench.concurrency=1,8", "engine=hf", "replicas=1,2"], ["bench.concurrency", "replicas"]
    )
    assert "replicas=1,2 bench.concurrency=1,8" in advice


def test_point_names_are_stable_sorted_and_safe():
    axes = ["replicas", "bench.concurrency"]
    a = sweep.point_name(["cluster=local_slurm", "replicas=2", "bench.concurrency=8"], axes)
    b = sweep.point_name(["bench.concurrency=8", "replicas=2", "cluster=local_slurm", "serve.ready_timeout_s=9"], axes)
    assert a == b == "bench.concurrency=8,replicas=2"
    assert sweep.point_name(["engine=hf"], []) == "default"
    assert (
        sweep.point_name(["bench.dataset=sharegpt:/data/x y.json", "engine=hf"], None)
        == "bench.dataset=sharegpt__data_x_y.json,engine=hf"
    )
    long = sweep.point_name([f"+k{i}=" + "v" * 40 for i in range(5)], None)
    assert len(long) == sweep.MAX_NAME and long != sweep.point_name(
        [f"+k{i}=" + "v" * 40 for i in range(4)] + ["+k4=w"], None
    )
    assert sweep.axis_overrides(["engine=hf", "replicas=2"], ["replicas"]) == ["replicas=2"]


@pytest.mark.parametrize(
    "state,expected",
    [
        (dict(has_result=True, stored_measure_key="m", current_key=None), ("skip", "none", False)),
        (
            dict(has_result=True, stored_measure_key=None, current_key="k"),
            ("skip", "none", False),
        ),  # written by hand: trusted
        (
            dict(has_result=True, stored_measure_key="old", current_key="k"),
            ("measure", "reuse", False),
        ),  # config changed
        (dict(has_result=False, current_key=None), ("measure", "launch", False)),
        (dict(has_result=False, current_key="k"), ("measure", "reuse", False)),
        (dict(has_result=False, current_key="other"), ("measure", "launch", True)),
        (
            dict(has_result=False, current_key="other", problems=["bad"]),
            ("fail", "none", False),
        ),  # keeps the running server
        (dict(has_result=False, current_key="other", failed_server="OOM"), ("fail", "none", False)),
    ],
)
def test_decide(state, expected):
    kw = dict(stored_measure_key=None, measure_key="m", problems=[], key="k", failed_server=None)
    kw.update(state)
    d = sweep.decide(**kw)
    assert (d.action, d.server, d.stop_current) == expected
    assert d.stage == ("" if d.action != "fail" else "serve" if state.get("failed_server") else "validate")


def test_bench_problems_are_found_before_any_server_starts():
    ok = plain("bench=sharegpt_small")["bench"]
    assert sweep.bench_problems(ok) == []
    assert any("concurrency" in p for p in sweep.bench_problems({**ok, "concurrency": 0}))
    assert sweep.bench_problems({**ok, "concurrency": 0, "request_rate": 5.0}) == []  # open loop needs no concurrency
    assert any("nothing to measure" in p for p in sweep.bench_problems(plain()["bench"]))
    assert any(
        "bench.processes=16" in p and "bench.concurrency=8" in p for p in sweep.bench_problems({**ok, "processes": 16})
    )
    assert sweep.bench_problems({**ok, "processes": 4, "streams": 2}) == []


@pytest.mark.parametrize(
    "override,needle", [("bench.dataset=sharegpt", "bench.dataset='sharegpt'"), ("bench.streams=0", "bench.streams=0")]
)
def test_a_point_with_a_bad_bench_field_fails_validation(override, needle):
    """Each bench field's own domain (launcher/schema.py) is checked with the point's config, beside bench_problems."""
    from launcher.sweep.point import _validate

    cfg = compose(["bench=sharegpt_small", override])
    _, problems = _validate(cfg, plain("bench=sharegpt_small", override))
    assert any(needle in p and "fix:" in p for p in problems), problems


def test_bench_and_client_command_lines():
    b = plain("bench=sharegpt_small", "bench.concurrency=4")["bench"]
    args = sweep.bench_argv(b, "grpc://10.0.0.1:8001", "hf_model", "/s/p/result.json", tokenizer="/tok", label="p")
    assert args[:6] == ["--url", "grpc://10.0.0.1:8001", "--model", "hf_model", "--dataset-name", "synthetic"]
    assert "--concurrency" in args and args[args.index("--concurrency") + 1] == "4" and "--request-rate" not in args
    assert args[-2:] == ["--result-json", "/s/p/result.json"] and "--tokenizer" in args and "--ignore-eos" in args
    rate = sweep.bench_argv({**b, "request_rate": 2.5, "dataset": "sharegpt:/d/sg.json"}, "u", "m", "r")
    assert rate[rate.index("--request-rate") + 1] == "2.5" and "--concurrency" not in rate
    assert rate[rate.index("--dataset") + 1] == "/d/sg.json" and rate[rate.index("--dataset-name") + 1] == "sharegpt"
    on_cluster = client_argv("/venv/python", ["--url", "u"], job_id="123", container_args=["--container-image=img"])
    assert on_cluster == [
        "srun",
        "--jobid=123",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        "--mpi=none",
        "--container-image=img",
        "/venv/python",
        "-m",
        "launcher.bench.cli",
        "--url",
        "u",
    ]
    assert client_argv("/py", ["--url", "u"]) == ["/py", "-m", "launcher.bench.cli", "--url", "u"]
    assert "--processes" not in args and "--streams" not in args  # one process, one stream: the defaults
    spread = sweep.bench_argv({**b, "processes": 4, "streams": 2}, "u", "m", "r")
    assert spread[spread.index("--processes") + 1] == "4" and spread[spread.index("--streams") + 1] == "2"
    with_split = sweep.bench_argv(b, "u", "m", "r", server_metrics="http://10.0.0.1:8002/metrics")
    assert with_split[with_split.index("--server-metrics") + 1] == "http://10.0.0.1:8002/metrics"


def test_first_token_metrics_url_only_where_the_served_model_reports_it():
    hf = plan(["engine=hf"])[1]
    spec = lambda s, replicas=1: dataclasses.replace(s, replicas=replicas)  # noqa: E731
    ep = endpoint_record(metrics_url="http://10.0.0.1:8002/metrics")
    assert sweep.first_token_metrics_url(spec(hf), ep) == "http://10.0.0.1:8002/metrics"  # rank 0's own server
    vllm = spec(plan(["engine=vllm", "model.path=/m"])[1])
    assert sweep.first_token_metrics_url(vllm, ep) == "http://10.0.0.1:8002/metrics"  # the async runtime's split
    assert sweep.first_token_metrics_url(spec(plan(["engine=trtllm", "model.path=/m"])[1]), ep) == ""
    # with replicas: every replica leader's own server (endpoint.json's replicas), which the bench sums; the public
    # metrics port is the front end's
    assert sweep.first_token_metrics_url(spec(hf, replicas=2), ep) == (
        "http://10.0.0.1:41003/metrics,http://10.0.0.2:41004/metrics"
    )
    one_unknown = (ep.replicas[0], dataclasses.replace(ep.replicas[1], metrics_url=""))
    assert sweep.first_token_metrics_url(spec(hf, replicas=2), dataclasses.replace(ep, replicas=one_unknown)) == ""
    # disagg: the prefill replicas' (replicas 0..P-1) are named apart, so the bench splits the first token by role
    pd = dataclasses.replace(hf, replicas=2, prefill_replicas=1)
    assert sweep.prefill_metrics_url(pd, ep) == "http://10.0.0.1:41003/metrics"
    assert sweep.prefill_metrics_url(spec(hf, replicas=2), ep) == ""  # aggregated
    assert sweep.prefill_metrics_url(pd, dataclasses.replace(ep, replicas=one_unknown)) == ""
    b = plain("bench=sharegpt_small")["bench"]
    args = sweep.bench_argv(b, "u", "m", "r", server_metrics="a,b", prefill_metrics="a")
    assert args[args.index("--prefill-metrics") + 1] == "a"


def test_judge_bench():
    ok = {"metrics": {"completed": 3, "failed": 1}, "requests": []}
    assert sweep.judge_bench(1, ok) is None  # some failed requests are data
    assert "no request completed" in sweep.judge_bench(
        1, {"metrics": {"completed": 0, "failed": 4}, "requests": [{"error": "too long"}]}
    )
    assert "status 2" in sweep.judge_bench(2, None)


def test_allocation_problems_name_the_hydra_launcher_fix():
    env = {"SLURM_JOB_NUM_NODES": "1", "SLURM_CPUS_ON_NODE": "1", "SLURM_GPUS_ON_NODE": "1"}
    fixes = [fix for _, _, fix in allocation_problems(2, 2, 1, 2, env)]
    assert fixes == [
        "set hydra.launcher.nodes=2",
        "set hydra.launcher.cpus_per_task=2",
        "set hydra.launcher.gpus_per_node=2",
    ]
    assert allocation_problems(1, 2, 1, 2, {"SLURM_CPUS_ON_NODE": "2", "SLURM_GPUS_ON_NODE": "2"}) == []


# ----------------------------------------------------------------------------- the CLI (Hydra multirun)
def llmlaunch(cwd, *args, timeout=900):
    """`llmlaunch -m ARGS` in `cwd`; the random tiny model unless ARGS choose one (its servers start in seconds)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    model = [] if any(a.startswith("model=") for a in args) else ["model=tiny"]
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", "-m", *model, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_dry_run_prints_each_point_reuse_and_skips_and_writes_nothing(tmp_path):
    sweep_dir = tmp_path / "sweeps" / "s1"
    args = [
        "cluster=local_slurm",
        "replicas=1,2",
        "bench.concurrency=1,4",
        *TINY_LOAD,
        f"hydra.sweep.dir={sweep_dir}",
        "dry_run=true",
    ]
    r = llmlaunch(tmp_path, *args)
    assert r.returncode == 0, r.stderr
    assert (
        r.stdout.count("server: launch") == 1
        and r.stdout.count("then launch") == 1
        and r.stdout.count("server: reuse") == 2
    )
    assert r.stdout.count("load: srun '--jobid=<job id>' --overlap") == 4 and "#SBATCH --gpus-per-node=2" in r.stdout
    assert "4 points to measure on 2 server launches" in r.stderr
    assert not (tmp_path / "sweeps").exists()  # Hydra's sweep dir and multirun.yaml were taken back
    # a point already measured (with this config) is skipped; a client axis listed first draws the advice
    done = sweep_dir / "bench.concurrency=1,replicas=1"
    done.mkdir(parents=True)
    (done / "result.json").write_text("{}")
    r = llmlaunch(
        tmp_path,
        "cluster=local_slurm",
        "bench.concurrency=1,4",
        "replicas=1,2",
        *TINY_LOAD,
        f"hydra.sweep.dir={sweep_dir}",
        "dry_run=true",
    )
    assert r.returncode == 0, r.stderr
    assert "point 1/4 bench.concurrency=1,replicas=1: skipped, result.json exists" in r.stderr
    assert "list server-side axes first: replicas=1,2 bench.concurrency=1,4" in r.stderr
    assert sorted(p.name for p in sweep_dir.iterdir()) == [done.name]


def test_invalid_points_are_failure_records_not_a_crash(tmp_path):
    """Per-point validation (build_spec, the load settings) fails those points only; nothing is started."""
    sweep_dir = tmp_path / "s"
    stale = sweep_dir / "tp=1"  # measured before with another config: kept aside, not reported
    stale.mkdir(parents=True)
    (stale / "result.json").write_text("{}")
    (stale / "point.json").write_text(json.dumps({"measure_key": "old", "config": {"bench": {"concurrency": 8}}}))
    r = llmlaunch(
        tmp_path,
        "cluster=local_slurm",
        "tp=5,1",
        "bench.concurrency=0",
        *TINY_LOAD,
        f"hydra.sweep.dir={sweep_dir}",
        "cluster.jobs_dir=" + str(tmp_path / "jobs"),
    )
    assert r.returncode == 0, r.stderr
    assert "result.json was measured with another config (bench.concurrency: 8 -> 0" in r.stderr
    assert (stale / "result.previous.json").exists() and not (stale / "result.json").exists()
    for point, needle in (("tp=5", "needs 5 GPUs"), ("tp=1", "bench.concurrency=0")):
        f = json.loads((sweep_dir / point / "failure.json").read_text())
        assert f["stage"] == "validate" and needle in f["error"] and f"{point}" in f["overrides"]
    assert not (tmp_path / "jobs").exists()
    rows = list(csv.DictReader(open(sweep_dir / "summary.csv")))
    assert [r["status"] for r in rows] == ["failed", "failed"]


def test_an_accuracy_check_after_the_load_only_where_asked():
    """bench.eval: llmlaunch-bench --eval's command against the OpenAI API; its tasks checked with the config."""
    from launcher.sweep.point import _validate

    b = plain("bench=sharegpt_small")["bench"]
    assert b["eval"] == [] and sweep.eval_argv(b, "http://h:8003/v1", "/tok", "/p/eval.json") == []
    two = plain("bench=sharegpt_small", "bench.eval=[arithmetic,arithmetic_choice]")["bench"]
    assert sweep.eval_argv(two, "u", "/tok", "/e.json")[5:7] == ["--tasks", "arithmetic,arithmetic_choice"]
    args = sweep.eval_argv({**b, "eval": ["arithmetic"], "eval_limit": 20}, "http://h:8003/v1", "/tok", "/p/eval.json")
    assert args == [
        "--eval",
        "--url",
        "http://h:8003/v1",
        "--tokenizer",
        "/tok",
        "--tasks",
        "arithmetic",
        "--result-json",
        "/p/eval.json",
        "--limit",
        "20",
    ]
    bad = ["bench=sharegpt_small", "bench.eval=[gsm8k]"]
    _, problems = _validate(compose(bad), plain(*bad))
    assert any("bench.eval[0]='gsm8k'" in p and "arithmetic, arithmetic_choice" in p for p in problems), problems
