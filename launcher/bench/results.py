"""Where a llmlaunch-bench run's results go: `--result-json` (the whole run, format "llmlaunch-bench/1", written
whole or not at all) and `--result-csv` (one summary line a run, appended under a header written once); with
--compare, B's files beside A's."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from launcher.bench import metrics

CSV_FIELDS = (
    "time",
    "label",
    "url",
    "model",
    "dataset",
    "num_requests",
    "concurrency",
    "request_rate",
    "burstiness",
    "processes",
    "completed",
    "failed",
    "errors",
    "zero_token",
    "duration_s",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "goodput",
    *[f"{k}_{s}_ms" for k in metrics.LATENCIES for s in ("mean", "p50", "p90", "p99")],
    "total_input_tokens",
    "total_output_tokens",
)


def write_json(doc: dict, path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, allow_nan=False, default=metrics.finite)
        f.write("\n")
    os.replace(tmp, path)


def csv_row(doc: dict) -> dict:
    m, c = doc["metrics"], doc["config"]
    row = {
        "time": doc["started_at"],
        "label": doc["label"],
        "url": c["url"],
        "model": c["model"],
        "dataset": c["dataset"]["path"] or c["dataset"]["name"],
        "num_requests": m["requests"],
        "concurrency": c["load"]["concurrency"],
        "request_rate": c["load"]["request_rate"],
        "burstiness": c["load"]["burstiness"],
        "processes": c["load"]["processes"],
    }
    for k in (
        "completed",
        "failed",
        "errors",
        "zero_token",
        "duration_s",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "goodput",
        "total_input_tokens",
        "total_output_tokens",
    ):
        row[k] = m.get(k)
    for k in metrics.LATENCIES:
        for s in ("mean", "p50", "p90", "p99"):
            row[f"{k}_{s}_ms"] = m[f"{k}_ms"][s]
    return {k: (f"{v:.4f}" if isinstance(v, float) else ("" if v is None else v)) for k, v in row.items()}


def append_csv(rows: list, path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    with open(path, "a", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        if new:
            w.writeheader()
        for row in rows:
            w.writerow(row)


def b_path(path: str) -> Path:
    p = Path(path)
    return p.with_name(f"{p.stem}.B{p.suffix or '.json'}")
