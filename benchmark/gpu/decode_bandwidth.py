"""How far the hf engine's batch-1 decode is from the memory-bandwidth limit (docs/performance/hf.md, one_gpu.sh).

    python -m benchmark.gpu.decode_bandwidth --model /tmp/llama-1b [--tokens 512]

A decode step at batch 1 must read every weight once, so the step rate can be
at most (device copy bandwidth) / (weight bytes).  Measured here, in one
process on one GPU:

* copy bandwidth: `dst.copy_(src)` of a 2 GiB buffer, bytes read + written per
  second, best of 20;
* the engine (launcher.hf.engine.Engine, in-process) four ways (--ways):
  eager, CUDA-graph decode, torch.compile'd, and compiled + CUDA graphs (the GPU
  default): one request, greedy, exactly --tokens new tokens;
  decode steps/s = (tokens - 1) / (time from first to last token); and how long
  compiling took;
* static `model.generate` at batch 1 with the same settings, for reference
  (eager transformers, a DynamicCache);
* where a graph step's time goes, with and without compile: the graph replayed
  back to back (its kernels' GPU time), `runner.execute` in a loop (+ inputs,
  sampling, host sync), and the engine figure above (+ scheduler, detokenizer,
  callbacks).

Then, in float32, the greedy tokens of 4 prompts run together (with graphs: through one
wave graph) must be the same with graphs, without, compiled with graphs, and from `generate`,
and so must those of
the 4 prompts run one after the other (compiled, graphs: each prompt through a prompt graph)
and those of the 4 prompts arriving while the others decode (compiled, graphs: a prompt
replays its graph alone, two a wave graph, while the decode rows wait, the rows then decode on;
the counts of such steps are printed).  Prints one JSON document: bandwidth
GB/s, weight GB, limit steps/s, steps/s of each and their fractions of the limit,
and the greedy comparisons.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def copy_bandwidth(device, gib: float = 2.0, iters: int = 20) -> float:
    import torch

    n = int(gib * 2**30) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(iters + 3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n * 2 / best / 1e9  # read + write, GB/s


# the engine ways: name -> (cuda_graphs, torch_compile)
WAYS = {"eager": (False, False), "graphs": (True, False), "compiled": (False, True), "compiled_graphs": (True, True)}


def engine_steps(
    model_dir: str, tokens: int, prompt_len: int, dtype: str, cuda_graphs: bool, torch_compile: bool
) -> dict:
    import queue

    from launcher.engines.hf.config import HFEngineArgs
    from launcher.hf.engine import Engine, SamplingParams

    t0 = time.perf_counter()
    engine = Engine.from_args(
        HFEngineArgs(
            model_path=model_dir,
            device="cuda",
            dtype=dtype,
            max_num_seqs=8,
            cuda_graphs=cuda_graphs,
            torch_compile=str(torch_compile).lower(),
        )
    ).start()
    start_s = time.perf_counter() - t0
    try:
        prompt = list(range(10, 10 + prompt_len))
        best = None
        for _ in range(3):  # the first run warms allocator and kernels
            times: list = []
            done: queue.SimpleQueue = queue.SimpleQueue()

            def on_output(out, times=times, done=done):
                if out.output_tokens:
                    times.append((time.perf_counter(), out.output_tokens))
                if out.finish_reason is not None:
                    done.put(out)

            engine.add_request(
                f"bw{time.monotonic_ns()}", prompt, SamplingParams(max_tokens=tokens, ignore_eos=True), on_output
            )
            out = done.get(timeout=600)
            assert out.finish_reason == "length", out
            (t_first, n_first), (t_last, n_last) = times[0], times[-1]
            rate = (n_last - n_first) / (t_last - t_first)
            best = rate if best is None else max(best, rate)
        res = {
            "steps_per_s": round(best, 1),
            "graph_error": engine.runner.graph_error,
            "compile_error": engine.runner.compile_error,
            "engine_start_s": round(start_s, 1),
        }
        if cuda_graphs and engine.runner.use_graphs:
            res.update(step_parts(engine.runner))
        return res
    finally:
        engine.shutdown()


def batch1_graph(runner):
    """(the captured batch-1 decode graph, its step): slot 0 of the idle runner at position 199, run once."""
    from launcher.hf.runner import SamplingRows, StepInputs

    step = StepInputs([0], [5], [199], [], [], SamplingRows())
    runner.execute(step)
    return runner.decode_graphs.graphs[runner.decode_graphs.bucket(1, 200)].graph, step


def step_parts(runner, n: int = 300) -> dict:
    """Where a batch-1 graph step's time goes, on the idle engine's runner: the graph replay alone (GPU time
    of the step's kernels, back to back), `runner.execute` (+ inputs, sampling, the host sync), and what the
    engine loop adds on top of that (scheduler, detokenizer, callbacks) is the rest of engine steps/s."""
    import torch

    graph, step = batch1_graph(runner)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        graph.replay()
    torch.cuda.synchronize()
    replay = n / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(n):
        runner.execute(step)
    execute = n / (time.perf_counter() - t0)
    return {"graph_replay_steps_per_s": round(replay, 1), "runner_execute_steps_per_s": round(execute, 1)}


GREEDY_CASES = ("together", "one_at_a_time", "while_decoding", "slots_full")


def greedy_tokens(model_dir: str, cuda_graphs, torch_compile, n: int = 64, arrive: str = "together") -> list:
    """Greedy tokens (float32) of 4 prompts of different lengths through the engine.  arrive: "together" (one
    step takes them all: with graphs, a wave graph of 4 rows of 48 tokens); "one_at_a_time" (each after the last finished: its step is its own and replays a prompt
    graph); "while_decoding" (prompt 0, then 1 and 2 at once once 0 has 8 tokens, then 3 once 2 has 8: each
    arrives while others decode, and with graphs goes beside them through a mixed graph); "slots_full" (all
    four in one call to an engine of two slots: two wait for a slot while the others decode, their decode steps
    queued ahead all the same, and take the slots the first two leave)."""
    import queue
    import threading

    from launcher.engines.hf.config import HFEngineArgs
    from launcher.hf.engine import Engine, SamplingParams

    engine = Engine.from_args(
        HFEngineArgs(
            model_path=model_dir,
            device="cuda",
            dtype="float32",
            max_num_seqs=2 if arrive == "slots_full" else 8,
            cuda_graphs=cuda_graphs,
            torch_compile=str(torch_compile).lower(),
        )
    ).start()
    try:
        done: queue.SimpleQueue = queue.SimpleQueue()
        outs: dict = {i: [] for i in range(4)}
        progress = threading.Condition()

        def on_output(out, i):
            with progress:
                outs[i].extend(out.token_ids)
                progress.notify_all()
            if out.finish_reason:
                done.put(i)

        def add(i, length):
            engine.add_request(
                f"g{i}",
                list(range(20 + i, 20 + i + length)),
                SamplingParams(max_tokens=n, ignore_eos=True),
                lambda out, i=i: on_output(out, i),
            )

        def tokens_of(i, k):
            with progress:
                assert progress.wait_for(lambda: len(outs[i]) >= k, timeout=600), f"prompt {i} stalled"

        lengths = (5, 17, 40, 9)
        one_call = arrive in ("together", "slots_full")
        if one_call:  # in one call, so that the engine finds them waiting together: with graphs, a wave
            engine.add_requests(
                [
                    (
                        f"g{i}",
                        list(range(20 + i, 20 + i + length)),
                        SamplingParams(max_tokens=n, ignore_eos=True),
                        lambda out, i=i: on_output(out, i),
                    )
                    for i, length in enumerate(lengths)
                ]
            )
        for i, length in enumerate(() if one_call else lengths):
            if arrive == "while_decoding" and i in (1, 3):
                tokens_of(i - 1, 8)
            add(i, length)
            if arrive == "one_at_a_time":
                done.get(timeout=600)
        for _ in outs if arrive != "one_at_a_time" else ():
            done.get(timeout=600)
        if cuda_graphs:
            s = engine.stats
            print(
                f"[greedy] {arrive}: {engine.features}; {s.prompt_steps} steps with prompts, "
                f"{s.prompt_graph_steps} of them through a prompt or wave graph, {s.mixed_steps} beside decode rows "
                f"through a mixed graph; {s.ahead_steps} of {s.steps} steps "
                f"queued ahead",
                file=sys.stderr,
                flush=True,
            )
        return [outs[i] for i in sorted(outs)]
    finally:
        engine.shutdown()


def generate_tokens(model_dir: str, n: int = 64) -> list:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    res = []
    with torch.inference_mode():
        for i, length in enumerate((5, 17, 40, 9)):
            ids = torch.arange(20 + i, 20 + i + length, device="cuda")[None]
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False
            )
            res.append(out[0, length:].tolist())
    del model
    torch.cuda.empty_cache()
    return res


def generate_steps(model_dir: str, tokens: int, prompt_len: int, dtype: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    dt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "auto": torch.bfloat16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dt).cuda().eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ids = torch.arange(10, 10 + prompt_len, device="cuda")[None]
    best = None
    with torch.inference_mode():
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=1, min_new_tokens=1, do_sample=False
            )
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False
            )
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            # time of the decode steps alone: the full call minus a one-token call (prefill + set-up)
            rate = (tokens - 1) / ((t2 - t1) - (t1 - t0))
            best = rate if best is None else max(best, rate)
    del model
    torch.cuda.empty_cache()
    return {"generate_steps_per_s": round(best, 1), "weight_bytes": weight_bytes}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="HF model folder")
    ap.add_argument("--tokens", type=int, default=512, help="new tokens per request")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--no-greedy-check", action="store_true", help="skip the float32 greedy comparison")
    ap.add_argument("--greedy-only", action="store_true", help="only the float32 greedy comparison")
    ap.add_argument(
        "--greedy-cases",
        nargs="+",
        choices=GREEDY_CASES,
        default=list(GREEDY_CASES),
        help="the greedy comparisons to run (default: all)",
    )
    ap.add_argument(
        "--ways", nargs="+", choices=list(WAYS), default=list(WAYS), help="the engine ways to time (default: all)"
    )
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("decode_bandwidth.py measures a GPU; none is visible", file=sys.stderr)
        return 2
    out = {"device": torch.cuda.get_device_name()}
    if not args.greedy_only:
        bw = copy_bandwidth("cuda")
        gen = generate_steps(args.model, args.tokens, args.prompt_tokens, args.dtype)
        limit = bw * 1e9 / gen["weight_bytes"]
        out.update(
            {
                "copy_bandwidth_GBps": round(bw, 1),
                "weight_GB": round(gen["weight_bytes"] / 1e9, 3),
                "limit_steps_per_s": round(limit, 1),
                "generate_steps_per_s": gen["generate_steps_per_s"],
                "generate_fraction_of_limit": round(gen["generate_steps_per_s"] / limit, 4),
            }
        )
    # the ways, named as in the output: engine_<name>_steps_per_s, ..._fraction_of_limit, ...
    for name in () if args.greedy_only else args.ways:
        r = engine_steps(args.model, args.tokens, args.prompt_tokens, args.dtype, *WAYS[name])
        out[f"engine_{name}_steps_per_s"] = r["steps_per_s"]
        out[f"engine_{name}_fraction_of_limit"] = round(r["steps_per_s"] / limit, 4)
        out[f"engine_{name}_start_s"] = r["engine_start_s"]
        for key in ("graph_replay_steps_per_s", "runner_execute_steps_per_s"):
            if key in r:
                out[f"{name}_{key}"] = r[key]
        for key in ("graph_error", "compile_error"):
            if r[key]:
                out[f"{name}_{key}"] = r[key]
    if not args.no_greedy_check:
        cases = set(args.greedy_cases)
        ref = generate_tokens(args.model)
        if "together" in cases:
            # float32, 4 prompts together (rows of idle slots padded in the graph): the same tokens four ways
            with_graphs, without = greedy_tokens(args.model, True, False), greedy_tokens(args.model, False, False)
            compiled = greedy_tokens(args.model, True, True)
            out["greedy_graphs_equal_eager"] = with_graphs == without
            out["greedy_graphs_equal_generate"] = with_graphs == ref
            out["greedy_eager_equal_generate"] = without == ref
            out["greedy_compiled_graphs_equal_generate"] = compiled == ref
        for arrive in ("one_at_a_time", "while_decoding", "slots_full"):
            # one prompt at a time: each prompt's step replays a prompt graph (buckets 16, 24, 48, 16); arriving while
            # others decode: prompt graphs between decode steps queued ahead; two slots for four: decode steps queued
            # ahead while two requests wait for a slot
            if arrive in cases:
                out[f"greedy_compiled_graphs_{arrive}_equal_generate"] = (
                    greedy_tokens(args.model, True, True, arrive=arrive) == ref
                )
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
