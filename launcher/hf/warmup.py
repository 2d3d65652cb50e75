"""What the `hf` engine's runner settles before serving, so that no request waits on it: which attention kernels
captures and eager steps may use, torch.compile of the model's forward, and the warm-up that compiles every step
shape and captures the CUDA graphs (on every tensor-parallel rank alike).

Its own module: these run once at start and decide how each step will run (compiled or not, which kernels, which
graphs exist); the step path (runner.py) only uses what they leave (model_forward, the backends' contexts, the
graph families).  HFModelRunner takes these methods from `WarmUp`.
"""

from __future__ import annotations

import logging

from launcher.engines.hf.config import CUDNN_ATTENTION, DEFAULTS
from launcher.hf.step import PrefillChunk, SamplingRows, StepInputs
from launcher.stage import announce

log = logging.getLogger("launcher.hf.runner")  # the runner's one logger, whichever of its modules logs


class WarmUp:
    """The start-up part of HFModelRunner: attention backends, torch.compile, `warm_up` and the tensor-parallel
    ranks' agreement on it.  It calls the runner's `_run` (compiling) and its graph families' captures."""

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
    # (the modes, launcher.engines.hf.config.CUDNN_ATTENTION) graphs: captured decode graphs only; all: torch's choice; off: never

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

    # -- attention over the paged cache: decode rows, and prompt chunks that start anywhere ----------------------
    # Why kernels of our own: the gather path copies every live key and value of a decode batch per layer and step
    # (launcher.hf.paged_decode says what it cost), and a prompt's prefix from the cache into a tensor whose shape no
    # CUDA graph can hold (launcher.hf.paged_prefill).  Each is checked on the device against the gather path before
    # any step uses it, so a Triton that miscompiles it or is missing costs speed, never answers.
    def _init_paged_kernels(self) -> None:
        import functools

        from launcher.hf import paged_decode, paged_prefill

        rep = self.num_heads // self.num_kv_heads
        self.prefill_tile = paged_prefill.query_tokens(rep)  # query tokens a tile of the prefill kernel holds
        self.decode_kernel, self.decode_kernel_note = self._checked_kernel(
            "decode", lambda sms: functools.partial(paged_decode.paged_decode, programs=2 * sms), paged_decode.check
        )
        self.prefill_kernel, self.prefill_kernel_note = self._checked_kernel(
            "prefill", lambda sms: paged_prefill.paged_prefill, paged_prefill.check
        )

    def _checked_kernel(self, kind: str, make, check) -> tuple:
        """(the paged `kind` kernel made by make(streaming multiprocessors), "paged kernel"), or (None, the gather path
        and why) where it is not used: off the GPU, eager attention, Triton's interpreter, or a failed check."""
        if self.device.type != "cuda" or self.eager:
            return None, "gather + SDPA" if self.device.type == "cuda" else ""
        import os

        if os.environ.get("TRITON_INTERPRET") == "1":  # Triton's interpreter runs kernels on the host, step by step
            note = "gather + SDPA (TRITON_INTERPRET=1 would run the paged kernel on the host)"
            log.warning("hf engine: %s attention: %s", kind, note)
            return None, note
        try:
            import torch

            kernel = make(torch.cuda.get_device_properties(self.device).multi_processor_count)
            rep = self.num_heads // self.num_kv_heads
            err = check(kernel, self.num_kv_heads, rep, self.head_dim, self.block_size, self.dtype, self.device)
        except Exception as exc:  # noqa: BLE001 - Triton missing or failing to compile: the gather path serves
            note = f"gather + SDPA (paged kernel unusable: {type(exc).__name__}: {exc})"[:300]
            log.warning("hf engine: %s attention: %s", kind, note)
            return None, note
        if err is not None:
            note = f"gather + SDPA (paged kernel off: {err})"
            log.warning("hf engine: %s attention: %s", kind, note)
            return None, note
        return kernel, "paged kernel"

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
        # tp > 1: each layer's all-reduce is traced as a functional collective (launcher.hf.tp.TPGroup.all_reduce); with
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
