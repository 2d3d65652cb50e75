"""The model side of the `hf` engine: run one scheduled step of a HF transformers model.

The scheduler (scheduler.py) decides *what* runs in a step and describes it as a `StepInputs` of plain Python lists
(step.py); `HFModelRunner.execute(step)` runs it and returns the sampled token per output row.  The runner owns the
model and the KV-cache pool (launcher.hf.blocks: blocks of tokens, a block table per slot, a slot per running
sequence) and puts the pieces together:

* loading: the model onto the device (sharded with tp > 1), its shape, the KV-cache pool and the block tables
  (ModelLoading);
* warmup: attention kernels, torch.compile, and the warm-up that compiles and captures before serving (WarmUp);
* step: the step as plain data (broadcastable to tensor-parallel workers), and its layout for an eager run;
* attention: our attention, registered with transformers, which writes the cache and attends over it;
* graphs: the CUDA graphs that replay decode-only, whole-prompt and mixed steps;
* sampling: the batched sampler; fuse: fused projections; tp: tensor parallelism.

This module is the step itself: a step runs as one captured graph where one fits (`_replay`), else eagerly (`_run`),
then samples.  The only device->host sync is reading the sampled tokens at the end (`wait`).  Sliding-window models
are served with max_model_len capped at the window, where full attention is the same thing.
"""

from __future__ import annotations

from launcher.engines.hf.config import DEFAULTS
from launcher.hf.attention import register_attention, tls
from launcher.hf.graphs.buckets import mixed_buckets, prefill_buckets, token_limit
from launcher.hf.graphs.decode import DecodeGraphs
from launcher.hf.graphs.mixed import MixedGraphs
from launcher.hf.graphs.prompt import PromptGraphs, WaveGraphs
from launcher.hf.loading import ModelLoading
from launcher.hf.logprobs import StepLogProbs

# PrefillChunk, SamplingRows, StepInputs and group_first_chunks are imported from this module by the engine, the
# benchmarks and the tests
from launcher.hf.step import PrefillChunk, SamplingRows, StepInputs, group_first_chunks, prepare_step
from launcher.hf.warmup import WarmUp

__all__ = ["HFModelRunner", "PrefillChunk", "SamplingRows", "StepInputs", "group_first_chunks"]


class HFModelRunner(ModelLoading, WarmUp):
    """Owns the model and the KV-cache pool; `execute(StepInputs)` -> sampled token per output row."""

    def __init__(
        self,
        model_path: str,
        device: str = DEFAULTS.device,
        dtype: str = DEFAULTS.dtype,
        max_num_seqs: int = DEFAULTS.max_num_seqs,
        max_model_len: int | None = None,
        attn_implementation: str = DEFAULTS.attn_implementation,
        kv_cache_memory: float | None = None,
        block_size: int = DEFAULTS.block_size,
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
        kv_cache_memory: bytes of the KV-cache pool (None: ModelLoading.CPU_KV_CACHE on CPU, GPU_KV_SHARE of the free
        GPU memory); block_size: tokens a block holds.
        cuda_graphs: replay decode-only steps as CUDA graphs (None: on for cuda; with tp > 1 the graphs hold the
        NCCL all-reduces, and every rank captures the same ones, see `warm_up`).  With them, steps of one whole
        prompt and of several (WAVE_ROWS) replay graphs too.
        torch_compile: run the model's forward through torch.compile (None: on for cuda; with tp > 1 the
        all-reduces are traced as functional collectives); `warm_up()` compiles before serving.
        prefill_graphs: the longest prompt (tokens) whose prompt-only step replays a CUDA graph (None: HFEngineArgs.prefill_graphs; 0:
        none; needs cuda_graphs); see graphs.prompt.PromptGraphs.
        mixed_graphs: the most prompt tokens a step of decode rows and whole prompts together replays a CUDA graph
        for (None: HFEngineArgs.mixed_graphs; 0: none; needs cuda_graphs and tp=1); see graphs.mixed.MixedGraphs.
        Each layer's q/k/v and gate/up projections run as one product each (fuse.py)."""
        from launcher.hf.sampling import Sampler

        register_attention()
        if attn_implementation not in ("sdpa", "eager"):
            raise ValueError(f"attn_implementation {attn_implementation!r} is not one of sdpa, eager")
        self.eager = attn_implementation == "eager"
        self._load_model(model_path, device, dtype, max_model_len, tp, tp_group, tp_timeout_s, torch_compile)
        self.max_num_seqs = int(max_num_seqs)
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        self._init_graphs(cuda_graphs, prefill_graphs, mixed_graphs)
        self._init_attention_backends(cudnn_attention)
        self._init_compile(torch_compile)
        self._allocate_cache(kv_cache_memory, block_size)
        self._init_paged_kernels()
        self.sampler = Sampler(self.max_num_seqs, self.vocab_size, self.device)
        self._last_done = None  # the completion event of the step launched last, until the engine idles (gpu_times)
        self.last_graph = None  # the graph the last launch replayed: "decode", "prompt", "wave", "mixed" or None
        self._layer_idx_check()

    # -- CUDA graphs (launcher.hf.graphs): decode-only steps, steps of one or several whole prompts, mixed steps ----
    WAVE_ROWS = WaveGraphs.ROWS  # prompts per wave graph
    MIXED_PROMPTS = MixedGraphs.PROMPTS  # the most prompts beside decode rows in a mixed graph
    prefill_buckets = staticmethod(prefill_buckets)
    mixed_buckets = staticmethod(mixed_buckets)

    def _init_graphs(self, cuda_graphs, prefill_graphs=None, mixed_graphs=None) -> None:
        if cuda_graphs is None:
            cuda_graphs = DEFAULTS.cuda_graphs
        self.use_graphs = bool(cuda_graphs) and self.device.type == "cuda"
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

    @property
    def mixed_any_start(self) -> bool:
        """Do mixed graphs take prompts that start part-way (a cached prefix), with decode rows or without?"""
        return self.mixed_graphs.any_start

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
                self.apply_block_updates(step.block_updates)
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
        if any(c.logprobs >= 0 for c in step.prefill):  # prompt log probabilities: every prompt row's logits, eagerly
            return None
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
            self.apply_block_updates(step.block_updates)
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
            n_sampled = len(step.decode_tokens) + sum(c.sample for c in step.prefill)
            lp = None
            if step.sampling.logprobs or logits.shape[0] > n_sampled:
                lp = StepLogProbs(step, n_sampled)
                lp.start(logits, self.sampler.valid_vocab, self.device)  # before the sampler masks logits in place
                logits = logits[:n_sampled]
            tokens = self.sampler.sample(logits, step.sampling, step.penalty_resets)
            if lp is not None:
                lp.finish(tokens)
            if self.device.type != "cuda":
                return tokens, tokens, None, None, None, lp
            host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            host.copy_(tokens, non_blocking=True)
            done = torch.cuda.Event(enable_timing=True)
            done.record()
            self._last_done = done
            return tokens, host, done, start, after, lp

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
    def logprobs(handle) -> tuple[list, list] | None:
        """After `wait(handle)`: the step's log probabilities (StepLogProbs.read), or None when nothing asked."""
        lp = handle[5]
        return None if lp is None else lp.read()

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
            step,
            self.device,
            self.num_kv_heads,
            self.block_table,
            self.block_size,
            self.dtype,
            self.eager,
            self.decode_kernel,
            self.prefill_kernel,
            self.prefill_tile,
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
        """Logits [len(keep), vocab] of the model on one packed row of tokens (our attention reads launcher.hf.attention.tls)."""
        return self.model(input_ids=input_ids, position_ids=positions, use_cache=False, logits_to_keep=keep).logits[0]
