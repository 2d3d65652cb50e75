#!/usr/bin/env python3
"""Profile a served LLM with the seeds' command line, through llmlaunch-bench (a user's profiling entry point).

    python3 -m benchmark.profile_triton_python_backend 0.0.0.0:33337 /path/to/model \\
        /path/to/ShareGPT_V3_unfiltered_cleaned_split.json --num_prompts 1000 --concurrency=128

Positional arguments (as in the SGLang / lmdeploy scripts):
  ADDR               HOST:PORT (or grpc://HOST:PORT) of tritonserver's gRPC endpoint
  MODEL_OR_TOKENIZER a directory = a Hugging Face tokenizer (or model) path, used for
                     token lengths, and the served model is asked from the server;
                     anything else = the served model's name (token lengths estimated)
  DATASET            ShareGPT JSON (also CNN/DailyMail JSON or prompts .txt)

Options keep the old spellings (--num_prompts, --stream_output, --top_k, ...) and
the llmlaunch-bench ones (--num-prompts, ...); every other llmlaunch-bench option
(--request-rate, --goodput, --result-json, --ignore-eos, ...) passes through.
--csv FILE appends the one-line summary there. Exit status as llmlaunch-bench.
"""

from __future__ import annotations

import argparse
import os
import sys

from launcher.bench import cli


def translate(argv: list[str]) -> list[str]:
    """The seeds' command line -> llmlaunch-bench arguments."""
    p = argparse.ArgumentParser(
        prog="python -m benchmark.profile_triton_python_backend", add_help=True, description=__doc__.split("\n\n")[0]
    )
    p.add_argument("addr")
    p.add_argument("model_or_tokenizer")
    p.add_argument("dataset")
    p.add_argument("--num_prompts", "--num-prompts", dest="num_prompts", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--top_k", "--top-k", dest="top_k", type=int)
    p.add_argument("--top_p", "--top-p", dest="top_p", type=float)
    p.add_argument("--temperature", type=float)
    p.add_argument(
        "--stream_output", "--stream-output", dest="stream_output", default="true", help="true/false (default true)"
    )
    p.add_argument("--csv", help="append the summary line to this CSV file")
    p.add_argument("--seed", type=int, default=0)
    args, rest = p.parse_known_args(argv)
    out = [
        "--url",
        args.addr,
        "--dataset",
        args.dataset,
        "--num-prompts",
        str(args.num_prompts),
        "--concurrency",
        str(args.concurrency),
        "--seed",
        str(args.seed),
    ]
    if os.path.isdir(args.model_or_tokenizer):
        out += ["--tokenizer", args.model_or_tokenizer]
    else:
        out += ["--model", args.model_or_tokenizer]
    for flag, value in (("--top-k", args.top_k), ("--top-p", args.top_p), ("--temperature", args.temperature)):
        if value is not None:
            out += [flag, str(value)]
    if str(args.stream_output).lower() in ("false", "0", "no"):
        out.append("--no-stream")
    if args.csv:
        out += ["--result-csv", args.csv]
    return out + rest


def main(argv=None) -> int:
    return cli.main(translate(sys.argv[1:] if argv is None else list(argv)))


if __name__ == "__main__":
    sys.exit(main())
