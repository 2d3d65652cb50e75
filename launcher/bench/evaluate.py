"""Is the served model right, not only fast?  `llmlaunch-bench --eval` runs lm-eval (the `lm-eval` package) against
the OpenAI API of a running job, on tasks whose items ship with llmlaunch (no downloads), and fails when the model
answers nothing: a server that returns empty text must not pass for a fast one.

    llmlaunch-bench --eval --url http://127.0.0.1:8003/v1 --tokenizer MODEL_DIR [--tasks arithmetic,arithmetic_choice]

The tasks (launcher/data/arithmetic.jsonl: 200 sums of two numbers from 2 to 60, each with three wrong answers near
it, drawn once with a fixed seed):
  arithmetic         generate_until: "Question: What is A plus B?\\nAnswer:", greedy, up to 8 tokens, exact match
  arithmetic_choice  loglikelihood: the same question, the four answers scored, accuracy (lm-eval's multiple_choice)
lm-eval's `local-completions` model sends token-id prompts built with the model's own tokenizer (`--tokenizer`), so
the scores are the model's, comparable with lm-eval's `hf` backend on the same weights.  `task_yaml` and `lm_eval_argv`
render what runs (pure); `main` runs it and reads lm-eval's results and samples.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

from launcher.paths import EVAL_TASKS, PACKAGE_ROOT

DATA = os.path.join(PACKAGE_ROOT, "launcher", "data", "arithmetic.jsonl")
QUESTION = "Question: What is {{a}} plus {{b}}?\nAnswer:"
# lm-eval's task fields for each task over DATA: launcher/data/eval_tasks.json, which the config's bench.eval also
# takes its choices from (launcher.domains.eval_tasks)
with open(EVAL_TASKS) as _f:
    TASKS = json.load(_f)["tasks"]
PREFIX = "llmlaunch_"  # the tasks' names in lm-eval (apart from its own tasks of the same names)


def task_yaml(name: str, data: str = DATA) -> str:
    """lm-eval's task file for one of TASKS over `data` (JSON is YAML: no YAML writer needed)."""
    spec = {
        "task": PREFIX + name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": os.path.abspath(data)}},
        "test_split": "test",
        "doc_to_text": QUESTION,
        **TASKS[name],
    }
    return json.dumps(spec, indent=1) + "\n"


def lm_eval_argv(url: str, model: str, tokenizer: str, tasks: list, include: str, out: str, args) -> list:
    """lm-eval's command line: its local-completions model against `url` (…/v1), token-id prompts."""
    model_args = ",".join(
        [
            f"model={model}",
            f"base_url={url.rstrip('/')}/completions",
            f"tokenizer={tokenizer}",
            "tokenizer_backend=huggingface",
            "tokenized_requests=True",
            f"num_concurrent={args.concurrency}",
            "max_retries=1",
            f"timeout={args.timeout}",
        ]
    )
    argv = [sys.executable, "-m", "lm_eval", "run", "--model", "local-completions", "--model_args", model_args]
    argv += ["--tasks", ",".join(PREFIX + t for t in tasks), "--include_path", include, "--output_path", out]
    argv += ["--log_samples", "--batch_size", "1", "--seed", "0"]
    if args.limit:
        argv += ["--limit", str(args.limit)]
    return argv


def read_results(out: str) -> dict:
    """{task: {"metric", "value", "items", "answered"}} from lm-eval's results and samples under `out`."""
    found = sorted(glob.glob(os.path.join(out, "**", "results_*.json"), recursive=True))
    if not found:
        raise RuntimeError(f"lm-eval wrote no results under {out}")
    with open(found[-1]) as f:
        results = json.load(f)["results"]
    table = {}
    for task, metrics in results.items():
        name = task[len(PREFIX) :] if task.startswith(PREFIX) else task
        metric = TASKS.get(name, {}).get("metric_list", [{"metric": "acc"}])[0]["metric"]
        value = next((v for k, v in metrics.items() if k.split(",")[0] == metric), None)
        generate = TASKS.get(name, {}).get("output_type") == "generate_until"
        items = answered = 0
        for sample in read_samples(out, task):
            items += 1
            answered += _answered(sample, generate)
        table[name] = {"metric": metric, "value": value, "items": items, "answered": answered}
    return table


def read_samples(out: str, task: str) -> list:
    """lm-eval's logged samples of `task` (its full name) under `out` (samples_<task>_<time>.jsonl)."""
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "**", f"samples_{task}_*.jsonl"), recursive=True)):
        if os.path.basename(path)[len(f"samples_{task}_") :][:1].isdigit():  # not a longer task name's file
            with open(path) as f:
                rows.extend(json.loads(line) for line in f)
    return rows


def _answered(sample: dict, generate: bool) -> bool:
    """Did the server answer this item: text (generate_until), or the scores (loglikelihood)?"""
    flat, todo = [], list(sample.get("resps") or [])
    while todo:
        x = todo.pop()
        if isinstance(x, list):
            todo.extend(x)
        else:
            flat.append(x)
    return any(isinstance(x, str) and x.strip() for x in flat) if generate else bool(flat)


def _served_model(url: str) -> str:
    with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=30) as r:
        return json.loads(r.read())["data"][0]["id"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="llmlaunch-bench --eval", description=__doc__.split("\n\n")[0])
    p.add_argument("--eval", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--url", required=True, help="the job's OpenAI base URL, e.g. http://127.0.0.1:8003/v1")
    p.add_argument("--tokenizer", required=True, help="the served model's tokenizer folder (its model.path)")
    p.add_argument("--model", default="", help="model name to send (default: the one /v1/models lists)")
    p.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, of {', '.join(TASKS)}")
    p.add_argument("--limit", type=int, default=0, help="items per task (default: all 200)")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight (lm-eval's num_concurrent)")
    p.add_argument("--timeout", type=int, default=300, help="seconds a request may take")
    p.add_argument("--result-json", default="", help="write the scores here")
    p.add_argument("--output-path", default="", help="keep lm-eval's results and samples here (default: not kept)")
    args = p.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        p.error(f"--tasks {','.join(unknown)}: not a task here; pick from {', '.join(TASKS)}")
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        print("llmlaunch-bench --eval needs lm-eval: pip install 'llmlaunch[eval]'", file=sys.stderr)
        return 2
    model = args.model or _served_model(args.url)
    with tempfile.TemporaryDirectory(prefix="llmlaunch-eval-") as tmp:
        include, out = os.path.join(tmp, "tasks"), os.path.abspath(args.output_path or os.path.join(tmp, "out"))
        os.makedirs(include)
        for t in tasks:
            with open(os.path.join(include, f"{t}.yaml"), "w") as f:
                f.write(task_yaml(t))
        argv = lm_eval_argv(args.url, model, args.tokenizer, tasks, include, out, args)
        print("running: lm-eval " + " ".join(argv[3:]), file=sys.stderr, flush=True)
        done = subprocess.run(argv)
        if done.returncode != 0:
            print(f"lm-eval failed (exit {done.returncode})", file=sys.stderr)
            return done.returncode
        table = read_results(out)
    print(f"{'task':<20} {'metric':<12} {'value':>8} {'answered':>10}")
    for name, row in table.items():
        print(f"{name:<20} {row['metric']:<12} {row['value']:>8.4f} {row['answered']:>5}/{row['items']:<4}")
    if args.result_json:
        with open(args.result_json, "w") as f:
            json.dump({"url": args.url, "model": model, "tasks": table}, f, indent=1)
    silent = [n for n, r in table.items() if TASKS[n]["output_type"] == "generate_until" and not r["answered"]]
    if silent:
        print(f"the model answered none of {', '.join(silent)}: the server returns empty text", file=sys.stderr)
        return 1
    return 0
