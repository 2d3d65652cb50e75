"""The command line, `python -m launcher.client`: one prompt streamed to stdout, or a file of prompts sent
concurrently with the answers written in prompt order; and its sampling flags (contract inputs)."""

from __future__ import annotations

import argparse
import sys
import time

from launcher.client.connection import ClientError, parse_url
from launcher.client.control import default_model
from launcher.client.request import Generation
from launcher.client.stream import generate, generate_many


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    """Sampling flags shared by the client and the benchmark."""
    g = parser.add_argument_group("sampling (contract inputs; unset = server default)")
    g.add_argument("--temperature", type=float, help="temperature (0 = greedy)")
    g.add_argument("--top-p", type=float, help="top_p")
    g.add_argument("--top-k", type=int, help="top_k")
    g.add_argument("--seed", type=int, help="random_seed for sampling")
    g.add_argument("--stop", action="append", default=[], metavar="WORD", help="stop word (repeatable)")
    g.add_argument("--min-tokens", type=int, help="min_length: tokens before EOS/stop may end the request")
    g.add_argument("--ignore-eos", action="store_true", default=None, help="generate exactly --max-tokens")


def generation_from_args(args, prompt: str, max_tokens: int, stream: bool = True) -> Generation:
    return Generation(
        prompt=prompt,
        max_tokens=max_tokens,
        stream=stream,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=tuple(args.stop or ()),
        min_tokens=args.min_tokens,
        ignore_eos=args.ignore_eos,
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m launcher.client",
        description="Send prompts to an llmlaunch model over Triton gRPC and print the answers.",
    )
    p.add_argument(
        "--url", "-u", default="localhost:8001", help="grpc://HOST:PORT or HOST:PORT (default localhost:8001)"
    )
    p.add_argument("--model", "-m", help="model name (default: the one the server serves)")
    p.add_argument("--prompt", "-p", help="prompt text (default: 'I am going to' unless --prompts-file)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens to generate (default 128)")
    p.add_argument("--no-stream", action="store_true", help="ask for one response with the whole answer")
    p.add_argument("--prompts-file", help="file with one prompt per line")
    p.add_argument(
        "--output", "-o", default="results.txt", help="where --prompts-file answers go (default results.txt)"
    )
    p.add_argument(
        "--concurrency", "-c", type=int, default=8, help="requests in flight with --prompts-file (default 8)"
    )
    p.add_argument("--iterations", type=int, default=1, help="send the prompts file this many times")
    p.add_argument("--verbose", "-v", action="store_true", help="print timing details on stderr")
    add_sampling_args(p)
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        url = parse_url(args.url)
        model = args.model or default_model(url)
        if args.prompts_file:
            return _run_file(args, url, model)
        return _run_one(args, url, model)
    except (ClientError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _run_one(args, url: str, model: str) -> int:
    gen = generation_from_args(args, args.prompt or "I am going to", args.max_tokens, stream=not args.no_stream)

    def show(rec, i):
        sys.stdout.write(rec.piece(i))
        sys.stdout.flush()

    rec = generate(url, model, gen, on_response=show)
    sys.stdout.write("\n")
    sys.stdout.flush()
    if args.verbose and rec.times:
        print(
            f"[{model}] first response {1000 * (rec.times[0] - rec.sent):.1f} ms, {len(rec.times)} responses, "
            f"tokens in/out {rec.input_tokens}/{rec.output_tokens}, finish_reason {rec.finish_reason!r}, "
            f"total {1000 * (rec.times[-1] - rec.sent):.1f} ms",
            file=sys.stderr,
        )
    if rec.error:
        print(f"error: model {model!r} at {url}: {rec.error}", file=sys.stderr)
        return 1
    return 0


def _run_file(args, url: str, model: str) -> int:
    print(f"Loading inputs from `{args.prompts_file}`...", file=sys.stderr)
    with open(args.prompts_file, encoding="utf-8") as f:
        prompts = [line.rstrip("\n") for line in f if line.strip()]
    prompts = prompts * max(1, args.iterations)
    gens = [generation_from_args(args, p, args.max_tokens, stream=not args.no_stream) for p in prompts]
    start = time.perf_counter()
    records = generate_many(url, model, gens, args.concurrency)
    elapsed = time.perf_counter() - start
    print(f"Storing results into `{args.output}`...", file=sys.stderr)
    with open(args.output, "w", encoding="utf-8") as f:
        for prompt, rec in zip(prompts, records):
            f.write(prompt + (f"\n[error: {rec.error}]" if rec.error else rec.text))
            f.write("\n\n=========\n\n")
    failed = [r for r in records if r.error]
    if args.verbose:
        tokens = sum(r.output_tokens or 0 for r in records)
        print(f"{len(records)} requests in {elapsed:.2f} s, {tokens / elapsed:.1f} output tokens/s", file=sys.stderr)
    if failed:
        print(f"error: {len(failed)} of {len(records)} requests failed; first: {failed[0].error}", file=sys.stderr)
        return 1
    print(f"PASS: {len(records)} prompts answered by {model!r}", file=sys.stderr)
    return 0
