"""The hf engine's arguments: one dataclass, the one place each setting's default lives.

The launcher's schema (`launcher.schema.HFEngineConfig`) takes its hf fields' defaults from here, the registry
writes one `HFEngineArgs` to the model's `1/model.json`, and the Triton model (model_repository/hf/1/model.py)
reads it back with `HFEngineArgs.from_dict` and hands it to the engine process, `Engine` and the runner.
Imports nothing heavy (no torch, no transformers): the stub, the launcher and the engine all import it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Mapping

ARGS_FILE = "model.json"  # the file beside model.py that holds the arguments (config.pbtxt names it)
CUDNN_ATTENTION = ("graphs", "all", "off")  # cudnn_attention's choices (launcher.hf.warmup says what each means)

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


@dataclass
class HFEngineArgs:
    # -- what to load
    model_path: str = ""  # HF-format model folder (config, weights, tokenizer); required to serve
    tokenizer_path: str = ""  # tokenizer folder; empty = model_path
    device: str = "auto"  # auto (cuda when available) | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto (float32 on CPU, where bf16 matmuls are slow; the model's half type on a GPU) | float32 | bfloat16 | float16
    # -- batching
    max_num_seqs: int = 64  # sequences decoded together (also the config's max_batch_size)
    max_model_len: int = 0  # context limit in tokens (prompt + generated); 0 = the model's own, or what one sequence can hold in the KV-cache pool where that is less
    # -- the KV cache (launcher.hf.blocks): a pool of blocks sized to the machine, shared by every sequence
    kv_cache_memory: float = (
        0.0  # GiB the KV-cache pool takes; 0 = 0.5 GiB on CPU, 85% of the GPU memory free once the weights are loaded
    )
    block_size: int = 16  # tokens a KV-cache block holds: a sequence takes its memory a block at a time, and prefix caching shares whole blocks
    prefix_caching: bool = True  # a request whose prompt starts with tokens another request computed (a system prompt, a conversation's history) reuses their KV-cache blocks and prefills only the rest
    prefill_chunk: int = 0  # prompt tokens prefilled per engine step, so running streams keep flowing; 0 = 512 on CPU, 2048 on a GPU (an eager mixed step costs ~15 ms of launches there whatever its size, so bigger chunks get a wave of prompts its first tokens in fewer steps)
    # -- kernels
    attn_implementation: str = "sdpa"  # sdpa (torch's fused kernels) | eager (matmul + softmax): the engine's attention
    cuda_graphs: bool = True  # replay decode steps and steps of whole prompts as captured CUDA graphs (GPU only; with tp_size > 1 every rank replays the same graphs, NCCL inside): a step then costs one launch instead of hundreds
    torch_compile: str = "auto"  # auto | true | false: fuse the model's small kernels with torch.compile when it loads (auto: on for GPUs, off on CPU, where compiling takes longer than it saves)
    cudnn_attention: str = "graphs"  # graphs | all | off: where attention may use cuDNN (graphs: captured decode graphs only, whose plan cuDNN builds once at capture, so prompt steps build no per-shape cuDNN plans on the host)
    torch_threads: int = 0  # intra-op threads of the engine; 0 = torch's default (one per core). On small CPU machines 1 leaves the other cores to tritonserver and the clients
    # -- graph limits (each trades capture time and memory at start-up for launch overhead while serving)
    prefill_graphs: int = (
        2048  # the longest prompt (tokens) whose prompt-only step replays a CUDA graph; 0 = none (needs cuda_graphs)
    )
    mixed_graphs: int = 512  # the most prompt tokens that go beside decode rows in one step through a mixed CUDA graph; 0 = none (needs cuda_graphs and tp_size 1)
    prompts_alone: int = 4  # at most this many waiting prompts go one per step through their prompt graphs while others decode (more go as one wave); 0 = never
    # -- tensor parallelism
    tp_timeout_s: float = 120.0  # tensor-parallel ranks: a collective that waits longer than this fails the engine (a hung or dead rank fails the job instead of hanging it); the idle leader's heartbeat comes every quarter of it
    tp_size: int = 1  # tensor-parallel ranks: one tritonserver per rank, group rank 0 runs the engine, the others the worker loop of launcher.hf.tp (must divide the model's attention and kv heads)
    # -- responses (the Triton model's side)
    engine_process: bool = True  # run the engine in a child process, so building and sending responses never competes with the engine loop for the GIL; false runs it in the stub, whose interpreter then needs torch and transformers
    stream_interval_ms: int = 0  # least time between two streamed responses of a request; tokens made meanwhile go in one response (its first token and its end never wait). 0 = a response per engine step. Each response costs the server CPU, so under load a few ms cut the first token's serving overhead
    cancel_check_ms: int = 50  # how often (per request) to ask Triton whether the client cancelled; each ask is a round trip to the server; 0 = every step

    # ------------------------------------------------------------------------------------------------ reading
    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], source: str = ARGS_FILE) -> "HFEngineArgs":
        """Arguments from a mapping (model.json, or strings as a config.pbtxt gives them): each value is coerced to
        its field's type; an unknown key or a value of the wrong kind raises ValueError naming it."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(fields))
        if unknown:
            raise ValueError(
                f"{source}: the hf engine has no argument {', '.join(unknown)}; valid keys are "
                f"{', '.join(sorted(fields))}"
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

    def to_json(self) -> str:
        """model.json's text: every argument, sorted keys (as the vLLM model's file)."""
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

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
