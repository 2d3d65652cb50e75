"""The model side of the `hf` engine: run one scheduled step of a HF transformers model.

The scheduler (hf_engine.py) decides *what* runs in a step and describes it as a `StepInputs` of plain Python lists
(hf_step); `HFModelRunner.execute(step)` runs it and returns the sampled token per output row.  The runner owns the
model and the slot KV cache (one slot per running sequence) and puts the pieces together:

* hf_step: the step as plain data (broadcastable to tensor-parallel workers), and its layout for an eager run;
* hf_attention: our attention, registered with transformers, which writes the cache and attends over it;
* hf_graphs: the CUDA graphs that replay decode-only, whole-prompt and mixed steps;
* hf_sampling: the batched sampler; hf_fuse: fused projections; hf_tp: tensor parallelism.

A step runs as one captured graph where one fits (`_replay`), else eagerly (`_run`), then samples.  The only
device->host sync is reading the sampled tokens at the end (`wait`).  Sliding-window models are served with
max_model_len capped at the window, where full attention is the same thing.
"""

from __future__ import annotations

import logging

from launcher.hf.args import CUDNN_ATTENTION, DEFAULTS
from launcher.hf.attention import ATTN_NAME, register_attention, tls
from launcher.hf.graphs import (
    DecodeGraphs,
    MixedGraphs,
    PromptGraphs,
    WaveGraphs,
    mixed_buckets,
    prefill_buckets,
    token_limit,
)

# PrefillChunk, SamplingRows, StepInputs and group_first_chunks are imported from this module by the engine, the
# benchmarks and the tests
from launcher.hf.step import PrefillChunk, SamplingRows, StepInputs, group_first_chunks, prepare_step
from launcher.stage import announce

__all__ = [
    "HFModelRunner",
    "PrefillChunk",
    "SamplingRows",
    "StepInputs",
    "group_first_chunks",
    "resolve_dtype",
    "use_llmlaunch_inductor_cache",
]

log = logging.getLogger(__name__)


def use_llmlaunch_inductor_cache() -> None:
    """Inductor keeps what it compiled in /tmp by default, which a cluster node forgets between jobs; under the
    llmlaunch cache (in the home directory, which the nodes share) the next start of the same model and settings
    loads it instead of compiling again.  A directory the user chose stays.  (Importing Inductor, which loading a
    model does, writes its default into the environment; that one is replaced.)"""
    import os

    from launcher.paths import cache_root

    key, ours = "TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor")
    current = os.environ.get(key)
    if current is None:
        os.environ[key] = ours
        return
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # older torch
        from torch._inductor.runtime.runtime_utils import default_cache_dir
    if os.path.abspath(current) == os.path.abspath(default_cache_dir()):
        os.environ[key] = ours


def resolve_dtype(dtype: str, device_type: str, config):
    """auto: float32 on CPU, else the checkpoint's half type (bfloat16 when it says float32)."""
    import torch

    if dtype in (None, "", "auto"):
        if device_type == "cpu":
            return torch.float32  # bf16 matmuls are slow on most CPUs
        cfg = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if isinstance(cfg, str):
            cfg = getattr(torch, cfg, None)
        return cfg if cfg in (torch.float16, torch.bfloat16) else torch.bfloat16
    names = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16"}
    value = getattr(torch, names.get(dtype, dtype), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"dtype {dtype!r} is not one of auto, float32, float16, bfloat16")
    return value


class HFModelRunner:
    """Owns the model and the slot KV cache; `execute(StepInputs)` -> sampled token per output row."""

    def __init__(
        self,
        model_path: str,
        device: str = DEFAULTS.device,
        dtype: str = DEFAULTS.dtype,
        max_num_seqs: int = DEFAULTS.max_num_seqs,
        max_model_len: int | None = None,
        attn_implementation: str = DEFAULTS.attn_implementation,
        kv_cache_memory: float | None = None,
        tp: int = 1,
        tp_group=None,
        cuda_graphs: bool | None = None,
        torch_compile: bool | None = None,
        cudnn_attention: str | None = None,
        prefill_graphs: int | None = None,
        mixed_graphs: int | None = None,
        tp_timeout_s: float = DEFAULTS.tp_timeout_s,
    ):
        """tp > 1: this process is one rank of a tensor-parallel group (launcher.hf.tp): `tp_group` (a TPGroup) or one
        made from the rank's environment (its collectives time out after `tp_timeout_s`); the model is sharded after
        loading.
        cuda_graphs: replay decode-only steps as CUDA graphs (None: on for cuda; with tp > 1 the graphs hold the
        NCCL all-reduces, and every rank captures the same ones, see `warm_up`).  With them, steps of one whole
        prompt and of several (WAVE_ROWS) replay graphs too.
        torch_compile: run the model's forward through torch.compile (None: on for cuda; with tp > 1 the
        all-reduces are traced as functional collectives); `warm_up()` compiles before serving.
        prefill_graphs: the longest prompt (tokens) whose prompt-only step replays a CUDA graph (None: HFEngineArgs.prefill_graphs; 0:
        none; needs cuda_graphs); see hf_graphs.PromptGraphs.
        mixed_graphs: the most prompt tokens a step of decode rows and whole prompts together replays a CUDA graph
        for (None: HFEngineArgs.mixed_graphs; 0: none; needs cuda_graphs and tp=1); see hf_graphs.MixedGraphs.
        Each layer's q/k/v and gate/up projections run as one product each (hf_fuse)."""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from launcher.hf import fuse as hf_fuse
        from launcher.hf.sampling import Sampler

        register_attention()
        if attn_implementation not in ("sdpa", "eager"):
            raise ValueError(f"attn_implementation {attn_implementation!r} is not one of sdpa, eager")
        self.eager = attn_implementation == "eager"
        if device in (None, "", "auto"):
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if torch_compile is not False:
            use_llmlaunch_inductor_cache()
        config = AutoConfig.from_pretrained(model_path)
        self.dtype = resolve_dtype(dtype, self.device.type, config)
        announce(f"hf engine: loading {model_path} ({str(self.dtype).replace('torch.', '')}) on {self.device}")
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype, attn_implementation="sdpa")
        # switch every (sub)config to our attention after loading: loading validates the name against the
        # built-in list in some transformers versions, the forward only looks it up in AttentionInterface.
        for cfg in (model.config, getattr(model.config, "text_config", None)):
            if cfg is not None:
                cfg._attn_implementation = ATTN_NAME
        text_cfg = getattr(model.config, "text_config", None) or model.config
        self.tp = int(tp or 1)
        self.tp_group = None
        if self.tp > 1:
            from launcher.hf import tp as hf_tp

            hf_tp.check_divisible(text_cfg, self.tp)  # before joining the group: a clear error, no hang
            if self.device.type == "cuda" and self.device.index is None:
                # set_device needs an index.  Ranks that see several GPUs (no per-rank CUDA_VISIBLE_DEVICES)
                # take one per local rank; a rank given its own GPU sees it as cuda:0.
                import os

                local = int(os.environ.get("_LLMLAUNCH_LOCAL_RANK", "0") or 0)
                self.device = torch.device("cuda", local % max(1, torch.cuda.device_count()))
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)  # before the process group: NCCL uses the current device
            self.tp_group = tp_group or hf_tp.TPGroup(self.tp, device_type=self.device.type, timeout=tp_timeout_s)
            hf_tp.shard_model(model, text_cfg, self.tp_group)  # on the host, before moving the shard
        self.model = model.to(self.device).eval()
        # after sharding: a rank fuses its own shards; on the device: the concatenation is a device copy
        self.fused = hf_fuse.fuse_projections(self.model)
        self.config = model.config
        self.num_layers = text_cfg.num_hidden_layers
        # kv heads of this rank (all of them with tp=1): the cache and our attention only see these
        self.num_kv_heads = (getattr(text_cfg, "num_key_value_heads", None) or text_cfg.num_attention_heads) // self.tp
        self.head_dim = getattr(text_cfg, "head_dim", None) or text_cfg.hidden_size // text_cfg.num_attention_heads
        self.vocab_size = text_cfg.vocab_size
        limit = getattr(text_cfg, "max_position_embeddings", None) or 2048
        # Sliding-window layers attend to the last `window` tokens only; our attention is full, which is the same
        # thing as long as no sequence is longer than the window.
        window = getattr(text_cfg, "sliding_window", None)
        if window and (getattr(text_cfg, "use_sliding_window", True) or getattr(text_cfg, "layer_types", None)):
            limit = min(limit, int(window))
        self.max_model_len = int(max_model_len) if max_model_len else min(limit, 4096)
        if self.max_model_len > limit:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the model's context of {limit} tokens")
        self.max_num_seqs = int(max_num_seqs)
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        self._init_graphs(cuda_graphs, prefill_graphs, mixed_graphs)
        self._init_attention_backends(cudnn_attention)
        self._init_compile(torch_compile)
        self._allocate_cache(kv_cache_memory)
        self.sampler = Sampler(self.max_num_seqs, self.vocab_size, self.device)
        self._last_done = None  # the completion event of the step launched last, until the engine idles (gpu_times)
        self.last_graph = None  # the graph the last launch replayed: "decode", "prompt", "wave", "mixed" or None
        self._layer_idx_check()

    # -- setup ---------------------------------------------------------------------------------------------
    def _allocate_cache(self, budget: float | None) -> None:
        import torch

        itemsize = torch.empty((), dtype=self.dtype).element_size()
        slots = self.max_num_seqs + self._spare_slots
        per_layer = slots * self.num_kv_heads * self.max_model_len * self.head_dim * itemsize * 2
        total = per_layer * self.num_layers
        if budget is None:
            if self.device.type == "cuda":
                free, _ = torch.cuda.mem_get_info(self.device)
                budget = 0.85 * free
            else:
                import os

                budget = 0.5 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if total > budget:
            raise ValueError(
                f"the KV cache for max_num_seqs={self.max_num_seqs} x max_model_len={self.max_model_len} needs "
                f"{total / 2**30:.1f} GiB but {budget / 2**30:.1f} GiB are available; lower max_num_seqs or "
                f"max_model_len"
            )
        shape = (slots, self.num_kv_heads, self.max_model_len, self.head_dim)
        self.cache = [
            (
                torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device),
            )
            for _ in range(self.num_layers)
        ]
        log.info(
            "hf engine: KV cache %d slots x %d tokens, %.2f GiB", self.max_num_seqs, self.max_model_len, total / 2**30
        )

    def _layer_idx_check(self) -> None:
        idx = sorted(
            getattr(m, "layer_idx", -1)
            for m in self.model.modules()
            if hasattr(m, "layer_idx") and hasattr(m, "num_key_value_groups")
        )
        if idx and idx != list(range(self.num_layers)):
            raise ValueError(
                f"unsupported architecture: attention layer indices {idx[:8]}... do not match {self.num_layers} layers"
            )

    # -- which attention kernels SDPA may pick -------------------------------------------------------------
    # Why: on a GPU torch's SDPA prefers cuDNN's attention for our shapes.  cuDNN builds an execution plan on the
    # host for every new shape it sees (milliseconds each), and eager steps (prompt groups, mixed steps) bring new
    # shapes all the time: on an H100 at 128 streams that held launch at 5.4 ms a step until the plan cache filled,
    # 0.74 of the engine at a warm cache.  A captured decode graph builds
    # its plan once, at capture, and replays it for free.  So by default ("graphs") captures (their warm-up
    # included: warm-up and capture must pick the same kernels, or the capture builds a plan inside itself and
    # fails, as tried) keep torch's choice and eager steps use flash / memory-efficient / math.  Measured on an H100
    # the in-process engine steady from its first round at 128 streams (27-31k tokens/s, where
    # "all" climbed 15k -> 22k over three rounds), decode graphs as fast as with cuDNN everywhere.
    # (the modes, launcher.hf.args.CUDNN_ATTENTION) graphs: captured decode graphs only; all: torch's choice; off: never

    def _init_attention_backends(self, mode) -> None:
        import contextlib

        if mode in (None, ""):
            mode = DEFAULTS.cudnn_attention
        if mode not in CUDNN_ATTENTION:
            raise ValueError(f"cudnn_attention {mode!r} is not one of {', '.join(CUDNN_ATTENTION)}")
        self.cudnn_attention = mode
        self._eager_backends = self.capture_backends = contextlib.nullcontext
        if mode == "all":
            return
        from torch.nn.attention import SDPBackend, sdpa_kernel

        others = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        self._eager_backends = lambda: sdpa_kernel(others)
        if mode == "off":
            self.capture_backends = self._eager_backends

    # -- torch.compile ----------------------------------------------------------------------------------------
    # Why: HF's Llama runs ~40 kernels per layer, most of them tiny (the norm alone is 7: cast, pow, mean, add,
    # rsqrt, mul, mul), so even replayed as a CUDA graph a batch-1 decode step spent 2.4 ms where its weight
    # reads need 0.8.  Inductor fuses them (a norm becomes one kernel; rotary, residual
    # adds and SiLU*up join their neighbours); the matrix products stay cuBLAS; our attention stays one opaque
    # op.  One compiled form covers every step: token count and kept logits are dynamic, so besides the general
    # form only the size-1 specializations (one output row; one token) are compiled, all in `warm_up`.
    def _init_compile(self, torch_compile) -> None:
        if torch_compile is None:
            torch_compile = self.device.type == "cuda"
        # tp > 1: each layer's all-reduce is traced as a functional collective (hf_tp.TPGroup.all_reduce); with
        # graphs, tp=2 on two H200s ran 1.24-1.30x faster compiled
        self.use_compile = bool(torch_compile)
        self.compile_error = ""
        self.compile_s = 0.0  # how long warm_up compiled
        self.model_forward = self._forward  # what every step runs: the model's forward, compiled or not
        if self.use_compile:
            import torch

            self.model_forward = torch.compile(self._forward, dynamic=True, fullgraph=True)

    def warm_up(self, max_prefill_tokens: int | None = None) -> None:
        """Before serving: compile (each shape class a step can have) and capture the decode graphs and the
        prompt graphs (prompts up to max_prefill_tokens, the engine's chunk), so that no request waits on
        either.  A model that cannot be compiled still serves, uncompiled (compile_error).

        tp > 1: every step of the warm-up and every capture runs the layers' all-reduces, so all ranks must do the
        same ones in the same order.  The leader (group rank 0) calls this from the Engine and first sends its plan
        to the workers, whose loop (launcher.hf.worker.run_worker) then calls it too; the ranks compare plans before and
        results after (a rank that would replay a graph its peer does not have would hang both)."""
        import time

        import torch

        if self.tp_group is not None:
            plan = self._tp_plan(max_prefill_tokens)
            if self.tp_group.rank == 0:
                from launcher.hf.tp import WARM_UP

                self.tp_group.broadcast((WARM_UP, plan))
            self._tp_agree("plans", plan)
        if self.use_compile:
            announce(
                "hf engine: compiling the model with torch.compile (1-2 minutes for a 1 B model with a cold "
                "Inductor cache)"
            )
            t0 = time.perf_counter()
            two = self.max_num_seqs > 1
            # general form first (several tokens, several output rows), then one output row, then one token
            shapes = ([[PrefillChunk(0, 0, 4, True), PrefillChunk(1, 0, 3, True)]] if two else []) + [
                [PrefillChunk(0, 0, 4, True)]
            ]
            steps = [
                StepInputs([], [], [], chunks, [1] * sum(c.length for c in chunks), SamplingRows()) for chunks in shapes
            ]
            steps.append(StepInputs([0], [1], [4], [], [], SamplingRows()))
            try:
                with torch.inference_mode():
                    for step in steps:
                        self._run(step)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
            except Exception as e:
                self.use_compile = False
                self.model_forward = self._forward
                self.compile_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                log.warning("hf engine: torch.compile failed (%s); the model runs uncompiled", self.compile_error)
            else:
                self.compile_s = time.perf_counter() - t0
                log.info(
                    "hf engine: model compiled (torch.compile, %d step shapes) in %.1f s", len(steps), self.compile_s
                )
        self.capture_graphs()
        self.capture_prefill_graphs(max_prefill_tokens)
        self.capture_mixed_graphs()
        if self.tp_group is not None:
            self._tp_agree(
                "results",
                {
                    "compiled": self.use_compile,
                    "decode graphs": len(self.decode_graphs.graphs),
                    "prompt graphs": len(self.prompt_graphs.graphs),
                    "wave graphs": len(self.wave_graphs.graphs),
                },
            )

    def _tp_plan(self, max_prefill_tokens) -> dict:
        return {
            "max_prefill_tokens": max_prefill_tokens,
            "torch_compile": self.use_compile,
            "cuda_graphs": self.use_graphs,
            "prefill_graphs": self.prompt_graphs.limit,
            "fused": self.fused,
            "cudnn_attention": self.cudnn_attention,
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
        }

    def _tp_agree(self, what: str, mine: dict) -> None:
        """Raise on every rank unless all ranks' `mine` are equal (host side, over the gloo group)."""
        everyone = self.tp_group.all_gather(mine)
        differ = sorted({k for other in everyone for k in mine if other.get(k) != mine[k]})
        if differ:
            each = "; ".join(
                f"rank {r}: " + ", ".join(f"{k}={o.get(k)!r}" for k in differ) for r, o in enumerate(everyone)
            )
            raise RuntimeError(
                f"the tensor-parallel ranks' warm-up {what} differ ({each}): every rank must compile "
                f"and capture the same steps; give all ranks the same engine settings, or set "
                f"engine.cuda_graphs=false"
            )

    # -- CUDA graphs (hf_graphs): decode-only steps, steps of one or several whole prompts, mixed steps -------------
    WAVE_ROWS = WaveGraphs.ROWS  # prompts per wave graph
    MIXED_PROMPTS = MixedGraphs.PROMPTS  # the most prompts beside decode rows in a mixed graph
    prefill_buckets = staticmethod(prefill_buckets)
    mixed_buckets = staticmethod(mixed_buckets)

    def _init_graphs(self, cuda_graphs, prefill_graphs=None, mixed_graphs=None) -> None:
        if cuda_graphs is None:
            cuda_graphs = DEFAULTS.cuda_graphs
        self.use_graphs = bool(cuda_graphs) and self.device.type == "cuda"
        self._spare_slots = 1 if self.use_graphs else 0  # the slot padded rows write to
        self.graph_pool = None  # the memory pool every graph shares (they replay one at a time)
        self.decode_graphs = DecodeGraphs(self)
        limit = token_limit(
            prefill_graphs, "prefill_graphs", DEFAULTS.prefill_graphs, "the longest prompt to graph, 0 for none"
        )
        self.prompt_graphs = PromptGraphs(self, limit if self.use_graphs else 0)
        self.wave_graphs = self.prompt_graphs.waves
        limit = token_limit(
            mixed_graphs,
            "mixed_graphs",
            DEFAULTS.mixed_graphs,
            "the most prompt tokens beside decode rows in a graph, 0 for none",
        )
        # tp > 1 would need every rank to capture and pick the same mixed graphs: not built, so they run as before
        self.mixed_graphs = MixedGraphs(
            self, self.decode_graphs, min(limit, self.max_model_len) if self.use_graphs and self.tp == 1 else 0
        )
        # the families a step is offered to, in this order (_replay)
        self._graph_families = (self.decode_graphs, self.mixed_graphs, self.prompt_graphs, self.wave_graphs)

    def capture_graphs(self) -> int:
        """Capture every decode bucket; returns the number of graphs."""
        return self.decode_graphs.capture_all()

    def capture_prefill_graphs(self, max_prefill_tokens: int | None = None) -> int:
        """Capture the prompt and wave graphs of prompts up to min(prefill_graphs, max_prefill_tokens,
        max_model_len); returns the number of graphs."""
        return self.prompt_graphs.capture_all(max_prefill_tokens)

    def capture_mixed_graphs(self) -> int:
        """Capture the mixed graph of every decode bucket and packed size; returns the number of graphs."""
        return self.mixed_graphs.capture_all()

    # what the engine asks of the graphs: to schedule prompts, and for its features line
    def prompt_graphed(self, length: int) -> bool:
        """Would a step of one whole prompt of `length` tokens (and nothing else) replay a prompt graph?"""
        return self.prompt_graphs.graphed(length)

    @property
    def wave_rows(self) -> tuple[int, ...]:
        """The prompts per wave graph captured (none: waves go eagerly)."""
        return self.wave_graphs.captured_rows

    def wave_graph_key(self, lengths: list[int]) -> tuple[int, int] | None:
        """The wave graph that runs whole prompts of these lengths together, or None (none captured fits)."""
        return self.wave_graphs.key_of(lengths)

    def mixed_prompts_fit(self, lengths: list[int]) -> bool:
        """Would whole prompts of these lengths go beside decode rows through a mixed graph?"""
        return self.mixed_graphs.fits(lengths)

    # each family's graphs and why its capture failed ("" if it did not), as Engine.features reports them
    @property
    def _graphs(self) -> dict:
        return self.decode_graphs.graphs

    @property
    def _prefill_graphs(self) -> dict:
        return self.prompt_graphs.graphs

    @property
    def _wave_graphs(self) -> dict:
        return self.wave_graphs.graphs

    @property
    def _mixed_graphs(self) -> dict:
        return self.mixed_graphs.graphs

    @property
    def graph_error(self) -> str:
        return self.decode_graphs.error

    @property
    def prefill_graph_error(self) -> str:
        return self.prompt_graphs.error or self.wave_graphs.error

    @property
    def mixed_graph_error(self) -> str:
        return self.mixed_graphs.error

    # -- one step ------------------------------------------------------------------------------------------
    def execute(self, step: StepInputs, sample: bool = True, ahead: bool = False) -> list[int]:
        """Run one step; the sampled token per output row.  sample=False (tensor-parallel workers): run the
        layers only (no lm_head, no sampling) and return [].  ahead (workers): the leader launched this step
        before its decode tokens reached its host, and sends them over the device (`launch` with prev)."""
        import torch

        if not sample:
            with torch.inference_mode():
                ids = None
                if ahead:
                    ids = torch.empty(len(step.decode_tokens), dtype=torch.long, device=self.device)
                    self.tp_group.broadcast_tensor(ids)
                if self._replay(step, ids, prompt_graph=not ahead) is None:
                    self._run(step, sample=False, ids=ids)
            return []
        return self.wait(self.launch(step))

    def _replay(self, step: StepInputs, ids=None, prompt_graph: bool = True):
        """Logits of `step` through a captured graph (and `last_graph` set to which), or None: run it eagerly.
        Each family in turn is offered the step; prompt_graph=False skips the families that read their tokens from
        the host.  Tensor-parallel ranks make this choice from the StepInputs alone, so all of them make the same
        one."""
        self.last_graph = None
        for family in self._graph_families:
            if family.reads_host_tokens and not prompt_graph:
                continue
            key = family.key_for(step)
            if key is not None:
                logits = family.replay(step, key, ids)
                if logits is not None:
                    self.last_graph = family.kind
                return logits
        return None

    def launch(self, step: StepInputs, prev=None, prev_rows: list[int] | None = None):
        """Start the step and return at once, before its tokens exist; `wait(handle)` gives them.

        prev: the handle of the step before, still running, whose sampled tokens are this step's decode tokens
        (step.decode_tokens are placeholders then): decode row j takes prev's output row prev_rows[j] (default:
        row j), or, where prev_rows[j] is -1 (a row that sat the step before out), step.decode_tokens[j].  They
        go from sampler to input on the device, so the engine can queue this step behind the last one and do its
        host work for the last one (detokenize, stop checks, send) while the GPU runs this one."""
        import torch

        if step.decode_positions and max(step.decode_positions) >= self.max_model_len:
            # the cache write would land in the next head's or slot's row: refuse instead of corrupting it
            raise ValueError(f"decode position {max(step.decode_positions)} is past max_model_len {self.max_model_len}")
        with torch.inference_mode():
            start = after = None
            if self.device.type == "cuda":
                # GPU timing (gpu_times): this step's span on the stream, and the gap since the step launched before
                start = torch.cuda.Event(enable_timing=True)
                start.record()
                after, self._last_done = self._last_done, None
            ids = None
            if prev is not None:
                ids = prev[0]
                n = ids.shape[0]
                if prev_rows is not None and prev_rows != list(range(n)):
                    if min(prev_rows, default=0) < 0:  # rows with their token on the host: after prev's rows
                        ids = torch.cat(
                            [
                                ids.to(torch.long),
                                torch.tensor(step.decode_tokens, dtype=torch.long).to(self.device, non_blocking=True),
                            ]
                        )
                        prev_rows = [r if r >= 0 else n + j for j, r in enumerate(prev_rows)]
                    rows = torch.tensor(prev_rows, dtype=torch.long).to(self.device, non_blocking=True)
                    ids = ids.index_select(0, rows)
                if self.tp_group is not None:  # the workers' copy of this step waits for these (execute, ahead)
                    ids = self.tp_group.broadcast_tensor(ids.to(torch.long).contiguous())
            # a prompt graph reads its tokens from the host: not for a step whose tokens come from `prev`
            logits = self._replay(step, ids, prompt_graph=prev is None)
            if logits is None:
                logits = self._run(step, ids=ids)
            tokens = self.sampler.sample(logits, step.sampling, step.penalty_resets)
            if self.device.type != "cuda":
                return tokens, tokens, None, None, None
            host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            host.copy_(tokens, non_blocking=True)
            done = torch.cuda.Event(enable_timing=True)
            done.record()
            self._last_done = done
            return tokens, host, done, start, after

    def mark_idle(self) -> None:
        """The engine has nothing to run: the next step's gap since the last one is not the host being late."""
        self._last_done = None

    @staticmethod
    def wait(handle) -> list[int]:
        """The sampled token per output row of a launched step (waits for that step only, not for later ones)."""
        host, done = handle[1], handle[2]
        if done is not None:
            done.synchronize()
        return host.tolist()

    @staticmethod
    def gpu_times(handle) -> tuple[float, float | None] | None:
        """After `wait(handle)`: (seconds from the step's first GPU work to its last, seconds the GPU stood idle
        between the step launched before it and this one, or None when the engine was idle in between or this is
        the first step); None off the GPU.  The gap is the host being late: the step before had finished before
        this one was queued behind it (with overlap, the host work of a step should fit in the next one's GPU time)."""
        done, start, after = handle[2], handle[3], handle[4]
        if done is None:
            return None
        return start.elapsed_time(done) / 1000.0, None if after is None else after.elapsed_time(start) / 1000.0

    def _run(self, step: StepInputs, sample: bool = True, ids=None):
        """The step through the model, without a graph: logits of its output rows ([0, vocab] if not sample).
        ids: the decode tokens as a device tensor, in place of step.decode_tokens (see `launch`)."""
        import torch

        ctx, input_ids, positions, logits_idx = prepare_step(
            step, self.device, self.num_kv_heads, self.max_model_len, self.dtype, self.eager
        )
        if ids is not None:
            input_ids[0, : len(step.decode_tokens)] = ids
        if not sample:
            logits_idx = logits_idx[:0]
        keep = logits_idx
        if self.use_compile and not len(keep):
            # Compiled, nothing would use the attention ops' outputs (a prompt chunk that does not end its prompt,
            # alone in its step), so Inductor would drop them and with them their cache writes: keep one row.
            keep = torch.full((1,), input_ids.shape[1] - 1, dtype=torch.long, device=self.device)
        tls.ctx, tls.cache = ctx, self.cache
        try:
            with self._eager_backends():
                logits = self.model_forward(input_ids, positions, keep)
        finally:
            tls.ctx = None
        return logits[: len(logits_idx)]

    def _forward(self, input_ids, positions, keep):
        """Logits [len(keep), vocab] of the model on one packed row of tokens (our attention reads hf_attention.tls)."""
        return self.model(input_ids=input_ids, position_ids=positions, use_cache=False, logits_to_keep=keep).logits[0]
