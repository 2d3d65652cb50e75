"""Do two servings compute the same model? Greedy answers to the same prompts, compared token by token.

    python -m benchmark.gpu.identity collect --url grpc://HOST:8001 --out A.json      # one serving's answers
    python -m benchmark.gpu.identity compare A.json B.json --tokenizer M [--json R.json]

`collect` sends --prompts prompts (windows of four sentences of launcher/data/tiny_corpus.txt, the same on
every call) greedily (temperature 0), --max-tokens new tokens each, not streamed, --concurrency at a time,
and writes the answers. `compare` tokenizes both answers to each prompt with the model's tokenizer and
reports the share of positions holding the same token, the share of answers identical throughout, and for
each answer that differs the first position where it does (with the two tokens there): engines computing
the same model in float32 agree on almost every token, and where they part it is at a near-tie, after
which the rest of the answer follows a different path. A difference at the first token of many answers is
a bug (a different model, prompt or sampling), not arithmetic.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from launcher.paths import PACKAGE_ROOT

CORPUS = os.path.join(PACKAGE_ROOT, "launcher", "data", "tiny_corpus.txt")


def prompts(n: int) -> list[str]:
    with open(CORPUS, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return [" ".join(lines[(i + k) % len(lines)] for k in range(4)) for i in range(n)]


def collect(url: str, n: int, max_tokens: int, concurrency: int) -> dict:
    from launcher.client.connection import parse_url
    from launcher.client.control import default_model
    from launcher.client.request import Generation
    from launcher.client.stream import generate_many

    url = parse_url(url)
    model = default_model(url)
    texts = prompts(n)
    records = generate_many(
        url,
        model,
        [Generation(prompt=p, max_tokens=max_tokens, stream=False, temperature=0.0) for p in texts],
        concurrency,
    )
    failed = [r.error for r in records if r.error]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(records)} requests failed; first: {failed[0]}")
    return {
        "url": url,
        "model": model,
        "max_tokens": max_tokens,
        "prompts": texts,
        "answers": [r.text for r in records],
        "output_tokens": [r.output_tokens for r in records],
    }


def compare(a: dict, b: dict, tokenizer) -> dict:
    if a["prompts"] != b["prompts"]:
        raise SystemExit("error: the two files answer different prompts; collect both with the same --prompts")
    same = total = whole = 0
    firsts = []
    for i, (x, y) in enumerate(zip(a["answers"], b["answers"])):
        tx = tokenizer.encode(x, add_special_tokens=False)
        ty = tokenizer.encode(y, add_special_tokens=False)
        n = max(len(tx), len(ty))
        total += n
        same += sum(1 for p, q in zip(tx, ty) if p == q)
        if tx == ty:
            whole += 1
            continue
        at = next((k for k, (p, q) in enumerate(zip(tx, ty)) if p != q), min(len(tx), len(ty)))
        firsts.append(
            {
                "prompt": i,
                "position": at,
                "a": tokenizer.decode(tx[at : at + 1]) if at < len(tx) else "<end>",
                "b": tokenizer.decode(ty[at : at + 1]) if at < len(ty) else "<end>",
            }
        )
    return {
        "answers": len(a["answers"]),
        "identical_answers": whole,
        "token_share": same / total if total else 1.0,
        "first_divergence": sorted(firsts, key=lambda d: d["position"]),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="one serving's greedy answers")
    c.add_argument("--url", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--prompts", type=int, default=32)
    c.add_argument("--max-tokens", type=int, default=64)
    c.add_argument("--concurrency", type=int, default=8)
    k = sub.add_parser("compare", help="two collections, token by token")
    k.add_argument("a")
    k.add_argument("b")
    k.add_argument("--tokenizer", required=True, help="the model's folder")
    k.add_argument("--json", help="also write the report here")
    args = p.parse_args(argv)
    if args.cmd == "collect":
        doc = collect(args.url, args.prompts, args.max_tokens, args.concurrency)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"{args.out}: {len(doc['answers'])} answers, {sum(doc['output_tokens'])} tokens")
        return 0
    from transformers import AutoTokenizer

    with open(args.a) as f, open(args.b) as g:
        a, b = json.load(f), json.load(g)
    report = compare(a, b, AutoTokenizer.from_pretrained(args.tokenizer))
    report.update(a=args.a, b=args.b)
    print(
        f"{os.path.basename(args.a)} vs {os.path.basename(args.b)}: {report['token_share']:.4f} of tokens identical, "
        f"{report['identical_answers']}/{report['answers']} answers identical"
    )
    for d in report["first_divergence"][:8]:
        print(f"  prompt {d['prompt']:>3}: first differs at token {d['position']:>3}: {d['a']!r} vs {d['b']!r}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
