"""The settings every engine has (`EngineConfig`); each engine package's config.py extends it with its own fields,
one comment per field and its domain beside it (launcher/domains.py), and sets the defaults that are its own."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.domains import DEVICES, Choice, Int, Name, arg

ARG_NAME_WHAT = "an argument name (a Python identifier: letters, digits and _)"  # the keys of pass-through mappings


@dataclass
class EngineConfig:
    # the registry key (launcher/engines/registry.py, which launcher/validate.py checks it against): hf | trtllm |
    # vllm | sglang | lmdeploy
    name: str = arg(Name(), "")
    model_name: str = arg(
        Name(empty="the engine's default"), ""
    )  # Triton model name clients address; empty = the engine's default
    max_num_seqs: int = arg(
        Int("sequences batched at once"), 64
    )  # sequences batched at once (also the config's max_batch_size)
    device: str = arg(Choice(DEVICES), "auto")  # auto (cuda when the cluster has GPUs, else cpu) | cpu | cuda
