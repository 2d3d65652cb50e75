"""TensorRT-LLM's LLM API served by our python model: `engine=trtllm engine.layout=llmapi` (the default).

Upstream's Triton layout for current releases is one python model (TensorRT-LLM's
triton_backend/all_models/llmapi/tensorrt_llm: `1/model.py` builds `tensorrt_llm.LLM(**model.yaml)` on a
Hugging Face checkpoint, no engine build) and, for several GPUs and nodes, one MPI world started with
`trtllm-llmapi-launch` (scripts/launch_triton_server.py --trtllm_llmapi_launch puts it in front of every
rank's tritonserver). Ours keeps that shape with our own model (launcher/engines/trtllm/models/llmapi.py,
the common request contract):

* the repository is one decoupled python model (default name `tensorrt_llm`, upstream's) whose
  `1/model.yaml` holds the `tensorrt_llm.LLM` arguments: the ones llmlaunch derives from the launch, then
  `engine.llm_args` over them;
* a model copy of one GPU is a plain tritonserver per rank (replicas are data-parallel copies);
* a copy of several GPUs is the job's MPI world, one task per GPU under `srun --mpi=pmix`, every task
  started through `trtllm-llmapi-launch`: on rank 0 it runs tritonserver (with the MPI variables cleared)
  beside TensorRT-LLM's MPI leader, whose session the LLM in our model reaches through a proxy; on the
  other ranks it runs TensorRT-LLM's MPI worker and no tritonserver. The launcher reads the world from
  SLURM_PROCID / SLURM_NTASKS, so the world is the whole job: one model copy per job.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple

from launcher import pbtxt
from launcher.engines.base import RenderedModel, model_path

DEFAULT_MODEL_NAME = "tensorrt_llm"  # upstream's model name in all_models/llmapi
ARGS_FILE = "model.yaml"  # upstream's name for the LLM arguments beside model.py
MPI_LAUNCHER = "trtllm-llmapi-launch"  # TensorRT-LLM's console script (tensorrt_llm/llmapi/trtllm-llmapi-launch)
ENGINE_FILE_SUFFIX = ".engine"  # a built TensorRT engine folder holds rank<N>.engine files


def uses_launcher(spec) -> bool:
    """Is a model copy an MPI world started by trtllm-llmapi-launch (more than one GPU)?"""
    return spec.tp * spec.pp > 1


def llm_args(spec) -> Dict[str, Any]:
    """The tensorrt_llm.LLM keyword arguments of this launch: ours, then engine.llm_args over them."""
    e, m = spec.engine, spec.model
    args: Dict[str, Any] = {
        "model": model_path(spec),
        "backend": "pytorch",  # LLM's default backend; the TensorRT-engine one is the ensemble layout's job
        "tensor_parallel_size": spec.tp,
        "pipeline_parallel_size": spec.pp,
        "max_batch_size": e.max_num_seqs,
        "kv_cache_config": {"free_gpu_memory_fraction": e.kv_cache_free_gpu_mem_fraction},
    }
    if m.tokenizer and m.tokenizer != m.path:
        args["tokenizer"] = m.tokenizer
    if m.dtype != "auto":
        args["dtype"] = m.dtype
    if m.max_model_len:
        args["max_seq_len"] = m.max_model_len
    if uses_launcher(spec):
        # the MPI ranks' GPUs: TensorRT-LLM places rank r on GPU r % gpus_per_node of its node
        args["gpus_per_node"] = spec.gpus_per_node_used
    args.update(e.llm_args)
    return args


def model_yaml(spec) -> str:
    import yaml

    head = (
        "# tensorrt_llm.LLM(**this) for llmlaunch's TensorRT-LLM model (model_repository/trtllm/llmapi);\n"
        "# written from the launch and engine.llm_args, which wins over the rest\n"
    )
    return head + yaml.safe_dump(llm_args(spec), sort_keys=True, default_flow_style=False)


def render_models(spec) -> List[RenderedModel]:
    params = {"llm_args_file": ARGS_FILE, "tokenizer_path": spec.model.tokenizer or model_path(spec)}
    cfg = pbtxt.python_model(spec.model_name, spec.engine.max_num_seqs, params)
    return [
        RenderedModel(
            spec.model_name, cfg, {"1/model.py": "trtllm/llmapi/1/model.py"}, {f"1/{ARGS_FILE}": model_yaml(spec)}
        )
    ]


def rank_argv(spec, rank, argv: List[str]) -> List[str]:
    """The command a rank runs, given its tritonserver command line: a copy of several GPUs runs every rank
    under trtllm-llmapi-launch, which serves on rank 0 and runs an MPI worker (no tritonserver) elsewhere."""
    if not uses_launcher(spec):
        return argv
    return [MPI_LAUNCHER, *argv] if rank.group_rank == 0 else [MPI_LAUNCHER]


def runs_server(spec, rank) -> bool:
    return not uses_launcher(spec) or rank.group_rank == 0


def looks_like_engine_dir(path: str) -> bool:
    return any(name.endswith(ENGINE_FILE_SUFFIX) for name in os.listdir(path))


def check(c, scheduler) -> List[Tuple[str, str, str]]:
    """The llmapi layout's problems (`scheduler`: the class of cluster.scheduler, launcher.schedulers). A path is looked at only where it exists on this machine (it may live on
    a filesystem only the nodes mount)."""
    e, m, problems = c.engine, c.model, []
    path = m.path
    if not path:
        problems.append(
            (
                "model.path=''",
                "engine.layout=llmapi serves a Hugging Face checkpoint (tensorrt_llm.LLM builds no engine)",
                "set model.path=/path/to/hf_model (a folder with config.json and the weights), or "
                "engine.layout=ensemble with engine.engine_dir=<built engine folder>",
            )
        )
    elif os.path.isdir(path):
        if looks_like_engine_dir(path):
            problems.append(
                (
                    f"model.path={path!r}",
                    "holds a built TensorRT engine (rank<N>.engine); engine.layout=llmapi "
                    "loads a Hugging Face checkpoint",
                    "set model.path to the model's Hugging Face folder, or "
                    "engine.layout=ensemble to serve this engine on the C++ backend",
                )
            )
        elif not os.path.isfile(os.path.join(path, "config.json")):
            problems.append(
                (
                    f"model.path={path!r}",
                    "has no config.json: not a Hugging Face model folder, which engine.layout=llmapi loads",
                    "set model.path to a folder with config.json and the weights",
                )
            )
    frac = e.kv_cache_free_gpu_mem_fraction
    if not 0 < frac <= 1:
        problems.append(
            (
                f"engine.kv_cache_free_gpu_mem_fraction={frac}",
                "a fraction of free GPU memory",
                "use a value in (0, 1], e.g. 0.9",
            )
        )
    bad = [k for k in e.llm_args if not isinstance(k, str) or not k.isidentifier()]
    if bad:
        problems.append(
            (
                f"engine.llm_args keys {bad}",
                "tensorrt_llm.LLM takes keyword arguments",
                "use argument names such as enable_chunked_prefill",
            )
        )
    group = c.tp * c.pp
    if group > 1 and c.replicas != 1:
        problems.append(
            (
                f"replicas={c.replicas} with tp*pp={group}",
                f"{MPI_LAUNCHER} makes one MPI world of the job's "
                "tasks (SLURM_NTASKS), so a job holds one model copy of several GPUs",
                "set replicas=1 (another job for another copy), or tp=1 pp=1 for data-parallel copies",
            )
        )
    if group > 1 and not scheduler.starts_mpi_world:
        problems.append(
            (
                f"tp*pp={group} with cluster.scheduler={c.cluster.scheduler!r}",
                f"the MPI world {MPI_LAUNCHER} joins is the one srun starts (--mpi=pmix)",
                "use a Slurm cluster profile (cluster=local_slurm on this machine), or tp=1 pp=1",
            )
        )
    return problems


def host_paths(c) -> List[Tuple[str, str, str]]:
    """The Hugging Face checkpoint tensorrt_llm.LLM loads (and its tokenizer where given apart)."""
    m = c.model
    return [("model.path", m.path, "hf_model")] + (
        [("model.tokenizer", m.tokenizer, "tokenizer")] if m.tokenizer else []
    )
