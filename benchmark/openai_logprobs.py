"""Do two OpenAI servers give the same log probabilities? The same prompts to each, compared.

    python -m benchmark.openai_logprobs collect --url http://HOST:PORT/v1 --out A.json   # one server's answers
    python -m benchmark.openai_logprobs compare A.json B.json [--json R.json]

`collect` sends --prompts prompts (benchmark/gpu/identity.py's, the same on every call) to /v1/completions twice
each: greedily with `logprobs=--top` for --max-tokens new tokens, and scored (`echo`, `logprobs`, one new token), the
request lm-eval's loglikelihood tasks send.  `compare` reports, over the generated positions where both answers hold
the same token (greedy answers part at a near-tie and then differ) and over every prompt position, the largest
difference of the token's log probability and of its top tokens' (those both list by the same text), and the share of positions
whose top tokens are the same set of texts (servers render a token that is not whole UTF-8 alone differently).  Any OpenAI-compatible server: llmlaunch's API, `vllm serve`, SGLang's.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request


def _post(url: str, body: dict, timeout: float = 300.0) -> dict:
    req = urllib.request.Request(url + "/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def collect(url: str, n: int, max_tokens: int, top: int, model: str = "") -> dict:
    from benchmark.gpu.identity import prompts

    if not model:
        with urllib.request.urlopen(url + "/models", timeout=30) as r:
            model = json.loads(r.read())["data"][0]["id"]
    out = {"url": url, "model": model, "top": top, "generated": [], "scored": []}
    for p in prompts(n):
        base = {"model": model, "prompt": p, "temperature": 0, "logprobs": top}
        g = _post(url, {**base, "max_tokens": max_tokens})["choices"][0]
        s = _post(url, {**base, "max_tokens": 1, "echo": True})["choices"][0]
        out["generated"].append(
            {"text": g["text"], **{k: g["logprobs"][k] for k in ("tokens", "token_logprobs", "top_logprobs")}}
        )
        out["scored"].append({k: s["logprobs"][k] for k in ("tokens", "token_logprobs", "top_logprobs")})
    return out


def _diffs(a: dict, b: dict, stop_at_difference: bool) -> tuple:
    """(largest |own lp difference|, largest |top lp difference| over the texts both list, positions, positions whose top token
    texts are the same set) over the positions of two answers."""
    own = top = 0.0
    n = same_set = 0
    for ta, tb, la, lb, xa, xb in zip(
        a["tokens"], b["tokens"], a["token_logprobs"], b["token_logprobs"], a["top_logprobs"], b["top_logprobs"]
    ):
        if ta != tb:
            if stop_at_difference:
                break
            continue
        if la is None or lb is None:
            continue
        n += 1
        own = max(own, abs(la - lb))
        # the tokens both list by the same text: OpenAI's top_logprobs is keyed by text, so tokens that render alike
        # (bytes that are not whole UTF-8 alone: "\ufffd" on one server, "" on another) collapse into one entry
        common = set(xa) & set(xb)
        top = max([top] + [abs(xa[k] - xb[k]) for k in common])
        same_set += set(xa) == set(xb)
    return own, top, n, same_set


def compare(a: dict, b: dict) -> dict:
    result = {}
    for part, stop in (("generated", True), ("scored", False)):
        own = top = 0.0
        n = same = 0
        for x, y in zip(a[part], b[part]):
            o, t, k, s = _diffs(x, y, stop)
            own, top, n, same = max(own, o), max(top, t), n + k, same + s
        result[part] = {
            "positions": n,
            "max_logprob_diff": own,
            "max_top_logprob_diff": top,
            "same_top_set": same / n if n else 0.0,
        }
    result["identical_answers"] = sum(x["text"] == y["text"] for x, y in zip(a["generated"], b["generated"]))
    result["answers"] = len(a["generated"])
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("--url", required=True, help="the server's OpenAI base URL (…/v1)")
    c.add_argument("--out", required=True)
    c.add_argument("--model", default="", help="the model name to send (default: the first /v1/models lists)")
    c.add_argument("--prompts", type=int, default=32)
    c.add_argument("--max-tokens", type=int, default=32)
    c.add_argument("--top", type=int, default=5)
    m = sub.add_parser("compare")
    m.add_argument("a")
    m.add_argument("b")
    m.add_argument("--json", default="")
    args = p.parse_args(argv)
    if args.cmd == "collect":
        with open(args.out, "w") as f:
            json.dump(collect(args.url.rstrip("/"), args.prompts, args.max_tokens, args.top, args.model), f)
        return 0
    with open(args.a) as f:
        a = json.load(f)
    with open(args.b) as f:
        b = json.load(f)
    r = compare(a, b)
    for part in ("generated", "scored"):
        x = r[part]
        print(
            f"{part:>9}: {x['positions']} positions, max |logprob diff| {x['max_logprob_diff']:.2e}, "
            f"max |top logprob diff| {x['max_top_logprob_diff']:.2e}, same top-{a['top']} set {100 * x['same_top_set']:.1f}%"
        )
    print(f"identical greedy answers: {r['identical_answers']} of {r['answers']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
