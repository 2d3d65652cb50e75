"""What the `hf` engine reports about itself: the running totals of its loop (EngineStats, which the served metrics
and the benchmarks read as a dict) and the one line that says what speeds it up (describe_features, of
Engine.features, for the server's ready line and the benchmarks' reports).

Its own module: the Triton model's stub and the benchmarks only format or carry these, and need nothing of the
engine's loop, scheduler or runner for that.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    """Running totals of the engine loop (engine thread).  Per step, wall = launch + wait + host work, where the
    host work is scheduling, detokenizing, stop checks and handing outputs on; on a GPU, gpu_idle says whether
    that host work kept the GPU waiting (launcher.python_backend.timings.engine_step_split makes per-step means)."""

    steps: int = 0
    decode_tokens: int = 0
    prefill_tokens: int = 0
    finished: int = 0
    busy_s: float = 0.0  # from a step's launch to its tokens on the host (the model call, with overlap its wait)
    ahead_steps: int = 0  # steps launched before the tokens of the step before were known (overlap)
    wall_s: float = 0.0  # the engine loop's time in iterations that ran a step (not idle waiting for requests)
    launch_s: float = 0.0  # in HFModelRunner.launch: preparing inputs and queueing the step's GPU work
    wait_s: float = 0.0  # blocked until a step's tokens reached the host (waiting for the GPU)
    gpu_s: float = 0.0  # GPU: from each step's first work to its last (CUDA events)
    gpu_idle_s: float = 0.0  # GPU idle between a step and the next one, because the host queued it late
    gpu_steps: int = 0  # steps timed on the GPU (0 off the GPU)
    # of those, steps whose gap since the step before was measured: not the first step after the engine stood idle,
    # whose wait gpu_idle_s leaves out (if those are many under steady load, the loop's time and the GPU's differ)
    gpu_gaps: int = 0
    prompt_steps: int = 0  # steps with prompt tokens
    prompt_graph_steps: int = 0  # of those, steps of prompts replayed as a CUDA graph (one prompt or a wave)
    mixed_steps: int = (
        0  # of those, steps replayed as a mixed CUDA graph (decode rows and prompts, or prompts part-way)
    )
    # Per request, from add_request (its prompt tokenized) on: where a first token's time inside the engine goes
    admitted: int = 0  # requests given a KV-cache slot
    queued_s: float = 0.0  # summed: add_request to a slot (waiting for the loop's next schedule, or a free slot)
    first_tokens: int = 0  # requests whose first token reached the host
    to_first_token_s: float = 0.0  # summed: add_request to the first token on the host (queued + prompt steps)
    # add_requests (the engine process's reader hands over what it read at once; their text prompts are tokenized in
    # one call): requests / calls is how many prompts arrive together
    intake_calls: int = 0
    intake_requests: int = 0
    # The KV-cache pool (launcher.hf.blocks): prompt tokens admitted, of those found in the prefix cache (not
    # prefilled), requests preempted because the pool ran out (computed again later), the pool's blocks in use
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    preempted: int = 0
    kv_blocks_used: int = 0
    kv_blocks: int = 0
    # prompt tokens whose keys and values came from another engine (add_request's kv_prefix) into the prefix cache
    imported_prompt_tokens: int = 0
    # those prefixes' transfers (launcher/hf/kv_transfer.py's PrefixFetcher, on its threads): done and failed (the
    # prompt then computed here), the bytes they brought and the seconds they took
    kv_transfers: int = 0
    kv_transfer_failures: int = 0
    kv_transfer_bytes: int = 0
    kv_transfer_s: float = 0.0

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens served from the prefix cache over prompt tokens admitted."""
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def engine_features(r, prompt_encode_why_not: str, prefix_caching: bool) -> dict:
    """Engine.features: what speeds the engine on runner `r` up, as it started (describe_features words it)."""
    return {
        "torch_compile": r.use_compile,
        "compile_s": round(r.compile_s, 1),
        "compile_error": r.compile_error,
        "decode_graphs": len(r._graphs),
        "graph_error": r.graph_error,
        "prefill_graphs": len(r._prefill_graphs),
        "wave_graphs": len(r._wave_graphs),
        "prefill_graph_error": r.prefill_graph_error,
        "fused": dict(r.fused),
        "mixed_graphs": len(r._mixed_graphs),
        "mixed_graph_error": r.mixed_graph_error,
        "cudnn_attention": r.cudnn_attention if r.device.type == "cuda" else "",
        "decode_attention": r.decode_kernel_note,
        "prefill_attention": r.prefill_kernel_note,
        "prompt_encode": prompt_encode_why_not or "backend",
        "kv_blocks": r.num_blocks - 1,
        "block_size": r.block_size,
        "kv_gib": round(r.kv_cache_bytes / 2**30, 2),
        "prefix_caching": prefix_caching,
    }


def describe_features(f: dict) -> str:
    """'torch_compile on (12.3 s), 16 decode graphs, ..., cuDNN attention in graphs' from Engine.features
    ('' for none)."""
    if not f:
        return ""
    parts = [
        f"torch_compile failed ({f['compile_error']})"
        if f.get("compile_error")
        else f"torch_compile on ({f.get('compile_s', 0):.1f} s)"
        if f.get("torch_compile")
        else "torch_compile off",
        f"decode graphs failed ({f['graph_error']})"
        if f.get("graph_error")
        else f"{f.get('decode_graphs', 0)} decode graphs",
        f"prompt graphs failed ({f['prefill_graph_error']})"
        if f.get("prefill_graph_error")
        else f"{f.get('prefill_graphs', 0)} prompt graphs, {f.get('wave_graphs', 0)} wave graphs",
        f"mixed graphs failed ({f['mixed_graph_error']})"
        if f.get("mixed_graph_error")
        else f"{f.get('mixed_graphs', 0)} mixed graphs",
    ]
    if f.get("kv_blocks"):  # the KV-cache pool
        parts.append(
            f"KV cache {f['kv_blocks']} blocks x {f['block_size']} tokens ({f.get('kv_gib', 0):.2f} GiB), "
            f"prefix caching {'on' if f.get('prefix_caching') else 'off'}"
        )
    if "fused" in f:  # layers whose q/k/v (gate/up) projections run as one product (launcher.hf.fuse)
        fused = {k: n for k, n in f["fused"].items() if n}
        parts.append(
            "projections fused (" + ", ".join(f"{k.replace('_proj', '')} x{n}" for k, n in fused.items()) + ")"
            if fused
            else "projections unfused"
        )
    # launcher.hf.encode.PromptEncoder: the backend's encode, or why prompts go through the call
    if f.get("prompt_encode"):
        parts.append(
            "prompts: backend encode"
            if f["prompt_encode"] == "backend"
            else f"prompts: tokenizer call ({f['prompt_encode']})"
        )
    if f.get("decode_attention"):  # GPU only: the paged decode kernel or why not (launcher.hf.paged_decode)
        parts.append(f"decode attention: {f['decode_attention']}")
    if f.get("prefill_attention"):  # GPU only: the paged prefill kernel or why not (launcher.hf.paged_prefill)
        parts.append(f"prefill attention: {f['prefill_attention']}")
    where = {"graphs": "in graphs", "all": "everywhere", "off": "off"}.get(f.get("cudnn_attention", ""))
    if where:  # GPU only: CPU attention has no cuDNN
        parts.append(f"cuDNN attention {where}")
    return ", ".join(parts)
