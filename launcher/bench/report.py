"""`llmlaunch-report SWEEP_DIR`: summary.csv and plots from a benchmark sweep.

Sweep layout: any directory below SWEEP_DIR holding a `result.json` or a
`failure.json` is one point (a Hydra multirun's numbered job dirs qualify):

    SWEEP_DIR/
      <point>/
        overrides.yaml     # what this point changed; or .hydra/overrides.yaml (Hydra writes it)
        result.json        # llmlaunch-bench --result-json output ("llmlaunch-bench/1", launcher/bench/cli.py)
      <point>/
        overrides.yaml
        failure.json       # instead of result.json when the point could not be measured

overrides.yaml: a YAML list of Hydra overrides (`- engine=hf`,
`- bench.concurrency=64`) or a mapping {key: value}.

failure.json (written by whoever runs the point):
    {"format": "llmlaunch-failure/1",
     "overrides": ["engine=hf", "bench.concurrency=64"],   # same as overrides.yaml
     "stage": "serve",          # where it broke: render | submit | serve | bench | ...
     "error": "tritonserver exited with status 1 while loading model ...",
     "exit_code": 1,            # optional
     "time": "2026-11-22T03:00:00+00:00",   # optional
     "log": "tritonserver.log"} # optional, relative to the point dir
`write_failure(...)` writes one. A point with a result.json whose run had
failed requests is reported with status "errors" and its counts; a
failure.json point has status "failed"; when both files exist, result.json wins, but
a failure of stage "eval" (bench.eval: the model answered nothing) makes its status "no answers".

Grouping: a point's x value is its concurrency (result config, else an
override whose last dotted part is `concurrency`), or its request rate when
no point has a concurrency. Its config is every other override except seeds
("k=v, k=v"); points with equal configs form one line in the plots.

Outputs (in SWEEP_DIR, or --out):
    summary.csv                     one row per point (its path relative to SWEEP_DIR), failures included
    throughput_vs_concurrency.png   output tokens/s against concurrency, a line per config,
                                    failed points as red crosses on the x axis
    latency_throughput.png          p50 (solid) and p99 (dashed) TTFT against output tokens/s
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from launcher.readiness import CSV_COLUMNS as READY_COLUMNS  # the time to READY of a point's server

X_KEYS = ("concurrency", "request_rate")
IGNORED_KEYS = ("seed",)

SUMMARY_FIELDS = (
    "point",
    "status",
    "config",
    "concurrency",
    "request_rate",
    "requests",
    "completed",
    "failed",
    "request_throughput",
    "output_throughput",
    "gpus",
    "output_per_gpu",
    "total_token_throughput",
    "goodput",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "ttft_mean_ms",
    "ttft_engine_ms",
    "ttft_prefill_ms",
    "ttft_outside_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "itl_p50_ms",
    "itl_p90_ms",
    "itl_p99_ms",
    "tokens_per_response",
    "e2el_p50_ms",
    "e2el_p99_ms",
    "engine_step_ms",
    "engine_gpu_idle_ms",
    "kv_transfers",
    "kv_transfer_ms",
    "kv_transfer_mib",
    "eval",
    *READY_COLUMNS,
    "error",
    "overrides",
)


@dataclass
class Point:
    path: Path  # the point directory
    overrides: dict = field(default_factory=dict)  # key -> value (strings)
    result: Optional[dict] = None  # result.json
    failure: Optional[dict] = None  # failure.json
    concurrency: Optional[float] = None
    request_rate: Optional[float] = None
    config: str = ""

    @property
    def status(self) -> str:
        if self.result is None:
            return "failed"
        if (self.failure or {}).get("stage") == "eval":  # measured, but the model answered nothing (bench.eval)
            return "no answers"
        return "errors" if self.result.get("metrics", {}).get("failed") else "ok"

    def metric(self, key: str):
        m = (self.result or {}).get("metrics", {})
        for part in key.split("."):
            m = m.get(part) if isinstance(m, dict) else None
        return m


def write_failure(
    point_dir, overrides, stage: str, error: str, exit_code: Optional[int] = None, log: Optional[str] = None
) -> Path:
    """Record that a sweep point could not be measured (see the module docstring)."""
    import datetime as _dt

    point_dir = Path(point_dir)
    point_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "format": "llmlaunch-failure/1",
        "overrides": list(overrides or []),
        "stage": stage,
        "error": error,
        "exit_code": exit_code,
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "log": log,
    }
    path = point_dir / "failure.json"
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return path


def parse_overrides(data) -> dict:
    """Hydra list ['a.b=1', '+c=x', '~d'] or a mapping -> {key: value-as-string}."""
    if data is None:
        return {}
    if isinstance(data, dict):
        return {str(k): "" if v is None else str(v) for k, v in data.items()}
    out = {}
    for item in data:
        item = str(item)
        key, sep, value = item.partition("=")
        key = key.lstrip("+~")
        out[key] = value if sep else ""
    return out


def _read_overrides(point: Path, failure: Optional[dict]) -> dict:
    import yaml

    for candidate in (point / "overrides.yaml", point / ".hydra" / "overrides.yaml"):
        if candidate.exists():
            with open(candidate, encoding="utf-8") as f:
                return parse_overrides(yaml.safe_load(f))
    if failure and failure.get("overrides") is not None:
        return parse_overrides(failure["overrides"])
    return {}


def _number(value) -> Optional[float]:
    if value in (None, "", "null", "None", "inf"):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _from_overrides(overrides: dict, name: str) -> Optional[float]:
    for key, value in overrides.items():
        if key.rsplit(".", 1)[-1] == name:
            return _number(value)
    return None


def _json_file(path: Path) -> Optional[dict]:
    """A point's JSON file (point.json, eval.json), None when it is missing or unreadable."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def load_points(sweep: Path) -> list[Point]:
    points = []
    dirs = sorted({p.parent for pattern in ("result.json", "failure.json") for p in Path(sweep).rglob(pattern)})
    for d in dirs:
        result = failure = None
        if (d / "result.json").exists():
            try:
                result = json.loads((d / "result.json").read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as exc:
                failure = {"stage": "report", "error": f"unreadable result.json: {exc}"}
        if (d / "failure.json").exists() and failure is None:  # beside a result: bench.eval's failure
            try:
                failure = json.loads((d / "failure.json").read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as exc:
                failure = {"stage": "report", "error": f"unreadable failure.json: {exc}"}
        pt = Point(path=d, result=result, failure=failure)
        pt.overrides = _read_overrides(d, failure)
        load = (result or {}).get("config", {}).get("load", {})
        pt.concurrency = (
            _number(load.get("concurrency"))
            if load.get("concurrency") is not None
            else _from_overrides(pt.overrides, "concurrency")
        )
        pt.request_rate = (
            _number(load.get("request_rate"))
            if load.get("request_rate") is not None
            else _from_overrides(pt.overrides, "request_rate")
        )
        rest = {k: v for k, v in pt.overrides.items() if k.rsplit(".", 1)[-1] not in X_KEYS + IGNORED_KEYS}
        if rest:
            pt.config = ", ".join(f"{k}={v}" for k, v in sorted(rest.items()))
        else:
            pt.config = (result or {}).get("config", {}).get("model") or "default"
        points.append(pt)
    return points


def layout_gpus(config: Optional[dict]) -> Optional[int]:
    """The GPUs a point's server holds, from its composed config (point.json): tp x pp a model copy, one copy a
    replica (disagg: the prefill and the decode ones); None where the point has no config."""
    if not isinstance(config, dict):
        return None
    split = config.get("disagg") or {}
    copies = max(int(config.get("replicas") or 1), int(split.get("prefill") or 0) + int(split.get("decode") or 0))
    return int(config.get("tp") or 1) * int(config.get("pp") or 1) * copies


def _fmt(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else str(round(v, 4))
    return v


def summary_rows(points: list[Point], sweep: Optional[Path] = None) -> list[dict]:
    from launcher.readiness import csv_columns

    rows = []
    for pt in points:
        if pt.result is not None:
            first_error = next((r.get("error") for r in pt.result.get("requests", []) if r.get("error")), "")
            error = (pt.failure or {}).get("error") or first_error
        else:
            f = pt.failure or {}
            error = f"{f.get('stage', '?')}: {f.get('error', 'no result.json')}"
        row = {
            "point": str(pt.path.relative_to(sweep)) if sweep else str(pt.path),
            "status": pt.status,
            "config": pt.config,
            "concurrency": pt.concurrency,
            "request_rate": pt.request_rate,
            "requests": pt.metric("requests"),
            "completed": pt.metric("completed"),
            "failed": pt.metric("failed"),
            "request_throughput": pt.metric("request_throughput"),
            "output_throughput": pt.metric("output_throughput"),
            "total_token_throughput": pt.metric("total_token_throughput"),
            "goodput": pt.metric("goodput"),
            "error": error,
            "overrides": " ".join(f"{k}={v}" for k, v in sorted(pt.overrides.items())),
        }
        for k in ("ttft", "tpot", "itl", "e2el"):
            for p in ("p50", "p90", "p99") if k in ("ttft", "itl") else ("p50", "p99"):
                row[f"{k}_{p}_ms"] = pt.metric(f"{k}_ms.{p}")
        row["tokens_per_response"] = pt.metric("tokens_per_response")  # ITL is per response: tokens in one
        # the hf model's split of the mean TTFT (llmlaunch-bench --server-metrics): its engine part (queue +
        # prefill) and what lies outside the model (tritonserver, gRPC, client); empty for other servers
        split = (pt.result or {}).get("server_first_token_ms") or {}
        row.update(
            ttft_mean_ms=pt.metric("ttft_ms.mean"),
            ttft_engine_ms=split.get("engine"),
            # disagg: the prefill replica's share (its one-token request, inside its server); engine is the decode's
            ttft_prefill_ms=(split.get("prefill") or {}).get("inside_server"),
            ttft_outside_ms=split.get("outside_server"),
        )
        # ... and how its engine spent a step: the loop's time per step (an engine that times none, vLLM's: the run's
        # wall time over its steps), and the GPU waiting for the host
        steps = (pt.result or {}).get("server_engine_steps") or {}
        row.update(
            engine_step_ms=steps.get("step_ms", steps.get("wall_step_ms")), engine_gpu_idle_ms=steps.get("gpu_idle_ms")
        )
        # disaggregated layouts: the decode replicas' transfers from prefill replicas, ms and MiB each
        moved = (pt.result or {}).get("server_kv_transfer") or {}
        row.update(
            kv_transfers=moved.get("transfers"),
            kv_transfer_ms=moved.get("ms_per_transfer"),
            kv_transfer_mib=moved.get("mib_per_transfer"),
        )
        # bench.eval's scores (llmlaunch-bench --eval after the load): "task metric=value answered/items; ..."
        tasks = (_json_file(pt.path / "eval.json") or {}).get("tasks") or {}
        row["eval"] = "; ".join(
            f"{t} {s['metric']}={s['value']:.3f} {s['answered']}/{s['items']}" for t, s in tasks.items()
        )
        # the time to READY of the server the point was measured against (point.json, from its run record)
        stored = _json_file(pt.path / "point.json") or {}
        server = stored.get("server") or {}
        # per GPU: layouts of different sizes (replicas=2 against disagg.prefill=1 disagg.decode=2) side by side
        gpus = layout_gpus(stored.get("config"))
        out = pt.metric("output_throughput")
        row.update(gpus=gpus, output_per_gpu=out / gpus if gpus and out is not None else None)
        row.update(csv_columns(server.get("time_to_ready")))
        rows.append({k: _fmt(v) for k, v in row.items()})
    return rows


def write_summary(points: list[Point], path: Path, sweep: Optional[Path] = None) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=SUMMARY_FIELDS)
        w.writeheader()
        w.writerows(summary_rows(points, sweep))


def format_summary(points: list[Point]) -> str:
    head = f"{'config':<40} {'x':>8} {'status':>7} {'out tok/s':>11} {'p50 TTFT':>10} {'p99 TTFT':>10} {'p99 ITL':>9}"
    lines = [head, "-" * len(head)]
    for pt in sorted(points, key=lambda p: (p.config, p.concurrency or p.request_rate or 0)):
        x = pt.concurrency if pt.concurrency is not None else pt.request_rate
        figures = [pt.metric(k) for k in ("output_throughput", "ttft_ms.p50", "ttft_ms.p99", "itl_ms.p99")]
        cells = [("" if v is None else f"{v:,.1f}").rjust(w) for v, w in zip(figures, (11, 10, 10, 9))]
        lines.append(f"{pt.config[:40]:<40} {'' if x is None else f'{x:g}':>8} {pt.status:>7} " + " ".join(cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="llmlaunch-report", description="summary.csv and plots from a benchmark sweep directory"
    )
    p.add_argument("sweep", help="sweep directory (points are the dirs holding result.json or failure.json)")
    p.add_argument("--out", help="where to write summary.csv and the plots (default: the sweep directory)")
    p.add_argument("--no-plots", action="store_true", help="only summary.csv")
    args = p.parse_args(argv)
    sweep = Path(args.sweep)
    if not sweep.is_dir():
        print(f"error: {sweep} is not a directory", file=sys.stderr)
        return 2
    points = load_points(sweep)
    if not points:
        print(f"error: no point under {sweep} has a result.json or failure.json", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else sweep
    out.mkdir(parents=True, exist_ok=True)
    write_summary(points, out / "summary.csv", sweep)
    written = [out / "summary.csv"]
    if not args.no_plots:
        from launcher.bench.plots import plot

        written += plot(points, out)
    print(format_summary(points))
    failed = sum(1 for pt in points if pt.status == "failed")
    with_errors = sum(1 for pt in points if pt.status == "errors")
    note = f"{len(points)} points"
    if failed or with_errors:
        note += f" ({failed} failed, {with_errors} with failed requests)"
    print(f"{note}; wrote {', '.join(str(w) for w in written)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
