"""Who runs what on which rank, for the third-party engines, from the launch spec (pure: no servers).

For 2 nodes x 8 GPUs and one model copy over both (tp=16), the engines' rank hooks
(launcher/engines/registry.py) are called with a RankContext built here, and the pure parts
of their model.py files (engine arguments from config parameters and the rank's environment)
are checked against the addresses and ports of that context.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest

from launcher.cli import plan
from launcher.engines.registry import ENGINES
from launcher.errors import LaunchError
from launcher.rank.rendezvous import RankContext
from launcher.rank.topology import Topology, rank_environment
from launcher.render import repository_files, tritonserver_argv

ROOT = Path(__file__).resolve().parents[2]
LEADER, DIST_PORT = "10.0.0.1", 29555


def spec_for(*overrides):
    return plan(["cluster=slurm", "model.path=/models/llama-70b", *overrides])[1]


def contexts(spec):
    """One RankContext per rank; rank r lives on host 10.0.0.<node+1>."""
    hosts = tuple(f"10.0.0.{r.node + 1}" for r in spec.ranks)
    out = []
    for r in spec.ranks:
        leader = spec.ranks[r.rank - r.group_rank]
        out.append(
            RankContext(
                rank=r,
                job_id="4242",
                leader_addr=hosts[leader.rank],
                dist_port=DIST_PORT,
                hosts=hosts,
                ports={"grpc_port": 8001, "http_port": 8000, "metrics_port": 8002} if r.role == "leader" else {},
            )
        )
    return out


def env_of(spec, ctx):
    env = rank_environment(spec, ctx, Path("/jobs/run"), [str(i) for i in range(8)])
    env.update(ENGINES[spec.engine.name].rank_env(spec, ctx))
    return env


def load_model_module(engine: str):
    """A fresh copy of an engine's Triton model module (launcher/engines/<engine>/model.py, or trtllm/<model>: its
    models/<model>.py) outside Triton (a stub triton_python_backend_utils)."""
    stub = "triton_python_backend_utils" not in sys.modules
    if stub:
        sys.modules["triton_python_backend_utils"] = types.ModuleType("triton_python_backend_utils")
    try:
        package, _, model = engine.partition("/")
        mod_spec = importlib.util.find_spec(f"launcher.engines.{package}." + (f"models.{model}" if model else "model"))
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
        return module
    finally:
        if stub:
            del sys.modules["triton_python_backend_utils"]


def config_params(spec):
    from launcher import pbtxt

    cfg = pbtxt.parse(repository_files(spec)[f"{spec.model_name}/config.pbtxt"])
    return {k: v.string_value for k, v in cfg.parameters.items()}


# ----------------------------------------------------------------------------- vLLM
def test_vllm_two_nodes_leader_serves_and_the_other_node_joins_ray():
    spec = spec_for("engine=vllm", "tp=16", "nodes=2")
    assert [(r.rank, r.node, r.role, r.serves, r.gpus) for r in spec.ranks] == [
        (0, 0, "leader", "public", tuple(range(8))),
        (1, 1, "worker", "none", tuple(range(8))),
    ]
    leader, worker = contexts(spec)
    edef = ENGINES["vllm"]
    assert edef.rank_command(spec, leader) is None  # tritonserver; its model starts the Ray head
    argv = tritonserver_argv(spec, spec.ranks[0], job_id="4242")
    assert "--grpc-port=8001" in argv and "--allow-grpc=false" not in argv
    assert edef.rank_command(spec, worker) == [
        spec.python,
        "-m",
        "launcher.engines.ray",
        "worker",
        f"--address={LEADER}:{DIST_PORT}",
        "--timeout=900",
        "--node-ip-address=10.0.0.2",
    ]
    e0, e1 = env_of(spec, leader), env_of(spec, worker)
    assert (e0["VLLM_HOST_IP"], e1["VLLM_HOST_IP"]) == ("10.0.0.1", "10.0.0.2")
    assert e0["_LLMLAUNCH_LEADER_ADDR"] == e1["_LLMLAUNCH_LEADER_ADDR"] == LEADER and e1["_LLMLAUNCH_DIST_PORT"] == str(
        DIST_PORT
    )
    assert e1["_LLMLAUNCH_GROUP_RANK"] == "1" and e1["_LLMLAUNCH_GROUP_SIZE"] == "2"
    args = json.loads(repository_files(spec)["vllm_model/1/model.json"])
    assert (args["tensor_parallel_size"], args["distributed_executor_backend"]) == (16, "ray")
    assert config_params(spec)["nnodes"] == "2"


def test_vllm_one_node_needs_no_ray():
    spec = spec_for("engine=vllm", "tp=8")
    (ctx,) = contexts(spec)
    assert ENGINES["vllm"].rank_command(spec, ctx) is None and ENGINES["vllm"].rank_env(spec, ctx) == {}
    assert json.loads(repository_files(spec)["vllm_model/1/model.json"])["distributed_executor_backend"] == "mp"


def test_vllm_mp_executor_cannot_span_nodes():
    with pytest.raises(LaunchError, match="Ray executor"):
        spec_for("engine=vllm", "tp=16", "nodes=2", "engine.distributed_executor_backend=mp")


def test_vllm_engine_args_file_and_sampling_mapping():
    m = load_model_module("vllm")
    fields = {"model", "tensor_parallel_size", "enable_log_requests"}
    assert m.engine_kwargs({"model": "x", "disable_log_requests": True}, fields) == {
        "model": "x",
        "enable_log_requests": False,
    }
    with pytest.raises(ValueError, match=r"no \['tensor_parallel'\]"):
        m.engine_kwargs({"tensor_parallel": 2}, fields)
    from launcher.python_backend.triton_io import SamplingParams

    kw = m.sampling_kwargs(
        SamplingParams(max_tokens=9, top_k=0, seed=3, stop=("x",), bad_words=("y",), end_id=7, ignore_eos=True)
    )
    assert (
        kw["max_tokens"],
        kw["top_k"],
        kw["seed"],
        kw["stop"],
        kw["bad_words"],
        kw["stop_token_ids"],
        kw["ignore_eos"],
    ) == (9, -1, 3, ["x"], ["y"], [7], True)


# ----------------------------------------------------------------------------- SGLang
def test_sglang_two_nodes_every_node_runs_the_engine_node0_serves():
    spec = spec_for("engine=sglang", "tp=16", "nodes=2")
    leader, worker = contexts(spec)
    edef = ENGINES["sglang"]
    assert edef.rank_command(spec, leader) is None and edef.rank_command(spec, worker) is None
    argv1 = tritonserver_argv(spec, spec.ranks[1], job_id="4242")
    assert {
        "--allow-grpc=false",
        "--allow-http=false",
        "--model-control-mode=explicit",
        "--load-model=sglang_model",
    } <= set(argv1)
    assert edef.rank_env(spec, leader) == {} and edef.rank_env(spec, worker) == {
        "SGLANG_BLOCK_NONZERO_RANK_CHILDREN": "0"
    }
    m = load_model_module("sglang")
    params = config_params(spec)
    kw0 = m.server_args_kwargs(params, env_of(spec, leader))
    kw1 = m.server_args_kwargs(params, env_of(spec, worker))
    assert (kw0["nnodes"], kw0["node_rank"], kw0["dist_init_addr"], kw0["tp_size"]) == (
        2,
        0,
        f"{LEADER}:{DIST_PORT}",
        16,
    )
    assert (kw1["nnodes"], kw1["node_rank"], kw1["dist_init_addr"]) == (2, 1, f"{LEADER}:{DIST_PORT}")
    assert kw0["model_path"] == "/models/llama-70b" and kw0["max_running_requests"] == 256


def test_sglang_one_node_has_no_distributed_init():
    spec = spec_for("engine=sglang", "tp=4", "replicas=2")
    m = load_model_module("sglang")
    for ctx in contexts(spec):
        kw = m.server_args_kwargs(config_params(spec), env_of(spec, ctx))
        assert kw["nnodes"] == 1 and "dist_init_addr" not in kw and kw["tp_size"] == 4
        assert env_of(spec, ctx)["CUDA_VISIBLE_DEVICES"] == ",".join(str(g) for g in ctx.rank.gpus)


@pytest.mark.parametrize(
    "kernel_files, extra_args, backend",
    [
        (["common_ops.abi3.so"], {}, "triton"),  # a kernel package without FlashAttention-3: triton attention
        (["common_ops.abi3.so", "flash_ops.abi3.so"], {}, None),  # the whole package: SGLang's own default
        (None, {}, None),  # no sgl_kernel: SGLang says so itself
        (["common_ops.abi3.so"], {"decode_attention_backend": "flashinfer"}, None),  # the user's choice stays
        (["common_ops.abi3.so"], {"attention_backend": "flashinfer"}, "flashinfer"),
    ],
)
def test_sglang_attention_backend_follows_the_installed_kernels(
    tmp_path, monkeypatch, kernel_files, extra_args, backend
):
    """SGLang's Hopper default is FlashAttention-3, which a trimmed sgl_kernel lacks; the model reads the installed
    package's files (a package folder made here: sgl_kernel's CUDA ops cannot load on this machine)."""
    if kernel_files is not None:
        (tmp_path / "sgl_kernel").mkdir()
        (tmp_path / "sgl_kernel" / "__init__.py").write_text("raise ImportError('never imported')\n")
        for name in kernel_files:
            (tmp_path / "sgl_kernel" / name).write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    overrides = [f"engine.extra_args.{k}={v}" for k, v in extra_args.items()]
    spec = spec_for("engine=sglang", *overrides)
    m = load_model_module("sglang")
    kw = m.server_args_kwargs(config_params(spec), env_of(spec, contexts(spec)[0]))
    assert kw.get("attention_backend") == backend


# ----------------------------------------------------------------------------- LMDeploy
def test_lmdeploy_turbomind_stays_on_one_node():
    with pytest.raises(LaunchError, match="TurboMind"):
        spec_for("engine=lmdeploy", "tp=16", "nodes=2")


def test_lmdeploy_pytorch_two_nodes_uses_ray_like_vllm():
    spec = spec_for("engine=lmdeploy", "engine.backend=pytorch", "tp=16", "nodes=2")
    leader, worker = contexts(spec)
    edef = ENGINES["lmdeploy"]
    assert edef.rank_command(spec, leader) is None
    assert edef.rank_command(spec, worker)[2:5] == ["launcher.engines.ray", "worker", f"--address={LEADER}:{DIST_PORT}"]
    assert edef.rank_env(spec, leader)["LMDEPLOY_EXECUTOR_BACKEND"] == "ray"
    m = load_model_module("lmdeploy")
    kw = m.backend_config_kwargs(
        config_params(spec),
        {"tp", "dtype", "cache_max_entry_count", "max_batch_size", "session_len", "distributed_executor_backend"},
    )
    assert (kw["tp"], kw["distributed_executor_backend"], kw["max_batch_size"]) == (16, "ray", 128)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        m.backend_config_kwargs({"dtype": "float32"}, set())


# ----------------------------------------------------------------------------- TensorRT-LLM
def test_trtllm_ensemble_two_nodes_every_rank_is_a_tritonserver(monkeypatch):
    spec = spec_for("engine=trtllm", "engine.layout=ensemble", "tp=16", "nodes=2")
    assert spec.world_size == 16 and spec.tasks_per_node == 8
    ctxs = contexts(spec)
    edef = ENGINES["trtllm"]
    assert all(edef.rank_command(spec, c) is None for c in ctxs)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    # leader mode: TensorRT-LLM picks its GPU by MPI rank among the node's GPUs, so each rank sees all of them
    assert {edef.rank_env(spec, c)["CUDA_VISIBLE_DEVICES"] for c in ctxs} == {"0,1,2,3,4,5,6,7"}
    argv0 = tritonserver_argv(spec, spec.ranks[0], job_id="4242")
    argv9 = tritonserver_argv(spec, spec.ranks[9], job_id="4242")
    assert "--grpc-port=8001" in argv0
    assert "--load-model=tensorrt_llm" in argv9 and "--allow-grpc=false" in argv9
    assert spec.ranks[9].node == 1 and spec.ranks[9].local_rank == 1


def test_trtllm_replicas_keep_one_gpu_per_rank(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    spec = spec_for("engine=trtllm", "engine.layout=ensemble", "tp=1", "replicas=8")
    assert all(ENGINES["trtllm"].rank_env(spec, c) == {} for c in contexts(spec))


def test_trtllm_llmapi_ranks_are_one_mpi_world_under_trtllm_llmapi_launch(monkeypatch):
    """engine.layout=llmapi (the default), 2 nodes x 8 GPUs: every task runs trtllm-llmapi-launch; rank 0's is the
    tritonserver command line (the only server), the others run TensorRT-LLM's MPI worker; each rank keeps the
    node's GPUs visible (TensorRT-LLM places MPI rank r on GPU r % gpus_per_node); one GPU copies are plain servers."""
    from launcher.render import rank_command

    spec = spec_for("engine=trtllm", "tp=16", "nodes=2")
    edef = ENGINES["trtllm"]
    commands = [rank_command(spec, r, job_id="4242") for r in spec.ranks]
    assert commands[0][:2] == ["trtllm-llmapi-launch", "tritonserver"] and "--grpc-port=8001" in commands[0]
    assert all(c == ["trtllm-llmapi-launch"] for c in commands[1:])
    assert [edef.runs_server(spec, r) for r in spec.ranks] == [True] + [False] * 15
    assert all(r.models == () for r in spec.ranks) and spec.model_name == "tensorrt_llm"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    assert {edef.rank_env(spec, c)["CUDA_VISIBLE_DEVICES"] for c in contexts(spec)} == {"0,1,2,3,4,5,6,7"}
    one = spec_for("engine=trtllm", "tp=1", "replicas=8")
    assert [rank_command(one, r, job_id="4242")[0] for r in one.ranks] == ["tritonserver"] * 8


def test_trtllm_llmapi_model_leaves_the_mpi_world_and_maps_the_contract():
    m = load_model_module("trtllm/llmapi")
    env = {
        "PMIX_RANK": "1",
        "PMIX_NAMESPACE": "x",
        "PMI_FD": "3",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_UNIVERSE_SIZE": "8",
        "PMIX_MCA_gds": "hash",
        "OMPI_MCA_btl": "self",
        "UCX_TLS": "rc",
        "SLURM_PROCID": "1",
        "TLLM_SPAWN_PROXY_PROCESS": "1",
    }
    assert sorted(m.leave_mpi_world(env)) == [
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_UNIVERSE_SIZE",
        "PMIX_NAMESPACE",
        "PMIX_RANK",
        "PMI_FD",
    ]
    assert sorted(env) == ["OMPI_MCA_btl", "PMIX_MCA_gds", "SLURM_PROCID", "TLLM_SPAWN_PROXY_PROCESS", "UCX_TLS"]
    assert m.llm_kwargs({"model": "/m", "backend": "pytorch"}, {"model", "backend"}) == {
        "model": "/m",
        "backend": "pytorch",
    }
    with pytest.raises(ValueError, match=r"takes no \['nope'\].*valid keys: backend, model"):
        m.llm_kwargs({"model": "/m", "nope": 1}, {"model", "backend"})
    with pytest.raises(ValueError, match="at least `model`"):
        m.llm_kwargs({"backend": "pytorch"}, None)
    from launcher.python_backend.triton_io import SamplingParams

    assert m.sampling_kwargs(SamplingParams(max_tokens=5)) == {
        "n": 1,
        "max_tokens": 5,
        "ignore_eos": False,
        "skip_special_tokens": True,
        "top_k": 1,
    }
    kw = m.sampling_kwargs(
        SamplingParams(max_tokens=5, temperature=0.7, top_k=40, top_p=0.95, end_id=7, stop=("x",), bad_words=("y",))
    )
    assert (kw["temperature"], kw["top_k"], kw["top_p"], kw["stop_token_ids"], kw["stop"], kw["bad"]) == (
        0.7,
        40,
        0.95,
        [7],
        ["x"],
        ["y"],
    )


# ----------------------------------------------------------------------------- engine facts the ranks act on
def test_ranks_rendezvous_through_files_where_the_server_is_the_mpi_program(monkeypatch, tmp_path):
    """Engine.server_uses_mpi (TensorRT-LLM leader mode): the ranks leave the task's MPI wire-up to tritonserver."""
    from launcher.rank import rendezvous as rank_mod

    monkeypatch.setattr(rank_mod, "MPIComm", lambda: "mpi")

    def comm(spec):
        return rank_mod.make_comm(
            spec, Topology("slurm", 0, spec.world_size, 0, 0, spec.nodes, "4242", "node1"), tmp_path
        )

    assert ENGINES["trtllm"].server_uses_mpi and not ENGINES["vllm"].server_uses_mpi
    assert isinstance(comm(spec_for("engine=trtllm", "engine.layout=ensemble", "tp=16", "nodes=2")), rank_mod.FileComm)
    assert isinstance(
        comm(spec_for("engine=trtllm", "tp=16", "nodes=2")), rank_mod.FileComm
    )  # llmapi: trtllm-llmapi-launch's world
    assert comm(spec_for("engine=vllm", "tp=16", "nodes=2")) == "mpi"


@pytest.mark.parametrize(
    "overrides,ray",
    [
        (("engine=vllm",), True),  # auto: ray across nodes
        (("engine=vllm", "engine.distributed_executor_backend=ray"), True),
        (("engine=lmdeploy", "engine.backend=pytorch"), True),
        (("engine=sglang",), False),
        (("engine=trtllm",), False),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else str(v),
)
def test_copies_over_nodes_run_their_other_nodes_on_ray_where_the_engine_says(overrides, ray):
    """Engine.ray (launcher.engines.ray.RayHooks): the copy's other nodes run `ray start` instead of tritonserver."""
    spec = spec_for(*overrides, "tp=16", "nodes=2")
    edef = ENGINES[spec.engine.name]
    *_, worker = contexts(spec)
    assert (edef.ray is not None and edef.ray.uses_ray(spec)) is ray
    assert (edef.rank_command(spec, worker) is not None) is ray
    assert ("RAY_USAGE_STATS_ENABLED" in edef.rank_env(spec, worker)) is ray


def test_no_engine_is_branched_on_by_name_or_asked_with_getattr():
    """Engine facts are its Engine's attributes and methods (launcher/engines/<name>/); nothing outside the engines'
    packages compares engine names or asks an engine config with getattr what the engine has (inside, getattr meets
    the engines' own objects, whose attributes differ between their releases)."""
    import re

    names = "|".join(sorted(ENGINES))
    compare = re.compile(rf"""(==|!=|\bin)\s*\(?\s*["']({names})["']""")
    ask = re.compile(r"getattr\((\w+\.)*engine\b")
    found = [
        f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
        for top in ("launcher", "model_repository")
        for p in sorted((ROOT / top).rglob("*.py"))
        if p.name not in ("registry.py", "schema.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if compare.search(line) or (ask.search(line) and "engines" not in p.relative_to(ROOT).parts)
    ]
    assert found == []


# ----------------------------------------------------------------------------- the Ray worker command
def _fake_ray(tmp_path):
    record = tmp_path / "ray_argv.json"
    ray = tmp_path / "ray"
    ray.write_text(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(record)!r}, 'w'))\n")
    ray.chmod(0o755)
    return ray, record


def test_ray_worker_waits_for_the_head_then_becomes_ray_start(tmp_path):
    ray, record = _fake_ray(tmp_path)
    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        head.listen()
        port = head.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "launcher.engines.ray",
                "worker",
                f"--address=127.0.0.1:{port}",
                "--node-ip-address=10.0.0.2",
                "--timeout=10",
                f"--ray={ray}",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(record.read_text()) == [
        "start",
        f"--address=127.0.0.1:{port}",
        "--block",
        "--node-ip-address=10.0.0.2",
    ]


def test_ray_worker_gives_up_when_the_head_never_answers(tmp_path):
    ray, record = _fake_ray(tmp_path)
    from launcher.ports import free_port

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher.engines.ray",
            "worker",
            f"--address=127.0.0.1:{free_port()}",
            "--timeout=1",
            f"--ray={ray}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1 and "did not answer" in proc.stderr and not record.exists()


def test_head_argv():
    from launcher.engines.ray import head_argv

    assert head_argv(6379, "10.0.0.1") == [
        "ray",
        "start",
        "--head",
        "--port=6379",
        "--block",
        "--include-dashboard=false",
        "--node-ip-address=10.0.0.1",
    ]


# ----------------------------------------------------------------------------- worker ranks fail fast
def test_runtime_stops_the_server_when_a_worker_engine_dies():
    from launcher.python_backend.adapter import EngineAdapter
    from launcher.python_backend.async_runtime import AsyncEngineRuntime

    class Dead(EngineAdapter):
        serves = False

        def wait_engine_exit(self):
            return True

    kills = []
    rt = AsyncEngineRuntime(Dead())
    rt._watch_engine(kill=lambda pid, sig: kills.append(sig))
    assert kills == [15]
    rt._stopping = True  # finalize in progress: the engine's exit is expected
    rt._watch_engine(kill=lambda pid, sig: kills.append(sig))
    assert kills == [15]


def test_hf_model_json_carries_the_engine_config():
    """The hf engine's settings reach its model as 1/model.json (HFEngineArgs, every default from there);
    config.pbtxt names the file and holds only what Triton reads."""
    from launcher.engines.hf.config import HFEngineArgs

    spec = spec_for(
        "engine=hf",
        "tp=2",
        "model.dtype=bfloat16",
        "engine.prefill_chunk=1024",
        "engine.torch_compile=true",
        "engine.cuda_graphs=false",
        "engine.stream_interval_ms=8",
    )
    files = repository_files(spec)
    args = HFEngineArgs.from_dict(json.loads(files["hf_model/1/model.json"]))
    assert (args.model_path, args.tp_size, args.dtype, args.prefill_chunk) == ("/models/llama-70b", 2, "bfloat16", 1024)
    assert (args.torch_compile, args.cuda_graphs, args.stream_interval_ms) == ("true", False, 8)
    assert (args.max_num_seqs, args.cudnn_attention) == (HFEngineArgs().max_num_seqs, "graphs")
    from launcher.contract import HONOURED_PARAMETERS_KEY

    params = config_params(spec)
    assert (
        set(params) == {"engine_args_file", HONOURED_PARAMETERS_KEY, "tokenizer_path"}
        and params["engine_args_file"] == "model.json"
    )
    assert params["tokenizer_path"] == "/models/llama-70b"  # for clients: llmlaunch-bench counts in these tokens
    kwargs = args.runner_kwargs()
    assert (args.prefill_tokens("cuda"), kwargs["torch_compile"], kwargs["max_model_len"]) == (1024, True, None)


def test_hf_engine_args_refuse_unknown_keys():
    from launcher.engines.hf.config import HFEngineArgs

    with pytest.raises(ValueError) as exc:
        HFEngineArgs.from_dict({"model_path": "/m", "prefil_chunk": 1})
    assert "prefil_chunk" in str(exc.value) and "prefill_chunk" in str(exc.value)  # the valid keys are listed
    with pytest.raises(ValueError, match="max_num_seqs='many' is not an integer"):
        HFEngineArgs.from_dict({"max_num_seqs": "many"})
    assert HFEngineArgs.from_dict({"cuda_graphs": "false", "max_num_seqs": "8", "torch_compile": True}) == HFEngineArgs(
        cuda_graphs=False, max_num_seqs=8, torch_compile="true"
    )


def test_the_arrival_barrier_names_the_ranks_that_never_came(tmp_path):
    from launcher.rank.rendezvous import RendezvousTimeout, arrival_barrier

    (tmp_path / "arrived_2").parent.mkdir(exist_ok=True)
    (tmp_path / "arrived_2").touch()
    with pytest.raises(RendezvousTimeout) as e:
        arrival_barrier(tmp_path, 0, 4, timeout_s=0.2)
    assert e.value.missing == [1, 3] and "ranks [1, 3] did not arrive within 0s (serve.rendezvous_timeout_s)" in str(
        e.value
    )
    for r in (1, 3):
        (tmp_path / f"arrived_{r}").touch()
    arrival_barrier(tmp_path, 0, 4, timeout_s=0.2)  # all there: returns


def test_vllm_log_probabilities_map_both_ways():
    """At vLLM's API boundary (vLLM does not run here): SamplingParams' logprobs / prompt_logprobs, and its per-token
    dicts of token id -> Logprob(logprob, rank) (the top k by rank and the sampled token, wherever it ranks) as the
    contract's rows, the token first; a prompt's first token (None) is its id and NaN."""
    from collections import namedtuple

    from launcher.python_backend.triton_io import SamplingParams

    m = load_model_module("vllm")
    kw = m.sampling_kwargs(SamplingParams(max_tokens=2, logprobs=2, prompt_logprobs=0))
    assert (kw["logprobs"], kw["prompt_logprobs"]) == (2, 0)
    assert "logprobs" not in m.sampling_kwargs(SamplingParams(max_tokens=2))
    Logprob = namedtuple("Logprob", "logprob rank decoded_token")
    per_token = [
        {9: Logprob(-3.0, 5, "a"), 4: Logprob(-0.1, 1, "b"), 6: Logprob(-2.0, 2, "c")},
        {4: Logprob(-0.2, 1, "b"), 6: Logprob(-2.5, 2, "c")},
    ]
    rows = m.logprob_rows([9, 4], per_token, 2)
    assert rows.ids == [[9, 4, 6], [4, 4, 6]] and rows.lps == [[-3.0, -0.1, -2.0], [-0.2, -0.2, -2.5]]
    prompt = m.logprob_rows([1, 4], [None, {4: Logprob(-0.3, 1, "b")}], 0)
    assert prompt.ids == [[1], [4]] and prompt.lps[0][0] != prompt.lps[0][0] and prompt.lps[1] == [-0.3]
