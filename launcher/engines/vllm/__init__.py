"""`engine=vllm`: vLLM's AsyncLLM in a python model, one tritonserver per model copy per node; vLLM owns the copy's
GPUs, through its mp executor on one node and a per-copy Ray cluster across nodes.

config.py  its settings (VLLMEngineConfig); `engine.engine_args` passes vLLM's own through to 1/model.json
model.py   the Triton python model (model_repository/vllm/1/model.py loads it)
core.py    one engine core for several front ends (engine.frontends), as `vllm serve --api-server-count` runs it
"""

from __future__ import annotations

import json
from typing import Dict, List

from launcher.engines.base import (
    Engine,
    Problem,
    RenderedModel,
    copy_nodes,
    model_path,
    python_engine_model,
    require_path,
    tokenizer_path,
)
from launcher.engines.ray import RayHooks
from launcher.engines.vllm.config import VLLMEngineConfig
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


def executor_backend(spec) -> str:
    """vLLM's distributed executor: `auto` is mp inside a node and ray across nodes."""
    backend = spec.engine.distributed_executor_backend
    return ("ray" if copy_nodes(spec) > 1 else "mp") if backend == "auto" else backend


def engine_args_file(spec) -> Dict[str, str]:
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
    if spec.prefill_replicas:  # disagg: blocks move from prefill to decode instances over NIXL (model.py)
        args["kv_transfer_config"] = dict(KV_TRANSFER_CONFIG)
    args.update(e.engine_args)
    return {"1/model.json": json.dumps(args, indent=2, sort_keys=True) + "\n"}


# vLLM's kv_transfer_config of a disaggregated launch's instances: NIXL, each instance both sends and receives, and a
# decode whose blocks cannot be read computes the prompt itself (vLLM's default policy fails the request)
KV_TRANSFER_CONFIG = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_load_failure_policy": "recompute"}


# auto is ray across nodes; mp cannot span nodes (check)
RAY = RayHooks(lambda e: e.distributed_executor_backend in ("auto", "ray"))


class VLLMEngine(Engine):
    """vLLM AsyncLLM; one tritonserver per model copy per node, vLLM owns the GPUs (Ray across nodes)."""

    name = "vllm"
    Config = VLLMEngineConfig
    layout = "per_group"
    tp_any_divisor = True  # vLLM shards heads over any tp dividing them
    kv_heads_replicate = True  # and copies a KV head to several ranks where tp exceeds the KV heads
    first_token_split = True  # launcher.python_backend.async_runtime
    kv_events = True  # vLLM's kv_events_config (launcher/engines/vllm/model.py sets it from the rank's endpoint)
    kv_usage = True  # SchedulerStats.kv_cache_usage, from a stat logger of the front end that logs the engine's stats
    # takes continue_ids: a stream moves mid-generation (but one with stop strings or a guide: model.py says why)
    continues_requests = True
    kv_transfer = (
        "vLLM's NixlConnector (kv_transfer_config in model.json): the prefill instance keeps the prompt's blocks and "
        "returns their kv_transfer_params, which the decode instance uses to read them over NIXL (each instance's "
        "side channel on a port it picks at start)"
    )
    kv_port_roles = ("prefill", "decode")  # every instance runs NIXL's side channel on a port of its own
    ray = RAY

    def models(self, spec) -> List[RenderedModel]:
        # engine.frontends instances: the front ends of one engine core (model.py); ready_timeout_s: how long the
        # other front ends wait for the first one's engine core
        params = {"engine_args_file": "model.json", "ready_timeout_s": spec.serve.ready_timeout_s}
        return [
            python_engine_model(
                spec, "vllm", params, engine_args_file(spec), instances=spec.engine.frontends, continues=True
            )
        ]

    def check(self, c, scheduler) -> List[Problem]:
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

    def needs_gpu(self, engine) -> bool:
        return engine.device != "cpu"  # cpu: a CPU build of vLLM

    def prefix_cache_switch(self, engine) -> str:
        on = engine.engine_args.get("enable_prefix_caching", True)  # vLLM's default: on
        return "" if on else "engine.engine_args.enable_prefix_caching=true"

    def load_phases(self, log_text: str) -> Dict[str, float]:
        return {**reported_phases(log_text), **phases_from_patterns(LOAD_PHASES, log_text)}
