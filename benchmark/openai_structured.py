"""Structured output and several choices through an OpenAI server: do constrained answers keep to their constraint,
and what do constraints and `n` cost in tokens/s?

    python -m benchmark.openai_structured --url http://HOST:PORT/v1 [--requests 100] [--concurrency 16] [--json R.json]

Any OpenAI-compatible server (llmlaunch's API, `vllm serve`), the same requests to each:
* `json_schema`: --requests chat requests, each asking for a made-up customer record, with `response_format`
  json_schema (SCHEMA: bounded strings, an enum, integers with a range, an array), greedy; every answer is parsed and
  validated against the schema (jsonschema).  The same requests without the constraint give free text's tokens/s.
* `regex` and `choice` (vLLM's `structured_outputs`): 20 requests each; the answer must match the pattern / be one of
  the choices.
* `n`: --requests/4 completions of n=4 against --requests completions of n=1 (sampled, ignore_eos, 128 tokens, the
  same streams in flight: concurrency/4 and concurrency requests); completion tokens/s of each.
Prints one line a part and writes them as JSON (--json).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "tier": {"enum": ["free", "pro", "enterprise"]},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3},
    },
    "required": ["name", "age", "tier", "active", "tags"],
    "additionalProperties": False,
}
REGEX = r"[0-9]{3}-[0-9]{3}-[0-9]{4}"
CHOICES = ["positive", "negative", "neutral"]


def _post(url: str, path: str, body: dict, timeout: float = 600.0) -> tuple[int, dict, float]:
    """(HTTP status, JSON body, seconds)."""
    t0 = time.perf_counter()
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), time.perf_counter() - t0
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}"), time.perf_counter() - t0


def _run(url: str, path: str, bodies: list[dict], concurrency: int) -> tuple[list, float]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda b: _post(url, path, b), bodies))
    return results, time.perf_counter() - t0


def _tokens(results) -> int:
    return sum(r[1].get("usage", {}).get("completion_tokens", 0) for r in results if r[0] == 200)


def _chat(model: str, i: int, max_tokens: int, **extra) -> dict:
    content = f"Make up customer number {i} of an online shop and describe them as a JSON record."
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


def json_schema_part(url: str, model: str, n: int, c: int, max_tokens: int) -> dict:
    import jsonschema

    rf = {"type": "json_schema", "json_schema": {"name": "customer", "schema": SCHEMA, "strict": True}}
    results, wall = _run(
        url, "/chat/completions", [_chat(model, i, max_tokens, response_format=rf) for i in range(n)], c
    )
    answered = parsed = valid = stopped = 0
    failures = []
    for status, body, _ in results:
        if status != 200:
            failures.append(f"HTTP {status}: {str(body)[:200]}")
            continue
        answered += 1
        choice = body["choices"][0]
        stopped += choice.get("finish_reason") == "stop"
        try:
            doc = json.loads(choice["message"]["content"])
            parsed += 1
            jsonschema.validate(doc, SCHEMA)
            valid += 1
        except (ValueError, jsonschema.ValidationError) as exc:
            failures.append(f"{type(exc).__name__}: {str(exc)[:120]} in {choice['message']['content'][:200]!r}")
    free, free_wall = _run(url, "/chat/completions", [_chat(model, i, max_tokens) for i in range(n)], c)
    example = results[0][1]["choices"][0]["message"]["content"] if results and results[0][0] == 200 else ""
    return {
        "requests": n,
        "concurrency": c,
        "answered": answered,
        "parsed": parsed,
        "valid": valid,
        "finish_stop": stopped,
        "tokens_per_s": _tokens(results) / wall,
        "latency_s_p50": statistics.median(r[2] for r in results),
        "free_text_tokens_per_s": _tokens(free) / free_wall,
        "free_text_latency_s_p50": statistics.median(r[2] for r in free),
        "example": example,
        "failures": failures[:5],
    }


def kinds_part(url: str, model: str, c: int) -> dict:
    out = {}
    for kind, so, ok in (
        ("regex", {"regex": REGEX}, lambda t: re.fullmatch(REGEX, t) is not None),
        ("choice", {"choice": CHOICES}, lambda t: t in CHOICES),
    ):
        prompt = "A phone number: " if kind == "regex" else "The review 'great product, would buy again' is"
        bodies = [
            {
                "model": model,
                "prompt": f"{prompt} (#{i})",
                "max_tokens": 24,
                "temperature": 0.8,
                "seed": i,
                "structured_outputs": so,
            }
            for i in range(20)
        ]
        results, _ = _run(url, "/completions", bodies, c)
        texts = [r[1]["choices"][0]["text"] for r in results if r[0] == 200]
        out[kind] = {"requests": 20, "answered": len(texts), "kept": sum(map(ok, texts)), "examples": texts[:3]}
    return out


def n_part(url: str, model: str, n: int, c: int) -> dict:
    def body(i: int, k: int) -> dict:
        return {
            "model": model,
            "prompt": f"Story {i}: once upon a time",
            "max_tokens": 128,
            "temperature": 1.0,
            "ignore_eos": True,
            "n": k,
            "seed": i,
        }

    four, four_wall = _run(url, "/completions", [body(i, 4) for i in range(max(n // 4, 1))], max(c // 4, 1))
    one, one_wall = _run(url, "/completions", [body(i, 1) for i in range(n)], c)
    bad = [r for r in four + one if r[0] != 200]
    return {
        "n4_requests": len(four),
        "n4_choices": sum(len(r[1].get("choices", ())) for r in four),
        "n4_tokens_per_s": _tokens(four) / four_wall,
        "n1_requests": len(one),
        "n1_tokens_per_s": _tokens(one) / one_wall,
        "failed": len(bad),
        "errors": [str(r[1])[:200] for r in bad[:3]],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the server's OpenAI base URL, e.g. http://127.0.0.1:8003/v1")
    p.add_argument("--model", default="", help="the model name (default: the first of /models)")
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=200, help="json_schema part: the most tokens of an answer")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    model = args.model
    if not model:
        with urllib.request.urlopen(args.url + "/models", timeout=30) as r:
            model = json.loads(r.read())["data"][0]["id"]
    doc = {"url": args.url, "model": model}
    doc["json_schema"] = s = json_schema_part(args.url, model, args.requests, args.concurrency, args.max_tokens)
    print(
        f"json_schema: {s['valid']}/{s['requests']} valid ({s['parsed']} parsed, {s['answered']} answered, "
        f"{s['finish_stop']} ended by the model), {s['tokens_per_s']:.0f} tok/s at C={s['concurrency']} "
        f"(free text {s['free_text_tokens_per_s']:.0f}); e.g. {s['example'][:120]!r}",
        flush=True,
    )
    for f in s["failures"]:
        print("  ", f)
    doc["kinds"] = kinds_part(args.url, model, args.concurrency)
    for kind, k in doc["kinds"].items():
        print(f"{kind}: {k['kept']}/{k['requests']} kept ({k['answered']} answered); e.g. {k['examples']}", flush=True)
    doc["n"] = nn = n_part(args.url, model, args.requests * 4, args.concurrency * 4)
    print(
        f"n=4: {nn['n4_tokens_per_s']:.0f} tok/s ({nn['n4_requests']} requests, {nn['n4_choices']} choices); "
        f"n=1: {nn['n1_tokens_per_s']:.0f} tok/s ({nn['n1_requests']} requests); failed {nn['failed']} {nn['errors']}",
        flush=True,
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    ok = s["valid"] == s["requests"] and all(k["kept"] == k["requests"] for k in doc["kinds"].values())
    return 0 if ok and not nn["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
