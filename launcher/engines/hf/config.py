"""The hf engine's settings, declared once: `HFEngineConfig` (what a user chooses, each setting's domain, default and
meaning) and `HFEngineArgs` (the same settings plus what the launch decides: the model's paths and dtype, the
context limit and tp), which the registry writes to the model's `1/model.json` and the Triton model
(launcher/engines/hf/model.py) reads back for the engine process, `Engine` and the runner.

Imports nothing heavy (no torch, no transformers): the stub, the launcher and the engine all import it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Mapping

from launcher.domains import DEVICES, DTYPES, Choice, Flag, Float, Int, Name, Path, arg
from launcher.engines.config import EngineConfig

ARGS_FILE = "model.json"  # the file beside model.py that holds the arguments (config.pbtxt names it)
CUDNN_ATTENTION = ("graphs", "all", "off")  # cudnn_attention's choices (launcher.hf.warmup says what each means)
BLOCK_SIZES = tuple(2**i for i in range(9))  # block_size's choices: a power of two up to 256

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def _blocks(value: Any) -> Any:
    """block_size as its choices are written (Hydra may give an int-like string)."""
    try:
        return int(value) if not isinstance(value, bool) else value
    except (TypeError, ValueError):
        return value


@dataclass
class HFEngineConfig(EngineConfig):
    name: str = arg(Name(), "hf")  # our own continuous-batching engine on HF transformers
    model_name: str = arg(Name(empty="the engine's default"), "hf_model")  # Triton model name clients address
    max_num_seqs: int = arg(
        Int("sequences batched at once"), 64
    )  # sequences decoded together (also the config's max_batch_size)
    device: str = arg(Choice(DEVICES), "auto")  # auto (cuda when available) | cpu | cuda
    attn_implementation: str = arg(
        Choice(("sdpa", "eager")), "sdpa"
    )  # sdpa (torch's fused kernels) | eager (matmul + softmax): the engine's attention
    prefill_chunk: int = arg(
        Int(
            "prompt tokens per engine step",
            zero="the engine's default",
            fix="set {key}=0 (512 on CPU, 2048 on a GPU) or a positive number like 1024",
        ),
        0,
    )  # prompt tokens prefilled per engine step, so running streams keep flowing; 0 = 512 on CPU, 2048 on a GPU (an eager mixed step costs ~15 ms of launches there whatever its size, so bigger chunks get a wave of prompts its first tokens in fewer steps)
    cuda_graphs: bool = arg(
        Flag(), True
    )  # replay decode steps and steps of whole prompts as captured CUDA graphs (GPU only; with tp_size > 1 every rank replays the same graphs, NCCL inside): a step then costs one launch instead of hundreds
    stream_interval_ms: int = arg(
        Int(
            "least ms between two responses of a stream",
            zero="a response per engine step",
            fix="set {key}=0, or 8 to merge a stream's tokens into fewer responses under load",
        ),
        0,
    )  # least time between two streamed responses of a request; tokens made meanwhile go in one response (its first token and its end never wait). 0 = a response per engine step. Each response costs the server CPU, so under load a few ms cut the first token's serving overhead
    response_processes: int = arg(
        Int("model instances sharing the engine", fix="set {key}=1, or 4 to send responses from four processes"), 1
    )  # Triton model instances (stub processes, each with its own GIL) that share the engine process and send its responses; tp=1 only. The one responder setting (launcher/python_backend/responders.py derives threads per stub, nice and front-end processes from it, the device and the CPUs): one stub sends a few thousand responses/s whatever its threads, so the streams served at once, which only the user knows, decide it (1 up to tens of streams, 2-4 for 128 on a GPU)
    # a str field, so Hydra's engine.torch_compile=true arrives as 'True'
    torch_compile: str = arg(
        Choice(("auto", "true", "false"), normalize=lambda v: str(v).lower()), "auto"
    )  # auto | true | false: fuse the model's small kernels with torch.compile when it loads (auto: on for GPUs, off on CPU, where compiling takes longer than it saves)
    cudnn_attention: str = arg(
        Choice(CUDNN_ATTENTION), "graphs"
    )  # graphs | all | off: where attention may use cuDNN (graphs: captured decode graphs only, whose plan cuDNN builds once at capture, so prompt steps build no per-shape cuDNN plans on the host)
    tp_timeout_s: float = arg(
        Float("a deadline in seconds", 0.0, lo_open=True, fix="set a deadline in seconds, e.g. {key}=120"), 120.0
    )  # tensor-parallel ranks: a collective that waits longer than this fails the engine (a hung or dead rank fails the job instead of hanging it); the idle leader's heartbeat comes every quarter of it
    kv_cache_memory: float = arg(
        Float("GiB of KV cache", 0.0, zero="0.5 GiB on CPU, 85% of the GPU memory free after the weights"), 0.0
    )  # GiB the KV-cache pool takes; 0 = 0.5 GiB on CPU, 85% of the GPU memory free once the weights are loaded
    block_size: int = arg(
        Choice(BLOCK_SIZES, normalize=_blocks, fix="set {key}=16 (a power of two up to 256)"), 16
    )  # tokens a KV-cache block holds: a sequence takes its memory a block at a time, and prefix caching shares whole blocks
    prefix_caching: bool = arg(
        Flag(), True
    )  # a request whose prompt starts with tokens another request computed (a system prompt, a conversation's history) reuses their KV-cache blocks and prefills only the rest
    torch_threads: int = arg(
        Int("intra-op threads", zero="torch's default, one per core"), 0
    )  # intra-op threads of the engine; 0 = torch's default (one per core). On small CPU machines 1 leaves the other cores to tritonserver and the clients
    prefill_graphs: int = arg(
        Int("prompt tokens", zero="no prompt graphs"), 2048
    )  # the longest prompt (tokens) whose prompt-only step replays a CUDA graph; 0 = none (needs cuda_graphs)
    mixed_graphs: int = arg(
        Int("prompt tokens", zero="no mixed graphs"), 512
    )  # the most prompt tokens that go beside decode rows in one step through a mixed CUDA graph; 0 = none (needs cuda_graphs and tp 1)
    prompts_alone: int = arg(
        Int("waiting prompts", zero="never"), 4
    )  # at most this many waiting prompts go one per step through their prompt graphs while others decode (more go as one wave); 0 = never
    engine_process: bool = arg(
        Flag(), True
    )  # run the engine in a child process, so building and sending responses never competes with the engine loop for the GIL; false runs it in the stub, whose interpreter then needs torch and transformers
    cancel_check_ms: int = arg(
        Int("ms between cancellation checks", zero="every step"), 50
    )  # how often (per request) to ask Triton whether the client cancelled; each ask is a round trip to the server; 0 = every step


# The config's fields that are not engine arguments: they name the engine and its Triton model and size Triton's
# instance group, which config.pbtxt carries.
NOT_ARGUMENTS = ("name", "model_name", "response_processes")


@dataclass
class HFEngineArgs(HFEngineConfig):
    """What the engine loads and how: its settings (HFEngineConfig's fields, but those in NOT_ARGUMENTS) and what the
    launch decides (below), as `1/model.json` holds them."""

    model_path: str = arg(Path(""), "")  # HF-format model folder (config, weights, tokenizer); required to serve
    tokenizer_path: str = arg(Path(""), "")  # tokenizer folder; empty = model_path
    dtype: str = arg(
        Choice(DTYPES), "auto"
    )  # auto (float32 on CPU, where bf16 matmuls are slow; the model's half type on a GPU) | float32 | bfloat16 | float16
    max_model_len: int = arg(
        Int("tokens", zero="the model's own"), 0
    )  # context limit in tokens (prompt + generated); 0 = the model's own, or what one sequence can hold in the KV-cache pool where that is less
    tp_size: int = arg(
        Int("tensor-parallel ranks"), 1
    )  # tensor-parallel ranks: one tritonserver per rank, group rank 0 runs the engine, the others the worker loop of launcher.hf.tp (must divide the model's attention and kv heads)

    # ------------------------------------------------------------------------------------------------ reading
    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], source: str = ARGS_FILE) -> "HFEngineArgs":
        """Arguments from a mapping (model.json, or strings as a config.pbtxt gives them): each value is coerced to
        its field's type; an unknown key or a value of the wrong kind raises ValueError naming it."""
        names = argument_names()
        unknown = sorted(set(raw) - set(names))
        if unknown:
            raise ValueError(
                f"{source}: the hf engine has no argument {', '.join(unknown)}; valid keys are {', '.join(names)}"
            )
        defaults = cls()
        values = {k: _coerce(k, v, type(getattr(defaults, k)), source) for k, v in raw.items()}
        if "torch_compile" in values:
            values["torch_compile"] = _auto_flag("torch_compile", values["torch_compile"], source)
        return cls(**values)

    @classmethod
    def read(cls, path: str) -> "HFEngineArgs":
        with open(path) as f:
            raw = json.load(f)
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a JSON object of hf engine arguments")
        return cls.from_dict(raw, source=path)

    def to_dict(self) -> dict:
        """Every argument (the fields but NOT_ARGUMENTS), as from_dict reads them back."""
        return {k: getattr(self, k) for k in argument_names()}

    def to_json(self) -> str:
        """model.json's text: every argument, sorted keys (as the vLLM model's file)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    # ------------------------------------------------------------------------------------------------ resolving
    def prefill_tokens(self, device_type: str) -> int:
        """Prompt tokens per step on this device (prefill_chunk, or its device default)."""
        return prefill_tokens(self.prefill_chunk, device_type)

    def runner_kwargs(self) -> dict:
        """The keywords of `launcher.hf.runner.HFModelRunner` (and launcher.hf.worker.run_worker) beside the model path
        (0 / auto become its None: decided once the device is known)."""
        return {
            "device": self.device,
            "dtype": self.dtype,
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len or None,
            "kv_cache_memory": self.kv_cache_memory * 2**30 if self.kv_cache_memory else None,
            "block_size": self.block_size,
            "attn_implementation": self.attn_implementation,
            "tp": self.tp_size,
            "tp_timeout_s": self.tp_timeout_s,
            "cuda_graphs": self.cuda_graphs,
            "torch_compile": {"auto": None, "true": True, "false": False}[
                _auto_flag("torch_compile", self.torch_compile)
            ],
            "cudnn_attention": self.cudnn_attention,
            "prefill_graphs": self.prefill_graphs,
            "mixed_graphs": self.mixed_graphs,
        }


def argument_names() -> list:
    """model.json's keys, sorted: HFEngineArgs' fields but the config's own (NOT_ARGUMENTS)."""
    return sorted(f.name for f in dataclasses.fields(HFEngineArgs) if f.name not in NOT_ARGUMENTS)


def engine_args(config: HFEngineConfig, **launch: Any) -> HFEngineArgs:
    """The arguments of an engine config (its fields of the same names) and the launch's own (`launch`: model_path,
    tokenizer_path, dtype, max_model_len, tp_size)."""
    given = {k: getattr(config, k) for k in argument_names() if hasattr(config, k)}
    return HFEngineArgs.from_dict({**given, **launch}, source="engine config")


DEFAULTS = HFEngineArgs()  # for keyword defaults elsewhere that must name the same values


def prefill_tokens(chunk: int | None, device_type: str) -> int:
    """Prompt tokens per engine step: `chunk`, or where it is 0 / None, 512 on CPU and 2048 on a GPU."""
    return max(1, int(chunk or 0) or (2048 if device_type == "cuda" else 512))


def _coerce(name: str, value: Any, kind: type, source: str) -> Any:
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE + _FALSE:
            return text in _TRUE
        raise ValueError(f"{source}: {name}={value!r} is not true or false")
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return int(str(value).strip())
        except ValueError:
            raise ValueError(f"{source}: {name}={value!r} is not an integer") from None
    if kind is float:
        try:
            return float(str(value).strip())
        except ValueError:
            raise ValueError(f"{source}: {name}={value!r} is not a number") from None
    return str(value).lower() if isinstance(value, bool) else str(value)


def _auto_flag(name: str, value: Any, source: str = ARGS_FILE) -> str:
    """auto | true | false (also 1/0, yes/no, a bool; "" = auto)."""
    text = str(value).strip().lower()
    if text in ("", "auto"):
        return "auto"
    if text in _TRUE + _FALSE:
        return "true" if text in _TRUE else "false"
    raise ValueError(f"{source}: {name}={value!r} is not auto, true or false")
