"""An engine's steps between two readings of its totals (launcher/python_backend/timings.py's
`read_engine_metrics`, or an hf engine's EngineStats as a dict): the means a step that llmlaunch-bench reports after
a run (--server-metrics) and the hf model logs at its end, with their one-line form; `with_wall_step` gives a split
of an engine that times no step the run's wall time a step.  timings.py re-exports engine_step_split and
format_engine_split beside the counters they split."""

from __future__ import annotations


def engine_step_split(before: dict, after: dict) -> dict | None:
    """Per-step means (ms) between two readings of an engine's totals (EngineStats fields: `read_engine_metrics`,
    or `Engine.stats_dict()`; {} = from the start); None when no step ran between.

      step_ms     the engine loop's time per step (at one stream, about the inter-token latency)
      launch_ms   preparing inputs and queueing the GPU work;  wait_ms: blocked until the tokens reached the host
      host_ms     the rest: scheduling, detokenizing, stop checks, handing outputs on (step - launch - wait)
      gpu_ms      the step's span on the GPU;  gpu_idle_ms: the GPU waiting for the host to queue the next step
                  (both only on a GPU: they are absent without timed steps);  gpu_gap_seen: the share of timed steps
                  whose gap since the step before was measured (the others followed an idle engine, and their wait
                  is in neither: step_ms - gpu_ms - gpu_idle_ms is then loop time the GPU's timeline does not show)
      decode_rows, prefill_tokens: per step;  ahead: share of steps queued before the last one's tokens were known
      prompt: share of steps with prompt tokens;  prompt_graph: share of steps that were prompts alone replayed as a
      CUDA graph (one prompt or a wave);  mixed: share of steps of decode rows and prompts replayed as a mixed graph
      (the rest of the prompt steps ran eagerly)
      queue_ms, first_token_ms: per request, add_request to a slot and to its first token
      per_intake: requests handed to the engine together (their text prompts tokenized in one call)

    An engine that counts steps but no time (vLLM's engine core: counters.EngineSteps) gets steps, decode_rows and
    prefill_tokens, none of the loop's times or the hf engine's shares, and where it counted them:
      running, waiting   requests running and waiting a step (as each step left them)
      scheduled_tokens   tokens a step scheduled, over the steps that reported their CUDA graph
      graph_full, graph_piecewise, graph_none: shares of those steps by CUDA-graph runtime mode"""

    def d(key: str):
        """A total's change between the readings (0 where neither counted it: another engine's figure)."""
        return after.get(key, 0) - before.get(key, 0)

    n = d("steps")
    if n <= 0:
        return None
    ms = lambda v, k=n: round(1000.0 * v / k, 4)  # noqa: E731
    out = {
        "steps": int(n),
        "decode_rows": round(d("decode_tokens") / n, 2),
        "prefill_tokens": round(d("prefill_tokens") / n, 1),
    }
    if d("wall_s") > 0:  # the hf engine times its loop; vLLM reports no time, and zeros would read as measured
        out.update(
            step_ms=ms(d("wall_s")),
            launch_ms=ms(d("launch_s")),
            wait_ms=ms(d("wait_s")),
            host_ms=ms(d("wall_s") - d("launch_s") - d("wait_s")),
            ahead=round(d("ahead_steps") / n, 3),
            prompt=round(d("prompt_steps") / n, 3),
            prompt_graph=round(d("prompt_graph_steps") / n, 3),
            mixed=round(d("mixed_steps") / n, 3),
        )
    if d("running_sum") > 0 or d("waiting_sum") > 0:
        out["running"] = round(d("running_sum") / n, 2)
        out["waiting"] = round(d("waiting_sum") / n, 2)
    if d("graph_steps") > 0:  # vLLM with cudagraph_metrics=true: each step's CUDAGraphStat
        g = d("graph_steps")
        out["scheduled_tokens"] = round(d("scheduled_tokens") / g, 1)
        for mode in ("full", "piecewise", "none"):
            out[f"graph_{mode}"] = round(d(f"graph_{mode}_steps") / g, 3)
    if d("gpu_steps") > 0:
        out["gpu_ms"] = ms(d("gpu_s"), d("gpu_steps"))
        out["gpu_idle_ms"] = ms(d("gpu_idle_s"), d("gpu_steps"))
        out["gpu_gap_seen"] = round(d("gpu_gaps") / d("gpu_steps"), 3)
    # per request (absent in totals from before these counters): the mean wait from add_request to a slot, and
    # to the first token; their difference is the prompt's own steps and the decode steps it waited behind
    if d("admitted") > 0:
        out["queue_ms"] = ms(d("queued_s"), d("admitted"))
    if d("first_tokens") > 0:
        out["first_token_ms"] = ms(d("to_first_token_s"), d("first_tokens"))
    if d("prompt_tokens") > 0:  # the prefix cache: prompt tokens not prefilled because a request computed them before
        out["prefix_hit_rate"] = round(d("cached_prompt_tokens") / d("prompt_tokens"), 4)
        out["cached_prompt_tokens"] = int(d("cached_prompt_tokens"))
    if d("preempted") > 0:
        out["preempted"] = int(d("preempted"))
    if d("intake_calls") > 0:  # how many requests arrived together: the prompts of one tokenizer call
        out["per_intake"] = round(d("intake_requests") / d("intake_calls"), 2)
    return out


def with_wall_step(steps: dict | None, duration_s: float, servers: int = 1) -> dict | None:
    """An engine split that times no step (vLLM's: timings.engine_step_split) with `wall_step_ms`: the measured
    phase's wall time over the steps one engine ran, the steps counted on `servers` servers shared out among them
    (each server's engine stepped through the whole run).  It is not the engine's own time a step: it holds the time
    the engine stood idle between requests, and is the inter-token time only while the engine never did."""
    if not steps or "step_ms" in steps or duration_s <= 0:
        return steps
    return {**steps, "wall_step_ms": round(1000.0 * duration_s * servers / steps["steps"], 4)}


def format_engine_split(split: dict) -> str:
    """'step 1.780 ms = launch 0.210 + wait 1.400 + host 0.170; GPU 1.690 busy + 0.090 idle; ...' (one line); for an
    engine that times no step (vLLM) '1200 steps; 63.2 running, 0.4 waiting a step; 61.9 decode rows, 98.0 prompt
    tokens a step; CUDA graphs: 88% full, 12% piecewise, 0% none; ...'."""
    if "step_ms" in split:
        line = _format_timed_steps(split)
    else:
        line = _format_counted_steps(split)
    if "first_token_ms" in split:
        line += (
            f"; a request: {split.get('queue_ms', 0):.3f} ms to a slot, {split['first_token_ms']:.3f} ms to its "
            "first token"
        )
    if "per_intake" in split:
        line += f"; {split['per_intake']:g} requests a hand-over (one tokenizer call)"
    if "prefix_hit_rate" in split:
        line += (
            f"; prefix cache: {100 * split['prefix_hit_rate']:.1f}% of prompt tokens "
            f"({split['cached_prompt_tokens']} cached, not prefilled)"
        )
    if split.get("preempted"):
        line += f"; {split['preempted']} requests preempted (KV cache full)"
    return line


def _format_counted_steps(split: dict) -> str:
    """The head of `format_engine_split` for an engine that counts its steps but times none (vLLM's engine core);
    wall_step_ms, where a benchmark added it, is its run's wall time over the steps."""
    line = f"{split['steps']} steps"
    if "wall_step_ms" in split:
        line += f", {split['wall_step_ms']:.3f} ms of the run's wall time a step"
    if "running" in split:
        line += f"; {split['running']:.1f} running, {split['waiting']:.1f} waiting a step"
    line += f"; {split['decode_rows']:.1f} decode rows, {split['prefill_tokens']:.1f} prompt tokens a step"
    if "scheduled_tokens" in split:
        line += (
            f"; {split['scheduled_tokens']:.1f} tokens scheduled a step; CUDA graphs: "
            f"{100 * split['graph_full']:.0f}% full, {100 * split['graph_piecewise']:.0f}% piecewise, "
            f"{100 * split['graph_none']:.0f}% none"
        )
    return line


def _format_timed_steps(split: dict) -> str:
    """The head of `format_engine_split` for the hf engine, which times its loop."""
    line = (
        f"step {split['step_ms']:.3f} ms = launch {split['launch_ms']:.3f} + wait {split['wait_ms']:.3f} + "
        f"host {split['host_ms']:.3f}"
    )
    if "gpu_ms" in split:
        line += f"; GPU {split['gpu_ms']:.3f} busy + {split['gpu_idle_ms']:.3f} idle"
        if split.get("gpu_gap_seen", 1) < 1:  # steps after an idle engine: their wait is in neither
            line += f" (idle measured on {100 * split['gpu_gap_seen']:.0f}% of steps)"
    line += (
        f"; {split['decode_rows']:g} decode rows, {split['prefill_tokens']:g} prompt tokens a step, "
        f"{100 * split['ahead']:.0f}% queued ahead"
    )
    if split.get("prompt"):  # absent in totals from before these counters
        line += f", {100 * split['prompt']:.1f}% with prompts"
        graphed = [
            f"{100 * split[k]:.1f}% {what}"
            for k, what in (
                ("prompt_graph", "prompts alone through a graph"),
                ("mixed", "beside decode rows, mixed graph"),
            )
            if split.get(k)
        ]
        if graphed:
            line += f" ({', '.join(graphed)})"
    return line
