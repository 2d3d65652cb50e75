"""Bad input: a clear error naming the value and the fix, exit status 2, no traceback, nothing written."""

import os
import subprocess
import sys

import pytest

from launcher.cli import plan
from launcher.errors import LaunchError

LLMLAUNCH = [sys.executable, "-m", "launcher.cli"]

CASES = [
    (["engine=foo"], "engine=foo", "choose one of: hf, lmdeploy, sglang, trtllm, vllm"),
    (["cluster=nowhere"], "cluster=nowhere", "choose one of: local, local_slurm, luna, slurm"),
    (["engine=sglang", "model.path=/m", "tp=3"], "tp=3", "power of two"),
    (["engine=trtllm", "model.path=/m", "tp=6"], "tp=6", "use tp=1, 2, 4 or 8"),
    (["engine.prefill_chunk=-1"], "engine.prefill_chunk=-1", "set engine.prefill_chunk=0"),
    (["engine.response_processes=0"], "engine.response_processes=0", "set engine.response_processes=1"),
    (["engine.stream_interval_ms=-4"], "engine.stream_interval_ms=-4", "set engine.stream_interval_ms=0"),
    (
        ["cluster=local_slurm", "tp=2", "engine.response_processes=2"],
        "engine.response_processes=2",
        "set engine.response_processes=1",
    ),
    (["engine.torch_compile=maybe"], "engine.torch_compile='maybe'", "one of: auto, true, false"),
    (["engine.cudnn_attention=sometimes"], "engine.cudnn_attention='sometimes'", "one of: graphs, all, off"),
    (["tp=abc"], "tp=abc", "Integer"),
    (["cluster=local_slurm", "tp=4", "replicas=2"], "tp*pp*replicas=4*1*2=8", "set nodes=2"),
    (
        [
            "cluster=luna",
            "tp=8",
            "nodes=3",
            "engine.engine_dir=/e",
            "engine=trtllm",
            "engine.layout=ensemble",
            "model.path=/m",
        ],
        "nodes=3",
        "cannot be spread evenly",
    ),
    (["cluster=luna", "engine=lmdeploy", "model.path=/m", "tp=16", "nodes=2"], "engine=lmdeploy", "TurboMind"),
    (["cluster=luna", "engine=trtllm", "engine.layout=ensemble"], "engine.engine_dir=''", "engine.engine_dir="),
    (["cluster=luna", "engine=trtllm"], "model.path=''", "Hugging Face checkpoint"),
    (
        ["cluster=luna", "engine=trtllm", "model.path=/m", "engine.layout=engine"],
        "engine.layout='engine'",
        "set engine.layout to one of: llmapi, ensemble",
    ),
    (
        ["cluster=luna", "engine=trtllm", "model.path=/m", "tp=8", "replicas=2", "nodes=2"],
        "replicas=2 with tp*pp=8",
        "set replicas=1",
    ),
    (["engine=trtllm", "model.path=/m", "tp=2"], "tp*pp=2 with cluster.scheduler='local'", "cluster=local_slurm"),
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
    (
        ["cluster=local_slurm", "cluster.time=00:02:00"],
        "cluster.time=00:02:00",
        "set cluster.time=00:16:00 or more, or lower serve.ready_timeout_s",
    ),
    (
        ["cluster=slurm", "cluster.time=10", "serve.ready_timeout_s=600"],
        "less than serve.ready_timeout_s=600",
        "set cluster.time=00:11:00",
    ),
    (
        ["cluster=local_slurm", "serve.walltime_signal_s=20"],
        "serve.walltime_signal_s=20",
        "set serve.walltime_signal_s=40 or more",
    ),
    (["cluster=slurm", "requeue=true"], "requeue=true", "cluster.allows_requeue=true"),
    (["requeue=true"], "requeue=true", "a Slurm cluster profile whose cluster.allows_requeue is true"),
    (
        ["cluster=local_slurm", "serve.rendezvous_timeout_s=0"],
        "serve.rendezvous_timeout_s=0",
        "serve.rendezvous_timeout_s=600",
    ),
    (["engine=hf", "model.make=", "model.path="], "model.path=''", "model=tiny"),
    (["cluster=luna", "cluster.container.image="], "cluster.container.image=''", "pyxis"),
    (["nosuchkey=1"], "nosuchkey", "check the spelling"),
    (
        ["engine=vllm", "model.path=/m", "+engine.gpu_mem=0.5"],
        "engine.gpu_mem",
        "no such key in launcher/schema.py for engine=vllm",
    ),
    # a free mapping's keys need no `+`; a key beside it is still refused, and another engine's mapping too
    (["engine=vllm", "model.path=/m", "engine.gpu_mem=0.5"], "engine.gpu_mem", "no such key in launcher/schema.py"),
    (["cluster.envs.X=1"], "cluster.envs.X", "did you mean cluster.env.X?"),
    (
        ["engine=hf", "engine.engine_args.enforce_eager=true"],
        "engine.engine_args",
        "no such key in launcher/schema.py for engine=hf",
    ),
    # kv routing needs an engine that publishes KV-cache events, a prefix cache, and a tokenizer.json
    (
        ["engine=lmdeploy", "model.path=/m", "replicas=2", "serve.routing=kv"],
        "publishes no KV-cache events (engines that do: hf, vllm)",
        "use serve.routing=prefix",
    ),
    (
        [
            "engine=vllm",
            "model.path=/m",
            "replicas=2",
            "serve.routing=kv",
            "engine.engine_args.kv_events_config.topic=x",
        ],
        "engine.engine_args.kv_events_config",
        "remove engine.engine_args.kv_events_config",
    ),
    (
        ["model=tiny", "replicas=2", "serve.routing=kv", "engine.prefix_caching=false"],
        "keeps no prefix cache to route to",
        "set engine.prefix_caching=true",
    ),
    # a service (serve.router=host|job): replica jobs need Slurm; each takes nodes/replicas nodes; no requeue
    (["serve.router=host", "model=tiny"], "serve.router=host with cluster=local", "use a Slurm cluster profile"),
    (
        ["cluster=local_slurm", "serve.router=host", "model=tiny", "replicas=2", "nodes=3"],
        "nodes=3 replicas=2",
        "give nodes a multiple of replicas",
    ),
    (
        ["cluster=local_slurm", "serve.router=job", "model=tiny", "requeue=true", "cluster.allows_requeue=true"],
        "requeue=true with serve.router=job",
        "drop requeue=true",
    ),
    (
        ["cluster=local_slurm", "serve.router=host", "model=tiny", "replicas=5", "serve.autoscale.max_replicas=4"],
        "replicas=5 serve.autoscale.min_replicas=1 serve.autoscale.max_replicas=4",
        "min_replicas <= replicas <= max_replicas",
    ),
    (
        [
            "cluster=local_slurm",
            "serve.router=host",
            "model=tiny",
            "serve.autoscale.max_replicas=4",
            "serve.autoscale.down_at=8",
            "serve.autoscale.up_at=4",
        ],
        "serve.autoscale.down_at=8 serve.autoscale.up_at=4",
        "give down_at below up_at",
    ),
    # what it scales by: a signal the engine reports, a target where the signal has none, bounds in its unit
    (
        [
            "cluster=local_slurm",
            "serve.router=host",
            "engine=sglang",
            "model.path=/m",
            "serve.autoscale.max_replicas=4",
            "serve.autoscale.signal=kv_cache",
        ],
        "serve.autoscale.signal=kv_cache with engine=sglang",
        "use an engine that does (hf, vllm)",
    ),
    (
        [
            "cluster=local_slurm",
            "serve.router=host",
            "model=tiny",
            "serve.autoscale.max_replicas=4",
            "serve.autoscale.signal=ttft_p90",
        ],
        "serve.autoscale.signal=ttft_p90 serve.autoscale.up_at=0",
        "give serve.autoscale.up_at, your target",
    ),
    (
        [
            "cluster=local_slurm",
            "serve.router=host",
            "model=tiny",
            "serve.autoscale.max_replicas=4",
            "serve.autoscale.signal=kv_cache",
            "serve.autoscale.up_at=8",
        ],
        "serve.autoscale.signal=kv_cache serve.autoscale.up_at=8",
        "give up_at and down_at in its unit (e.g. up_at=0.8 down_at=0.4)",
    ),
    (
        ["cluster=local_slurm", "serve.router=host", "model=tiny", "serve.routing=kv"],
        "serve.routing=kv with serve.router=host",
        "use serve.routing=prefix",
    ),
    (
        ["cluster=local_slurm", "serve.router=host", "model=tiny", "serve.control_port=8001"],
        "serve.control_port=8001",
        "give serve.control_port its own port",
    ),
    # prefill and decode replicas: both roles, the replicas they make, an engine that moves keys and values
    (["model=tiny", "disagg.prefill=2"], "disagg.prefill=2 disagg.decode=0", "give both at least 1"),
    (
        ["model=tiny", "disagg.prefill=1", "disagg.decode=2", "replicas=2"],
        "replicas=2 disagg.prefill=1 disagg.decode=2",
        "leave replicas out (it becomes 3), or give replicas=3",
    ),
    (
        ["engine=sglang", "model.path=/m", "disagg.prefill=1", "disagg.decode=1"],
        "disagg.prefill=1 disagg.decode=1 with engine=sglang",
        "use an engine that does (hf, vllm)",
    ),
    (["model=tiny", "disagg.prefill=1", "disagg.decode=1", "tp=2"], "tp=2 disagg.prefill=1", "use tp=1"),
    (
        ["engine=vllm", "model.path=/m", "disagg.prefill=1", "disagg.decode=1", "pp=2", "nodes=1"],
        "pp=2 disagg.prefill=1",
        "use pp=1",
    ),
    (
        ["cluster=local_slurm", "serve.router=host", "model=tiny", "disagg.prefill=1", "disagg.decode=1"],
        "serve.router=host disagg.prefill=1 disagg.decode=1",
        "use serve.router=in_job",
    ),
    (
        ["model=tiny", "disagg.prefill=1", "disagg.decode=1", "engine.prefix_caching=false"],
        "disagg.prefill=1 with engine.prefix_caching=false",
        "leave engine.prefix_caching at true",
    ),
]


def test_prefill_and_decode_replicas_are_the_replicas_first_the_prefill_ones():
    _, spec = plan(["model=tiny", "disagg.prefill=2", "disagg.decode=1"])
    assert (spec.replicas, spec.prefill_replicas) == (3, 2)
    assert [spec.role(r) for r in range(3)] == ["prefill", "prefill", "decode"]
    _, plain = plan(["model=tiny", "replicas=2"])
    assert plain.prefill_replicas == 0 and plain.role(1) == ""


def test_a_service_spec_is_one_replica_jobs_and_counts_the_jobs_it_starts_with():
    _, spec = plan(["cluster=local_slurm", "serve.router=host", "model=tiny", "replicas=2", "nodes=4", "tp=2"])
    assert (spec.replicas, spec.nodes, spec.world_size, spec.service_replicas) == (1, 2, 2, 2)
    _, plain = plan(["cluster=local_slurm", "model=tiny", "replicas=2", "nodes=2"])
    assert (plain.replicas, plain.service_replicas, plain.service) == (2, 0, None)


@pytest.mark.parametrize("overrides,what,fix", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_names_value_and_fix(overrides, what, fix):
    with pytest.raises(LaunchError) as e:
        plan(overrides)
    text = e.value.render()
    assert what in text and fix in text, text


def test_trtllm_layout_says_which_model_path_it_needs(tmp_path):
    """engine.layout=llmapi serves a Hugging Face folder, the ensemble a built engine: where the folder exists
    here, the wrong kind is refused naming the layout that serves it."""
    engine_dir, hf_dir, other = tmp_path / "engine", tmp_path / "hf", tmp_path / "other"
    for d in (engine_dir, hf_dir, other):
        d.mkdir()
    (engine_dir / "rank0.engine").write_bytes(b"")
    (engine_dir / "config.json").write_text("{}")
    (hf_dir / "config.json").write_text("{}")
    cases = [
        (["engine=trtllm", f"model.path={engine_dir}"], "holds a built TensorRT engine", "engine.layout=ensemble"),
        (["engine=trtllm", f"model.path={other}"], "has no config.json", "a folder with config.json"),
        (
            ["engine=trtllm", "engine.layout=ensemble", f"model.path={hf_dir}"],
            "holds no rank<N>.engine file",
            "engine.layout=llmapi",
        ),
    ]
    for overrides, why, fix in cases:
        with pytest.raises(LaunchError) as e:
            plan(overrides)
        assert why in e.value.render() and fix in e.value.render(), e.value.render()
    assert plan(["engine=trtllm", f"model.path={hf_dir}"])[1].model_name == "tensorrt_llm"
    assert plan(["engine=trtllm", "engine.layout=ensemble", f"model.path={engine_dir}"])[1].model_name == "ensemble"


def test_several_problems_reported_together():
    with pytest.raises(LaunchError) as e:
        plan(["tp=0", "serve.grpc_port=0", "job_name=x y"])
    assert len(e.value.problems) == 3


@pytest.mark.parametrize(
    "args,needle",
    [
        (["engine=sglang", "model.path=/m", "tp=3", "dry_run=true"], "tp=3"),
        (["engine=foo", "dry_run=true"], "engine=foo"),
        (["tp=abc", "dry_run=true"], "tp=abc"),
    ],
)
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
    r = subprocess.run(
        LLMLAUNCH + ["cluster=luna", "engine=trtllm", "tp=8", "model.path=/m", "dry_run=true"],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    for needle in (
        "===== composed config",
        "===== rank layout",
        "model_repository/tensorrt_llm/1/model.yaml",
        "tensor_parallel_size: 8",
        "#SBATCH --ntasks-per-node=8",
        "--mpi=pmix",
        "rank 0: trtllm-llmapi-launch tritonserver ",
        "rank 7: trtllm-llmapi-launch\n",
    ):
        assert needle in r.stdout
    assert list(cwd.iterdir()) == [] and list((tmp_path / "home").iterdir()) == []


def test_cli_validates_a_launch_once(monkeypatch, capsys):
    """`llmlaunch ... dry_run=true` composes and validates once and prints the plan of that spec."""
    import launcher.validate
    from launcher import cli

    calls = []
    real = launcher.validate.build_spec
    monkeypatch.setattr(
        launcher.validate, "build_spec", lambda cfg, schedulers: calls.append(1) or real(cfg, schedulers)
    )
    cli.main(
        ["cluster=luna", "engine=trtllm", "tp=8", "engine.engine_dir=/e", "model.path=/m", "run_dir=/x", "dry_run=true"]
    )
    assert len(calls) == 1
    assert "#SBATCH --ntasks-per-node=8" in capsys.readouterr().out


@pytest.mark.parametrize("prefix", ["", "+", "++"])
def test_keys_of_a_free_mapping_take_either_spelling(prefix):
    """engine.engine_args (vLLM's AsyncEngineArgs), engine.extra_args and cluster.env hold the user's own keys:
    `engine.engine_args.enforce_eager=true` adds one as `+engine.engine_args.enforce_eager=true` does."""
    from launcher.compose import free_mappings

    assert {"engine.engine_args", "engine.extra_args", "cluster.env"} <= set(free_mappings())
    _, spec = plan(
        [
            "engine=vllm",
            "model.path=/m",
            f"{prefix}engine.engine_args.enforce_eager=true",
            f"{prefix}cluster.env.NCCL_DEBUG=WARN",
        ]
    )
    assert spec.engine.engine_args["enforce_eager"] is True and spec.cluster.env["NCCL_DEBUG"] == "WARN"
    _, spec = plan(["engine=sglang", "model.path=/m", f"{prefix}engine.extra_args.chunked_prefill_size=512"])
    assert spec.engine.extra_args == {"chunked_prefill_size": 512}


def test_cli_takes_a_free_mapping_key_without_plus(tmp_path):
    """The command line as a user types it: the plan's model.json carries the engine argument."""
    env = {**os.environ, "HOME": str(tmp_path)}
    r = subprocess.run(
        LLMLAUNCH + ["engine=vllm", "engine.engine_args.enforce_eager=true", "model.path=/tmp", "dry_run=true"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert '"enforce_eager": true' in r.stdout


# What a new user typed that used to reach a started server (or be accepted): each now exits 2 before anything
# starts, naming the key and the fix. <hf> is a Hugging Face-shaped folder. The GPU is hidden
# (CUDA_VISIBLE_DEVICES=''), so the device row is the same on a machine with one.
FIRST_TRIES = [
    (["model.make=", "model.path=/nonexistent"], "model.path='/nonexistent'", "no such file or folder"),
    (
        ["model.path=<hf>", "model.tokenizer=/nonexistent-tok"],
        "model.tokenizer='/nonexistent-tok'",
        "no such file or folder",
    ),
    (
        ["cluster=local_slurm", "model.make=", "model.path=/nonexistent"],
        "model.path='/nonexistent'",
        "no such file or folder",
    ),
    (["engine.device=cuda"], "engine.device='cuda'", "CUDA_VISIBLE_DEVICES=''"),
    (["model.max_model_len=-3", "dry_run=true"], "model.max_model_len=-3", "0 = the model's own"),
    (["engine.prefill_chunk=-1", "dry_run=true"], "engine.prefill_chunk=-1", "0 = the engine's default"),
    (["job_name=a", "b"], "'b'", "'job_name=a b'"),
]


@pytest.mark.parametrize("args,what,why", FIRST_TRIES, ids=[" ".join(c[0]) for c in FIRST_TRIES])
def test_first_tries_fail_before_anything_starts(args, what, why, tmp_path):
    from tests.unit.test_field_domains import make_hf_folder

    hf = make_hf_folder(tmp_path / "hf")
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "CUDA_VISIBLE_DEVICES": ""}
    args = [a.replace("<hf>", str(hf)) for a in args]
    r = subprocess.run(
        LLMLAUNCH + args + [f"run_dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        cwd=home,
        env=env,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert what in r.stderr and why in r.stderr and "fix:" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists() and list(home.iterdir()) == []


@pytest.mark.parametrize(
    "argv,what,fix",
    [
        (["job_name=a", "b"], "'b'", "quote the whole override for the shell: 'job_name=a b'"),
        (["tp=2", "stray"], "'stray'", "'tp=2 stray'"),
        (["stray"], "'stray'", "write it as key=value"),
        (["job_name=a;b"], "job_name=a;b", "it stops at ';'"),
        (["tp=("], "tp=(", "Hydra cannot parse this override"),
    ],
)
def test_a_word_that_is_no_override_says_what_and_how_to_quote(argv, what, fix):
    with pytest.raises(LaunchError) as e:
        plan(argv)
    text = e.value.render()
    assert what in text and fix in text and "quote" in text, text


def test_a_flags_value_is_no_stray_word():
    from launcher.compose import check_words

    check_words(["--cfg", "job", "tp=2"])  # Hydra's --cfg takes `job`: nothing to report


def test_a_multirun_with_a_stray_word_exits_2(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path)}
    r = subprocess.run(LLMLAUNCH + ["-m", "job_name=a", "b"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 2 and "'job_name=a b'" in r.stderr, r.stderr
