"""llmlaunch-report on synthetic sweep directories (no server needed)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from launcher.bench import metrics, report


def _result(concurrency: int, tput_per_req: float, ttft_s: float, failed: int = 0, n: int = 20) -> dict:
    results = []
    for i in range(n):
        t = [ttft_s + 0.01 * k + 0.001 * i for k in range(10)]
        r = metrics.RequestResult(
            index=i, prompt_len=16, max_tokens=10, sent=0.0, token_times=t, end=t[-1], input_tokens=16, output_tokens=10
        )
        if i < failed:
            r.error = "injected failure"
        results.append(r)
    duration = n * 10 / (tput_per_req * concurrency)
    return {
        "format": "llmlaunch-bench/1",
        "config": {"model": "tiny", "load": {"concurrency": concurrency, "request_rate": None}},
        "metrics": metrics.compute(results, duration),
        "requests": [r.to_json() for r in results],
    }


def _point(root: Path, name: str, overrides, result=None, failure=None, hydra=False) -> Path:
    d = root / name
    (d / ".hydra" if hydra else d).mkdir(parents=True, exist_ok=True)
    text = "".join(f"- {o}\n" for o in overrides)
    (d / ".hydra" / "overrides.yaml" if hydra else d / "overrides.yaml").write_text(text)
    if result is not None:
        (d / "result.json").write_text(json.dumps(result))
    if failure is not None:
        (d / "failure.json").write_text(json.dumps(failure))
    return d


@pytest.fixture
def sweep(tmp_path):
    root = tmp_path / "sweep"
    i = 0
    for engine, speed in (("hf", 50.0), ("hf_batched", 120.0)):
        for c in (1, 4, 16, 64):
            overrides = [f"engine={engine}", f"bench.concurrency={c}", "bench.seed=0"]
            if engine == "hf" and c == 64:  # failure.json written by the helper, overrides only in it
                report.write_failure(
                    root / str(i),
                    overrides,
                    "serve",
                    "tritonserver exited with status 1 while loading model hf",
                    exit_code=1,
                )
            else:
                ttft = 0.02 * (1 + c / 8) if engine == "hf" else 0.01 * (1 + c / 16)
                _point(
                    root,
                    str(i),
                    overrides,
                    result=_result(c, speed / (1 + c / 32), ttft, failed=2 if (engine, c) == ("hf_batched", 16) else 0),
                    hydra=engine == "hf_batched",
                )
            i += 1
    return root


def test_report_writes_summary_and_plots(sweep, capsys):
    assert report.main([str(sweep)]) == 0
    rows = list(csv.DictReader((sweep / "summary.csv").open()))
    assert len(rows) == 8
    by = {(r["config"], r["concurrency"]): r for r in rows}
    assert set(r["config"] for r in rows) == {"engine=hf", "engine=hf_batched"}  # concurrency and seed are not config
    failed = by[("engine=hf", "64")]
    assert failed["status"] == "failed" and failed["error"].startswith("serve: tritonserver exited")
    assert failed["output_throughput"] == "" and failed["point"] == "3"
    partial = by[("engine=hf_batched", "16")]
    assert partial["status"] == "errors" and partial["failed"] == "2" and partial["error"] == "injected failure"
    ok = by[("engine=hf_batched", "4")]
    assert ok["status"] == "ok" and float(ok["output_throughput"]) > float(by[("engine=hf", "4")]["output_throughput"])
    assert float(ok["ttft_p99_ms"]) >= float(ok["ttft_p90_ms"]) >= float(ok["ttft_p50_ms"]) > 0
    assert float(ok["itl_p99_ms"]) >= float(ok["itl_p90_ms"]) >= float(ok["itl_p50_ms"]) > 0
    assert ok["gpus"] == "" and ok["output_per_gpu"] == ""  # no point.json: the layout is unknown
    assert float(ok["tokens_per_response"]) == 1.0 and failed["tokens_per_response"] == ""  # 10 tokens, 10 responses
    for name in ("throughput_vs_concurrency.png", "latency_throughput.png"):
        data = (sweep / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    out = capsys.readouterr()
    assert "engine=hf_batched" in out.out and "8 points (1 failed, 1 with failed requests)" in out.err


def test_report_out_dir_and_mapping_overrides(tmp_path):
    root = tmp_path / "s"
    d = root / "a"
    d.mkdir(parents=True)
    (d / "overrides.yaml").write_text("engine: hf\nbench.request_rate: 5\n")
    res = _result(8, 40.0, 0.05)
    res["config"]["load"] = {"concurrency": None, "request_rate": 5}
    (d / "result.json").write_text(json.dumps(res))
    out = tmp_path / "out"
    assert report.main([str(root), "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert rows[0]["config"] == "engine=hf" and rows[0]["request_rate"] == "5" and rows[0]["concurrency"] == ""
    assert (out / "latency_throughput.png").exists()


def test_report_on_empty_dir_fails(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "no point" in capsys.readouterr().err


def test_parse_overrides():
    assert report.parse_overrides(["a.b=1", "+c=x", "~d"]) == {"a.b": "1", "c": "x", "d": ""}
    assert report.parse_overrides({"k": 2}) == {"k": "2"}
    assert report.parse_overrides(None) == {}


def test_a_point_whose_model_answered_nothing_keeps_its_load_and_says_so(tmp_path):
    """bench.eval: the load's result stays; a failure of stage eval makes the status "no answers"; scores are a
    column."""
    root = tmp_path / "sweep"
    tasks = {"arithmetic": {"metric": "exact_match", "value": 0.0, "answered": 0, "items": 4}}
    failure = {"stage": "eval", "error": "the model answered none of the generation items"}
    d = _point(root, "a", ["bench.concurrency=1"], result=_result(1, 50.0, 0.02), failure=failure)
    (d / "eval.json").write_text(json.dumps({"tasks": tasks}))
    ok = _point(root, "b", ["bench.concurrency=2"], result=_result(2, 50.0, 0.02))
    (ok / "eval.json").write_text(
        json.dumps({"tasks": {**tasks, "arithmetic": {**tasks["arithmetic"], "answered": 4}}})
    )
    rows = {r["point"]: r for r in report.summary_rows(report.load_points(root), root)}
    assert rows["a"]["status"] == "no answers" and "answered none" in rows["a"]["error"]
    assert rows["a"]["output_throughput"] and rows["a"]["eval"] == "arithmetic exact_match=0.000 0/4"
    assert rows["b"]["status"] == "ok" and rows["b"]["eval"] == "arithmetic exact_match=0.000 4/4"


def test_first_token_split_rows_leave_out_the_hops_a_model_does_not_have():
    """The vLLM, SGLang and LMDeploy models report no `add` or `back` (the hf engine process's hops): no rows."""
    from launcher.bench.metrics import format_first_token_split

    split = {"parse": 0.2, "add": 0.0, "engine": 9.5, "back": 0.0, "respond": 0.1, "send": 0.05}
    text = format_first_token_split({**split, "outside_server": 1.5, "requests": 7})
    assert "engine: queue, prefill (ms):" in text and "tritonserver, gRPC, client (ms):" in text
    assert "to the engine process" not in text and "first token back to the stub" not in text
    hf = format_first_token_split({**split, "add": 0.3, "back": 0.2, "outside_server": 1.5, "requests": 7})
    assert "to the engine process (ms):" in hf and "first token back to the stub (ms):" in hf


@pytest.mark.parametrize(
    "config,gpus",
    [
        ({"tp": 1, "pp": 1, "replicas": 2, "disagg": {"prefill": 0, "decode": 0}}, 2),
        ({"tp": 2, "pp": 1, "replicas": 1, "disagg": {"prefill": 1, "decode": 2}}, 6),
        ({"tp": 4, "pp": 2, "replicas": 1}, 8),
        (None, None),
    ],
)
def test_a_points_gpus_are_its_layouts_copies_times_their_size(config, gpus):
    assert report.layout_gpus(config) == gpus


def test_output_per_gpu_puts_layouts_of_different_sizes_side_by_side(tmp_path):
    root = tmp_path / "s"
    for name, split, replicas in (("agg", {"prefill": 0, "decode": 0}, 4), ("pd", {"prefill": 1, "decode": 1}, 1)):
        d = _point(
            root, name, [f"replicas={replicas}", f"disagg.prefill={split['prefill']}"], result=_result(4, 40, 0.05)
        )
        config = {"tp": 1, "pp": 1, "replicas": replicas, "disagg": split}
        (d / "point.json").write_text(json.dumps({"config": config, "server": None}))
    rows = {r["point"]: r for r in report.summary_rows(report.load_points(root), root)}
    assert (rows["agg"]["gpus"], rows["pd"]["gpus"]) == (4, 2)
    for r in rows.values():
        assert float(r["output_per_gpu"]) == pytest.approx(float(r["output_throughput"]) / int(r["gpus"]), rel=1e-3)


def test_a_split_layouts_transfers_are_in_its_row_and_an_aggregated_ones_are_empty(tmp_path):
    root = tmp_path / "s"
    moved = {"transfers": 40, "failed": 0, "bytes": 40 << 20, "mib": 40.0, "mib_per_transfer": 1.0}
    moved.update(ms_per_transfer=2.5, gib_per_s=0.4)
    _point(root, "pd", ["disagg.prefill=1"], result={**_result(4, 40, 0.05), "server_kv_transfer": moved})
    _point(root, "agg", ["replicas=2"], result=_result(4, 40, 0.05))
    rows = {r["point"]: r for r in report.summary_rows(report.load_points(root), root)}
    pd, agg = rows["pd"], rows["agg"]
    assert (pd["kv_transfers"], float(pd["kv_transfer_ms"]), float(pd["kv_transfer_mib"])) == (40, 2.5, 1.0)
    assert (agg["kv_transfers"], agg["kv_transfer_ms"], agg["kv_transfer_mib"]) == ("", "", "")
