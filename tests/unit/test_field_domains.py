"""Every field of launcher/schema.py declares its domain, and a bad value of each is refused before anything starts:
exit status 2, the field's name in the message and a fix line. The table below has a bad value for every field of
every engine; a field added to the schema without a row here (or without a domain) fails these tests."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from launcher import cli, domains, hostcheck
from launcher.engines.registry import schemas
from launcher.schema import LaunchConfig

ENGINE_SCHEMAS = schemas()  # engine name -> its config dataclass


def schema_fields():
    """(engine, dotted name) of every field: the launch's own under engine "hf", each engine's under its name."""
    out = set()

    def walk(cls, prefix, engine):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name == "engine" and cls is LaunchConfig:
                continue
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], f"{prefix}{f.name}.", engine)
            else:
                out.add((engine, prefix + f.name))

    walk(LaunchConfig, "", "hf")
    for name, cls in ENGINE_SCHEMAS.items():
        walk(cls, "engine.", name)
    return out


def all_dataclasses():
    seen, todo = [], [LaunchConfig, *ENGINE_SCHEMAS.values()]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.append(cls)
        hints = typing.get_type_hints(cls)
        todo += [hints[f.name] for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])]
    return seen


HF_DIR = "<hf>"  # replaced by a Hugging Face-shaped folder
FILE = "<file>"  # replaced by an existing plain file
# Context each engine's rows need to get past the rules that are not the field's (a model path, an engine folder).
CONTEXT = {
    "hf": [],
    "trtllm": ["engine=trtllm", f"model.path={HF_DIR}", f"engine.engine_dir={HF_DIR}"],
    "vllm": ["engine=vllm", f"model.path={HF_DIR}"],
    "sglang": ["engine=sglang", f"model.path={HF_DIR}"],
    "lmdeploy": ["engine=lmdeploy", f"model.path={HF_DIR}"],
}
COMMON_ENGINE = {
    "engine.name": "engine.name=foo",
    "engine.model_name": "engine.model_name=a b",
    "engine.max_num_seqs": "engine.max_num_seqs=0",
    "engine.device": "engine.device=tpu",
}
LAUNCH = "launch"  # a row whose bad value only the launch host shows (a path): run as a launch, not a dry run
# (engine, field) -> the overrides giving it a bad value (plus LAUNCH for a launch)
BAD = {
    ("hf", "cluster.name"): ["cluster.name=a b"],
    ("hf", "cluster.scheduler"): ["cluster.scheduler=pbs"],
    ("hf", "cluster.partition"): ["cluster=slurm", "cluster.partition=a b"],
    ("hf", "cluster.account"): ["cluster=slurm", "cluster.account='$(id)'"],
    ("hf", "cluster.qos"): ["cluster=slurm", "cluster.qos=a b"],
    ("hf", "cluster.reservation"): ["cluster=slurm", "cluster.reservation=a b"],
    ("hf", "cluster.constraint"): ["cluster=slurm", "cluster.constraint='a|b c'"],
    ("hf", "cluster.exclusive"): ["cluster.exclusive=maybe"],
    ("hf", "cluster.gpus_per_node"): ["cluster.gpus_per_node=0"],
    ("hf", "cluster.gpu_request"): ["cluster.gpu_request=gpus"],
    ("hf", "cluster.mpi"): ["cluster.mpi=openmpi"],
    ("hf", "cluster.time"): ["cluster.time=forever"],
    ("hf", "cluster.cpus_per_task"): ["cluster.cpus_per_task=-1"],
    ("hf", "cluster.mem"): ["cluster.mem=lots"],
    ("hf", "cluster.container.runtime"): ["cluster.container.runtime=docker"],
    ("hf", "cluster.container.image"): ["cluster.container.image=my image"],
    ("hf", "cluster.container.mounts"): ["cluster.container.mounts=['/a b:/c']"],
    ("hf", "cluster.container.workdir"): ["cluster.container.workdir=relative/dir"],
    ("hf", "cluster.setup"): ['cluster.setup=["echo \'unclosed"]'],
    ("hf", "cluster.lock_clocks"): ["cluster.lock_clocks=fast"],
    ("hf", "cluster.env"): ["+cluster.env.bad-key=1"],
    ("hf", "cluster.extra_sbatch"): ["cluster.extra_sbatch=['--gpu bind']"],
    ("hf", "cluster.tritonserver"): ["cluster.tritonserver=/nonexistent/tritonserver", LAUNCH],
    ("hf", "cluster.slurm_conf"): ["cluster.slurm_conf=/nonexistent/slurm.conf", LAUNCH],
    ("hf", "cluster.python"): ["cluster.python=/nonexistent/python3", LAUNCH],
    ("hf", "cluster.paths_on_host"): ["cluster.paths_on_host=maybe"],
    ("hf", "cluster.jobs_dir"): ["cluster.jobs_dir=a b"],
    ("hf", "cluster.allows_requeue"): ["cluster.allows_requeue=maybe"],
    ("hf", "cluster.router_partition"): ["cluster=slurm", "cluster.router_partition=a b"],
    ("hf", "cluster.router_time"): ["cluster.router_time=forever"],
    ("hf", "model.name"): ["model.name=a b"],
    ("hf", "model.path"): ["model.path=/nonexistent", LAUNCH],
    ("hf", "model.tokenizer"): [f"model.path={HF_DIR}", "model.tokenizer=/nonexistent-tok", LAUNCH],
    ("hf", "model.make"): ["model.make=huge"],
    ("hf", "model.dtype"): ["model.dtype=int4"],
    ("hf", "model.max_model_len"): ["model.max_model_len=-3"],
    ("hf", "serve.host"): ["serve.host=a b"],
    ("hf", "serve.grpc_port"): ["serve.grpc_port=70000"],
    ("hf", "serve.http_port"): ["serve.http_port=0"],
    ("hf", "serve.metrics_port"): ["serve.metrics_port=-1"],
    ("hf", "serve.openai_port"): ["serve.openai_port=65536"],
    ("hf", "serve.ready_timeout_s"): ["serve.ready_timeout_s=0"],
    ("hf", "serve.log_verbose"): ["serve.log_verbose=-1"],
    ("hf", "serve.drain_timeout_s"): ["serve.drain_timeout_s=-1"],
    ("hf", "serve.routing"): ["serve.routing=round_robin"],
    ("hf", "serve.api_key_file"): ["serve.api_key_file=/nonexistent-key", LAUNCH],
    ("hf", "serve.rendezvous_timeout_s"): ["serve.rendezvous_timeout_s=0"],
    ("hf", "serve.walltime_signal_s"): ["serve.walltime_signal_s=-5"],
    ("hf", "serve.max_migrations"): ["serve.max_migrations=-1"],
    ("hf", "serve.max_restarts"): ["serve.max_restarts=two"],
    ("hf", "serve.stall_timeout_s"): ["serve.stall_timeout_s=-1"],
    ("hf", "serve.max_request_bytes"): ["serve.max_request_bytes=100"],
    ("hf", "serve.breaker_errors"): ["serve.breaker_errors=-1"],
    ("hf", "serve.breaker_cooldown_s"): ["serve.breaker_cooldown_s=0"],
    ("hf", "serve.router"): ["serve.router=cloud"],
    ("hf", "serve.handover_margin_s"): ["serve.handover_margin_s=-5"],
    ("hf", "serve.max_replacements"): ["serve.max_replacements=-1"],
    ("hf", "serve.control_port"): ["serve.control_port=70000"],
    ("hf", "serve.autoscale.max_replicas"): ["serve.autoscale.max_replicas=-2"],
    ("hf", "serve.autoscale.min_replicas"): ["serve.autoscale.min_replicas=0"],
    ("hf", "serve.autoscale.signal"): ["serve.autoscale.signal=cpu"],
    ("hf", "serve.autoscale.up_at"): ["serve.autoscale.up_at=-1"],
    ("hf", "serve.autoscale.down_at"): ["serve.autoscale.down_at=-1"],
    ("hf", "serve.autoscale.window_s"): ["serve.autoscale.window_s=0"],
    ("hf", "serve.autoscale.up_cooldown_s"): ["serve.autoscale.up_cooldown_s=-1"],
    ("hf", "serve.autoscale.down_cooldown_s"): ["serve.autoscale.down_cooldown_s=-1"],
    ("hf", "serve.autoscale.pending_deadline_s"): ["serve.autoscale.pending_deadline_s=0"],
    ("hf", "bench.name"): ["bench.name=a b"],
    ("hf", "bench.dataset"): ["bench.dataset=sharegpt"],
    ("hf", "bench.num_prompts"): ["bench.num_prompts=0"],
    ("hf", "bench.concurrency"): ["bench.concurrency=-1"],
    ("hf", "bench.request_rate"): ["bench.request_rate=-1"],
    ("hf", "bench.input_len"): ["bench.input_len=0"],
    ("hf", "bench.output_len"): ["bench.output_len=0"],
    ("hf", "bench.ignore_eos"): ["bench.ignore_eos=maybe"],
    ("hf", "bench.warmup"): ["bench.warmup=-1"],
    ("hf", "bench.seed"): ["bench.seed=-1"],
    ("hf", "bench.processes"): ["bench.processes=0"],
    ("hf", "bench.streams"): ["bench.streams=0"],
    ("hf", "bench.eval"): ["bench.eval=[gsm8k]"],
    ("hf", "bench.eval_limit"): ["bench.eval_limit=-1"],
    ("hf", "tp"): ["tp=0"],
    ("hf", "pp"): ["pp=0"],
    ("hf", "nodes"): ["nodes=0"],
    ("hf", "replicas"): ["replicas=0"],
    ("hf", "disagg.prefill"): ["disagg.prefill=-1"],
    ("hf", "disagg.decode"): ["disagg.decode=-1"],
    ("hf", "dry_run"): ["dry_run=maybe"],
    ("hf", "requeue"): ["requeue=maybe"],
    ("hf", "job_name"): ["job_name=a b"],
    ("hf", "run_dir"): [f"run_dir={FILE}", LAUNCH],
    ("hf", "engine.attn_implementation"): ["engine.attn_implementation=flash"],
    ("hf", "engine.prefill_chunk"): ["engine.prefill_chunk=-1"],
    ("hf", "engine.cuda_graphs"): ["engine.cuda_graphs=maybe"],
    ("hf", "engine.stream_interval_ms"): ["engine.stream_interval_ms=-4"],
    ("hf", "engine.response_processes"): ["engine.response_processes=0"],
    ("hf", "engine.torch_compile"): ["engine.torch_compile=maybe"],
    ("hf", "engine.cudnn_attention"): ["engine.cudnn_attention=sometimes"],
    ("hf", "engine.tp_timeout_s"): ["engine.tp_timeout_s=0"],
    ("hf", "engine.kv_cache_memory"): ["engine.kv_cache_memory=-1"],
    ("hf", "engine.block_size"): ["engine.block_size=12"],
    ("hf", "engine.prefix_caching"): ["engine.prefix_caching=maybe"],
    ("hf", "engine.torch_threads"): ["engine.torch_threads=-1"],
    ("hf", "engine.prefill_graphs"): ["engine.prefill_graphs=-1"],
    ("hf", "engine.mixed_graphs"): ["engine.mixed_graphs=-1"],
    ("hf", "engine.prompts_alone"): ["engine.prompts_alone=-1"],
    ("hf", "engine.engine_process"): ["engine.engine_process=maybe"],
    ("hf", "engine.cancel_check_ms"): ["engine.cancel_check_ms=-1"],
    ("trtllm", "engine.layout"): ["engine.layout=onnx"],
    ("trtllm", "engine.llm_args"): ["engine.llm_args.bad-key=1"],
    ("trtllm", "engine.engine_dir"): ["engine.layout=ensemble", "engine.engine_dir=/nonexistent-engine", LAUNCH],
    ("trtllm", "engine.tokenizer_dir"): [
        "engine.layout=ensemble",
        "engine.engine_dir=/nonexistent-engine",
        "engine.tokenizer_dir=/nonexistent-tok",
        LAUNCH,
    ],
    ("trtllm", "engine.tokenizer_type"): ["engine.tokenizer_type=gpt"],
    ("trtllm", "engine.batching_strategy"): ["engine.batching_strategy=V2"],
    ("trtllm", "engine.batch_scheduler_policy"): ["engine.batch_scheduler_policy=fifo"],
    ("trtllm", "engine.kv_cache_free_gpu_mem_fraction"): ["engine.kv_cache_free_gpu_mem_fraction=0"],
    ("trtllm", "engine.max_tokens_in_paged_kv_cache"): ["engine.max_tokens_in_paged_kv_cache=-1"],
    ("trtllm", "engine.max_attention_window_size"): ["engine.max_attention_window_size=-1"],
    ("trtllm", "engine.enable_kv_cache_reuse"): ["engine.enable_kv_cache_reuse=maybe"],
    ("trtllm", "engine.enable_chunked_context"): ["engine.enable_chunked_context=maybe"],
    ("trtllm", "engine.decoupled"): ["engine.decoupled=maybe"],
    ("trtllm", "engine.max_beam_width"): ["engine.max_beam_width=0"],
    ("trtllm", "engine.exclude_input_in_output"): ["engine.exclude_input_in_output=maybe"],
    ("trtllm", "engine.max_queue_delay_microseconds"): ["engine.max_queue_delay_microseconds=-1"],
    ("trtllm", "engine.preprocessing_instances"): ["engine.preprocessing_instances=-1"],
    ("trtllm", "engine.postprocessing_instances"): ["engine.postprocessing_instances=-1"],
    ("trtllm", "engine.bls"): ["engine.bls=maybe"],
    ("trtllm", "engine.backend"): ["engine.backend=onnx"],
    ("vllm", "engine.engine_args"): ["engine.engine_args.bad-key=1"],
    ("vllm", "engine.gpu_memory_utilization"): ["engine.gpu_memory_utilization=1.5"],
    ("vllm", "engine.distributed_executor_backend"): ["engine.distributed_executor_backend=slurm"],
    ("vllm", "engine.frontends"): ["engine.frontends=0"],
    ("sglang", "engine.mem_fraction_static"): ["engine.mem_fraction_static=1.0"],
    ("sglang", "engine.extra_args"): ["engine.extra_args.bad-key=1"],
    ("sglang", "engine.frontends"): ["engine.frontends=0"],
    ("lmdeploy", "engine.backend"): ["engine.backend=onnx"],
    ("lmdeploy", "engine.session_len"): ["engine.session_len=-1"],
    ("lmdeploy", "engine.cache_max_entry_count"): ["engine.cache_max_entry_count=0"],
    ("lmdeploy", "engine.extra_args"): ["engine.extra_args.bad-key=1"],
    **{(e, k): [v] for e in ENGINE_SCHEMAS for k, v in COMMON_ENGINE.items()},
}


def make_hf_folder(path: Path) -> Path:
    """A folder shaped as a Hugging Face model (config, weights, tokenizer); nothing loads it here."""
    path.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (path / name).write_text("{}")
    return path


def test_every_field_declares_a_domain():
    for cls in all_dataclasses():
        for f in dataclasses.fields(cls):
            d = domains.domain_of(f)
            assert d is not None, f"{cls.__name__}.{f.name} has no domain: declare it with launcher.domains.arg"
            if isinstance(d, domains.Path):
                assert d.kind in hostcheck.KINDS, f"{cls.__name__}.{f.name}: unknown path kind {d.kind!r}"


def test_the_validator_refuses_a_field_without_a_domain():
    @dataclasses.dataclass
    class Config:
        count: int = 1

    with pytest.raises(TypeError, match="Config.count declares no domain"):
        domains.problems(Config())


def test_the_table_has_a_bad_value_for_every_field():
    assert set(BAD) == schema_fields()


@pytest.mark.parametrize("engine,field", sorted(BAD), ids=[f"{e}:{k}" for e, k in sorted(BAD)])
def test_a_bad_value_of_every_field_exits_2_naming_it(engine, field, tmp_path, monkeypatch, capsys):
    import launcher.schedulers.registry

    hf = str(make_hf_folder(tmp_path / "hf"))
    (tmp_path / "file").write_text("")
    args = [a.replace(HF_DIR, hf).replace(FILE, str(tmp_path / "file")) for a in CONTEXT[engine] + BAD[engine, field]]
    launch = LAUNCH in args
    args = [a for a in args if a != LAUNCH]
    if not any(a.startswith("run_dir=") for a in args):
        args.append(f"run_dir={tmp_path / 'run'}")
    # a launch row must be refused before anything starts: a GPU "is there", the scheduler must not be reached
    monkeypatch.setattr(hostcheck, "GPU_PROBE", lambda: (True, "a GPU for this test"))
    if launch:
        monkeypatch.setattr(
            launcher.schedulers.registry, "for_spec", lambda spec: pytest.fail("a scheduler was reached")
        )
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(SystemExit) as e:
        cli.main(args if launch else args + ["dry_run=true"])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert field in err and "fix:" in err, err
    assert not (tmp_path / "run").exists()
