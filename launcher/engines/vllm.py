"""`engine=vllm`: vLLM's AsyncLLM in a python model (model_repository/vllm), one tritonserver per model copy per node;
vLLM owns the copy's GPUs, through its mp executor on one node and a per-copy Ray cluster across nodes."""

from __future__ import annotations

import json
from typing import Dict, List

from launcher.engines.base import (
    EngineDef,
    Problem,
    copy_nodes,
    model_path,
    python_engine_models,
    require_path,
    tokenizer_path,
)
from launcher.engines.ray import RayHooks
from launcher.readiness import phases_from_patterns, reported_phases

# What vLLM's start is made of, as its own log lines say: its load phases for the time-to-READY breakdown.
LOAD_PHASES = {
    "weights_s": r"Loading weights took ([0-9.]+) seconds",
    "model_load_s": r"Model loading took .*? and ([0-9.]+) seconds",
    "dynamo_s": r"Dynamo bytecode transform time: ([0-9.]+) s",
    "compile_s": r"torch\.compile took ([0-9.]+) s in total",
    "cuda_graphs_s": r"Graph capturing finished in ([0-9.]+) secs",
    "engine_init_s": r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+)",
}


def load_phases(log_text: str) -> Dict[str, float]:
    return {**reported_phases(log_text), **phases_from_patterns(LOAD_PHASES, log_text)}


def executor_backend(spec) -> str:
    """vLLM's distributed executor: `auto` is mp inside a node and ray across nodes."""
    backend = spec.engine.distributed_executor_backend
    return ("ray" if copy_nodes(spec) > 1 else "mp") if backend == "auto" else backend


def engine_args(spec) -> Dict[str, str]:
    """vLLM's own engine-args file (model.json): ours fill the gaps, the user's win."""
    e = spec.engine
    args = {
        "model": model_path(spec),
        "tokenizer": tokenizer_path(spec),
        "tensor_parallel_size": spec.tp,
        "pipeline_parallel_size": spec.pp,
        "max_num_seqs": e.max_num_seqs,
        "gpu_memory_utilization": e.gpu_memory_utilization,
        "dtype": spec.model.dtype,
    }
    if spec.model.max_model_len:
        args["max_model_len"] = spec.model.max_model_len
    args["distributed_executor_backend"] = executor_backend(spec)
    args.update(e.engine_args)
    return {"1/model.json": json.dumps(args, indent=2, sort_keys=True) + "\n"}


def _check(c, scheduler) -> List[Problem]:
    problems = require_path(c, engine="vllm")
    b = c.engine.distributed_executor_backend
    gpn = c.cluster.gpus_per_node
    if b == "mp" and isinstance(gpn, int) and gpn > 0 and c.tp * c.pp > gpn:
        problems.append(
            (
                f"engine.distributed_executor_backend='mp' with tp*pp={c.tp * c.pp}",
                f"a model copy larger than a node ({gpn} GPUs) spans nodes, and vLLM spans nodes only with its Ray executor",
                "set engine.distributed_executor_backend=auto (or ray)",
            )
        )
    if c.serve.routing == "kv" and c.replicas > 1 and "kv_events_config" in (c.engine.engine_args or {}):
        problems.append(
            (
                "engine.engine_args.kv_events_config",
                "serve.routing=kv publishes vLLM's KV-cache events where the front end reads them",
                "remove engine.engine_args.kv_events_config, or use serve.routing=prefix to publish your own",
            )
        )
    return problems


# auto is ray across nodes; mp cannot span nodes (_check)
RAY = RayHooks(lambda e: e.distributed_executor_backend in ("auto", "ray"))

ENGINE = EngineDef(
    name="vllm",
    default_model_name="vllm_model",
    layout="per_group",
    # engine.frontends instances: the front ends of one engine core (vllm model.py)
    # ready_timeout_s: how long the other front ends wait for the first one's engine core
    models=python_engine_models(
        "vllm",
        lambda s: {"engine_args_file": "model.json", "ready_timeout_s": s.serve.ready_timeout_s},
        engine_args,
        instances=lambda s: s.engine.frontends,
    ),
    worker_models=(),
    check=_check,
    tp_any_divisor=True,  # vLLM shards heads over any tp dividing them
    kv_heads_replicate=True,  # and copies a KV head to several ranks where tp exceeds the KV heads
    needs_gpu=lambda e: e.device != "cpu",  # cpu: a CPU build of vLLM
    ray=RAY,
    rank_env=RAY.rank_env,
    rank_command=RAY.rank_command,
    load_phases=load_phases,
    summary="vLLM AsyncLLMEngine; one tritonserver per model copy per node, vLLM owns the GPUs (Ray across nodes)",
    first_token_split=True,  # launcher.python_backend.async_runtime
    kv_events=True,  # vLLM's kv_events_config (model_repository/vllm sets it from the rank's endpoint)
)
