"""The yardsticks a served engine is measured against: the same engine, configured as llmlaunch configures
it, driven in-process without tritonserver, gRPC or the python backend.

    python -m benchmark.engine_yardstick async   --concurrency 1:32 64:1000 128:1000 -- engine=vllm model.path=M
    python -m benchmark.engine_yardstick offline --batch 1 64 128 -- engine=vllm model.path=M model.dtype=bfloat16
    python -m benchmark.engine_yardstick lmdeploy --concurrency 1:32 64:1000 128:1000 -- engine=lmdeploy \
        engine.backend=pytorch model.path=M model.dtype=bfloat16
    python -m benchmark.engine_yardstick sglang --concurrency 1:32 64:1000 128:1000 -- engine=sglang model.path=M

The llmlaunch overrides after `--` are rendered exactly as `llmlaunch` renders them, and the engine is built
from the rendered files (vLLM: `1/model.json`, its AsyncEngineArgs), so the yardstick and the served model
run one configuration. --engine-args FILE reads that file from a served run's folder instead
(`<run dir>/model_repository/vllm_model/1/model.json`), without rendering: then the yardstick can run under the
python that runs the served model's stub, to tell that environment's cost from tritonserver's.

async    vLLM's `AsyncLLM` in this process, a closed loop per concurrency C: C requests in flight, the
         next one sent as soon as one finishes, N requests counted after C warm-up requests. With
         --frontends K: one engine core and K processes, each an AsyncLLM client of it (what the served
         model runs with engine.frontends=K, minus tritonserver), the C streams spread over them and the
         next request taken from one counter they share. The
         prompts are llmlaunch-bench's synthetic ones (same seed, input length and tokenizer), every
         request streams (output_kind DELTA) and generates exactly --output-len tokens (ignore_eos).
         TTFT, ITL and tokens/s are computed by llmlaunch-bench's own metrics code, so the rows compare
         with `llmlaunch-bench` run against the served model. Each load sends the prompts llmlaunch-bench sends the
         served model under serve_bench, new to the engine (--prompts per-load); --prompts shared draws every load
         from one list, so a load resends prompts an earlier load sent and the engine's prefix cache serves most of
         their prefill. --through-adapter drives the same engine through llmlaunch's vLLM
         adapter too, --through-runtime through the served models' runtime on that adapter (the stub's loop,
         parsing and sender threads, without tritonserver: benchmark/runtime_alone.py), taking turns with the
         plain AsyncLLM calls; --repeat R passes over the loads.
lmdeploy LMDeploy's `AsyncEngine` in this process, built from the rendered config.pbtxt parameters by the
         served model's own functions (launcher/engines/lmdeploy/model.py), driven like `async`: closed
         loops, llmlaunch-bench's prompts, raw prompts (no chat template), greedy, ignore_eos, exactly
         --output-len tokens, the same prompts (--prompts) and metrics code (benchmark/served_model_yardsticks.py).
sglang   SGLang's `Engine` in this process, the same way (launcher/engines/sglang/model.py's ServerArgs and
         sampling parameters, streamed through `async_generate`).
offline  vLLM's `LLM.generate` with B prompts at once (batch B), --rounds times after one warm-up
         round: output tokens / wall time, and decode steps/s (tokens/s / B).

Each mode prints a table and writes --json. Run each mode in a process of its own: an engine holds the GPU
until its process exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid

from benchmark import host_pulse
from benchmark.yardstick_loop import LoadPrompts, closed_loop, counter, parse_loads, print_row, samples_for
from launcher.bench import metrics


def rendered_engine_args(overrides: list) -> tuple:
    """(engine name, the engine's arguments as llmlaunch renders them, model path) for `overrides`."""
    from launcher.cli import plan
    from launcher.render import repository_files

    _, spec = plan(list(overrides))
    name = spec.engine.name
    files = repository_files(spec)
    if name in ("lmdeploy", "sglang"):  # their served model builds the engine from config.pbtxt's parameters
        from launcher import pbtxt

        cfg = pbtxt.parse(files[f"{spec.model_name}/config.pbtxt"])
        params = {k: v.string_value for k, v in cfg.parameters.items()}
        return name, params, params["model_path"]
    if name != "vllm":
        raise SystemExit(f"engine_yardstick: engine={name} has no yardstick here yet (vllm, lmdeploy and sglang have)")
    args = json.loads(files[f"{spec.model_name}/1/model.json"])
    return name, args, args["model"]


# ----------------------------------------------------------------------------- vLLM
async def _drive(engine, samples, sampling: dict, streams: int, take, clock: dict) -> list:
    """closed_loop on one AsyncLLM: every request streams (output_kind DELTA)."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    async def stream_of(sample):
        sp = SamplingParams(output_kind=RequestOutputKind.DELTA, max_tokens=sample.output_len, **sampling)
        async for out in engine.generate(sample.prompt, sp, uuid.uuid4().hex):
            c = out.outputs[0]
            yield len(c.token_ids), len(out.prompt_token_ids or ()), (c.finish_reason or "") if out.finished else ""

    return await closed_loop(stream_of, samples, streams, take, clock)


def _adapter_stream(adapter):
    """stream_of for closed_loop through llmlaunch's vLLM adapter (launcher.engines.vllm.model.VLLMAdapter.generate):
    the served path's own per-request parameters (its SamplingParams from the contract's defaults, output kind,
    request ids, the pieces it makes of each output, vLLM's request stamps read), minus the stub's runtime,
    tritonserver and gRPC.  The request is what llmlaunch-bench sends: the prompt's text, max_tokens, ignore_eos."""
    from launcher.python_backend.generation import GenerationRequest, SamplingParams as Params

    async def stream_of(sample):
        req = GenerationRequest(
            prompt=sample.prompt, params=Params(max_tokens=sample.output_len, ignore_eos=True), stream=True
        )
        async for piece in adapter.generate(uuid.uuid4().hex, req):
            yield len(piece.token_ids or ()), piece.input_tokens, piece.finish_reason or ""

    return stream_of


def _served_adapter(engine_args: dict):
    """llmlaunch's vLLM adapter for one front end, on `engine_args` as the served model makes it (its
    `1/model.json`, written to a folder of its own); not started.  Its AsyncLLM is the engine every path of the run
    drives."""
    import os
    import tempfile

    from launcher.engines.vllm.model import ENGINE_ARGS_FILE, VLLMAdapter
    from launcher.python_backend.adapter import Log

    folder = tempfile.mkdtemp(prefix="yardstick-vllm-")
    with open(os.path.join(folder, ENGINE_ARGS_FILE), "w") as f:
        json.dump(engine_args, f)
    return VLLMAdapter({"frontends": "1"}, folder, Log("yardstick"), "vllm_model")


async def vllm_async(args, engine_args: dict, prompts: LoadPrompts) -> list:
    """Closed loops on one AsyncLLM in this process; --through-adapter adds the same loads through llmlaunch's vLLM
    adapter on the same engine, --through-runtime through the served models' runtime on that adapter
    (benchmark/runtime_alone.py), the paths taking turns, each --repeat times (the spread of one path beside the
    other's, in one process and one lease).  With the runtime, the engine lives on the runtime's loop thread, as in
    the stub, and the other paths' closed loops run there too; the runtime's own client is this thread's loop."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

    from benchmark import runtime_alone
    from launcher.engines.vllm import core as vllm_core
    from launcher.python_backend import counters
    from launcher.python_backend.step_splits import with_wall_step
    from launcher.python_backend.timings import engine_step_split, mean_first_token_ms

    t_start = time.perf_counter()
    adapter = _served_adapter(engine_args) if args.through_adapter or args.through_runtime else None
    runtime = runtime_alone.start_runtime(adapter) if args.through_runtime else None
    if adapter and not runtime:
        await adapter.start()
    # the engine core's steps, counted as the served model counts them (its stat logger), so a row's step figures
    # compare with llmlaunch-bench --server-metrics'; on the adapter's engine, the adapter's own counters
    if adapter:
        engine, steps = adapter.engine, adapter.engine_steps
    else:
        steps = counters.EngineSteps()
        logger = vllm_core.engine_stats_logger(counters.Latest(), None, steps)
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args), stat_loggers=[logger])
    load_s = time.perf_counter() - t_start

    async def on_engine(coro):  # a closed loop of the paths that call the engine themselves: on its loop
        if runtime is None:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, runtime.loop))

    async def raw(sample):  # as _drive's: every request streams (output_kind DELTA)
        sp = SamplingParams(output_kind=RequestOutputKind.DELTA, max_tokens=sample.output_len, **sampling)
        async for out in engine.generate(sample.prompt, sp, uuid.uuid4().hex):
            c = out.outputs[0]
            yield len(c.token_ids), len(out.prompt_token_ids or ()), (c.finish_reason or "") if out.finished else ""

    sampling = {"ignore_eos": True, "temperature": 0.0}
    paths = [("in-process AsyncLLM", raw, on_engine)]
    if args.through_adapter:
        paths.append(("in-process, via adapter", _adapter_stream(adapter), on_engine))
    if runtime:
        through_runtime = runtime_alone.runtime_stream(runtime)
        paths.append(("in-process, via the stub's runtime", through_runtime, _here))
    rows, run = [], 0
    try:
        for r in range(args.repeat):
            for label, stream_of, where in paths:
                for c, n in parse_loads(args.concurrency):
                    warmup = c if args.warmup < 0 else args.warmup
                    warm, w_take, measured, m_take = prompts.for_load(c, n, warmup, run)
                    clock = {"t0": time.perf_counter()}
                    await where(closed_loop(stream_of, warm, warmup, w_take, clock))
                    if where is _here:  # the warm-up's first tokens all counted, none of them in the measured split
                        before = runtime_alone.settled_first_tokens(runtime, through_runtime.requests)
                    clock["t0"] = time.perf_counter()
                    wall = [time.time()]
                    steps_before = steps.totals_map()
                    results = await where(closed_loop(stream_of, measured, c, m_take, clock, args.gap_ms / 1000))
                    wall.append(time.time())
                    m = metrics.compute(results, max(x.end for x in results))
                    # steps of the measured requests (outputs still in flight come in with the last ones' end)
                    engine_steps = with_wall_step(engine_step_split(steps_before, steps.totals_map()), m["duration_s"])
                    row = {"path": label, "pass": r + 1, "prompts": args.prompts, "concurrency": c, "requests": n}
                    if args.gap_ms:
                        row["gap_ms"] = args.gap_ms
                    row["wall"] = wall  # where the load sits in the host's pulse (--pulse)
                    if args.pulse:
                        row["host"] = host_pulse.window(args.pulse, *wall)
                    if engine_steps:
                        row["engine_steps"] = engine_steps
                    if where is _here:  # where the runtime's first tokens spent their time, as the served split's
                        after = runtime_alone.settled_first_tokens(runtime, through_runtime.requests)
                        row["first_token_ms"] = mean_first_token_ms(before, after)
                    rows.append({**row, "load_s": load_s, **m})
                    print_row(rows[-1])
                run += 1
        return rows
    finally:
        if runtime:
            runtime.stop()
        elif adapter:
            await adapter.stop()
        else:
            engine.shutdown()


async def _here(coro):
    """A closed loop on this thread's loop (the runtime's client, as tritonserver is the stub's)."""
    return await coro


def _frontend_main(
    k: int, n: int, engine_args: dict, info: dict, samples, loads: list, warmup: int, shared, ready, go, results
) -> None:
    """Front end k of n (a process of its own): an AsyncLLM client of the engine core; for each load, its share of
    the streams, taking requests from the counter all front ends share."""
    from launcher.engines.vllm import core as vllm_core

    _, config = vllm_core.engine_config(engine_args, n, k)

    def take(stop: int):
        def next_index():
            with shared.get_lock():
                if shared.value >= stop:
                    return None
                shared.value += 1
                return shared.value - 1

        return next_index

    async def run() -> None:
        engine = vllm_core.client(config, n, k, info, stats=True, log_stats=k == 0)  # as the served front ends
        sampling = {"ignore_eos": True, "temperature": 0.0}
        try:
            for c, count in loads:
                streams = c // n + (1 if k < c % n else 0)  # C streams spread over the front ends
                w = streams if warmup < 0 else warmup // n  # each front end warms its own streams up
                clock = {"t0": time.perf_counter()}
                await _drive(engine, samples, sampling, w, counter(0, w), clock)
                ready.put(k)
                start = go.get()  # the parent's perf_counter (one clock for every process) once all are warm
                clock["t0"] = start
                while time.perf_counter() < start:
                    await asyncio.sleep(0.001)
                stop = (c if warmup < 0 else warmup) + count
                out = await _drive(engine, samples, sampling, streams, take(stop), clock) if streams else []
                results.put([r.to_json() for r in out])
        finally:
            engine.shutdown()

    asyncio.run(run())


def vllm_async_frontends(args, engine_args: dict, samples) -> list:
    """The served layout of engine.frontends=N without tritonserver: one engine core started for N clients
    (launcher.engines.vllm.core, as the served model starts it), N processes each an AsyncLLM client driving its
    share of the streams."""
    import multiprocessing

    from launcher.engines.vllm import core as vllm_core

    n = args.frontends
    loads = parse_loads(args.concurrency)
    ctx = multiprocessing.get_context("spawn")
    shared, ready, go, results = ctx.Value("l", 0), ctx.Queue(), ctx.Queue(), ctx.Queue()
    t_start = time.perf_counter()
    core, info = vllm_core.launch_core(*vllm_core.engine_config(engine_args, n, -1), n)
    load_s = time.perf_counter() - t_start
    procs = [
        ctx.Process(
            target=_frontend_main,
            args=(k, n, engine_args, info, samples, loads, args.warmup, shared, ready, go, results),
        )
        for k in range(n)
    ]
    for p in procs:
        p.start()
    rows = []
    try:
        for c, count in loads:
            for _ in range(n):
                ready.get(timeout=900)
            shared.value = c if args.warmup < 0 else args.warmup
            start = time.perf_counter() + 0.05
            for _ in range(n):
                go.put(start)
            found = [metrics.RequestResult.from_json(d) for _ in range(n) for d in results.get(timeout=900)]
            m = metrics.compute(found, max(r.end for r in found))
            rows.append(
                {"path": f"in-process AsyncLLM x{n}", "concurrency": c, "requests": count, "load_s": load_s, **m}
            )
            print_row(rows[-1])
    finally:
        for p in procs:
            p.join(60)
        vllm_core.stop_core(core)
    return rows


def vllm_offline(args, engine_args: dict, samples) -> list:
    from vllm import LLM, SamplingParams

    kwargs = {k: v for k, v in engine_args.items() if k not in ("enable_log_requests", "disable_log_requests")}
    t_start = time.perf_counter()
    llm = LLM(**kwargs)
    load_s = time.perf_counter() - t_start
    sp = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=0.0)
    rows = []
    for batch in args.batch:
        prompts = [s.prompt for s in samples[:batch]]
        llm.generate(prompts, sp, use_tqdm=False)  # warm-up round
        walls, tokens = [], 0
        for _ in range(args.rounds):
            t = time.perf_counter()
            outs = llm.generate(prompts, sp, use_tqdm=False)
            walls.append(time.perf_counter() - t)
            tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        best = sorted(walls)[len(walls) // 2]  # the median round
        rows.append(
            {
                "path": "offline LLM.generate",
                "batch": batch,
                "rounds": args.rounds,
                "load_s": load_s,
                "output_tokens": tokens,
                "wall_s_median": best,
                "output_throughput": tokens / best,
                "steps_per_s": tokens / best / batch,
            }
        )
        print(
            f"offline  batch {batch:>4}: {tokens / best:>10.1f} tok/s  {tokens / best / batch:>8.1f} steps/s  "
            f"(median of {args.rounds} rounds, {best:.2f} s)",
            flush=True,
        )
    return rows


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("async", "offline", "lmdeploy", "sglang"))
    p.add_argument(
        "--concurrency",
        nargs="+",
        default=["1:32", "64:1000", "128:1000"],
        help="async, lmdeploy, sglang: C:N, N requests counted at concurrency C (default 1:32 64:1000 128:1000)",
    )
    p.add_argument(
        "--warmup", type=int, default=-1, help="async, lmdeploy, sglang: warm-up requests before each loop (default: C)"
    )
    p.add_argument(
        "--frontends",
        type=int,
        default=1,
        help="async: AsyncLLM clients of one engine core, each a process of its own, sharing the streams "
        "(the layout of the served model's engine.frontends; default 1: one AsyncLLM in this process)",
    )
    p.add_argument(
        "--prompts",
        choices=("per-load", "shared"),
        default="per-load",
        help="async with one front end, lmdeploy, sglang: per-load (the default: llmlaunch-bench's prompts under "
        "serve_bench, seed 2C for the measured requests, 2C + 1 for the warm-up, new to the engine at every load and "
        "pass, as the served runs send them) or shared (one prompt list for every load: a later load resends prompts "
        "an earlier one sent, whose prefill the engine's prefix cache serves)",
    )
    p.add_argument(
        "--repeat", type=int, default=1, help="async with one front end, lmdeploy, sglang: passes over the loads"
    )
    p.add_argument(
        "--through-adapter",
        action="store_true",
        help="async, one front end: also drive the engine through llmlaunch's vLLM adapter (the served path's "
        "per-request parameters and output handling, without the stub's runtime, tritonserver or gRPC), the two "
        "paths taking turns on one engine",
    )
    p.add_argument(
        "--through-runtime",
        action="store_true",
        help="async, one front end: also drive the engine through the served models' runtime on llmlaunch's vLLM "
        "adapter (the stub's event loop, request parsing and sender threads, without tritonserver or gRPC: "
        "benchmark/runtime_alone.py), taking turns with the other paths; its rows carry the runtime's first-token "
        "split",
    )
    p.add_argument(
        "--gap-ms",
        type=float,
        default=0.0,
        help="async, one front end: each closed loop sends its next request this long after its previous one ended "
        "(default 0: at once), as a served client's next request reaches the engine only after the last token's way "
        "out and the next request's way in",
    )
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64, 128], help="offline: batch sizes")
    p.add_argument("--rounds", type=int, default=3, help="offline: measured rounds per batch")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0, help="prompt sampling seed (llmlaunch-bench --seed)")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--label", default="", help="the row's name in engines_table.py (with --json)")
    p.add_argument(
        "--pulse",
        metavar="FILE",
        default="",
        help="the host's pulse (benchmark/host_pulse.py's file): each async row says how fast the host ran then",
    )
    p.add_argument(
        "--engine-args",
        metavar="FILE",
        help="vLLM's model.json from a rendered repository, instead of rendering the overrides",
    )
    args = p.parse_args(argv)
    if args.gap_ms and (args.mode != "async" or args.frontends > 1):
        raise SystemExit(
            f"engine_yardstick: --gap-ms {args.gap_ms:g} paces the closed loops of async with one front end: drop it, "
            f"or run mode async without --frontends"
        )
    if args.gap_ms < 0:
        raise SystemExit(f"engine_yardstick: --gap-ms {args.gap_ms:g} is negative: give 0 or more milliseconds")
    if args.engine_args:
        with open(args.engine_args) as f:
            engine_args = json.load(f)
        engine, model = "vllm", engine_args["model"]
    else:
        engine, engine_args, model = rendered_engine_args(overrides)
    need = max([n + c for c, n in parse_loads(args.concurrency)] + args.batch)
    samples = samples_for(model, max(need, 1000), args.input_len, args.output_len, args.seed)
    if args.mode in ("lmdeploy", "sglang") or engine in ("lmdeploy", "sglang"):
        if args.mode != engine:
            raise SystemExit(f"engine_yardstick: mode {args.mode} does not drive engine={engine}")
        from benchmark import served_model_yardsticks

        drive = getattr(served_model_yardsticks, f"{engine}_async")
        rows = asyncio.run(drive(args, engine_args, LoadPrompts(args, model, samples)))
    elif args.mode == "async" and args.frontends > 1:
        if args.through_adapter or args.through_runtime:
            raise SystemExit(
                "engine_yardstick: --through-adapter and --through-runtime drive one front end: drop --frontends "
                f"{args.frontends}, or run them without it in a run of their own"
            )
        rows = vllm_async_frontends(args, engine_args, samples)
    elif args.mode == "async":
        tokenizer = engine_args.get("tokenizer") or model
        rows = asyncio.run(vllm_async(args, engine_args, LoadPrompts(args, tokenizer, samples)))
    else:
        rows = vllm_offline(args, engine_args, samples)
    if args.json:
        with open(args.json, "w") as f:
            doc = {
                "engine": engine,
                "mode": args.mode,
                "overrides": overrides,
                "engine_args": engine_args,
                "rows": rows,
            }
            if args.label:
                doc["yardstick_label"] = args.label
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
