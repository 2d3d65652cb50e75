"""Config schema: dataclasses with one comment per field, registered in Hydra's ConfigStore.

YAML files under `conf/<group>/` fill these in; `MISSING` marks what a profile
must give. Engine-specific fields live in one dataclass per engine, each
registered as `engine/base_<name>` so `conf/engine/<name>.yaml` extends it.
Nothing here touches a cluster; validation beyond types is in `launcher.spec`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING


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


# --------------------------------------------------------------------------- model
@dataclass
class ModelConfig:
    name: str = MISSING  # short name used in job names and tables
    path: str = ""  # HF-format folder with weights (or an engine dir for trtllm); empty = made on the spot (make)
    tokenizer: str = ""  # tokenizer folder; empty = path
    make: str = ""  # "tiny": llmlaunch builds a random-weight Llama and a locally trained tokenizer into the cache
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    max_model_len: int = 0  # context length limit; 0 = the model's own


# --------------------------------------------------------------------------- engines
@dataclass
class EngineConfig:
    name: str = MISSING  # registry key: hf | trtllm | vllm | sglang | lmdeploy
    model_name: str = ""  # Triton model name clients address; empty = the engine's default
    max_num_seqs: int = 64  # sequences batched at once (also the config's max_batch_size)
    device: str = "auto"  # auto (cuda when the cluster has GPUs, else cpu) | cpu | cuda


@dataclass
class HFEngineConfig(EngineConfig):
    name: str = "hf"  # our own continuous-batching engine on HF transformers
    attn_implementation: str = "sdpa"  # transformers attention kernel: sdpa | eager
    prefill_chunk: int = 0  # prompt tokens prefilled per engine step, so running streams keep flowing (0: 512 on CPU, 2048 on a GPU)
    cuda_graphs: bool = True  # replay decode steps and one-prompt steps as captured CUDA graphs (GPU; with tp>1 every rank replays the same graphs, NCCL inside): 4x the eager step rate, TTFT 11.5 -> 2.5 ms on an H100; tp=2 5.5x on two H200s
    response_threads: int = 0  # threads of the Triton model that send the streams' responses (0: 1 on CPU, 4 on a GPU; with response_processes=8, 2 measured better)
    response_nice: int = -1  # nice value tritonserver and the stubs take once the engine process has started, so on a node whose CPUs are all busy the engine's threads run first: 0-19, 0 = unchanged, -1 = 10 on a GPU and 0 on CPU (H100 hosts, 8 server vCPUs, 64-128 closed streams: 0.009-0.049 more of in-process tokens/s in 9 of 10 pairs)
    stream_interval_ms: int = 0  # least time between two streamed responses of a request; tokens made meanwhile go in one response (its first token and its end never wait). 0: a response per engine step. Each response costs the server CPU: on an H100 host with 8 server vCPUs, 128 closed streams, 8 ms took the first token added by serving from +4.4-4.6 to +1.3-1.5 ms and tokens/s from 0.957 to 0.985-0.992 of in-process (~45 responses a request instead of ~100, each ~9 ms apart); on another, +2.0-2.2 to +0.2-0.6 ms, and at 1-64 streams the two within 0.5 ms of each other (fortieth)
    response_processes: int = 1  # Triton model instances (stub processes, each with its own GIL) that share the engine process and send its responses; tp=1 only
    torch_compile: str = "auto"  # auto | true | false: fuse the model's small kernels with torch.compile when it loads (auto: on for GPUs, off on CPU)
    cudnn_attention: str = "graphs"  # graphs | all | off: where attention may use cuDNN (graphs: captured decode graphs only, so prompt steps build no per-shape cuDNN plans on the host)


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
    ready_timeout_s: float = 900.0  # give up waiting for READY after this many seconds
    log_verbose: int = 0  # tritonserver --log-verbose level
    drain_timeout_s: float = 30.0  # on stop, how long in-flight requests may finish before the server is killed
    frontend_processes: int = 0  # replicas > 1: front-end processes sharing the gRPC port (SO_REUSEPORT); 0 = one per process sending responses (replicas x engine.response_processes), at most half rank 0's CPUs
    keep_cpus_awake: bool = False  # idle-priority spinners on each rank's CPUs: threads wake without a halted vCPU's delay (median first token at one stream -0.1 to -0.46 ms on VMs, its p99 up to +1.2 ms), at the cost of 100% CPU while the server is idle or lightly loaded (launcher/awake.py)
    awake_pause_at: int = 2  # with keep_cpus_awake: the spinners pause while an hf engine of the node holds this many requests or more (busy threads seldom sleep, and a spinner slows its hyperthread sibling); 0: never pause


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
    job_name: str = "llmlaunch"  # Slurm job name and job-folder prefix
    run_dir: str = ""  # job folder; "" = <cluster.jobs_dir>/<job_name>/<timestamp> (tests pin it)


ENGINE_SCHEMAS = {
    "hf": HFEngineConfig,
    "trtllm": TRTLLMEngineConfig,
    "vllm": VLLMEngineConfig,
    "sglang": SGLangEngineConfig,
    "lmdeploy": LMDeployEngineConfig,
}


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
