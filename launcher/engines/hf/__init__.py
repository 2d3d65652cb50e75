"""`engine=hf`: our continuous-batching engine on HF transformers (launcher/hf), one tritonserver per GPU.

config.py   its settings, declared once (HFEngineConfig) and as the engine reads them (HFEngineArgs, 1/model.json)
model.py    the Triton python model (model_repository/hf/1/model.py loads it)
streams.py  that model's response side: streams, threads, the engine process's outputs

With tp > 1 every rank runs a tritonserver; rank 0's engine leads and the others run its steps (launcher/hf/tp.py).
"""

from __future__ import annotations

from typing import List

from launcher import pbtxt
from launcher.engines.base import Engine, Problem, RenderedModel, model_path, tokenizer_path
from launcher.engines.hf.config import ARGS_FILE, HFEngineArgs, HFEngineConfig, engine_args


def launch_args(spec) -> HFEngineArgs:
    """The hf engine's arguments for this launch: the engine config's settings, the model's dtype and max_model_len,
    its paths and tp."""
    return engine_args(
        spec.engine,
        dtype=spec.model.dtype,
        max_model_len=spec.model.max_model_len,
        model_path=model_path(spec),
        tokenizer_path=tokenizer_path(spec),
        tp_size=spec.tp,
    )


class HFEngine(Engine):
    """Our continuous-batching engine on HF transformers; one tritonserver per GPU, rank 0 leads."""

    name = "hf"
    Config = HFEngineConfig
    layout = "per_gpu"
    worker_models = ("hf_model",)
    tp_any_divisor = True  # launcher/hf/tp.py shards heads, KV heads and MLP rows over any tp dividing them
    first_token_split = True
    continues_requests = True
    copy_restarts = True  # its tp ranks meet through torch.distributed at the leader's dist_port, again at a restart
    kv_events = True  # launcher.hf.blocks records them, launcher.hf.engine publishes them
    kv_usage = True  # its scheduler's pool blocks in use (EngineStats.kv_blocks_used), pushed by its model
    kv_transfer = (
        "the prefill leader's engine serves the prompt's cached blocks on a port it picks at start and the decode "
        "replica's engine fetches them over TCP (launcher/hf/kv_transfer.py)"
    )

    def models(self, spec) -> List[RenderedModel]:
        args = launch_args(spec)
        # config.pbtxt holds what Triton reads (batch size, instances) and the arguments file's name; the engine's
        # arguments are in 1/model.json. Several instances share one engine process (each sends its own streams'
        # responses): launcher/engines/hf/model.py
        params = {"engine_args_file": ARGS_FILE}
        if args.tokenizer_path or args.model_path:  # for clients: llmlaunch-bench counts prompts in the served tokens
            params["tokenizer_path"] = args.tokenizer_path or args.model_path
        cfg = pbtxt.python_model(
            spec.model_name, args.max_num_seqs, params, instances=spec.engine.response_processes, continues=True
        )
        return [
            RenderedModel(spec.model_name, cfg, {"1/model.py": "hf/1/model.py"}, {f"1/{ARGS_FILE}": args.to_json()})
        ]

    def check(self, c, scheduler) -> List[Problem]:
        m, e = c.model, c.engine
        if not m.path and not m.make:
            return [
                (
                    "model.path=''",
                    "the hf engine needs a HF-format model folder",
                    "set model.path=/path/to/hf_model, or model=smollm2 (a real small model) or model=tiny (random weights) for one llmlaunch makes",
                )
            ]
        if c.pp != 1:
            return [(f"pp={c.pp}", "the hf engine has no pipeline parallelism", "use pp=1; scale out with replicas")]
        n = e.response_processes  # its domain (config.py) is checked with every field's
        if isinstance(n, int) and n > 1 and c.tp != 1:
            return [
                (
                    f"engine.response_processes={n}",
                    f"with tp={c.tp} each rank runs one model instance (the "
                    "tensor-parallel leader's engine process is not shared)",
                    "set engine.response_processes=1",
                )
            ]
        # tp > 1: one tritonserver per rank, rank 0 leads (launcher/hf/tp.py); whether tp divides the model's heads and
        # kv heads is checked against its config.json before launch (launcher/hostcheck.py)
        if c.disagg.prefill and c.tp != 1:
            return [
                (
                    f"tp={c.tp} disagg.prefill={c.disagg.prefill}",
                    "the hf engine moves keys and values between engines of one rank each",
                    "use tp=1 (add prefill or decode replicas for more GPUs)",
                )
            ]
        if c.disagg.prefill and (not e.prefix_caching or not e.engine_process):
            off = "engine.prefix_caching=false" if not e.prefix_caching else "engine.engine_process=false"
            return [
                (
                    f"disagg.prefill={c.disagg.prefill} with {off}",
                    "a prefill replica's engine process serves a prompt's keys and values from its prefix cache, and "
                    "a decode replica's engine process takes them into its own",
                    f"leave {off.split('=')[0]} at true",
                )
            ]
        return []

    def prefix_cache_switch(self, engine) -> str:
        return "" if engine.prefix_caching else "engine.prefix_caching=true"

    def response_processes(self, engine) -> int:
        return engine.response_processes
