"""The model side of the `hf` engine: run one scheduled step of a HF transformers model.

The scheduler (hf_engine.py) decides *what* runs in a step and describes it as a `StepInputs` of plain Python lists
(hf_step); `HFModelRunner.execute(step)` runs it and returns the sampled token per output row.  The runner owns the
model and the slot KV cache (one slot per running sequence) and puts the pieces together:

* hf_step: the step as plain data (broadcastable to tensor-parallel workers), and its layout for an eager run;
* hf_attention: our attention, registered with transformers, which writes the cache and attends over it;
* hf_sampling: the batched sampler; hf_fuse: fused projections; hf_tp: tensor parallelism.

A step runs as one captured graph where one fits (`_replay`), else eagerly (`_run`), then samples.  The only
device->host sync is reading the sampled tokens at the end (`wait`).  Sliding-window models are served with
max_model_len capped at the window, where full attention is the same thing.
"""

from __future__ import annotations

import logging

from launcher.engines.hf_args import DEFAULTS
from launcher.engines.hf_attention import ATTN_NAME, StepContext, decode_mask, register_attention, tls
# PrefillChunk, SamplingRows, StepInputs and group_first_chunks are imported from this module by the engine, the
# benchmarks and the tests
from launcher.engines.hf_step import PrefillChunk, SamplingRows, StepInputs, group_first_chunks, prepare_step
from launcher.spec import CUDNN_ATTENTION
from launcher.stage import announce

__all__ = ["HFModelRunner", "PrefillChunk", "SamplingRows", "StepInputs", "group_first_chunks", "resolve_dtype",
           "use_llmlaunch_inductor_cache"]

log = logging.getLogger(__name__)


def _token_limit(value, name: str, default: int, meaning: str) -> int:
    """A runner's token-count setting: `value`, else `default`; a negative one is refused naming the setting and
    what it means."""
    if value is None:
        value = default
    if int(value) < 0:
        raise ValueError(f"{name}={value} is negative: {meaning}")
    return int(value)


def use_llmlaunch_inductor_cache() -> None:
    """Inductor keeps what it compiled in /tmp by default, which a cluster node forgets between jobs; under the
    llmlaunch cache (in the home directory, which the nodes share) the next start of the same model and settings
    loads it instead of compiling again.  A directory the user chose stays.  (Importing Inductor, which loading a
    model does, writes its default into the environment; that one is replaced.)"""
    import os

    from launcher.tiny import cache_root

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

    def __init__(self, model_path: str, device: str = DEFAULTS.device, dtype: str = DEFAULTS.dtype,
                 max_num_seqs: int = DEFAULTS.max_num_seqs,
                 max_model_len: int | None = None, attn_implementation: str = DEFAULTS.attn_implementation,
                 kv_cache_memory: float | None = None, tp: int = 1, tp_group=None, cuda_graphs: bool | None = None,
                 torch_compile: bool | None = None, cudnn_attention: str | None = None,
                 prefill_graphs: int | None = None, mixed_graphs: int | None = None):
        """tp > 1: this process is one rank of a tensor-parallel group (see hf_tp): `tp_group` (an
        hf_tp.TPGroup) or one made from the LLMLAUNCH_* environment; the model is sharded after loading.
        cuda_graphs: replay decode-only steps as CUDA graphs (None: on for cuda; with tp > 1 the graphs hold the
        NCCL all-reduces, and every rank captures the same ones, see `warm_up`).  With them, steps of one whole
        prompt and of several (WAVE_ROWS) replay graphs too.
        torch_compile: run the model's forward through torch.compile (None: on for cuda; with tp > 1 the
        all-reduces are traced as functional collectives); `warm_up()` compiles before serving.
        prefill_graphs: the longest prompt (tokens) whose prompt-only step replays a CUDA graph (None: HFEngineArgs.prefill_graphs; 0:
        none; needs cuda_graphs); see `_init_prefill_graphs`.
        mixed_graphs: the most prompt tokens a step of decode rows and whole prompts together replays a CUDA graph
        for (None: HFEngineArgs.mixed_graphs; 0: none; needs cuda_graphs and tp=1); see MIXED_PROMPTS.
        Each layer's q/k/v and gate/up projections run as one product each (hf_fuse)."""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from launcher.engines import hf_fuse
        from launcher.engines.hf_sampling import Sampler

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
            from launcher.engines import hf_tp

            hf_tp.check_divisible(text_cfg, self.tp)  # before joining the group: a clear error, no hang
            if self.device.type == "cuda" and self.device.index is None:
                # set_device needs an index.  Ranks that see several GPUs (no per-rank CUDA_VISIBLE_DEVICES)
                # take one per local rank; a rank given its own GPU sees it as cuda:0.
                import os

                local = int(os.environ.get("LLMLAUNCH_LOCAL_RANK", "0") or 0)
                self.device = torch.device("cuda", local % max(1, torch.cuda.device_count()))
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)  # before the process group: NCCL uses the current device
            self.tp_group = tp_group or hf_tp.TPGroup(self.tp, device_type=self.device.type)
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
                f"max_model_len")
        shape = (slots, self.num_kv_heads, self.max_model_len, self.head_dim)
        self.cache = [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                       torch.zeros(shape, dtype=self.dtype, device=self.device)) for _ in range(self.num_layers)]
        log.info("hf engine: KV cache %d slots x %d tokens, %.2f GiB", self.max_num_seqs, self.max_model_len,
                 total / 2**30)

    def _layer_idx_check(self) -> None:
        idx = sorted(getattr(m, "layer_idx", -1) for m in self.model.modules()
                     if hasattr(m, "layer_idx") and hasattr(m, "num_key_value_groups"))
        if idx and idx != list(range(self.num_layers)):
            raise ValueError(f"unsupported architecture: attention layer indices {idx[:8]}... do not match "
                             f"{self.num_layers} layers")

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
    # (the modes, launcher.spec.CUDNN_ATTENTION) graphs: captured decode graphs only; all: torch's choice; off: never

    def _init_attention_backends(self, mode) -> None:
        import contextlib

        if mode in (None, ""):
            mode = DEFAULTS.cudnn_attention
        if mode not in CUDNN_ATTENTION:
            raise ValueError(f"cudnn_attention {mode!r} is not one of {', '.join(CUDNN_ATTENTION)}")
        self.cudnn_attention = mode
        self._eager_backends = self._capture_backends = contextlib.nullcontext
        if mode == "all":
            return
        from torch.nn.attention import SDPBackend, sdpa_kernel

        others = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        self._eager_backends = lambda: sdpa_kernel(others)
        if mode == "off":
            self._capture_backends = self._eager_backends

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
        self._fwd = self._forward
        if self.use_compile:
            import torch

            self._fwd = torch.compile(self._forward, dynamic=True, fullgraph=True)

    def warm_up(self, max_prefill_tokens: int | None = None) -> None:
        """Before serving: compile (each shape class a step can have) and capture the decode graphs and the
        prompt graphs (prompts up to max_prefill_tokens, the engine's chunk), so that no request waits on
        either.  A model that cannot be compiled still serves, uncompiled (compile_error).

        tp > 1: every step of the warm-up and every capture runs the layers' all-reduces, so all ranks must do the
        same ones in the same order.  The leader (group rank 0) calls this from the Engine and first sends its plan
        to the workers, whose loop (hf_tp.run_worker) then calls it too; the ranks compare plans before and
        results after (a rank that would replay a graph its peer does not have would hang both)."""
        import time

        import torch

        if self.tp_group is not None:
            plan = self._tp_plan(max_prefill_tokens)
            if self.tp_group.rank == 0:
                from launcher.engines.hf_tp import WARM_UP

                self.tp_group.broadcast((WARM_UP, plan))
            self._tp_agree("plans", plan)
        if self.use_compile:
            announce("hf engine: compiling the model with torch.compile (1-2 minutes for a 1 B model with a cold "
                     "Inductor cache)")
            t0 = time.perf_counter()
            two = self.max_num_seqs > 1
            # general form first (several tokens, several output rows), then one output row, then one token
            shapes = ([[PrefillChunk(0, 0, 4, True), PrefillChunk(1, 0, 3, True)]] if two else []) + [
                [PrefillChunk(0, 0, 4, True)]]
            steps = [StepInputs([], [], [], chunks, [1] * sum(c.length for c in chunks), SamplingRows())
                     for chunks in shapes]
            steps.append(StepInputs([0], [1], [4], [], [], SamplingRows()))
            try:
                with torch.inference_mode():
                    for step in steps:
                        self._run(step)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
            except Exception as e:
                self.use_compile = False
                self._fwd = self._forward
                self.compile_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                log.warning("hf engine: torch.compile failed (%s); the model runs uncompiled", self.compile_error)
            else:
                self.compile_s = time.perf_counter() - t0
                log.info("hf engine: model compiled (torch.compile, %d step shapes) in %.1f s", len(steps),
                         self.compile_s)
        self.capture_graphs()
        self.capture_prefill_graphs(max_prefill_tokens)
        self.capture_mixed_graphs()
        if self.tp_group is not None:
            self._tp_agree("results", {"compiled": self.use_compile, "decode graphs": len(self._graphs),
                                       "prompt graphs": len(self._prefill_graphs),
                                       "wave graphs": len(self._wave_graphs)})

    def _tp_plan(self, max_prefill_tokens) -> dict:
        return {"max_prefill_tokens": max_prefill_tokens, "torch_compile": self.use_compile,
                "cuda_graphs": self.use_graphs, "prefill_graphs": self.prefill_graph_limit, "fused": self.fused,
                "cudnn_attention": self.cudnn_attention, "max_num_seqs": self.max_num_seqs,
                "max_model_len": self.max_model_len}

    def _tp_agree(self, what: str, mine: dict) -> None:
        """Raise on every rank unless all ranks' `mine` are equal (host side, over the gloo group)."""
        everyone = self.tp_group.all_gather(mine)
        differ = sorted({k for other in everyone for k in mine if other.get(k) != mine[k]})
        if differ:
            each = "; ".join(f"rank {r}: " + ", ".join(f"{k}={o.get(k)!r}" for k in differ)
                             for r, o in enumerate(everyone))
            raise RuntimeError(f"the tensor-parallel ranks' warm-up {what} differ ({each}): every rank must compile "
                               f"and capture the same steps; give all ranks the same engine settings, or set "
                               f"engine.cuda_graphs=false")

    # -- CUDA graphs for decode-only steps -----------------------------------------------------------------
    # Why: a decode step of a 1 B model launches ~20 kernels per layer from Python; on the H100 host that
    # costs ~15 ms per step whatever the batch (the GPU idles: 6% of the memory-bandwidth limit at batch 1).  Replaying a captured graph launches them all at once.
    #
    # A graph has static shapes, so a decode step is padded to a bucket: R rows (one per cache slot 0..R-1,
    # R = the power of two >= the highest decoding slot + 1) attending over L positions (a power of two
    # from 256, >= the longest sequence).  Row r carries the token of the sequence in slot r; rows of idle
    # slots carry a dummy token that writes its keys/values to a spare cache slot nobody reads and attends
    # to one position, and their logits are dropped.  Mixed steps (prompt chunks) run eagerly.
    #
    # tp > 1: a graph holds the layers' NCCL all-reduces, so each rank's replay meets its peers' replays of the
    # same graph.  Every rank captures the same buckets in the same order in `warm_up` (the leader's plan) and
    # picks graph or eager for a step by the same rule (`_replay`, from the broadcast StepInputs alone); a
    # capture that fails is fatal there (a rank falling back to eager steps alone would hang its peers).
    _GRAPH_MIN_LEN = 256

    def _init_graphs(self, cuda_graphs, prefill_graphs=None, mixed_graphs=None) -> None:
        if cuda_graphs is None:
            cuda_graphs = DEFAULTS.cuda_graphs
        self.use_graphs = bool(cuda_graphs) and self.device.type == "cuda"
        self._spare_slots = 1 if self.use_graphs else 0  # the slot dummy rows write to
        self._graphs: dict = {}
        self._graph_pool = None
        self.graph_error = ""
        self._init_prefill_graphs(prefill_graphs)
        self._init_mixed_graphs(mixed_graphs)

    def _bucket(self, rows: int, length: int) -> tuple[int, int]:
        r = 1
        while r < rows:
            r *= 2
        n = self._GRAPH_MIN_LEN
        while n < length:
            n *= 2
        return min(r, self.max_num_seqs), min(n, self.max_model_len)

    def capture_graphs(self) -> int:
        """Capture every decode bucket now, so that serving never stalls on a capture (~0.1 s each, and a
        capture mid-run also delays every running request).  Returns the number of graphs."""
        import time

        import torch

        if not self.use_graphs:
            return 0
        rows = sorted({self._bucket(r, 1)[0] for r in range(1, self.max_num_seqs + 1)})
        lengths, n = [], self._GRAPH_MIN_LEN
        while True:
            lengths.append(min(n, self.max_model_len))
            if n >= self.max_model_len:
                break
            n *= 2
        announce(f"hf engine: capturing {len(rows) * len(lengths)} decode CUDA graphs")
        t0 = time.perf_counter()
        with torch.inference_mode():
            for length in lengths:
                for r in rows:
                    if (r, length) not in self._graphs and self._capture(r, length) is None:
                        return 0
        log.info("hf engine: %d decode graphs (rows %s x lengths %s) captured in %.1f s", len(self._graphs), rows,
                 lengths, time.perf_counter() - t0)
        return len(self._graphs)

    def _graph_decode(self, step: StepInputs, ids=None):
        """Logits [n_dec, vocab] of a decode-only step through a CUDA graph, or None (then run it eagerly).
        ids: the decode tokens as a device tensor (see `launch`), in place of step.decode_tokens."""
        import torch

        key = self._bucket(max(step.decode_slots) + 1, max(step.decode_positions) + 1)
        g = self._graphs.get(key)
        if g is None:
            g = self._capture(*key)
            if g is None:
                return None
        meta, logits = g[1], g[2]
        rows, dev_ids = key[0], ids
        meta.copy_(torch.tensor(self._decode_layout(step, rows), dtype=torch.long), non_blocking=True)
        keep = torch.tensor(step.decode_slots, dtype=torch.long).to(self.device, non_blocking=True)
        if dev_ids is not None:
            meta[0].index_copy_(0, keep, dev_ids)
        g[0].replay()
        return logits.index_select(0, keep)

    def _decode_layout(self, step: StepInputs, rows: int) -> list[list[int]]:
        """[ids, positions, slots, lengths] of a step's decode rows placed on their slot's row of a graph of `rows`
        rows; the rows between them are padding (the spare slot, one position attended: no NaN)."""
        spare = self.max_num_seqs
        ids, pos, slot, lens = [0] * rows, [0] * rows, [spare] * rows, [1] * rows
        for s, t, p in zip(step.decode_slots, step.decode_tokens, step.decode_positions):
            ids[s], pos[s], slot[s], lens[s] = t, p, s, p + 1
        return [ids, pos, slot, lens]

    def _decode_mask(self, lens, span):
        """Additive attention mask [rows, 1, 1, len(span)] of decode rows over their cache row: row r sees its first
        lens[r] positions (`span`: the positions 0..n-1 as a device tensor)."""
        return decode_mask(lens, span, self.dtype, self.device)

    def _capture(self, rows: int, length: int):
        """Capture the decode step of bucket (rows, length); None (and graphs off) if capture fails."""
        import torch

        try:
            dev = self.device
            meta = torch.zeros(4, rows, dtype=torch.long, device=dev)  # ids, positions, slots, lengths
            meta[2].fill_(self.max_num_seqs)
            meta[3].fill_(1)
            heads = torch.arange(self.num_kv_heads, device=dev)
            span = torch.arange(length, device=dev)
            keep = torch.arange(rows, device=dev)  # every row's logits (a tensor, as in mixed steps: one compiled form)
            ctx = StepContext()
            ctx.n_dec, ctx.dec_rows, ctx.dec_len = rows, rows, length
            ctx.eager, ctx.dec_scatter, ctx.chunks, ctx.groups = self.eager, None, [], []

            def body():
                # index tensors are computed inside the graph, from `meta`, so a replay sees the new step
                ctx.flat_idx = ((meta[2][:, None] * self.num_kv_heads + heads[None, :]) * self.max_model_len
                                + meta[1][:, None]).reshape(-1)
                ctx.dec_mask = self._decode_mask(meta[3], span)
                tls.ctx, tls.cache = ctx, self.cache
                try:
                    return self._fwd(meta[0:1], meta[1:2], keep)
                finally:
                    tls.ctx = None

            graph, logits = self._capture_graph(body)
        except Exception as e:  # a model whose forward cannot be captured still serves, eagerly
            self._tp_capture_failed("decode", e)
            self.use_graphs = False
            self.graph_error = f"{type(e).__name__}: {e}"
            log.warning("hf engine: CUDA graph capture failed (%s); decode steps run eagerly", self.graph_error)
            return None
        # every tensor the graph reads must outlive it: a freed input's memory would be reused under it
        self._graphs[(rows, length)] = (graph, meta, logits, heads, span, keep)
        log.debug("hf engine: captured decode graph rows=%d length=%d", rows, length)
        return self._graphs[(rows, length)]

    def _tp_capture_failed(self, kind: str, exc: Exception) -> None:
        if self.tp > 1:
            raise RuntimeError(f"tp={self.tp}, rank {self.tp_group.rank}: capturing a {kind} CUDA graph failed "
                               f"({type(exc).__name__}: {exc}); the ranks cannot fall back to eager steps one by "
                               f"one, so set engine.cuda_graphs=false") from exc

    def _capture_graph(self, body):
        """(graph, its output) of `body()` captured after two warm-up runs on a side stream (lazy inits, the
        allocator, cuDNN's plan); every graph shares one memory pool (they replay one at a time)."""
        import torch

        dev = self.device
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        # tp > 1: torch's NCCL watchdog thread queries the events of earlier collectives; in the default ("global")
        # capture mode such a call from another thread during a capture is an error, so only this thread is
        # checked, and the device is idle (no collective left for the watchdog) before the capture starts
        mode = "thread_local" if self.tp > 1 else "global"
        with self._capture_backends():  # the same kernels for the warm-up and the capture
            with torch.cuda.stream(side):
                for _ in range(2):
                    body()
            torch.cuda.current_stream(dev).wait_stream(side)
            if self.tp > 1:
                torch.cuda.synchronize(dev)
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._graph_pool, capture_error_mode=mode):
                out = body()
        return graph, out

    # -- CUDA graphs for prompt-only steps of one prompt ------------------------------------------------------
    # Why: a request that finds the engine idle (low load: every request at concurrency 1) gets its first token
    # from a step that prefills its prompt alone.  Run eagerly that step is kernel launches from Python (~290
    # kernels compiled, ~700 not, ~25 us each on an H100 host) for a few ms of GPU work: most of the time to first
    # token.  So such steps replay a graph too: the prompt padded to a bucket B (16, 24, 32, 48, ... x1.5 / x4/3
    # steps, up to the engine's prompt chunk), causal attention over its own B tokens.  Padding is harmless there:
    # a padded token sits after every real one, so causality hides it from them; its keys/values go to the
    # spare slot's cache row (as a padded decode row's do), and only the last real token's logits are kept.
    # Steps of several whole prompts replay wave graphs (WAVE_ROWS), whole prompts beside decode rows mixed graphs
    # (MIXED_PROMPTS); a prompt's later chunk stays eager.  Captured at start, after the decode graphs; a failed
    # capture leaves decode graphs on.

    def _init_prefill_graphs(self, prefill_graphs) -> None:
        prefill_graphs = _token_limit(prefill_graphs, "prefill_graphs", DEFAULTS.prefill_graphs, "the longest prompt to graph, 0 for none")
        self.prefill_graph_limit = prefill_graphs if self.use_graphs else 0
        self._prefill_graphs: dict = {}  # bucket length -> (graph, meta, keep, logits)
        self._wave_graphs: dict = {}  # (prompts, bucket length) -> (graph, meta, keep, logits): see WAVE_ROWS
        self.prefill_graph_error = ""

    @staticmethod
    def prefill_buckets(limit: int) -> list[int]:
        """Padded prompt lengths up to `limit`: 16, 24, 32, 48, 64, 96, ... (each <= 1.5x the one before), and
        `limit` itself last, so a prompt pads by less than half its length."""
        out, n = [], 16
        while n < limit:
            out.append(n)
            n = n * 3 // 2 if (n & (n - 1)) == 0 else n * 4 // 3  # 16 -> 24 -> 32 -> 48 -> 64 ...
        if limit > 0:
            out.append(limit)
        return out

    def capture_prefill_graphs(self, max_prefill_tokens: int | None = None) -> int:
        """Capture the prompt graph of every bucket up to min(prefill_graph_limit, max_prefill_tokens,
        max_model_len).  Returns the number of graphs."""
        import time

        import torch

        limit = min(self.prefill_graph_limit, max_prefill_tokens or self.prefill_graph_limit, self.max_model_len)
        if not self.use_graphs or limit <= 0:
            self.prefill_graph_limit = 0
            return 0
        buckets = self.prefill_buckets(limit)
        waves = self.wave_buckets(limit)
        announce(f"hf engine: capturing {len(buckets)} prompt CUDA graphs (prompts up to {limit} tokens)"
                 + (f" and {len(waves)} wave graphs (2 to {max(n for n, _ in waves)} prompts)" if waves else ""))
        t0 = time.perf_counter()
        with torch.inference_mode():
            for length in buckets:
                if length not in self._prefill_graphs and self._capture_prefill(length) is None:
                    return 0
            for key in waves:
                if key not in self._wave_graphs and self._capture_wave(*key) is None:
                    return 0
        self.prefill_graph_limit = limit
        log.info("hf engine: %d prompt graphs (lengths %s) and %d wave graphs (prompts x length %s) captured in "
                 "%.1f s", len(self._prefill_graphs), buckets, len(self._wave_graphs), waves, time.perf_counter() - t0)
        return len(self._prefill_graphs) + len(self._wave_graphs)

    def prompt_graphed(self, length: int) -> bool:
        """Would a step of one whole prompt of `length` tokens (and nothing else) replay a prompt graph?"""
        return bool(self._prefill_graphs) and length <= self.prefill_graph_limit

    def prefill_graph_key(self, step: StepInputs) -> int | None:
        """The bucket whose graph runs `step`, or None (run it eagerly): a step of one whole prompt, no decode rows."""
        if step.decode_tokens or len(step.prefill) != 1:
            return None
        c = step.prefill[0]
        if c.start != 0 or not c.sample or not self.prompt_graphed(c.length):
            return None
        return next((b for b in self._prefill_graphs if b >= c.length), None)  # captured shortest first

    def prefill_graph_inputs(self, step: StepInputs, length: int) -> tuple[list[list[int]], int]:
        """(meta rows [ids, positions, slots] of `length` tokens, kept row) of a one-prompt step padded to a bucket:
        padded tokens (id 0) continue the positions and write to the spare slot; the kept row is the last real."""
        c = step.prefill[0]
        pad = length - c.length
        return ([list(step.prefill_tokens) + [0] * pad, list(range(length)),
                 [c.slot] * c.length + [self.max_num_seqs] * pad], c.length - 1)

    def _prefill_body(self, meta, keep, length: int):
        """The padded one-prompt step (what a prompt graph holds): logits [1, vocab] of row keep[0].  Everything is
        computed from `meta` / `keep`, so a replay sees the new prompt."""
        ctx = StepContext()
        ctx.n_dec, ctx.dec_rows, ctx.dec_len, ctx.dec_mask, ctx.dec_scatter = 0, 0, 0, None, None
        ctx.eager, ctx.groups = self.eager, []
        ctx.chunks = [(0, 0, 0, length, None)]  # one first chunk: causal attention over its own tokens
        return self._meta_forward(ctx, meta, keep)

    def _meta_forward(self, ctx, meta, keep):
        """Logits of `keep` for a graph's inputs: `meta` rows ids, positions, slots (each token's cache row, set in
        ctx.flat_idx here), `ctx` the rest of the step's attention context."""
        import torch

        heads = torch.arange(self.num_kv_heads, device=self.device)
        ctx.flat_idx = ((meta[2][:, None] * self.num_kv_heads + heads[None, :]) * self.max_model_len
                        + meta[1][:, None]).reshape(-1)
        tls.ctx, tls.cache = ctx, self.cache
        try:
            return self._fwd(meta[0:1], meta[1:2], keep)
        finally:
            tls.ctx = None

    def _capture_prefill(self, length: int):
        """Capture the prompt graph of bucket `length`; None (and prompt graphs off) if the capture fails."""
        g = self._capture_prompt_rows("prompt", 1, length, lambda meta, keep: self._prefill_body(meta, keep, length))
        if g is not None:
            self._prefill_graphs[length] = g
        return g

    def _capture_prompt_rows(self, kind: str, n: int, length: int, body):
        """(graph, meta, keep, logits) of body(meta, keep) captured for n rows of `length` prompt tokens: meta holds
        ids, positions (0..length-1 in each row) and slots (the spare one) for the replays to fill, keep each row's
        last token.  A prompt graph is one such row, a wave graph several.  None if the capture fails: then every
        prompt and wave graph is dropped and prompt steps run eagerly (decode graphs stay)."""
        import torch

        try:
            dev = self.device
            meta = torch.zeros(3, n * length, dtype=torch.long, device=dev)  # ids, positions, slots
            meta[1].copy_(torch.arange(length, device=dev).repeat(n))
            meta[2].fill_(self.max_num_seqs)
            keep = torch.arange(1, n + 1, device=dev) * length - 1
            graph, logits = self._capture_graph(lambda: body(meta, keep))
        except Exception as e:
            self._tp_capture_failed(kind, e)
            self.prefill_graph_limit = 0
            self._prefill_graphs.clear()
            self._wave_graphs.clear()
            self.prefill_graph_error = f"{type(e).__name__}: {e}"
            log.warning("hf engine: %s CUDA graph capture failed (%s); prompt steps run eagerly", kind,
                        self.prefill_graph_error)
            return None
        return graph, meta, keep, logits

    def _graph_prefill(self, step: StepInputs, length: int):
        """Logits [1, vocab] of a one-prompt step through the prompt graph of bucket `length`."""
        import torch

        graph, meta, keep, logits = self._prefill_graphs[length]
        rows, last = self.prefill_graph_inputs(step, length)
        meta.copy_(torch.tensor(rows, dtype=torch.long), non_blocking=True)
        keep.fill_(last)
        graph.replay()
        return logits

    # -- CUDA graphs for prompt-only steps of several whole prompts (a wave) ------------------------------------
    # Why: the closed loops of a benchmark, and clients that send in bursts, hand the engine many prompts at once
    # (all the requests that ended in one step have their successors sent together).  More of them than
    # Engine.PROMPTS_ALONE_MAX went in one eager step, kernel launches from Python; a wave of 8 prompts of 128 tokens
    # came out of it 28 ms after it arrived, against 15 ms when the same prompts reached the engine one by one
    # and went through their graphs alone.  So a step of n whole prompts replays a
    # wave graph: n rows (WAVE_ROWS: 2, 4, 8 or 16; rows left over carry padding only) of L tokens each (a
    # prefill_buckets length, n * L at most the prompt-graph limit), each row causal over its own tokens, as one
    # padded group (_slot_attention's groups).  Padding is as in a prompt graph: after every real token of its row,
    # its keys/values to the spare slot, its logits dropped.  The decode rows wait that step (Engine._prompt_wave).
    WAVE_ROWS = (2, 4, 8, 16)

    @property
    def wave_rows(self) -> tuple[int, ...]:
        """The prompts per wave graph captured (none: waves go eagerly)."""
        return tuple(sorted({n for n, _ in self._wave_graphs}))

    def wave_buckets(self, limit: int) -> list[tuple[int, int]]:
        """(prompts, length) of every wave graph for a prompt-graph limit of `limit` tokens (no more prompts than
        there are cache slots)."""
        return [(n, length) for n in self.WAVE_ROWS if n <= self.max_num_seqs
                for length in self.prefill_buckets(limit) if n * length <= limit]

    def wave_graph_key(self, lengths: list[int]) -> tuple[int, int] | None:
        """The wave graph that runs whole prompts of these lengths together, or None (none captured fits)."""
        if len(lengths) < 2 or not self._wave_graphs:
            return None
        n = next((r for r in self.WAVE_ROWS if r >= len(lengths)), None)
        longest = max(lengths)
        if n is None or longest > self.prefill_graph_limit:
            return None
        length = next((b for b in self.prefill_buckets(self.prefill_graph_limit) if b >= longest), None)
        return (n, length) if (n, length) in self._wave_graphs else None

    def wave_step_key(self, step: StepInputs) -> tuple[int, int] | None:
        """The wave graph that runs `step`, or None: a step of whole prompts only, all of them sampled."""
        if step.decode_tokens or len(step.prefill) < 2:
            return None
        if any(c.start != 0 or not c.sample for c in step.prefill):
            return None
        return self.wave_graph_key([c.length for c in step.prefill])

    def wave_graph_inputs(self, step: StepInputs, n: int, length: int) -> tuple[list[list[int]], list[int]]:
        """(meta rows [ids, positions, slots] of n x length tokens, the kept token row of each of the n rows) of a
        step of whole prompts: prompt i in row i, padded (id 0, the spare slot) to `length`; rows past the prompts
        are padding only (kept row: their last, whose logits are dropped)."""
        spare = self.max_num_seqs
        ids, slots, keep, offset = [], [], [], 0
        for i, c in enumerate(step.prefill):
            pad = length - c.length
            ids.extend(step.prefill_tokens[offset:offset + c.length])
            ids.extend([0] * pad)
            slots.extend([c.slot] * c.length + [spare] * pad)
            keep.append(i * length + c.length - 1)
            offset += c.length
        for i in range(len(step.prefill), n):
            ids.extend([0] * length)
            slots.extend([spare] * length)
            keep.append(i * length + length - 1)
        return [ids, list(range(length)) * n, slots], keep

    def _wave_body(self, meta, keep, n: int, length: int):
        """The padded wave step (what a wave graph holds): logits [n, vocab] of the kept rows, computed from `meta`
        and `keep`, so that a replay sees the new prompts."""
        import torch

        every = torch.arange(n * length, device=self.device)  # one group of n rows, all of them kept
        ctx = StepContext()
        ctx.n_dec, ctx.dec_rows, ctx.dec_len, ctx.dec_mask, ctx.dec_scatter = 0, 0, 0, None, None
        ctx.eager, ctx.chunks = self.eager, []
        ctx.groups = [(every, n, length, every, every)]
        return self._meta_forward(ctx, meta, keep)

    def _capture_wave(self, n: int, length: int):
        """Capture the wave graph (n prompts of up to `length` tokens); None (and prompt graphs off) if it fails."""
        g = self._capture_prompt_rows("prompt wave", n, length,
                                      lambda meta, keep: self._wave_body(meta, keep, n, length))
        if g is not None:
            self._wave_graphs[(n, length)] = g
        return g

    def _graph_wave(self, step: StepInputs, key: tuple[int, int]):
        """Logits [prompts, vocab] of a step of whole prompts through the wave graph `key`."""
        import torch

        graph, meta, keep, logits = self._wave_graphs[key]
        rows, kept = self.wave_graph_inputs(step, *key)
        host = torch.tensor(rows + [kept + [0] * (len(rows[0]) - len(kept))], dtype=torch.long)
        meta.copy_(host[:3], non_blocking=True)
        keep.copy_(host[3, :len(kept)], non_blocking=True)
        graph.replay()
        return logits[:len(step.prefill)]

    # -- CUDA graphs for steps of decode rows and whole prompts together (mixed) ----------------------------------
    # Why: a prompt that arrives while others decode went through its prompt graph (or a wave graph) in a step of its
    # own, and every decoding row waited that step: on an H100, ~2.2-3.8 ms for a 1 B model's 128-token prompt
    # beside ~3 ms decode steps at 128 rows.  Through a server, closed loops hand the engine their successors
    # scattered, so 10-11% of its steps at 128 streams were such steps, more than in-process; an eager step with prompts and decode rows costs ~10 ms of kernel launches instead.
    # A mixed graph runs both in one step: the decode rows as in a decode graph of (rows, length), then up to
    # MIXED_PROMPTS whole prompts packed into `tokens` (a power of two up to mixed_limit), each causal over its own
    # tokens through one attention call with a block-diagonal mask.  The prompt tokens cost the decode step little
    # (its matrix products read the weights once for all rows).  Padding: decode rows as in a decode graph (the spare
    # slot); packed tokens past the prompts write to the spare slot, form a segment of their own, and their logits
    # are dropped.  Graphs: one per decode bucket and packed size, captured at start after the prompt graphs.
    MIXED_PROMPTS = 8

    def _init_mixed_graphs(self, mixed_graphs) -> None:
        mixed_graphs = _token_limit(mixed_graphs, "mixed_graphs", DEFAULTS.mixed_graphs,
                                    "the most prompt tokens beside decode rows in a graph, 0 for none")
        # tp > 1 would need every rank to capture and pick the same mixed graphs: not built, so they run as before
        self.mixed_limit = min(mixed_graphs, self.max_model_len) if self.use_graphs and self.tp == 1 else 0
        self._mixed_graphs: dict = {}  # (rows, length, tokens) -> (graph, meta, keep, logits)
        self._mixed_eager = False  # tests without a GPU: mixed steps run the graph's body directly (see _graph_mixed)
        self.mixed_graph_error = ""

    @staticmethod
    def mixed_buckets(limit: int) -> list[int]:
        """Packed prompt sizes of the mixed graphs for a limit of `limit` tokens: 32, 64, ... and `limit` last."""
        out, n = [], 32
        while n < limit:
            out.append(n)
            n *= 2
        if limit > 0:
            out.append(limit)
        return out

    def mixed_prompts_fit(self, lengths: list[int]) -> bool:
        """Would whole prompts of these lengths go beside decode rows through a mixed graph?"""
        return (bool(self._mixed_graphs) or self._mixed_eager) and 0 < len(lengths) <= self.MIXED_PROMPTS and \
            sum(lengths) <= self.mixed_limit

    def mixed_step_key(self, step: StepInputs) -> tuple[int, int, int] | None:
        """The mixed graph (rows, length, tokens) that runs `step`, or None: decode rows and whole prompts, each
        sampled, that fit one."""
        if not step.decode_tokens or not step.prefill or any(c.start != 0 or not c.sample for c in step.prefill):
            return None
        if not self.mixed_prompts_fit([c.length for c in step.prefill]):
            return None
        rows, length = self._bucket(max(step.decode_slots) + 1, max(step.decode_positions) + 1)
        total = sum(c.length for c in step.prefill)
        tokens = next(b for b in self.mixed_buckets(self.mixed_limit) if b >= total)
        key = (rows, length, tokens)
        return key if key in self._mixed_graphs or self._mixed_eager else None

    def mixed_graph_inputs(self, step: StepInputs, rows: int, tokens: int) -> tuple[list[list[int]], list[int],
                                                                                    list[int]]:
        """(meta rows [ids, positions, slots, decode lengths / prompt segments] of rows + tokens entries, the kept
        token of each of the graph's rows + MIXED_PROMPTS logits rows, the rows of those logits that are this step's
        output rows, in its order: decode rows, then prompts)."""
        spare = self.max_num_seqs
        ids, pos, slot, extra = self._decode_layout(step, rows)
        out = list(step.decode_slots)
        keep = list(range(rows))
        ids.extend(step.prefill_tokens)
        offset = 0
        for i, c in enumerate(step.prefill):
            pos.extend(range(c.length))
            slot.extend([c.slot] * c.length)
            extra.extend([i] * c.length)
            offset += c.length
            keep.append(rows + offset - 1)
            out.append(rows + i)
        pad = tokens - offset
        ids.extend([0] * pad)
        pos.extend(range(offset, tokens))  # any position in the cache row; the spare slot's
        slot.extend([spare] * pad)
        extra.extend([-1] * pad)  # a segment of their own: they attend to one another only
        keep.extend([rows + tokens - 1] * (self.MIXED_PROMPTS - len(step.prefill)))
        return [ids, pos, slot, extra], keep, out

    def _mixed_body(self, meta, keep, rows: int, length: int, tokens: int):
        """The padded mixed step (what a mixed graph holds): logits [rows + MIXED_PROMPTS, vocab] of `keep`, computed
        from `meta` and `keep`, so that a replay sees the new step."""
        import torch

        dev = self.device
        ctx = StepContext()
        ctx.n_dec, ctx.dec_rows, ctx.dec_len, ctx.dec_scatter = rows, rows, length, None
        ctx.dec_mask = self._decode_mask(meta[3, :rows], torch.arange(length, device=dev))
        seg = meta[3, rows:]
        idx = torch.arange(tokens, device=dev)
        allowed = (seg[:, None] == seg[None, :]) & (idx[None, :] <= idx[:, None])
        ctx.packed = (rows, tokens, torch.zeros(tokens, tokens, dtype=self.dtype, device=dev).masked_fill_(
            ~allowed, float("-inf")))
        ctx.eager, ctx.chunks, ctx.groups = self.eager, [], []
        return self._meta_forward(ctx, meta, keep)

    def _mixed_tensors(self, rows: int, tokens: int):
        import torch

        meta = torch.zeros(4, rows + tokens, dtype=torch.long, device=self.device)
        meta[2].fill_(self.max_num_seqs)
        meta[3, :rows].fill_(1)
        meta[3, rows:].fill_(-1)
        meta[1, rows:].copy_(torch.arange(tokens, device=self.device))
        keep = torch.cat([torch.arange(rows, device=self.device),
                          torch.full((self.MIXED_PROMPTS,), rows + tokens - 1, device=self.device)])
        return meta, keep

    def capture_mixed_graphs(self) -> int:
        """Capture the mixed graph of every decode bucket and packed size; returns the number of graphs."""
        import time

        import torch

        if not self.use_graphs or self.mixed_limit <= 0 or not self._graphs:
            self.mixed_limit = 0
            return 0
        keys = [(rows, length, tokens) for rows, length in sorted(self._graphs)
                for tokens in self.mixed_buckets(self.mixed_limit)]
        announce(f"hf engine: capturing {len(keys)} mixed CUDA graphs (decode rows with up to {self.MIXED_PROMPTS} "
                 f"prompts of {self.mixed_limit} tokens in all)")
        t0 = time.perf_counter()
        with torch.inference_mode():
            for rows, length, tokens in keys:
                try:
                    meta, keep = self._mixed_tensors(rows, tokens)
                    graph, logits = self._capture_graph(lambda: self._mixed_body(meta, keep, rows, length, tokens))
                except Exception as e:  # mixed steps then take turns with the decode rows, as before
                    self.mixed_limit = 0
                    self._mixed_graphs.clear()
                    self.mixed_graph_error = f"{type(e).__name__}: {e}"
                    log.warning("hf engine: mixed CUDA graph capture failed (%s); prompts take steps of their own",
                                self.mixed_graph_error)
                    return 0
                self._mixed_graphs[(rows, length, tokens)] = (graph, meta, keep, logits)
        log.info("hf engine: %d mixed graphs (packed prompt tokens %s) captured in %.1f s", len(self._mixed_graphs),
                 self.mixed_buckets(self.mixed_limit), time.perf_counter() - t0)
        return len(self._mixed_graphs)

    def _graph_mixed(self, step: StepInputs, key: tuple[int, int, int], ids=None):
        """Logits [output rows, vocab] of a step of decode rows and whole prompts through the mixed graph `key`.
        ids: the decode tokens as a device tensor (see `launch`), in place of step.decode_tokens."""
        import torch

        rows, length, tokens = key
        entry = self._mixed_graphs.get(key)
        if entry is None:  # _mixed_eager (tests without a GPU): the body the graph would hold, run directly
            meta, keep = self._mixed_tensors(rows, tokens)
        else:
            graph, meta, keep, logits = entry
        values, kept, out = self.mixed_graph_inputs(step, rows, tokens)
        width = rows + tokens
        host = torch.tensor(values + [kept + [0] * (width - len(kept)), out + [0] * (width - len(out))],
                            dtype=torch.long)
        dev = host.to(self.device, non_blocking=True)
        meta.copy_(dev[:4])
        keep.copy_(dev[4, :len(kept)])
        if ids is not None:
            meta[0].index_copy_(0, dev[5, :len(step.decode_tokens)], ids.to(torch.long))
        if entry is None:
            logits = self._mixed_body(meta, keep, rows, length, tokens)
        else:
            graph.replay()
        return logits.index_select(0, dev[5, :len(out)])

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
        Tensor-parallel ranks make this choice from the StepInputs alone, so all of them make the same one."""
        self.last_graph = None
        if self.use_graphs and step.decode_tokens and not step.prefill:
            logits = self._graph_decode(step, ids)
            self.last_graph = "decode" if logits is not None else None
            return logits
        if (self._mixed_graphs or self._mixed_eager) and step.decode_tokens and step.prefill:
            key = self.mixed_step_key(step)
            if key is not None:  # its prompt tokens come from the host, its decode tokens may follow on the device
                self.last_graph = "mixed"
                return self._graph_mixed(step, key, ids)
        if self._prefill_graphs and prompt_graph:
            bucket = self.prefill_graph_key(step)
            if bucket is not None:
                self.last_graph = "prompt"
                return self._graph_prefill(step, bucket)
            wave = self.wave_step_key(step)
            if wave is not None:
                self.last_graph = "wave"
                return self._graph_wave(step, wave)
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
                        ids = torch.cat([ids.to(torch.long), torch.tensor(step.decode_tokens, dtype=torch.long).to(
                            self.device, non_blocking=True)])
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

        ctx, input_ids, positions, logits_idx = prepare_step(step, self.device, self.num_kv_heads, self.max_model_len,
                                                             self.dtype, self.eager)
        if ids is not None:
            input_ids[0, :len(step.decode_tokens)] = ids
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
                logits = self._fwd(input_ids, positions, keep)
        finally:
            tls.ctx = None
        return logits[:len(logits_idx)]

    def _forward(self, input_ids, positions, keep):
        """Logits [len(keep), vocab] of the model on one packed row of tokens (our attention reads hf_attention.tls)."""
        return self.model(input_ids=input_ids, position_ids=positions, use_cache=False, logits_to_keep=keep).logits[0]
