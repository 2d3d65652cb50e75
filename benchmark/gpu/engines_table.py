"""One table from benchmark/gpu/engines.sh's results: every served configuration against its engine in-process.

    python -m benchmark.gpu.engines_table OUT [--markdown]

Rows: each served configuration (OUT/<label>.json from serve_bench.py) and its engine's in-process yardstick
(ENGINES: the engine a label names, vLLM when it names none) at each concurrency, with tokens/s as a share of
in-process and the median first token's difference to it, and as a share of the better row of the engine's own
server at the same load and workload (labels starting vllm_serve or sglang_serve: engines.sh vllm_serve,
sglang_serve), the server a user of that engine would otherwise start; then vLLM's offline generate
(OUT/offline.json) per batch.
"""

from __future__ import annotations

import argparse
import glob
import json
import os

# engine -> (its in-process yardstick's file, that row's name, the label prefix of its own server's rows)
ENGINES = {
    "vllm": ("inprocess.json", "vLLM AsyncLLM in-process", "vllm_serve"),
    "lmdeploy": ("lmdeploy_inprocess.json", "LMDeploy AsyncEngine in-process", None),
    "sglang": ("sglang_inprocess.json", "SGLang Engine in-process", "sglang_serve"),
}


def engine_of(label: str) -> str:
    return next((name for name in ENGINES if name != "vllm" and name in label), "vllm")


def in_process(path: str) -> dict:
    """An in-process yardstick's rows (engine_yardstick.py --json) by concurrency: its first path's, the mean of its
    passes (--repeat) where it ran several."""
    by_c: dict = {}
    if os.path.exists(path):
        rows = json.load(open(path))["rows"]
        for r in rows:
            if r.get("path", "") == rows[0].get("path", ""):
                by_c.setdefault(r["concurrency"], []).append(r)

    def mean(values):
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None

    return {
        c: {
            "tok_s": mean(r["output_throughput"] for r in rs),
            "ttft": mean(r["ttft_ms"]["p50"] for r in rs),
            "itl": mean(r["itl_ms"]["p50"] for r in rs),
            "failed": sum(r["failed"] for r in rs),
            "load_s": rs[0].get("load_s"),
        }
        for c, rs in by_c.items()
    }


def yardstick_as_rows(doc: dict, label: str) -> list:
    """An engine_yardstick.py document in the shape of served configurations', to sit in their rows: one for each
    path and pass it ran (--through-adapter, --through-runtime, --repeat), named after `label` and the path."""
    groups: dict = {}
    for r in doc["rows"]:
        groups.setdefault((r.get("path", ""), r.get("pass", 1)), []).append(r)
    passes = len({n for _, n in groups})
    out = []
    for (path, n), rows in groups.items():
        name = label if len(groups) == 1 else f"{label}: {path}" + (f", pass {n}" if passes > 1 else "")
        out.append(
            {
                "label": name,
                "ready_s": 0,
                "rows": [
                    {
                        "concurrency": r["concurrency"],
                        "output_throughput": r["output_throughput"],
                        "ttft_ms_p50": r["ttft_ms"]["p50"],
                        "itl_ms_p50": r["itl_ms"]["p50"],
                        "failed": r["failed"],
                    }
                    for r in rows
                ],
            }
        )
    return out


def load(out: str):
    served, offline = [], []
    inproc = {name: in_process(os.path.join(out, file)) for name, (file, _, _) in ENGINES.items()}
    path = os.path.join(out, "inprocess_frontends.json")
    if os.path.exists(path):
        doc = json.load(open(path))
        served += yardstick_as_rows(doc, doc["rows"][0]["path"] if doc["rows"] else "in-process front ends")
    path = os.path.join(out, "offline.json")
    if os.path.exists(path):
        offline = json.load(open(path))["rows"]
    for path in sorted(glob.glob(os.path.join(out, "*.json"))):
        name = os.path.basename(path)
        if name in ("inprocess_frontends.json", "offline.json", *(f for f, _, _ in ENGINES.values())) or "_c" in name:
            continue
        doc = json.load(open(path))
        if "rows" in doc and "label" in doc:
            served.append(doc)
        elif "yardstick_label" in doc:  # a yardstick run beside the served ones (engines.sh split)
            served += yardstick_as_rows(doc, doc["yardstick_label"])
    return inproc, served, offline


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = p.parse_args(argv)
    inproc, served, offline = load(args.out)
    head = ["path", "READY s", "C", "tok/s", "of in-process", "of own server", "TTFT p50 ms", "+ms", "ITL p50 ms"]
    head.append("failed")
    yard: dict = {}  # (engine, workload, C) -> the better row of the engine's own server: tokens/s
    for doc in served:
        engine = engine_of(doc["label"])
        for r in doc["rows"] if ENGINES[engine][2] and doc["label"].startswith(ENGINES[engine][2]) else ():
            key = (engine, r.get("workload", ""), r["concurrency"])
            yard[key] = max(yard.get(key, 0.0), r["output_throughput"])
    rows = []
    for engine, (_, path, _) in ENGINES.items():
        for c, r in sorted(inproc[engine].items()):
            rows.append(
                [
                    path,
                    f"{r['load_s']:.0f}" if r.get("load_s") else "",
                    c,
                    f"{r['tok_s']:.0f}",
                    "1.000",
                    f"{r['tok_s'] / yard[(engine, '', c)]:.3f}" if yard.get((engine, "", c)) else "",
                    f"{r['ttft']:.2f}",
                    "",
                    f"{r['itl']:.2f}",
                    r["failed"],
                ]
            )
    for doc in served:
        engine = engine_of(doc["label"])  # a served configuration is measured against its own engine
        for r in doc["rows"]:
            workload = r.get("workload", "")
            base = None if workload else inproc[engine].get(r["concurrency"])
            serve = yard.get((engine, workload, r["concurrency"]))
            rows.append(
                [
                    doc["label"] + (f" [{workload}]" if workload else ""),
                    f"{doc['ready_s']:.0f}",
                    r["concurrency"],
                    f"{r['output_throughput']:.0f}",
                    f"{r['output_throughput'] / base['tok_s']:.3f}" if base else "",
                    f"{r['output_throughput'] / serve:.3f}" if serve else "",
                    f"{r['ttft_ms_p50']:.2f}",
                    f"{r['ttft_ms_p50'] - base['ttft']:+.2f}" if base else "",
                    f"{r['itl_ms_p50']:.2f}",
                    r["failed"],
                ]
            )
    for r in offline:
        rows.append(
            [
                "vLLM offline LLM.generate",
                f"{r['load_s']:.0f}",
                f"batch {r['batch']}",
                f"{r['output_throughput']:.0f}",
                "",
                "",
                "",
                "",
                f"{1000 / r['steps_per_s']:.2f}",
                "",
            ]
        )
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(str(x) for x in row) + " |")
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
        for row in [head, *rows]:
            print("  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(row, widths))))
    for doc in served:
        if doc.get("check"):
            print(
                f"{doc['label']}: real-engine contract tests exit {doc['check']['returncode']}: "
                f"{doc['check']['output'].strip().splitlines()[-1] if doc['check']['output'].strip() else ''}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
