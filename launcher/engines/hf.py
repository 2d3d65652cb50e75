"""`engine=hf`: our continuous-batching engine on HF transformers (launcher/hf), one tritonserver per GPU.

The repository is one python model (model_repository/hf) whose arguments, `HFEngineArgs`, are written to
`1/model.json` from the engine config's fields of the same names. With tp > 1 every rank runs a tritonserver;
rank 0's engine leads and the others run its steps (launcher/hf/tp.py).
"""

from __future__ import annotations

import dataclasses
from typing import List

from launcher import pbtxt
from launcher.engines.base import EngineDef, Problem, RenderedModel, model_path, tokenizer_path
from launcher.hf.args import ARGS_FILE, HFEngineArgs


def engine_args(spec) -> HFEngineArgs:
    """The hf engine's arguments for this launch (HFEngineArgs): the engine config's fields of the same names, the
    model's dtype and max_model_len, its paths and tp; a setting the config leaves out keeps its default."""
    names = {f.name for f in dataclasses.fields(HFEngineArgs)}
    given = {k: v for k, v in dataclasses.asdict(spec.engine).items() if k in names}
    given.update(dtype=spec.model.dtype, max_model_len=spec.model.max_model_len)
    given.update(model_path=model_path(spec), tokenizer_path=tokenizer_path(spec), tp_size=spec.tp)
    return HFEngineArgs.from_dict(given, source="engine config")


def _models(spec) -> List[RenderedModel]:
    args = engine_args(spec)
    # config.pbtxt holds what Triton reads (batch size, instances) and the arguments file's name; the engine's
    # arguments are in 1/model.json. Several instances share one engine process (each sends its own streams'
    # responses): hf model.py
    params = {"engine_args_file": ARGS_FILE}
    if args.tokenizer_path or args.model_path:  # for clients: llmlaunch-bench counts prompts in the served tokens
        params["tokenizer_path"] = args.tokenizer_path or args.model_path
    cfg = pbtxt.python_model(spec.model_name, args.max_num_seqs, params, instances=spec.engine.response_processes)
    return [RenderedModel(spec.model_name, cfg, {"1/model.py": "hf/1/model.py"}, {f"1/{ARGS_FILE}": args.to_json()})]


def _check(c, scheduler) -> List[Problem]:
    """Rules across fields; each field's own domain is declared in launcher/engine_schema.py."""
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
    n = e.response_processes  # its domain (launcher/engine_schema.py) is checked with every field's
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
    return []


ENGINE = EngineDef(
    name="hf",
    default_model_name="hf_model",
    layout="per_gpu",
    models=_models,
    worker_models=("hf_model",),
    check=_check,
    tp_any_divisor=True,  # launcher/hf/tp.py shards heads, KV heads and MLP rows over any tp dividing them
    first_token_split=True,
    kv_events=True,  # launcher.hf.blocks records them, launcher.hf.engine publishes them
    summary="our continuous-batching engine on HF transformers; one tritonserver per GPU, rank 0 leads",
)
