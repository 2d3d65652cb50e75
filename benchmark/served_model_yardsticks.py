"""In-process yardsticks for the engines whose served model builds the engine itself from config.pbtxt's
parameters (LMDeploy, SGLang): the served model's own module configures the engine here, so the yardstick and
the served model run one configuration. Driven by benchmark/engine_yardstick.py (`lmdeploy`, `sglang` modes):
closed loops, llmlaunch-bench's prompts, raw prompts (no chat template), greedy, ignore_eos, exactly --output-len
tokens, llmlaunch-bench's metrics code.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time

from benchmark.yardstick_loop import LoadPrompts, load_rows
from launcher.python_backend.triton_io import SamplingParams


def served_model(engine: str):
    """A fresh copy of the engine's Triton model module (launcher/engines/<engine>/model.py), for its configuration and
    sampling mappings."""
    spec = importlib.util.find_spec(f"launcher.engines.{engine}.model")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def greedy(args) -> SamplingParams:
    return SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)


# ----------------------------------------------------------------------------- LMDeploy
async def lmdeploy_async(args, params: dict, prompts: LoadPrompts) -> list:
    import dataclasses

    from lmdeploy import GenerationConfig, PytorchEngineConfig, TurbomindEngineConfig
    from lmdeploy.serve.core import AsyncEngine

    served = served_model("lmdeploy")
    backend = params.get("backend", "turbomind")
    config_cls = TurbomindEngineConfig if backend == "turbomind" else PytorchEngineConfig
    cfg = config_cls(**served.backend_config_kwargs(params, {f.name for f in dataclasses.fields(config_cls)}))
    t_start = time.perf_counter()
    engine = AsyncEngine(
        params["model_path"],
        backend=backend,
        backend_config=cfg,
        **({"model_name": params["model_name"]} if params.get("model_name") else {}),
    )
    engine.start_loop(asyncio.get_running_loop(), use_async_api=True)
    load_s = time.perf_counter() - t_start
    gen_kwargs = served.generation_kwargs(greedy(args))

    async def stream_of(sample):  # preprocess + generate per request; outputs count tokens cumulatively
        gen_config = GenerationConfig(**{**gen_kwargs, "max_new_tokens": sample.output_len})
        request = await engine.preprocess(
            messages=sample.prompt, session_id=engine.session_mgr.get(), gen_config=gen_config, do_preprocess=False
        )
        seen = 0
        async for out in engine.generate(request, stream_response=True):
            new = max(out.generate_token_len - seen, 0)
            seen += new
            yield new, out.input_token_len, out.finish_reason or ""

    try:
        return await load_rows(args, stream_of, prompts, f"in-process LMDeploy {backend}", load_s)
    finally:
        engine.close()


# ----------------------------------------------------------------------------- SGLang
async def sglang_async(args, params: dict, prompts: LoadPrompts) -> list:
    """SGLang's `Engine` built on this loop (as the served model builds it on its runtime's loop) with the served
    model's ServerArgs, streamed through `async_generate`; its chunks count completion tokens cumulatively."""
    import sglang

    served = served_model("sglang")
    kwargs = served.server_args_kwargs(params, os.environ)
    t_start = time.perf_counter()
    engine = sglang.Engine(**kwargs)
    load_s = time.perf_counter() - t_start
    sampling = served.sampling_params(greedy(args))

    async def stream_of(sample):
        stream = await engine.async_generate(
            prompt=sample.prompt, sampling_params={**sampling, "max_new_tokens": sample.output_len}, stream=True
        )
        seen = 0
        async for chunk in stream:
            meta = chunk.get("meta_info") or {}
            done = int(meta.get("completion_tokens", 0))
            reason = meta.get("finish_reason") or ""
            yield (
                max(done - seen, 0),
                int(meta.get("prompt_tokens", 0)),
                (reason.get("type", "") if isinstance(reason, dict) else str(reason)),
            )
            seen = max(seen, done)

    try:
        attention = kwargs.get("attention_backend") or "default"
        return await load_rows(args, stream_of, prompts, f"in-process SGLang ({attention} attention)", load_s)
    finally:
        engine.shutdown()
