"""Bad input: a clear error naming the value and the fix, exit status 2, no traceback, nothing written."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli import plan
from launcher.errors import LaunchError

LLMLAUNCH = [sys.executable, "-m", "launcher.cli"]

CASES = [
    (["engine=foo"], "engine=foo", "choose one of: hf, lmdeploy, sglang, trtllm, vllm"),
    (["cluster=nowhere"], "cluster=nowhere", "choose one of: local, local_slurm, luna, slurm"),
    (["tp=3"], "tp=3", "power of two"),
    (["engine.prefill_chunk=-1"], "engine.prefill_chunk=-1", "set engine.prefill_chunk=0"),
    (["engine.response_processes=0"], "engine.response_processes=0", "set engine.response_processes=1"),
    (["engine.stream_interval_ms=-4"], "engine.stream_interval_ms=-4", "set engine.stream_interval_ms=0"),
    (["cluster=local_slurm", "tp=2", "engine.response_processes=2"], "engine.response_processes=2", "set engine.response_processes=1"),
    (["engine.torch_compile=maybe"], "engine.torch_compile='maybe'", "one of: auto, true, false"),
    (["engine.cudnn_attention=sometimes"], "engine.cudnn_attention='sometimes'", "one of: graphs, all, off"),
    (["tp=abc"], "tp=abc", "Integer"),
    (["cluster=local_slurm", "tp=4", "replicas=2"], "tp*pp*replicas=4*1*2=8", "set nodes=2"),
    (["cluster=luna", "tp=8", "nodes=3", "engine.engine_dir=/e", "engine=trtllm", "model.path=/m"], "nodes=3", "cannot be spread evenly"),
    (["cluster=luna", "engine=lmdeploy", "model.path=/m", "tp=16", "nodes=2"], "engine=lmdeploy", "TurboMind"),
    (["cluster=luna", "engine=trtllm"], "engine.engine_dir=''", "engine.engine_dir="),
    (["cluster=luna", "engine=vllm"], "model.path=''", "model.path="),
    (["engine=vllm", "model.path=/m", "engine.frontends=0"], "engine.frontends=0", "set engine.frontends=1, or 4"),
    (["serve.grpc_port=70000"], "serve.grpc_port=70000", "1-65535"),
    (["serve.grpc_port=8000"], "serve.http_port=8000", "the same port as serve.grpc_port"),
    (["serve.openai_port=0"], "serve.openai_port=0", "1-65535"),
    (["serve.openai_port=8001"], "serve.openai_port=8001", "the same port as serve.grpc_port"),
    (["job_name='a;b'"], "job_name='a;b'", "letters, digits"),
    (["job_name=a;b"], "job_name=a;b", "quote the value"),
    (["cluster=slurm", "cluster.partition='a b'"], "cluster.partition='a b'", "#SBATCH"),
    (["cluster=slurm", "cluster.account='$(id)'"], "cluster.account='$(id)'", "#SBATCH"),
    (["cluster=slurm", "+cluster.env.bad-key=1"], "cluster.env key 'bad-key'", "valid environment variable name"),
    (["cluster=slurm", "cluster.time=forever"], "cluster.time='forever'", "HH:MM:SS"),
    (["cluster=slurm", "cluster.mpi=none"], "cluster.mpi='none'", "pmix"),
    (["nodes=2"], "nodes=2", "cluster=local runs on this one machine"),
    # the time limit against the load time, the drain signal against the drain, requeue against the site
    (["cluster=local_slurm", "cluster.time=00:02:00"], "cluster.time=00:02:00", "set cluster.time=00:16:00 or more, or lower serve.ready_timeout_s"),
    (["cluster=slurm", "cluster.time=10", "serve.ready_timeout_s=600"], "less than serve.ready_timeout_s=600", "set cluster.time=00:11:00"),
    (["cluster=local_slurm", "serve.walltime_signal_s=20"], "serve.walltime_signal_s=20", "set serve.walltime_signal_s=40 or more"),
    (["cluster=slurm", "requeue=true"], "requeue=true", "cluster.allows_requeue=true"),
    (["requeue=true"], "requeue=true", "a Slurm cluster profile whose cluster.allows_requeue is true"),
    (["cluster=local_slurm", "serve.rendezvous_timeout_s=0"], "serve.rendezvous_timeout_s=0", "serve.rendezvous_timeout_s=600"),
    (["engine=hf", "model.make=", "model.path="], "model.path=''", "model=tiny"),
    (["cluster=luna", "cluster.container.image="], "cluster.container.image=''", "pyxis"),
    (["nosuchkey=1"], "nosuchkey", "+key=value"),
    (["engine=vllm", "model.path=/m", "+engine.gpu_mem=0.5"], "engine.gpu_mem", "no such key in launcher/schema.py for engine=vllm"),
    # a free mapping's keys need no `+`; a key beside it still does, and another engine's mapping is refused
    (["engine=vllm", "model.path=/m", "engine.gpu_mem=0.5"], "engine.gpu_mem", "+key=value"),
    (["cluster.envs.X=1"], "cluster.envs.X", "+key=value"),
    (["engine=hf", "engine.engine_args.enforce_eager=true"], "engine.engine_args", "no such key in launcher/schema.py for engine=hf"),
]


@pytest.mark.parametrize("overrides,what,fix", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_names_value_and_fix(overrides, what, fix):
    with pytest.raises(LaunchError) as e:
        plan(overrides)
    text = e.value.render()
    assert what in text and fix in text, text


def test_several_problems_reported_together():
    with pytest.raises(LaunchError) as e:
        plan(["tp=3", "serve.grpc_port=0", "job_name=x y"])
    assert len(e.value.problems) == 3


@pytest.mark.parametrize("args,needle", [(["tp=3", "dry_run=true"], "tp=3"), (["engine=foo", "dry_run=true"], "engine=foo"), (["tp=abc", "dry_run=true"], "tp=abc")])
def test_cli_exit_2_no_traceback(args, needle, tmp_path):
    env = {**os.environ, "HOME": str(tmp_path)}
    r = subprocess.run(LLMLAUNCH + args, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 2
    assert needle in r.stderr and "fix:" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_dry_run_prints_plan_and_writes_nothing(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    (tmp_path / "home").mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    r = subprocess.run(LLMLAUNCH + ["cluster=luna", "engine=trtllm", "tp=8", "engine.engine_dir=/e", "model.path=/m", "dry_run=true"], capture_output=True, text=True, cwd=cwd, env=env)
    assert r.returncode == 0, r.stderr
    for needle in ("===== composed config", "===== rank layout", "model_repository/ensemble/config.pbtxt", "#SBATCH --ntasks-per-node=8", "rank 7: "):
        assert needle in r.stdout
    assert list(cwd.iterdir()) == [] and list((tmp_path / "home").iterdir()) == []


def test_cli_validates_a_launch_once(monkeypatch, capsys):
    """`llmlaunch ... dry_run=true` composes and validates once and prints the plan of that spec."""
    import launcher.spec
    from launcher import cli

    calls = []
    real = launcher.spec.build_spec
    monkeypatch.setattr(launcher.spec, "build_spec", lambda cfg: calls.append(1) or real(cfg))
    cli.main(["cluster=luna", "engine=trtllm", "tp=8", "engine.engine_dir=/e", "model.path=/m", "run_dir=/x", "dry_run=true"])
    assert len(calls) == 1
    assert "#SBATCH --ntasks-per-node=8" in capsys.readouterr().out


@pytest.mark.parametrize("prefix", ["", "+", "++"])
def test_keys_of_a_free_mapping_take_either_spelling(prefix):
    """engine.engine_args (vLLM's AsyncEngineArgs), engine.extra_args and cluster.env hold the user's own keys:
    `engine.engine_args.enforce_eager=true` adds one as `+engine.engine_args.enforce_eager=true` does."""
    from launcher.schema import free_mappings

    assert {"engine.engine_args", "engine.extra_args", "cluster.env"} <= set(free_mappings())
    _, spec = plan(["engine=vllm", "model.path=/m", f"{prefix}engine.engine_args.enforce_eager=true", f"{prefix}cluster.env.NCCL_DEBUG=WARN"])
    assert spec.engine.engine_args["enforce_eager"] is True and spec.cluster.env["NCCL_DEBUG"] == "WARN"
    _, spec = plan(["engine=sglang", "model.path=/m", f"{prefix}engine.extra_args.chunked_prefill_size=512"])
    assert spec.engine.extra_args == {"chunked_prefill_size": 512}


def test_cli_takes_a_free_mapping_key_without_plus(tmp_path):
    """The command line as a user types it: the plan's model.json carries the engine argument."""
    env = {**os.environ, "HOME": str(tmp_path)}
    r = subprocess.run(LLMLAUNCH + ["engine=vllm", "engine.engine_args.enforce_eager=true", "model.path=/tmp", "dry_run=true"],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert '"enforce_eager": true' in r.stdout
