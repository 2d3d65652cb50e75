"""The pure parts of the GPU measurement scripts (benchmark/gpu): they run only on the lent GPU machine, so what
can be checked without a GPU is checked here: the token-by-token comparison of two servings' greedy answers, the
startup breakdown read from vLLM's log lines, the engines table's ratio to `vllm serve`, a yardstick server started
from a command, and that every benchmark script or module the scripts and the docs
name exists (a stale name in a GPU script would fail only there)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    return importlib.import_module(f"benchmark.gpu.{name}")


class Words:
    """A tokenizer of whitespace-separated words, enough for comparing answers token by token."""

    def __init__(self):
        self.ids: dict = {}

    def encode(self, text, add_special_tokens=False):
        return [self.ids.setdefault(w, len(self.ids)) for w in text.split()]

    def decode(self, ids):
        words = {v: k for k, v in self.ids.items()}
        return " ".join(words[i] for i in ids)


def test_identity_counts_equal_positions_and_names_the_first_divergence():
    identity = _load("identity")
    prompts = identity.prompts(3)
    assert len(set(prompts)) == 3 and prompts == identity.prompts(3)  # the same prompts on every call
    a = {"prompts": prompts, "answers": ["a b c d", "x y z w", "p q"]}
    b = {"prompts": prompts, "answers": ["a b c d", "x y k l", "p q r"]}
    report = identity.compare(a, b, Words())
    assert report["identical_answers"] == 1
    assert report["token_share"] == (4 + 2 + 2) / (4 + 4 + 3)
    assert report["first_divergence"] == [
        {"prompt": 1, "position": 2, "a": "z", "b": "k"},
        {"prompt": 2, "position": 2, "a": "<end>", "b": "r"},
    ]


def test_identity_refuses_answers_to_different_prompts():
    identity = _load("identity")
    with pytest.raises(SystemExit, match="different prompts"):
        identity.compare({"prompts": ["a"], "answers": ["x"]}, {"prompts": ["b"], "answers": ["x"]}, Words())


def test_startup_breakdown_reads_vllms_log_lines(tmp_path):
    serve_bench = _load("serve_bench")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.log").write_text(
        "(Worker pid=1) INFO [default_loader.py:430] Loading weights took 0.37 seconds\n"
        "(Worker pid=1) INFO [model_runner.py:302] Model loading took 2.3 GiB and 2.798511 seconds\n"
        "(Worker pid=1) INFO [backends.py:1149] Dynamo bytecode transform time: 3.78 s\n"
        "(Worker pid=1) INFO [monitor.py:53] torch.compile took 11.55 s in total\n"
        "(Worker pid=1) INFO [model_runner.py:722] Graph capturing finished in 2 secs, took 0.37 GiB\n"
        "(EngineCore pid=2) INFO [core.py:337] init engine (profile, create kv cache, warmup model) took 105.57 s\n"
    )
    (logs / "rank1.log").write_text("(Worker pid=3) INFO Loading weights took 9.00 seconds\n")
    assert serve_bench.startup_breakdown(str(tmp_path)) == {
        "weights_s": 0.37,
        "model_load_s": 2.798511,
        "dynamo_s": 3.78,
        "compile_s": 11.55,
        "cuda_graphs_s": 2.0,
        "engine_init_s": 105.57,
    }
    assert serve_bench.startup_breakdown(str(tmp_path / "absent")) == {}


def test_serve_bench_sends_every_load_pass_and_workload_prompts_of_their_own(tmp_path, monkeypatch):
    """serve_bench's llmlaunch-bench seeds (the measured requests' seed S, the warm-up's S + 1): a workload on the same
    server (--workload) must not resend the prompts of the loads before it, or the server's prefix cache serves their
    prefill and the rows compare a cached load with a new one."""
    import argparse
    import json

    serve_bench = _load("serve_bench")
    seeds = []

    def fake_run(argv, **kwargs):
        seeds.append(int(argv[argv.index("--seed") + 1]))
        out = argv[argv.index("--result-json") + 1]
        Path(out).write_text(json.dumps({"metrics": {}}))
        return argparse.Namespace(returncode=0, stderr="")

    monkeypatch.setattr(serve_bench.subprocess, "run", fake_run)
    args = argparse.Namespace(processes=4, input_len=16, output_len=4, tokenizer="t", label="x", server_command="")
    args.metrics = args.prefill_metrics = args.bench_args = ""
    for run in (0, 1):
        for workload in (0, 1, 2):
            for c in (1, 64, 128, 256):
                serve_bench.bench("u", c, 10, args, str(tmp_path / "b.json"), "", run, workload)
    assert seeds[:4] == [2, 128, 256, 512]  # the loads without a workload: the in-process yardsticks' seeds (2C)
    every = seeds + [s + 1 for s in seeds]  # with the warm-ups'
    assert len(set(every)) == len(every)


def _served(path: Path, label: str, rows: list[tuple]) -> None:
    """A serve_bench.py document: rows of (workload, C, tokens/s)."""
    keys = ("workload", "concurrency", "output_throughput")
    doc = {"label": label, "ready_s": 1.0, "rows": [dict(zip(keys, r)) for r in rows]}
    for r in doc["rows"]:
        r.update(ttft_ms_p50=10.0, itl_ms_p50=1.0, failed=0)
    (path / f"{label}.json").write_text(__import__("json").dumps(doc))


def test_engines_table_puts_each_served_row_against_the_better_vllm_serve_row_of_its_load(tmp_path, capsys):
    _served(tmp_path, "vllm_serve1", [("", 64, 800.0), ("", 128, 900.0)])
    _served(tmp_path, "vllm_serve4", [("", 64, 1000.0), ("", 128, 600.0)])
    _served(tmp_path, "v8", [("", 64, 1100.0), ("", 128, 450.0), ("prefix", 64, 500.0)])
    _load("engines_table").main([str(tmp_path), "--markdown"])
    lines = capsys.readouterr().out.splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(head, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]
    ratio = {(r["path"], r["C"]): r["of own server"] for r in rows}
    assert ratio[("v8", "64")] == "1.100"  # against vllm_serve4's 1,000, the better row at C=64
    assert ratio[("v8", "128")] == "0.500"  # against vllm_serve1's 900, the better row at C=128
    assert ratio[("v8 [prefix]", "64")] == ""  # no vllm serve row of that workload: no ratio
    assert ratio[("vllm_serve1", "64")] == "0.800"


def test_engines_table_measures_a_served_sglang_row_against_sglang_in_process_and_its_own_server(tmp_path, capsys):
    import json

    _served(tmp_path, "vllm_serve4", [("", 64, 5000.0)])
    _served(tmp_path, "sglang_serve", [("", 64, 800.0)])
    _served(tmp_path, "sglang", [("", 64, 1000.0)])
    # two passes (--repeat 2): the row is their mean, 1,250 tok/s and a first token at 8 ms
    inproc = {
        "rows": [
            {"concurrency": 64, "output_throughput": t, "ttft_ms": {"p50": f}}
            for t, f in ((1200.0, 7.5), (1300.0, 8.5))
        ]
    }
    for r in inproc["rows"]:
        r.update(itl_ms={"p50": 1.0}, failed=0)
    (tmp_path / "sglang_inprocess.json").write_text(json.dumps(inproc))
    _load("engines_table").main([str(tmp_path), "--markdown"])
    lines = capsys.readouterr().out.splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {
        (r["path"], r["C"]): r
        for r in (dict(zip(head, (c.strip() for c in x.strip("|").split("|")))) for x in lines[2:])
    }
    assert rows[("sglang", "64")]["of own server"] == "1.250"  # SGLang's own server, not vllm serve
    assert rows[("sglang", "64")]["of in-process"] == "0.800" and rows[("sglang", "64")]["+ms"] == "+2.00"
    assert rows[("SGLang Engine in-process", "64")]["of own server"] == "1.562"


def test_a_yardstick_server_that_exits_before_it_is_healthy_is_reported_with_its_log(tmp_path):
    serve_bench = _load("serve_bench")
    cmd = f"{__import__('sys').executable} -c \"print('bad flag --api-server-count'); raise SystemExit(3)\""
    with pytest.raises(RuntimeError, match="bad flag --api-server-count") as err:
        serve_bench.start_command(cmd, "http://127.0.0.1:9/health", str(tmp_path / "log"), 30)
    assert "exit 3" in str(err.value)


def test_weights_drawn_off_the_cpu_need_an_explicit_folder():
    from launcher.tiny import ensure_tiny_model

    with pytest.raises(ValueError, match="needs an explicit out folder"):
        ensure_tiny_model(init_device="cuda")


# `benchmark/x/y.py` / `.sh` paths and `-m benchmark.x.y` modules, as the shell scripts and docs write them
_PATH = re.compile(r"benchmark/[\w/]+\.(?:py|sh)")
_MODULE = re.compile(r"-m (benchmark(?:\.\w+)+)")


def test_every_benchmark_path_and_module_named_exists():
    scripts = [f for f in sorted((ROOT / "benchmark").rglob("*")) if f.suffix in (".py", ".sh")]
    texts = [*scripts, *sorted((ROOT / "docs").rglob("*.md"))]
    texts += [ROOT / "README.md", ROOT / "benchmark" / "README.md"]
    missing = []
    for f in texts:
        text = f.read_text()
        missing += [f"{f.relative_to(ROOT)}: {p}" for p in _PATH.findall(text) if not (ROOT / p).is_file()]
        for m in _MODULE.findall(text):
            if not (ROOT / (m.replace(".", "/") + ".py")).is_file():
                missing.append(f"{f.relative_to(ROOT)}: -m {m}")
    assert missing == []


def _yardstick(tmp_path, mode: str, loads: list, output_len: int, overrides: list, *flags) -> tuple:
    """engine_yardstick MODE against the engines' stand-ins (tests/standins): (its rows, the stand-in's events, its
    JSON file); each call's files named after its flags' count."""
    import json
    import os
    import subprocess
    import sys

    from tests.standins.server import STANDINS

    log, out = tmp_path / f"standin{len(flags)}.jsonl", tmp_path / f"{mode}{len(flags)}.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(STANDINS), str(ROOT)]), LLMLAUNCH_STANDIN_LOG=str(log))
    env["LLMLAUNCH_STANDIN_DELAY_S"] = "0"
    cmd = [sys.executable, "-m", "benchmark.engine_yardstick", mode, "--concurrency", *loads, *flags]
    cmd += ["--input-len", "16", "--output-len", str(output_len), "--json", str(out), "--", *overrides]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    return json.loads(out.read_text())["rows"], events, out


def _pulse(tmp_path, now: float, python_us) -> str:
    """A host pulse file whose ticks (one every 0.1 s from `now`, python_us(k) for tick k) span a test's run."""
    import json

    pulse = tmp_path / "pulse.jsonl"
    pulse.write_text(
        "".join(json.dumps({"t": now + k / 10, "python_us": python_us(k), "load1": 1.0}) + "\n" for k in range(3000))
    )
    return str(pulse)


def test_the_sglang_yardstick_builds_the_served_models_engine_and_sends_each_load_prompts_new_to_it(
    tmp_path, tiny_model_dir
):
    """engine_yardstick's sglang mode against the SGLang stand-in (tests/standins: SGLang needs a GPU): the Engine gets
    the served model's ServerArgs, every request streams exactly --output-len tokens, greedy, ignore_eos; each load and
    each pass (--repeat) sends llmlaunch-bench's prompts under serve_bench, so SGLang's radix cache serves no load's
    prefill from an earlier one, as none of the served runs'; --prompts shared resends them; rows sit in the host's
    pulse."""
    import time

    from benchmark.yardstick_loop import samples_for

    pulse = _pulse(tmp_path, time.time(), lambda k: 100.0)
    overrides = ["engine=sglang", f"model.path={tiny_model_dir}", "engine.max_num_seqs=8"]

    def run(*flags):
        rows, events, _ = _yardstick(tmp_path, "sglang", ["1:3", "4:8"], 5, overrides, *flags)
        return rows, events

    rows, events = run("--repeat", "2", "--pulse", pulse)
    assert [(r["pass"], r["concurrency"], r["requests"], r["completed"], r["failed"]) for r in rows] == [
        (p, c, n, n, 0) for p in (1, 2) for c, n in ((1, 3), (4, 8))
    ]
    assert all(r["total_output_tokens"] == 5 * r["requests"] and r["prompts"] == "per-load" for r in rows)
    assert all(r["wall"][0] <= r["wall"][1] and r["host"]["ticks"] >= 1 for r in rows)
    init = [e for e in events if e["event"] == "init"]
    assert len(init) == 1 and init[0]["args"]["model_path"] == str(tiny_model_dir)
    assert init[0]["args"]["max_running_requests"] == 8
    generated = [e for e in events if e["event"] == "generate"]
    sampling = [e["sampling"] for e in generated]
    assert len(sampling) == 2 * (1 + 3 + 4 + 8) and all(s["temperature"] == 0.0 and s["ignore_eos"] for s in sampling)
    assert {s["max_new_tokens"] for s in sampling} == {5}
    prompts = [e["prompt"] for e in generated]
    assert len(set(prompts)) == len(prompts)  # none sent twice, across loads and passes
    assert prompts[1:4] == [s.prompt for s in samples_for(str(tiny_model_dir), 3, 16, 5, 2 * 1)]  # serve_bench's C=1

    _, events = run("--prompts", "shared")
    prompts = [e["prompt"] for e in events if e["event"] == "generate"]
    assert len(set(prompts)) < len(prompts)  # C=4's warm-up resends C=1's prompts


def test_the_vllm_yardstick_sends_per_load_prompts_and_takes_turns_with_the_served_adapter_and_runtime(
    tmp_path, tiny_model_dir
):
    """engine_yardstick async against the vLLM stand-in: --prompts per-load sends each load, and each pass, prompts of
    its own (llmlaunch-bench's under serve_bench: seed 2C, the warm-up 2C + 1), so vLLM's prefix cache holds none of
    them from an earlier load, where --prompts shared resends the earlier loads' prompts; --through-adapter drives the
    same engine (one init) through llmlaunch's vLLM adapter too, --through-runtime through the served models' runtime
    on that adapter (llmlaunch-bench's requests parsed, the contract's responses counted), the paths taking turns
    --repeat times; the runtime's rows split their first tokens as the served rows do."""
    import time

    from benchmark.yardstick_loop import samples_for

    def run(*flags):
        overrides = ["engine=vllm", f"model.path={tiny_model_dir}"]
        return _yardstick(tmp_path, "async", ["1:3", "2:4"], 3, overrides, *flags)

    # a host pulse whose ticks span the run (stamped ahead, a tick every 0.1 s)
    pulse = _pulse(tmp_path, time.time(), lambda k: 100.0 + k % 3)
    rows, events, out = run(
        "--prompts",
        "per-load",
        "--through-adapter",
        "--through-runtime",
        "--repeat",
        "2",
        "--label",
        "stub python",
        "--pulse",
        pulse,
    )
    assert all(r["wall"][0] <= r["wall"][1] and r["host"]["ticks"] >= 1 for r in rows)  # each row in the pulse
    paths = ("in-process AsyncLLM", "in-process, via adapter", "in-process, via the stub's runtime")
    assert [(r["pass"], r["path"], r["concurrency"], r["completed"]) for r in rows] == [
        (p, path, c, n) for p in (1, 2) for path in paths for c, n in ((1, 3), (2, 4))
    ]
    assert all(r["total_output_tokens"] == 3 * r["requests"] and r["failed"] == 0 for r in rows)
    # each row counts the engine core's steps of its requests as the served model does (its stat logger)
    assert all(r["engine_steps"]["steps"] > 0 and r["engine_steps"]["wall_step_ms"] > 0 for r in rows)
    split = [r["first_token_ms"] for r in rows if r["path"] == paths[2]]
    assert [s["requests"] for s in split] == [3, 4, 3, 4] and all(s["inside_server"] > 0 for s in split)
    assert len([e for e in events if e["event"] == "init"]) == 1  # one engine, every path
    generated = [e for e in events if e["event"] == "generate"]
    prompts = [e["prompt"] for e in generated]
    assert len(prompts) == 6 * (1 + 3 + 2 + 4) and len(set(prompts)) == len(prompts)  # none sent twice
    through_runtime = generated[20:30]  # pass 1's third path: llmlaunch-bench's request as the runtime parsed it
    assert all(e["sampling"]["ignore_eos"] and e["sampling"]["min_tokens"] == 3 for e in through_runtime)
    # engines.sh table: each path and pass a row of its own beside the served configurations
    table = tmp_path / "table"
    table.mkdir()
    (table / "inprocess_vllm_stub.json").write_text(out.read_text())
    _, served, _ = _load("engines_table").load(str(table))
    assert [(d["label"], [r["concurrency"] for r in d["rows"]]) for d in served] == [
        (f"stub python: {path}, pass {p}", [1, 2]) for p in (1, 2) for path in paths
    ]
    first = [s.prompt for s in samples_for(str(tiny_model_dir), 3, 16, 3, 2 * 1)]
    assert prompts[1:4] == first  # C=1's measured requests: llmlaunch-bench's --seed 2 prompts

    rows, events, _ = run("--prompts", "shared")
    assert all(r["engine_steps"]["steps"] > 0 for r in rows)  # plain AsyncLLM: the yardstick's own stat logger
    prompts = [e["prompt"] for e in events if e["event"] == "generate"]
    assert len(set(prompts)) < len(prompts)  # C=2's warm-up resends C=1's prompts


def test_closed_loops_with_a_gap_send_each_next_request_that_long_after_the_last_ended_and_the_flag_is_checked(
    tmp_path,
):
    """--gap-ms paces engine_yardstick's closed loops: a loop sends its next request no sooner than the gap after its
    previous one ended (a served client's next request reaches the engine only after the last token's way out and the
    next request's way in); the first requests go at once; 0 keeps the loops back to back. It is refused where no
    closed loop of one front end runs."""
    import asyncio
    import subprocess
    import sys
    import time
    import types

    from benchmark.yardstick_loop import closed_loop, counter

    def run(gap_s: float) -> list:
        async def stream_of(sample):
            await asyncio.sleep(0.01)
            yield 1, 4, "length"

        samples = [types.SimpleNamespace(prompt=f"p{k}", prompt_len=4, output_len=1) for k in range(6)]
        clock = {"t0": time.perf_counter()}
        return asyncio.run(closed_loop(stream_of, samples, 2, counter(0, 6), clock, gap_s))

    results = sorted(run(0.15), key=lambda r: r.sent)
    assert [r.sent < 0.05 for r in results] == [True, True, False, False, False, False]  # two loops start at once
    for loop in (results[0::2], results[1::2]):  # each loop's requests in order (the loops keep in step here)
        assert all(b.sent - a.end >= 0.15 for a, b in zip(loop, loop[1:]))
    back_to_back = sorted(run(0.0), key=lambda r: r.sent)
    assert back_to_back[-1].end < 0.15

    for flags in (
        ["sglang", "--gap-ms", "20"],
        ["async", "--frontends", "2", "--gap-ms", "20"],
        ["async", "--gap-ms", "-1"],
    ):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmark.engine_yardstick",
                *flags,
                "--",
                "engine=vllm",
                "model.path=/nonexistent",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode != 0 and "--gap-ms" in done.stderr, done.stderr[-1000:]


def test_host_pulse_times_the_host_and_places_a_load_in_it(tmp_path):
    """host_pulse.py appends a tick every --every seconds (the fixed Python and numpy work timed, the load average;
    no GPU here, so no SM clock); `window` gives a load's share of the pulse against the whole file: the ticks inside
    it, or for a load shorter than their spacing the nearest one, and none far from every tick."""
    import json
    import subprocess
    import sys
    import time

    from benchmark import host_pulse

    out = tmp_path / "pulse.jsonl"
    t0 = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "benchmark.host_pulse", "--out", str(out), "--every", "0.1", "--for", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    ticks = host_pulse.read(str(out))
    assert 4 <= len(ticks) <= 12 and all(t["python_us"] > 0 and t["numpy_us"] > 0 for t in ticks)
    assert all(t0 <= t["t"] <= time.time() for t in ticks)
    whole = host_pulse.window(str(out), t0, time.time())
    assert whole["ticks"] == len(ticks) and 0.5 < whole["python_x"] < 2 and whole["sm_mhz"] is None

    # a host twice as slow after its first 11 ticks (the median is the fast one): a load then reads 2x, before 1x
    out.write_text(
        "".join(
            json.dumps({"t": 100.0 + k, "python_us": 10.0 if k <= 10 else 20.0, "load1": 0.5}) + "\n" for k in range(21)
        )
    )
    assert host_pulse.window(str(out), 114.0, 118.0)["python_x"] == 2.0
    assert host_pulse.window(str(out), 101.0, 105.0)["python_x"] == 1.0
    assert host_pulse.window(str(out), 103.4, 103.45)["ticks"] == 1  # shorter than the spacing: the nearest tick
    assert host_pulse.window(str(out), 500.0, 501.0) is None
    assert "python 2.00x" in host_pulse.text(host_pulse.window(str(out), 114.0, 118.0))
