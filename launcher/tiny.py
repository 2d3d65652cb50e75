"""A random-weight Llama model and a locally trained tokenizer, saved as a normal HF folder.

Tests and CPU benchmarks need a real model folder without downloading weights;
a GPU benchmark needs the same thing at ~1B parameters.  Everything else in
llmlaunch loads models with `from_pretrained(folder)`, so the folder written
here is indistinguishable from a downloaded checkpoint (config.json,
generation_config.json, model.safetensors, tokenizer.json, tokenizer_config.json).

    ensure_tiny_model()                      # 4 layers, hidden 256, vocab 1000 (seconds on CPU)
    python -m launcher.tiny --out /tmp/llama-1b --hidden 2048 --layers 16 --heads 32 \\
        --kv-heads 8 --intermediate 8192 --vocab 128256 --dtype bfloat16

The folder name carries a hash of the settings and the folder is written to a
temporary directory and renamed into place, so concurrent callers (pytest
workers, several ranks) either build it once or reuse it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from launcher.paths import cache_root

# Bump when the way the folder is built changes, so old cached folders are not reused.
_BUILD_VERSION = 1
_CORPUS = Path(__file__).parent / "data" / "tiny_corpus.txt"
BOS, EOS, PAD = "<s>", "</s>", "<pad>"


@dataclass(frozen=True)
class TinySettings:
    hidden: int = 256  # hidden_size
    layers: int = 4  # num_hidden_layers
    heads: int = 4  # num_attention_heads
    kv_heads: int = 2  # num_key_value_heads (< heads: grouped-query attention)
    intermediate: int = 512  # MLP intermediate_size
    vocab: int = 1000  # tokenizer and embedding size (BPE trained on the shipped text, extended synthetically)
    max_position_embeddings: int = 2048  # context length the config advertises
    rope_theta: float = 10000.0  # rotary base
    tie_word_embeddings: bool = False  # share lm_head with the embeddings (Llama 3.2 1B does)
    dtype: str = "float32"  # dtype of the saved weights: float32, bfloat16, float16
    seed: int = 0  # torch seed for the random weights
    initializer_range: float = 0.02  # std of the random weights

    def digest(self) -> str:
        payload = json.dumps({"v": _BUILD_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def default_cache_dir() -> Path:
    """`$LLMLAUNCH_CACHE/models`, else `~/.cache/llmlaunch/models`."""
    return cache_root() / "models"


def ensure_tiny_model(
    cache_dir: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    init_device: str = "cpu",
    **overrides,
) -> Path:
    """Return the folder of a random-weight Llama built from `TinySettings(**overrides)`; build it if absent.

    `cache_dir` is the parent folder (default `default_cache_dir()`); the model lands in
    `<cache_dir>/tiny-llama-<hash of settings>`.  `out` names the folder exactly instead.
    `init_device` draws the random weights there: "cuda" makes an 8 B model in seconds where the CPU takes minutes,
    but another generator draws other weights, so it needs `out` (the cache's names promise CPU-drawn weights).
    """
    if init_device != "cpu" and out is None:
        raise ValueError(f"init_device={init_device!r} needs an explicit out folder: cached models are drawn on cpu")
    valid = {f.name for f in fields(TinySettings)}
    unknown = sorted(set(overrides) - valid)
    if unknown:
        raise TypeError(f"unknown tiny-model settings {unknown}; valid: {sorted(valid)}")
    settings = TinySettings(**overrides)
    if settings.heads % settings.kv_heads or settings.hidden % settings.heads:
        raise ValueError(
            f"hidden ({settings.hidden}) must divide by heads ({settings.heads}) "
            f"and heads by kv_heads ({settings.kv_heads})"
        )
    if out is not None:
        final = Path(out).expanduser()
    else:
        final = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        final = final / f"tiny-llama-{settings.digest()}"
    if (final / "config.json").exists():
        return final
    return publish_folder(final, lambda tmp: _build(settings, tmp, init_device))


def publish_folder(final: Path, build) -> Path:
    """A model folder made by `build(tmp)` in a temporary sibling of `final`, then renamed into place: concurrent
    callers build it once or reuse it, and a folder whose build failed is never left where it would be reused."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        build(tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the model folder is shared (ranks, other users)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        try:
            os.rename(tmp, final)  # atomic on one filesystem; fails if another process won the race
        except OSError:
            if not (final / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _build(s: TinySettings, folder: Path, init_device: str = "cpu") -> None:
    tokenizer = build_tokenizer(s.vocab, s.max_position_embeddings)
    tokenizer.save_pretrained(folder)

    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=s.hidden,
        intermediate_size=s.intermediate,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        max_position_embeddings=s.max_position_embeddings,
        rope_theta=s.rope_theta,
        tie_word_embeddings=s.tie_word_embeddings,
        initializer_range=s.initializer_range,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    dtype = getattr(torch, s.dtype)
    # Seed the global generator only for the duration of the build.
    device = torch.device(init_device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), device:
        torch.manual_seed(s.seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(folder)
    (folder / "llmlaunch-tiny.json").write_text(
        json.dumps(
            {"build_version": _BUILD_VERSION, **asdict(s), "parameters": sum(p.numel() for p in model.parameters())},
            indent=2,
        )
        + "\n"
    )


def build_tokenizer(vocab_size: int, model_max_length: int = 2048):
    """A byte-level BPE `PreTrainedTokenizerFast` of exactly `vocab_size` tokens (BOS prepended, no chat template).

    BPE is trained on the shipped corpus; when the corpus cannot supply enough merges
    (large vocabularies such as Llama 3's 128256) the merge list is extended with
    synthetic concatenations of existing tokens, so every id decodes to some bytes.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [BOS, EOS, PAD]
    if vocab_size < 256 + len(specials) + 1:
        raise ValueError(f"vocab must be at least {256 + len(specials) + 1} (byte alphabet + specials)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=specials,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = _CORPUS.read_text(encoding="utf-8")
    tok.train_from_iterator(text.splitlines(), trainer=trainer)
    if tok.get_vocab_size() < vocab_size:
        tok = _extend_merges(tok, vocab_size)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )


def _extend_merges(tok, vocab_size: int):
    """Append merges `a + b` over existing tokens (deterministic order) until the vocab has `vocab_size` entries."""
    from tokenizers import Tokenizer

    data = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    merges: list = data["model"]["merges"]
    specials = {t["content"] for t in data["added_tokens"]}
    base = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if t not in specials]
    pair_as_list = bool(merges) and isinstance(merges[0], list)
    next_id = max(vocab.values()) + 1
    for a in base:
        for b in base:
            if next_id >= vocab_size:
                break
            new = a + b
            if new in vocab:
                continue
            vocab[new] = next_id
            next_id += 1
            merges.append([a, b] if pair_as_list else f"{a} {b}")
        if next_id >= vocab_size:
            break
    return Tokenizer.from_str(json.dumps(data))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m launcher.tiny", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="exact output folder (default: <cache>/tiny-llama-<hash>)")
    parser.add_argument("--cache-dir", help="parent folder when --out is not given")
    parser.add_argument("--init-device", default="cpu", help="draw the weights there, e.g. cuda (needs --out)")
    for f in fields(TinySettings):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool" or isinstance(f.default, bool):
            parser.add_argument(flag, type=lambda v: v.lower() in ("1", "true", "yes"), default=f.default)
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default)
    args = vars(parser.parse_args(argv))
    out, cache_dir, init_device = args.pop("out"), args.pop("cache_dir"), args.pop("init_device")
    path = ensure_tiny_model(cache_dir=cache_dir, out=out, init_device=init_device, **args)
    print(path)  # machine-readable: the folder on stdout
    return 0


if __name__ == "__main__":
    sys.exit(main())
