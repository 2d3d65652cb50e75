"""Config schema: dataclasses with one comment per field, registered in Hydra's ConfigStore.

YAML files under `conf/<group>/` fill these in; `MISSING` marks what a profile
must give. Engine-specific fields live in one dataclass per engine, each
registered as `engine/base_<name>` so `conf/engine/<name>.yaml` extends it.
Nothing here touches a cluster; validation beyond types is in `launcher.spec`.
"""

from __future__ import annotations

import collections.abc
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from omegaconf import MISSING

from launcher.engines.hf_args import HFEngineArgs


# --------------------------------------------------------------------------- cluster
@dataclass
class ContainerConfig:
    runtime: str = "none"  # none | pyxis (srun --container-image ...)
    image: str = ""  # container image for pyxis, e.g. nvcr.io#nvidia/tritonserver:24.08-trtllm-python-py3
    mounts: List[str] = field(default_factory=list)  # "host_path:container_path" pairs for --container-mounts
    workdir: str = ""  # --container-workdir; empty = the image's default


@dataclass
class ClusterConfig:
    name: str = MISSING  # profile name, shown in plans and job names
    scheduler: str = "local"  # local (this machine, no Slurm) | slurm
    partition: str = ""  # sbatch --partition; empty = the site default
    account: str = ""  # sbatch --account
    qos: str = ""  # sbatch --qos
    reservation: str = ""  # sbatch --reservation
    constraint: str = ""  # sbatch --constraint (node features)
    exclusive: bool = False  # sbatch --exclusive: whole nodes, nothing else on them
    gpus_per_node: int = 8  # GPUs on one node (on a CPU-only machine: how many ranks one node may run)
    gpu_request: str = "gpus-per-node"  # how GPUs are asked for: gpus-per-node | gres | none
    mpi: str = "pmix"  # srun --mpi= type: pmix | pmi2 | none
    time: str = "00:30:00"  # sbatch --time, HH:MM:SS or D-HH:MM:SS
    cpus_per_task: int = 0  # sbatch --cpus-per-task; 0 = site default
    mem: str = ""  # sbatch --mem per node, e.g. 200G or 0 (all); empty = site default
    container: ContainerConfig = field(default_factory=ContainerConfig)  # pyxis container settings
    setup: List[str] = field(default_factory=list)  # shell lines run in the job before srun (module load, venv activate)
    lock_clocks: str = ""  # e.g. "1410,1410": adds `sudo nvidia-smi -lgc <value>` before srun
    env: Dict[str, str] = field(default_factory=dict)  # environment variables exported in the job
    extra_sbatch: List[str] = field(default_factory=list)  # extra sbatch flags, e.g. ["--gpu-bind=none"]
    tritonserver: str = ""  # explicit path to the tritonserver binary; empty = resolve (PATH, /opt/tritonserver, wheel)
    slurm_conf: str = ""  # SLURM_CONF for the submitting side (the local test cluster); empty = the site default
    python: str = ""  # python interpreter ranks run with; empty = the one running llmlaunch
    jobs_dir: str = "llmlaunch-jobs"  # where job folders go (relative = under the current directory); must be shared with the nodes
    allows_requeue: bool = False  # the site lets a job requeue itself (slurm.conf JobRequeue, partition and QOS allow `scontrol requeue`): requeue=true needs it


# --------------------------------------------------------------------------- model
@dataclass
class ModelConfig:
    name: str = MISSING  # short name used in job names and tables
    path: str = ""  # HF-format folder with weights (or an engine dir for trtllm); empty = made on the spot (make)
    tokenizer: str = ""  # tokenizer folder; empty = path
    make: str = ""  # a model llmlaunch makes into its cache when path is empty (launcher/models MAKERS): smollm2 | tiny
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    max_model_len: int = 0  # context length limit; 0 = the model's own


# --------------------------------------------------------------------------- engines
@dataclass
class EngineConfig:
    name: str = MISSING  # registry key: hf | trtllm | vllm | sglang | lmdeploy
    model_name: str = ""  # Triton model name clients address; empty = the engine's default
    max_num_seqs: int = 64  # sequences batched at once (also the config's max_batch_size)
    device: str = "auto"  # auto (cuda when the cluster has GPUs, else cpu) | cpu | cuda


_HF = HFEngineArgs()  # the hf engine's defaults: each field below takes its own from here


@dataclass
class HFEngineConfig(EngineConfig):
    """The hf engine's settings a user chooses.  What each does, and its default, is HFEngineArgs' field of the same
    name (launcher/engines/hf_args.py); the registry writes them to the model's model.json."""

    name: str = "hf"  # our own continuous-batching engine on HF transformers
    max_num_seqs: int = _HF.max_num_seqs  # sequences batched at once (also the config's max_batch_size)
    device: str = _HF.device  # auto (cuda when the cluster has GPUs, else cpu) | cpu | cuda
    attn_implementation: str = _HF.attn_implementation  # transformers attention kernel: sdpa | eager
    prefill_chunk: int = _HF.prefill_chunk  # prompt tokens prefilled per engine step (0: by device)
    cuda_graphs: bool = _HF.cuda_graphs  # replay decode steps and prompt steps as captured CUDA graphs (GPU)
    stream_interval_ms: int = _HF.stream_interval_ms  # least time between two streamed responses of a request (0: every step)
    response_processes: int = 1  # Triton model instances (stub processes, each with its own GIL) that share the engine process and send its responses; tp=1 only. The one responder setting (launcher/serving/responders.py derives threads per stub, nice and front-end processes from it, the device and the CPUs): one stub sends a few thousand responses/s whatever its threads, so the streams served at once, which only the user knows, decide it (1 up to tens of streams, 2-4 for 128 on a GPU)
    torch_compile: str = _HF.torch_compile  # auto | true | false: fuse the model's small kernels with torch.compile
    cudnn_attention: str = _HF.cudnn_attention  # graphs | all | off: where attention may use cuDNN


@dataclass
class TRTLLMEngineConfig(EngineConfig):
    name: str = "trtllm"  # TensorRT-LLM backend (C++ inflight batcher) in an ensemble
    engine_dir: str = ""  # built TensorRT-LLM engine folder (gpt_model_path); required
    tokenizer_dir: str = ""  # tokenizer for pre/postprocessing; empty = model.tokenizer or model.path
    tokenizer_type: str = "auto"  # auto | llama | t5 (older backends' names; we load with AutoTokenizer)
    batching_strategy: str = "inflight_fused_batching"  # gpt_model_type: inflight_fused_batching | V1
    batch_scheduler_policy: str = "guaranteed_no_evict"  # guaranteed_no_evict | max_utilization
    kv_cache_free_gpu_mem_fraction: float = 0.9  # fraction of free GPU memory for the paged KV cache
    max_tokens_in_paged_kv_cache: int = 0  # cap on KV-cache tokens; 0 = unset (use the fraction)
    max_attention_window_size: int = 0  # sliding attention window; 0 = unset (full)
    enable_kv_cache_reuse: bool = False  # reuse KV blocks across requests with a shared prefix
    enable_chunked_context: bool = False  # chunked prefill in the C++ batcher
    decoupled: bool = True  # decoupled (streaming) mode of the tensorrt_llm model
    max_beam_width: int = 1  # beams the engine was built for
    exclude_input_in_output: bool = True  # tensorrt_llm returns only new tokens
    max_queue_delay_microseconds: int = 0  # dynamic batcher delay for tensorrt_llm
    preprocessing_instances: int = 0  # pre/postprocessing instances; 0 = match max_num_seqs up to 8
    postprocessing_instances: int = 0  # see preprocessing_instances
    bls: bool = False  # add the tensorrt_llm_bls model (streaming with stop words in Python)
    backend: str = "tensorrtllm"  # tensorrtllm (C++ backend, >= v0.9 layout) | python (LLM-API model.py, >= v0.17)


@dataclass
class VLLMEngineConfig(EngineConfig):
    name: str = "vllm"  # vLLM AsyncLLMEngine in a python model
    engine_args: Dict[str, Any] = field(default_factory=dict)  # passed through to vLLM's AsyncEngineArgs as model.json
    gpu_memory_utilization: float = 0.9  # vLLM's share of each GPU
    distributed_executor_backend: str = "auto"  # auto (mp on one node, ray across nodes) | mp | ray
    frontends: int = 4  # stub processes (model instances) that are front ends of one vLLM engine core, as vllm serve --api-server-count: each tokenizes, detokenizes and sends the responses of its share of the requests under its own GIL. One H100, 128 closed streams: 1 kept up only by merging 17 tokens a response (first token +170 ms over vLLM in-process), 4 added none (docs/performance.md); 1 costs least at one stream


@dataclass
class SGLangEngineConfig(EngineConfig):
    name: str = "sglang"  # SGLang offline Engine in a python model
    mem_fraction_static: float = 0.0  # SGLang's static memory fraction; 0 = its default
    extra_args: Dict[str, Any] = field(default_factory=dict)  # more sglang ServerArgs fields, passed through


@dataclass
class LMDeployEngineConfig(EngineConfig):
    name: str = "lmdeploy"  # LMDeploy pipeline in a python model
    backend: str = "turbomind"  # turbomind (HF weights or a converted workspace) | pytorch
    session_len: int = 0  # LMDeploy session length; 0 = the model's
    cache_max_entry_count: float = 0.8  # KV-cache share of free GPU memory
    extra_args: Dict[str, Any] = field(default_factory=dict)  # more backend-config fields, passed through


# --------------------------------------------------------------------------- serving, bench, top level
@dataclass
class ServeConfig:
    host: str = ""  # address rank 0 binds gRPC/HTTP/metrics to; "" = 127.0.0.1 locally, 0.0.0.0 on Slurm
    grpc_port: int = 8001  # gRPC endpoint of rank 0 (the one clients use)
    http_port: int = 8000  # HTTP endpoint of rank 0
    metrics_port: int = 8002  # Prometheus metrics of rank 0
    openai_port: int = 8003  # OpenAI-compatible HTTP API of rank 0 (/v1/completions, /v1/chat/completions, /v1/models; launcher/openai_api)
    ready_timeout_s: float = 900.0  # give up waiting for READY after this many seconds
    log_verbose: int = 0  # tritonserver --log-verbose level
    drain_timeout_s: float = 30.0  # on stop, how long in-flight requests may finish before the server is killed
    rendezvous_timeout_s: float = 600.0  # how long started ranks wait for the others; then the job fails naming the ranks that never arrived
    walltime_signal_s: int = 60  # Slurm signals the job (SIGUSR2, sbatch --signal) this many seconds before its time limit: the front ends refuse new requests, in-flight ones get up to serve.drain_timeout_s, every rank exits


@dataclass
class BenchConfig:
    name: str = "none"  # profile name; "none" = serve only, no load run
    dataset: str = "synthetic"  # synthetic | sharegpt:<path> | cnn:<path> | prompts:<path>
    num_prompts: int = 100  # requests counted in the run
    concurrency: int = 8  # requests in flight (fixed-concurrency mode)
    request_rate: float = 0.0  # requests/s (Poisson); 0 = fixed concurrency
    input_len: int = 128  # synthetic prompt tokens
    output_len: int = 64  # requested new tokens
    ignore_eos: bool = True  # enforce output length for fair comparisons
    warmup: int = 2  # requests sent first and not counted
    seed: int = 0  # dataset sampling seed
    processes: int = 1  # client processes sharing the load: one Python gRPC client saturates a core long before 128 streams
    streams: int = 1  # gRPC streams per client process


@dataclass
class LaunchConfig:
    cluster: ClusterConfig = MISSING  # where: conf/cluster/<name>.yaml
    engine: EngineConfig = MISSING  # what serves: conf/engine/<name>.yaml
    model: ModelConfig = MISSING  # which weights: conf/model/<name>.yaml
    serve: ServeConfig = field(default_factory=ServeConfig)  # ports and timeouts
    bench: BenchConfig = field(default_factory=BenchConfig)  # load run after READY (sweeps)
    tp: int = 1  # tensor-parallel GPUs per model copy (a power of two)
    pp: int = 1  # pipeline-parallel stages per model copy
    nodes: int = 1  # nodes in the job
    replicas: int = 1  # data-parallel model copies behind the one endpoint
    dry_run: bool = False  # print the plan, write and submit nothing
    requeue: bool = False  # Slurm: at the time limit the job drains, then requeues itself and serves again in a new allocation (needs cluster.allows_requeue)
    job_name: str = "llmlaunch"  # Slurm job name and job-folder prefix
    run_dir: str = ""  # job folder; "" = <cluster.jobs_dir>/<job_name>/<timestamp> (tests pin it)


ENGINE_SCHEMAS = {
    "hf": HFEngineConfig,
    "trtllm": TRTLLMEngineConfig,
    "vllm": VLLMEngineConfig,
    "sglang": SGLangEngineConfig,
    "lmdeploy": LMDeployEngineConfig,
}


def build(cls, data: Mapping[str, Any], where: str = "") -> Tuple[Any, List[str]]:
    """`cls` from a plain mapping (a composed config's node, or launch.json's), nested dataclasses built too.
    Returns (instance, the keys `cls` has no field for, as dotted names under `where`); those are left out and a
    field the mapping does not give keeps the dataclass's default."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    unknown = [f"{where}{k}" for k in data if k not in names]
    given = {}
    for k, v in data.items():
        if k not in names:
            continue
        if is_dataclass(hints[k]) and isinstance(v, Mapping):
            v, more = build(hints[k], v, f"{where}{k}.")
            unknown += more
        given[k] = v
    return cls(**given), unknown


def free_mappings() -> Tuple[str, ...]:
    """Dotted names of the fields that are free mappings (a `Dict` field: engine.engine_args, cluster.env, ...):
    their keys are the user's (an engine's own arguments, environment variables), not the schema's. The
    engine's are those of every engine's dataclass; a key under one of another engine is refused by
    launcher/spec.py as a field that engine does not have."""
    out: List[str] = []

    def walk(cls, prefix: str) -> None:
        for name, hint in typing.get_type_hints(cls).items():
            if typing.get_origin(hint) in (dict, collections.abc.Mapping):
                out.append(prefix + name)
            elif is_dataclass(hint):
                walk(hint, f"{prefix}{name}.")

    for name, hint in typing.get_type_hints(LaunchConfig).items():
        if name == "engine":
            for schema in ENGINE_SCHEMAS.values():
                walk(schema, "engine.")
        elif is_dataclass(hint):
            walk(hint, f"{name}.")
    return tuple(sorted(set(out)))


def register_configs() -> None:
    """Register the schemas with Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="launch_schema", node=LaunchConfig)
    cs.store(group="cluster", name="base_cluster", node=ClusterConfig)
    cs.store(group="model", name="base_model", node=ModelConfig)
    cs.store(group="bench", name="base_bench", node=BenchConfig)
    for name, schema in ENGINE_SCHEMAS.items():
        cs.store(group="engine", name=f"base_{name}", node=schema)
