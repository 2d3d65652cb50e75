"""Config schema: dataclasses with one comment per field (launcher/compose.py registers them in Hydra's ConfigStore).

YAML files under `conf/<group>/` fill these in; `MISSING` marks what a profile
must give. Each field declares its domain beside it (launcher/domains.py: range, choices, path kind, 0 = auto),
which the one validator, `launcher.domains.problems`, reads. Engine-specific fields live in one dataclass per
engine (its package's config.py, launcher/engines/<name>/), each registered as `engine/base_<name>` so
`conf/engine/<name>.yaml` extends it.
Nothing here touches a cluster; rules across fields are in launcher/validate.py and the engines' checks.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Dict, List, Mapping, Tuple

from omegaconf import MISSING

from launcher.domains import (
    CONTAINER_RUNTIMES,
    DTYPES,
    ENV_KEY,
    GPU_REQUESTS,
    MPI_TYPES,
    ROUTERS,
    ROUTINGS,
    SCALE_SIGNALS,
    SLURM_TIME,
    Choice,
    Flag,
    Float,
    FreeMapping,
    Int,
    Items,
    Name,
    Nested,
    Path,
    Pattern,
    SbatchToken,
    ShellLine,
    arg,
    eval_tasks,
)
from launcher.engines.config import EngineConfig
from launcher.engines.registry import schemas as engine_schemas
from launcher.models import MAKERS

# Each field: `name: type = arg(<its domain>, <default>)  # what it is`. The domain (launcher/domains.py) is
# what the one validator checks the value against; the comment says what the field does.
_ENV_KEY_WHAT = "a valid environment variable name (letters, digits and _, not starting with a digit)"


def _makers():
    return ("",) + tuple(sorted(MAKERS))


# --------------------------------------------------------------------------- cluster
@dataclass
class ContainerConfig:
    runtime: str = arg(Choice(CONTAINER_RUNTIMES), "none")  # none | pyxis (srun --container-image ...)
    image: str = arg(
        Pattern(
            r"[A-Za-z0-9._+@%:=,/~#-]*",
            "an image reference: no spaces, quotes or shell characters",
            "give {key} as <registry#image:tag>, e.g. nvcr.io#nvidia/tritonserver:25.12-trtllm-python-py3",
        ),
        "",
    )  # container image for pyxis, e.g. nvcr.io#nvidia/tritonserver:25.12-trtllm-python-py3
    mounts: List[str] = arg(
        Items(SbatchToken()), factory=list
    )  # "host_path:container_path" pairs for --container-mounts
    workdir: str = arg(Path("", absolute=True), "")  # --container-workdir; empty = the image's default


@dataclass
class ClusterConfig:
    name: str = arg(Name(), MISSING)  # profile name, shown in plans and job names
    scheduler: str = arg(
        Name(), "local"
    )  # local (this machine, no Slurm) | slurm: the registry launcher/schedulers/registry.py (launcher/validate.py checks it against its choices)
    partition: str = arg(SbatchToken(), "")  # sbatch --partition; empty = the site default
    account: str = arg(SbatchToken(), "")  # sbatch --account
    qos: str = arg(SbatchToken(), "")  # sbatch --qos
    reservation: str = arg(SbatchToken(), "")  # sbatch --reservation
    constraint: str = arg(SbatchToken(), "")  # sbatch --constraint (node features)
    exclusive: bool = arg(Flag(), False)  # sbatch --exclusive: whole nodes, nothing else on them
    gpus_per_node: int = arg(
        Int("GPUs (or CPU ranks) on one node"), 8
    )  # GPUs on one node (on a CPU-only machine: how many ranks one node may run)
    gpu_request: str = arg(Choice(GPU_REQUESTS), "gpus-per-node")  # how GPUs are asked for: gpus-per-node | gres | none
    mpi: str = arg(Choice(MPI_TYPES), "pmix")  # srun --mpi= type: pmix | pmi2 | none
    time: str = arg(
        Pattern(SLURM_TIME, "not a Slurm time limit", "use HH:MM:SS, D-HH:MM:SS or minutes, e.g. {key}=01:00:00"),
        "00:30:00",
    )  # sbatch --time, HH:MM:SS or D-HH:MM:SS
    cpus_per_task: int = arg(
        Int("CPUs per task", zero="the site default"), 0
    )  # sbatch --cpus-per-task; 0 = site default
    mem: str = arg(
        Pattern(
            r"\d+[KMGT]?",
            "not a Slurm memory size",
            "use a size like {key}=200G, or {key}=0 for all of a node's memory",
            empty="the site default",
        ),
        "",
    )  # sbatch --mem per node, e.g. 200G or 0 (all); empty = site default
    container: ContainerConfig = arg(Nested(), factory=ContainerConfig)  # pyxis container settings
    setup: List[str] = arg(
        Items(ShellLine()), factory=list
    )  # shell lines run in the job before srun (module load, venv activate)
    lock_clocks: str = arg(
        Pattern(
            r"\d+(,\d+)?",
            "not a clock pair in MHz",
            "use {key}=<min>,<max> in MHz, e.g. 1410,1410, or empty",
            empty="clocks left alone",
        ),
        "",
    )  # e.g. "1410,1410": adds `sudo nvidia-smi -lgc <value>` before srun
    env: Dict[str, str] = arg(
        FreeMapping(ENV_KEY, _ENV_KEY_WHAT), factory=dict
    )  # environment variables exported in the job
    extra_sbatch: List[str] = arg(
        Items(
            Pattern(
                r"--[a-z][a-z0-9-]*(=[A-Za-z0-9._+@%:=,/~-]+)?",
                "not a plain --flag or --flag=value",
                "write it as --name=value with no spaces or quotes",
            )
        ),
        factory=list,
    )  # extra sbatch flags, e.g. ["--gpu-bind=none"]
    tritonserver: str = arg(
        Path("executable"), ""
    )  # explicit path to the tritonserver binary; empty = resolve (PATH, /opt/tritonserver, wheel)
    slurm_conf: str = arg(
        Path("file"), ""
    )  # SLURM_CONF for the submitting side (the local test cluster); empty = the site default
    python: str = arg(Path("command"), "")  # python interpreter ranks run with; empty = the one running llmlaunch
    paths_on_host: bool = arg(
        Flag(), False
    )  # the nodes see this host's files at the same paths (the local Slurm cluster): a model path missing here is an error before submit, not a warning (scheduler=local: always)
    jobs_dir: str = arg(
        Path("dir", token=True), "llmlaunch-jobs"
    )  # where job folders go (relative = under the current directory); must be shared with the nodes
    router_partition: str = arg(
        SbatchToken(), ""
    )  # serve.router=job: the router job's partition (CPUs only); empty = cluster.partition
    router_time: str = arg(
        Pattern(SLURM_TIME, "not a Slurm time", "use {key}=D-HH:MM:SS or HH:MM:SS", empty="the partition's default"), ""
    )  # serve.router=job: the router job's time limit, which ends the service; empty = the partition's default
    allows_requeue: bool = arg(
        Flag(), False
    )  # the site lets a job requeue itself (slurm.conf JobRequeue, partition and QOS allow `scontrol requeue`): requeue=true needs it


# --------------------------------------------------------------------------- model
@dataclass
class ModelConfig:
    name: str = arg(Name(), MISSING)  # short name used in job names and tables
    path: str = arg(
        Path("engine"), ""
    )  # HF-format folder with weights (trtllm engine.layout=ensemble reads a built engine dir through engine.engine_dir); empty = made on the spot (make)
    tokenizer: str = arg(Path("engine"), "")  # tokenizer folder; empty = path
    make: str = arg(
        Choice(_makers), ""
    )  # a model llmlaunch makes into its cache when path is empty (launcher/models MAKERS): smollm2 | tiny
    dtype: str = arg(Choice(DTYPES), "auto")  # auto | float32 | bfloat16 | float16
    max_model_len: int = arg(
        Int("context length in tokens", zero="the model's own"), 0
    )  # context length limit; 0 = the model's own


# --------------------------------------------------------------------------- serving, bench, top level
def _port(default: int):
    return arg(Int("a TCP port (1-65535)", max=65535, fix="set {key} to a free port in 1024-65535"), default)


@dataclass
class AutoscaleConfig:
    max_replicas: int = arg(
        Int("replicas at most", min=0, zero="no scaling: the service keeps `replicas` replica jobs"), 0
    )  # with serve.router=host|job, the most replica jobs the service runs when load asks for them; 0 = it keeps `replicas` (llmlaunch-scale changes that by hand)
    min_replicas: int = arg(Int("replicas at least", min=1), 1)  # the fewest replica jobs the service scales down to
    signal: str = arg(
        Choice(SCALE_SIGNALS), "in_flight"
    )  # what it scales by (launcher/service/signals.py): in_flight = requests running or queued per serving replica, as the front end counts them | kv_cache = the share of each replica's KV cache in use, as its engine reports it (engine=hf, vllm) | ttft_p90 = the p90 of the last window's times to first token at the front end, in ms
    up_at: float = arg(
        Float(
            "a signal value",
            0.0,
            lo_open=True,
            zero="the signal's own: in_flight 8, kv_cache 0.8, ttft_p90 none (give one)",
            fix="give the value to scale up at, e.g. {key}=8 (in_flight), 0.8 (kv_cache), 500 (ttft_p90, ms)",
        ),
        0.0,
    )  # more replicas when the signal stays above this for window_s: as many as the load divided by this asks for (in_flight, kv_cache: per replica), or one more (ttft_p90)
    down_at: float = arg(
        Float(
            "a signal value",
            0.0,
            lo_open=True,
            zero="half of up_at",
            fix="give the value to scale down at, below up_at, e.g. {key}=4",
        ),
        0.0,
    )  # one replica fewer (the least loaded, drained first) when the signal stays below this for window_s, counted with one replica fewer for in_flight and kv_cache (below up_at: then a scale-down never brings a scale-up)
    window_s: float = arg(
        Float("seconds", 0.0, lo_open=True, fix="give seconds, e.g. {key}=20"), 20.0
    )  # how long the signal must hold beyond a bound before the service acts
    up_cooldown_s: float = arg(Float("seconds"), 30.0)  # after a scale-up, no other decision for this long
    down_cooldown_s: float = arg(Float("seconds"), 60.0)  # after a scale-down, no other scale-down for this long
    pending_deadline_s: float = arg(
        Float("seconds", 0.0, lo_open=True, fix="give seconds, e.g. {key}=600"), 600.0
    )  # a replica job Slurm has not started after this long is cancelled and reported (the service asks again later if the load still needs it)


@dataclass
class ServeConfig:
    host: str = arg(
        Pattern(
            r"[A-Za-z0-9._:-]+",
            "not a host name or address",
            "give {key} an address such as 0.0.0.0 or 127.0.0.1",
            empty="127.0.0.1 locally, 0.0.0.0 on Slurm",
        ),
        "",
    )  # address rank 0 binds gRPC/HTTP/metrics to; "" = 127.0.0.1 locally, 0.0.0.0 on Slurm
    grpc_port: int = _port(8001)  # gRPC endpoint of rank 0 (the one clients use)
    http_port: int = _port(8000)  # HTTP endpoint of rank 0
    metrics_port: int = _port(8002)  # Prometheus metrics of rank 0
    openai_port: int = _port(
        8003
    )  # OpenAI-compatible HTTP API of rank 0 (/v1/completions, /v1/chat/completions, /v1/models; launcher/openai_api)
    ready_timeout_s: float = arg(
        Float("a deadline in seconds", 0.0, lo_open=True, fix="set a deadline in seconds, e.g. {key}=900"), 900.0
    )  # give up waiting for READY after this many seconds
    log_verbose: int = arg(Int("tritonserver's log level", min=0), 0)  # tritonserver --log-verbose level
    drain_timeout_s: float = arg(
        Float("seconds in-flight requests may finish in"), 30.0
    )  # on stop, how long in-flight requests may finish before the server is killed
    rendezvous_timeout_s: float = arg(
        Float("a deadline in seconds", 0.0, lo_open=True, fix="set a deadline in seconds, e.g. {key}=600"), 600.0
    )  # how long started ranks wait for the others; then the job fails naming the ranks that never arrived
    walltime_signal_s: int = arg(
        Int("seconds before the time limit", zero="no signal: the job ends at its limit"), 60
    )  # Slurm signals the job (SIGUSR2, sbatch --signal) this many seconds before its time limit: the front ends refuse new requests, in-flight ones get up to serve.drain_timeout_s, every rank exits
    routing: str = arg(
        Choice(ROUTINGS), "least_outstanding"
    )  # with replicas > 1, which replica a request goes to: least_outstanding (fewest in flight) | prefix (the one sent the longest run of its prompt's prefix, within a load bound; launcher/frontend/routing.py) | kv (the one whose engine holds the longest run of its prompt's token blocks, from the engines' KV-cache events: engine=hf, vllm)
    max_migrations: int = arg(
        Int("times one request may move", min=0, zero="never: a stream whose replica fails ends in an error"), 3
    )  # with replicas > 1, how often one running request may move to another replica when its replica fails mid-stream: it goes on there after the tokens its client has (engines that can continue a request: hf, vllm but its requests with stop strings or a guide; launcher/frontend/migration.py)
    max_restarts: int = arg(
        Int("restarts of one replica", min=0, zero="never: a replica whose server dies is lost for the job"), 3
    )  # with replicas > 1, how often a replica whose server dies while the job serves is started again in place (same node and ports; after 1, 2, 4, ... s), rejoining the front end once it answers a real request; a copy over several ranks restarts as a whole where its engine's ranks can meet again (hf), else it is lost for the job, as is one past its restarts
    stall_timeout_s: float = arg(
        Float("seconds without a response", 0.0, zero="never: only a replica that dies is failed"), 60.0
    )  # with replicas > 1, a replica that sends no response to any of its running requests for this long (a hung engine, whose server still answers the health probe) is failed like a dead one: its streams move to another replica, and it stays out of routing for as long again
    breaker_errors: int = arg(
        Int("server errors in a row", min=0, zero="never: a replica is taken out only when it dies or stalls"), 5
    )  # with replicas > 1, a replica whose requests fail with the server's own errors this many times in a row (an engine that fails what it takes; a bad request, an overload or a cancellation never counts) is taken out of routing for serve.breaker_cooldown_s, then probed and taken back on trial: its next server error takes it out again, a request that succeeds closes the breaker
    breaker_cooldown_s: float = arg(
        Float("seconds out of routing", 0.0, lo_open=True, fix="give seconds, e.g. {key}=30"), 30.0
    )  # how long the circuit breaker keeps a replica out of routing (doubled each time in a row, up to 8x)
    max_request_bytes: int = arg(
        Int("bytes of one request body", min=1024), 4 << 20
    )  # the OpenAI API answers a larger request body with 413 before reading it whole (4 MiB: about a million tokens of English text)
    router: str = arg(
        Choice(ROUTERS), "in_job"
    )  # where the front end and the OpenAI API run: in_job (rank 0 of the one job, with every replica) | host (a process on the launch host, launcher/service/) | job (a CPU Slurm job of its own, cluster.router_partition); with host or job each replica is a Slurm job of its own that registers when it serves, is handed over before its time limit, replaced when it fails and scaled by serve.autoscale
    handover_margin_s: float = arg(
        Float("seconds"), 30.0
    )  # serve.router=host|job: a replica job's successor is submitted so that it serves this long before the old job's time-limit signal (serve.walltime_signal_s), by the service's measured queue wait and time to READY
    max_replacements: int = arg(
        Int("replacement jobs", min=0, zero="never: a failed replica job is not replaced"), 3
    )  # serve.router=host|job: replica jobs that fail (a rank died beyond its restarts, a node lost) are replaced by new jobs this many times in all
    control_port: int = _port(
        8004
    )  # serve.router=host|job: the router's control API (replicas register, llmlaunch-scale) and its /metrics
    autoscale: AutoscaleConfig = arg(Nested(), factory=AutoscaleConfig)  # serve.router=host|job: replicas by load
    api_key_file: str = arg(
        Path("key_file", fix="give {key} a file whose first line is the key (openssl rand -hex 24 > FILE)"), ""
    )  # a file whose first line is the key the OpenAI API requires as `Authorization: Bearer` on every route but /health; "" = no key (anyone who reaches serve.openai_port may use the model). The file's path travels, never the key


@dataclass
class BenchConfig:
    name: str = arg(Name(), "none")  # profile name; "none" = serve only, no load run
    dataset: str = arg(
        Pattern(
            r"synthetic|(sharegpt|cnn|prompts):.+",
            "not a dataset llmlaunch-bench reads",
            "use {key}=synthetic, sharegpt:<path>, cnn:<path> or prompts:<path>",
        ),
        "synthetic",
    )  # synthetic | sharegpt:<path> | cnn:<path> | prompts:<path>
    num_prompts: int = arg(Int("requests counted in the run"), 100)  # requests counted in the run
    concurrency: int = arg(
        Int("requests in flight", zero="none: the open loop of bench.request_rate"), 8
    )  # requests in flight (fixed-concurrency mode)
    request_rate: float = arg(
        Float("requests/s", 0.0, lo_open=True, zero="fixed concurrency"), 0.0
    )  # requests/s (Poisson); 0 = fixed concurrency
    input_len: int = arg(Int("prompt tokens"), 128)  # synthetic prompt tokens
    output_len: int = arg(Int("new tokens"), 64)  # requested new tokens
    ignore_eos: bool = arg(Flag(), True)  # enforce output length for fair comparisons
    warmup: int = arg(Int("warm-up requests", min=0), 2)  # requests sent first and not counted
    seed: int = arg(Int("a sampling seed", min=0), 0)  # dataset sampling seed
    processes: int = arg(
        Int("client processes"), 1
    )  # client processes sharing the load: one Python gRPC client saturates a core long before 128 streams
    streams: int = arg(Int("gRPC streams per client process"), 1)  # gRPC streams per client process
    eval: List[str] = arg(Items(Choice(eval_tasks)), factory=list)  # llmlaunch-bench --eval's tasks after the load
    eval_limit: int = arg(Int("items a task", zero="all 200"), 0)  # items of each eval task


@dataclass
class DisaggConfig:
    prefill: int = arg(
        Int("prefill replicas", min=0, zero="aggregated: every replica serves whole requests"), 0
    )  # replicas that compute prompts only (disaggregated serving, launcher/frontend/disagg.py): rank 0's front end sends each request's prompt to one of them first (serve.routing picks which), then to a decode replica, which takes the prompt's keys and values from it; 0 = aggregated. The replicas are prefill + decode
    decode: int = arg(
        Int("decode replicas", min=0, zero="aggregated"), 0
    )  # replicas that generate, starting from the keys and values a prefill replica computed (the least loaded one takes each request); where none can be had, a decode replica computes the prompt itself


@dataclass
class LaunchConfig:
    cluster: ClusterConfig = arg(Nested(), MISSING)  # where: conf/cluster/<name>.yaml
    engine: EngineConfig = arg(Nested(), MISSING)  # what serves: conf/engine/<name>.yaml
    model: ModelConfig = arg(Nested(), MISSING)  # which weights: conf/model/<name>.yaml
    serve: ServeConfig = arg(Nested(), factory=ServeConfig)  # ports and timeouts
    bench: BenchConfig = arg(Nested(), factory=BenchConfig)  # load run after READY (sweeps)
    tp: int = arg(
        Int("tensor-parallel GPUs per model copy"), 1
    )  # tensor-parallel GPUs per model copy: must divide the model's attention and KV heads (checked against its config.json before launch); a power of two except for engine=vllm and engine=hf
    pp: int = arg(Int("pipeline stages per model copy"), 1)  # pipeline-parallel stages per model copy
    nodes: int = arg(Int("nodes in the job"), 1)  # nodes in the job
    replicas: int = arg(Int("data-parallel model copies"), 1)  # data-parallel model copies behind the one endpoint
    disagg: DisaggConfig = arg(Nested(), factory=DisaggConfig)  # prefill and decode as separate replicas
    dry_run: bool = arg(Flag(), False)  # print the plan, write and submit nothing
    requeue: bool = arg(
        Flag(), False
    )  # Slurm: at the time limit the job drains, then requeues itself and serves again in a new allocation (needs cluster.allows_requeue)
    job_name: str = arg(
        Name("job names go into #SBATCH lines, file names and shm prefixes"), "llmlaunch"
    )  # Slurm job name and job-folder prefix
    run_dir: str = arg(Path("dir"), "")  # job folder; "" = <cluster.jobs_dir>/<job_name>/<timestamp> (tests pin it)


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


def field_domain(key: str):
    """The declared domain (launcher/domains.py) of a dotted key, e.g. "serve.grpc_port"; an engine key is looked up
    in every engine's dataclass, the first that has it. None for a key no dataclass has."""
    from launcher.domains import domain_of

    head, _, rest = key.partition(".")
    classes = list(engine_schemas().values()) if head == "engine" and rest else [LaunchConfig]
    for cls in classes:
        parts = rest.split(".") if head == "engine" and rest else key.split(".")
        found = None
        for i, part in enumerate(parts):
            f = next((f for f in fields(cls) if f.name == part), None)
            if f is None:
                break
            if i == len(parts) - 1:
                found = domain_of(f)
            else:
                cls = typing.get_type_hints(cls).get(part)
                if not is_dataclass(cls):
                    break
        if found is not None:
            return found
    return None
