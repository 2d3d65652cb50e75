"""llmlaunch-bench without a server: datasets, metrics, load specs and arrival schedules, and the pure parts of the
benchmark scripts. llmlaunch-bench against a real tritonserver: tests/integration/test_bench.py."""

from __future__ import annotations

import importlib
import json
import random
import statistics
from pathlib import Path

import pytest

from launcher.bench import datasets, metrics
from launcher.bench.runner import LoadSpec

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


# --------------------------------------------------------------------------- dataset files


def _text(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def make_sharegpt(path: Path, n: int = 70, seed: int = 1) -> Path:
    rng = random.Random(seed)
    data = []
    for i in range(n):
        conv = [{"from": "human", "value": _text(rng, 4, 30)}, {"from": "gpt", "value": _text(rng, 4, 12)}]
        if i % 7 == 0:
            conv = conv[:1]  # one turn only: dropped
        data.append({"id": f"c{i}", "conversations": conv})
    data.append({"id": "short", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]})
    path.write_text(json.dumps(data))
    return path


def make_cnn(path: Path, n: int = 55, seed: int = 2) -> Path:
    rng = random.Random(seed)
    rows = [
        {
            "instruction": "Summarize the following news article:",
            "input": _text(rng, 10, 60),
            "output": _text(rng, 3, 9),
        }
        for _ in range(n)
    ]
    path.write_text(json.dumps(rows))
    return path


def make_prompts(path: Path, lines) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


# --------------------------------------------------------------------------- datasets, metrics, load specs, scripts


def test_sharegpt_loader_filters_and_seeds(tmp_path):
    path = make_sharegpt(tmp_path / "sg.json")
    tokens = datasets.TokenCounter()
    a = datasets.load_sharegpt(path, 20, tokens, seed=3)
    b = datasets.load_sharegpt(path, 20, tokens, seed=3)
    c = datasets.load_sharegpt(path, 20, tokens, seed=4)
    assert [s.prompt for s in a] == [s.prompt for s in b] != [s.prompt for s in c]
    assert all(s.prompt_len >= 4 and s.output_len >= 4 for s in a)
    assert all(s.output_len == datasets.estimate_tokens(s.reference) for s in a)
    assert datasets.detect_kind(str(path)) == "sharegpt"
    fixed = datasets.load_sharegpt(path, 5, tokens, output_len=7)
    assert {s.output_len for s in fixed} == {7}


def test_cnn_and_synthetic_loaders(tmp_path):
    path = make_cnn(tmp_path / "cnn.json")
    assert datasets.detect_kind(str(path)) == "cnn"
    tokens = datasets.TokenCounter()
    s = datasets.load_cnn(path, 10, tokens, max_input_len=40)
    assert len(s) == 10 and all(x.prompt.startswith("Summarize") and x.prompt_len <= 40 for x in s)
    assert all(x.output_len == int(len(x.reference.split(" ")) * 1.3) for x in s)
    syn = datasets.load_synthetic(200, tokens, seed=1, input_len=20, output_len=10, range_ratio=0.5)
    assert all(10 <= x.prompt_len <= 30 and 5 <= x.output_len <= 15 for x in syn)
    assert len({x.output_len for x in syn}) > 3
    fixed = datasets.load_synthetic(5, tokens, input_len=16, output_len=8)
    assert {(x.prompt_len, x.output_len) for x in fixed} == {(16, 8)}
    assert all(len(x.prompt.split()) == 16 for x in fixed)


def test_metrics_from_known_times():
    r = metrics.RequestResult(
        index=0,
        prompt_len=3,
        max_tokens=4,
        sent=1.0,
        token_times=[1.05, 1.07, 1.09, 1.11],
        end=1.11,
        input_tokens=3,
        output_tokens=4,
        queued=0.9996,
    )
    assert r.ttft == pytest.approx(0.05) and r.e2el == pytest.approx(0.11)
    assert r.itl == pytest.approx([0.02, 0.02, 0.02]) and r.tpot == pytest.approx(0.02)
    bad = metrics.RequestResult(index=1, prompt_len=3, max_tokens=4, sent=1.0, error="boom")
    m = metrics.compute([r, bad], duration=2.0, slos={"ttft": 60})
    assert m["completed"] == 1 and m["errors"] == 1 and m["failed"] == 1
    assert m["ttft_ms"]["mean"] == pytest.approx(50) and m["itl_ms"]["p50"] == pytest.approx(20)
    assert m["output_throughput"] == pytest.approx(2.0) and m["goodput"] == pytest.approx(0.5)
    assert metrics.compute([r], 1.0, {"ttft": 10})["goodput"] == 0
    assert m["tokens_per_response"] == 1.0 and "Tokens per response (mean):" in metrics.format_table(m)
    # the client's hand-off (queued -> sent) is outside TTFT, reported apart; unknown (None) for old results
    assert m["client_handoff_ms"]["p50"] == pytest.approx(0.4) and "Client hand-off P99 (ms):" in metrics.format_table(
        m
    )
    # a server that merges a stream's tokens (stream_interval_ms): ITL is the gap between pieces of 3 and 4 tokens
    merged = metrics.RequestResult(
        index=2,
        prompt_len=3,
        max_tokens=8,
        sent=1.0,
        token_times=[1.05, 1.07, 1.09],
        end=1.09,
        input_tokens=3,
        output_tokens=8,
    )
    assert metrics.compute([r, merged], 2.0)["tokens_per_response"] == pytest.approx(12 / 7)
    no_queue = metrics.compute([merged], 2.0)  # results saved before `queued` existed: no hand-off row
    assert no_queue["client_handoff_ms"]["p50"] is None and "Client hand-off" not in metrics.format_table(no_queue)
    assert "1 of 2 requests failed (1 with errors)" == metrics.failure_summary(m)
    with pytest.raises(ValueError, match="ttft:MS"):
        metrics.parse_slos(["latency:5"])


def test_load_spec_rejects_nonsense():
    with pytest.raises(ValueError, match="--concurrency N, or --request-rate"):
        LoadSpec().check()
    with pytest.raises(ValueError, match="burstiness"):
        LoadSpec(concurrency=1, burstiness=0).check()


def _script(name: str):
    """A benchmark script's module (benchmark.<name>), imported to test its pure functions."""
    return importlib.import_module(f"benchmark.{name}")


def test_profile_wrapper_translates_seed_command_line(tmp_path):
    mod = _script("profile_triton_python_backend")
    argv = mod.translate(["0.0.0.0:33337", "sglang_model", "sg.json", "--num_prompts", "1000", "--concurrency=128"])
    assert argv[:4] == ["--url", "0.0.0.0:33337", "--dataset", "sg.json"]
    assert "--model" in argv and argv[argv.index("--model") + 1] == "sglang_model"
    assert argv[argv.index("--num-prompts") + 1] == "1000" and argv[argv.index("--concurrency") + 1] == "128"
    argv = mod.translate(["h:1", str(tmp_path), "sg.json", "--stream_output", "false", "--request-rate", "5"])
    assert argv[argv.index("--tokenizer") + 1] == str(tmp_path) and "--no-stream" in argv
    assert argv[-2:] == ["--request-rate", "5"]


def test_multi_gpu_verdict_allows_greedy_differences_only_across_tp_sizes_in_bf16():
    """benchmark/gpu/multi_gpu.py's exit status: a bf16 tp=2 that picks another near-tie than tp=1 is a note; the same
    difference in float32, or a layout that differs from the first of its tp size (replicas of tp=1 against tp=1) in
    any dtype, fails the run, as do failed requests and layouts that did not start."""
    mod = _script("gpu.multi_gpu")
    rows = [{"layout": n, "failed": 0} for n in ("tp1", "tp2", "rep2")]

    texts = {"tp1": "a b c", "tp2": "a b d", "rep2": "a b c"}
    assert mod.verdict(texts, rows, [], "bfloat16") == (
        0,
        [
            "greedy text of tp2 differs from tp1's (bfloat16, tp=2 against tp=1): expected in bfloat16; "
            "--dtype float32 checks equality"
        ],
    )
    assert mod.verdict(texts, rows, [], "float32") == (
        1,
        ["greedy text of tp2 differs from tp1's (float32, tp=2 against tp=1): it must not"],
    )
    # a replica compares with the first layout of its tp size, wherever that ran
    texts = {"tp2": "x", "tp1": "y", "rep2": "z", "rep2tp2": "x"}
    assert mod.verdict(texts, rows, [], "bfloat16") == (
        1,
        [
            "greedy text of rep2 differs from tp1's (the same tp size): it must not",
            "greedy text of tp1 differs from tp2's (bfloat16, tp=1 against tp=2): expected in bfloat16; "
            "--dtype float32 checks equality",
        ],
    )
    assert mod.verdict({"tp2": "x", "tp1": "y", "rep2": "y"}, rows, [], "bfloat16")[0] == 0
    assert mod.verdict({"tp1": "x", "tp2": "x"}, rows, [], "float32") == (0, [])
    assert mod.verdict({"tp1": "x"}, rows[:1] + [{"layout": "tp1", "failed": 3}], [], "bfloat16")[0] == 1
    assert mod.verdict({"tp1": "x"}, rows[:1], [{"layout": "tp2", "error": "no endpoint"}], "bfloat16")[0] == 1
    assert mod.verdict({}, [], [], "bfloat16") == (1, [])


def test_multi_gpu_bench_spreads_the_load_over_client_processes():
    """benchmark/gpu/multi_gpu.py renders its llmlaunch-bench command: by default a quarter of the host's CPUs as client
    processes (one cannot keep up with 128 streams), never more than the requests in flight, one stream each."""
    import argparse

    mod = _script("gpu.multi_gpu")
    assert mod.client_processes(0, 128, 32) == 8 and mod.client_processes(0, 1, 32) == 1
    assert mod.client_processes(0, 128, 2) == 1 and mod.client_processes(12, 128, 2) == 12
    assert mod.client_processes(12, 4, 32) == 4
    args = argparse.Namespace(num_prompts=0, client_processes=3, input_len=128, output_len=64, tokenizer="/m")
    argv, prompts, processes = mod.bench_argv("h:8001", "hf_model", args, 64, Path("/tmp/r.json"))
    assert (prompts, processes) == (256, 3)

    def value(flag):
        return argv[argv.index(flag) + 1]

    assert [value(f) for f in ("--concurrency", "--processes", "--streams", "--num-prompts", "--warmup")] == [
        "64",
        "3",
        "1",
        "256",
        "64",
    ]
    assert value("--tokenizer") == "/m" and value("--output-len") == "64" and "--ignore-eos" in argv


_ROLE_TREE = r"""
import subprocess, sys, time
py = sys.executable
burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\nprint('ok', flush=True)\ntime.sleep(120)"
kids = [subprocess.Popen(["bash", "-c", 'exec -a triton_python_backend_stub "$1" -c "$0"', burn, py], stdout=subprocess.PIPE),
        subprocess.Popen([py, "-c", burn, "-m", "launcher.hf.multiplexer", "3"], stdout=subprocess.PIPE),
        subprocess.Popen([py, "-c", burn], stdout=subprocess.PIPE)]
t = time.process_time()
while time.process_time() - t < 0.2:
    pass
for k in kids:
    k.stdout.readline()
print("ready", flush=True)
time.sleep(120)
"""


def test_server_cpu_by_role_puts_each_process_of_a_real_tree_in_its_role():
    """launcher.testing.processes.server_cpu_by_role over a real process tree named as a tritonserver's is: the root
    (the server), a process whose argv[0] is the python backend's stub, one running `-m launcher.hf.multiplexer`
    (the hf engine process) and one more.  Each burns 0.2 s of CPU and each lands in its own role, whatever the clock
    tick (a served test run is too short for that: a stub may use less than a tick)."""
    import os
    import signal
    import subprocess
    import sys

    from launcher.testing.processes import SERVER_ROLES, server_cpu_by_role

    root = subprocess.Popen(
        [sys.executable, "-c", _ROLE_TREE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert root.stdout.readline().strip() == "ready"
        roles = server_cpu_by_role(root.pid)
        assert tuple(roles) == SERVER_ROLES
        for role in SERVER_ROLES:  # 0.2 s each, read as clock ticks (10 ms)
            assert 0.15 <= roles[role] < 1.0, roles
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()


def test_overhead_loads_repeat_each_load_per_client_process_count():
    """launcher.bench.loads.make_loads (benchmark/overhead.py --client-processes 8 16): every load once per count,
    side by side, so that each count's served runs have in-process runs of their own on the same arrivals; a closed
    loop has at most C clients (C=1 once), and an open loop's arrivals are the same for either count (one schedule,
    split between the processes)."""
    import argparse

    from launcher.bench.loads import make_loads
    from launcher.bench.runner import arrival_times

    args = argparse.Namespace(concurrency=[1, 32], requests_per_stream=2, request_rate=[250.0], open_seconds=4.0)
    loads = make_loads(args, [8, 16])
    assert [(x.concurrency, x.rate, x.processes, x.requests) for x in loads] == [
        (1, 0.0, 1, 2),
        (32, 0.0, 8, 64),
        (32, 0.0, 16, 64),
        (0, 250.0, 8, 1000),
        (0, 250.0, 16, 1000),
    ]
    assert [x.label() for x in loads[2:4]] == ["C=32, 16 client processes", "rate=250/s, 8 client processes"]
    eight, sixteen = loads[3].arrivals(), loads[4].arrivals()
    assert eight == arrival_times(loads[3].open_spec(), 1000) == sixteen and len(set(eight)) == 1000
    (one,) = make_loads(
        argparse.Namespace(concurrency=[], requests_per_stream=2, request_rate=[250.0], open_seconds=4.0), [8]
    )
    assert one.label() == "rate=250/s" and one.arrivals() == eight  # one count: labels as before


def test_in_process_latency_gives_a_requests_mean_gap_and_the_median_gap_apart():
    """benchmark/overhead_paths.latency_stats: itl_ms_p50 is the p50 over requests of a request's mean gap between
    tokens (TPOT in vLLM's and llmlaunch-bench's tables), gap_itl_ms_p50 the p50 over every gap (their ITL): a
    request that waits one long step among short ones moves the first and not the second."""
    mod = _script("overhead_paths")
    # (TTFT s, the receive time of each output carrying tokens, tokens): A waits 80 ms once, B never
    per_request = [(0.005, [0.0, 0.01, 0.02, 0.10], 4), (0.005, [0.0, 0.01, 0.02], 3)]
    stats = mod.latency_stats(per_request, wall=0.2)
    assert stats["itl_ms_p50"] == 33.333  # A's mean gap, 100 ms / 3 (the upper of the two requests' 10 and 33.3)
    assert stats["gap_itl_ms_p50"] == 10.0  # gaps 10, 10, 10, 10, 80 ms
    assert stats["ttft_ms_p50"] == 5.0
    assert mod.latency_stats([(0.005, [0.0], 1)], wall=0.1)["gap_itl_ms_p50"] is None  # one token: no gap


def test_overhead_table_has_a_line_per_load():
    """benchmark/overhead.py's table (benchmark/overhead_report.py): a line per load (an open loop labelled by its rate, a closed one C=N) with each
    path's tokens/s and ratio to in-process, the TTFT serving adds as the JSON has it, the served first token's
    parts, ITL and requests in flight in-process / served, and the server's CPU a token by role; "-" where a run has
    no figure.  Without the served path the served columns are left out."""
    mod = _script("overhead_report")

    def path(prefix, tps, p50, itl, in_flight):
        return {
            f"{prefix}_tokens_per_s": tps,
            f"{prefix}_ttft_ms_p50": p50,
            f"{prefix}_itl_ms_p50": itl,
            f"{prefix}_in_flight_mean": in_flight,
        }

    split = {
        "parse": 0.11,
        "add": 0.43,
        "engine": 5.26,
        "back": 0.25,
        "respond": 0.34,
        "send": 0.27,
        "inside_server": 6.66,
        "outside_server": 1.0,
    }
    roles = {"tritonserver": 61.2, "stubs": 29.0, "engine": 198.4, "other": 0.0}
    rate = {
        "request_rate": 240.0,
        "concurrency": None,
        **path("direct", 30000.0, 5.014, 2.984, 77.13),
        **path("process", 29900.0, 5.5, 2.99, 77.5),
        **path("served", 29988.0, 7.077, 3.012, 77.955),
        "process_ratio": 0.9967,
        "ratio": 0.9996,
        "ttft_added_ms_p50": 2.063,
        "served_first_token_ms": split,
        "cpu_us_per_token": {"server_by_role": roles},
    }
    closed = dict(rate, request_rate=None, concurrency=8, served_vs_generate=2.5013, served_first_token_ms=None)
    doc = {"paths": ["direct", "process", "served"], "runs": [closed, rate]}
    head, c8, r240 = mod.table(doc).splitlines()
    assert head.split()[0] == "load" and "TTFT p50 in/served" in head and "send" in head.split()
    assert head.split().index("send") == head.split().index("respond") + 1
    assert c8.split()[0] == "C=8" and r240.split()[0] == "240/s"
    cells = r240.split()
    assert cells[1:6] == ["30000.0", "29900.0", "29988.0", "0.997", "1.000"]
    assert "2.06" in cells and cells[cells.index("0.34") + 1] == "0.27"  # send, after respond
    assert cells[-1] == "61+29+198" and cells[-2] == "-"  # no static generate at a rate
    assert c8.split()[-2] == "2.501" and c8.split().count("-") == 7  # no first-token split: its six parts and outside
    assert "2.984 / 3.012" in r240 and "77.1 / 78.0" in r240
    alone = mod.table({"paths": ["direct"], "runs": [path("direct", 500.0, 1.5, 2.0, 1.0) | {"concurrency": 1}]})
    head, line = alone.splitlines()
    assert "TTFT p50 in/served" not in head and line.split()[:2] == ["C=1", "500.0"]


def test_arrival_times_are_one_schedule_whatever_the_processes():
    """Request i is due at the i-th time of one seeded schedule (first at 0, gaps of mean 1 / rate), whichever process
    sends it: 1, 3 or 16 processes offer the same arrivals (one Poisson stream, no burst of P requests at 0); a
    shorter run's schedule is a prefix, each process's share (rank, rank + P, ...) is a slice of it, and the seed
    and burstiness change it."""
    import itertools

    from launcher.bench.runner import LoadSpec, arrival_schedule, arrival_times

    spec = LoadSpec(request_rate=300.0, processes=3, seed=5)
    times = arrival_times(spec, 9000)  # crosses the schedule's chunks of 4,096 draws
    assert times == arrival_times(spec, 9000) == arrival_times(LoadSpec(request_rate=300.0, processes=16, seed=5), 9000)
    assert times[0] == 0.0 and all(b > a for a, b in zip(times, times[1:]))
    assert arrival_times(spec, 30) == times[:30]
    mine = list(itertools.islice(arrival_schedule(300.0, 1.0, 5), 1, 3000, 3))  # process 1 of 3
    assert mine == times[1:3000:3]
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert statistics.mean(gaps) == pytest.approx(1 / 300, rel=0.05)
    assert statistics.pstdev(gaps) == pytest.approx(1 / 300, rel=0.1)  # exponential: sd = mean
    assert arrival_times(LoadSpec(request_rate=300.0, seed=6), 30) != times[:30]
    bursty = arrival_times(LoadSpec(request_rate=300.0, burstiness=0.25, seed=5), 9000)
    bursty_gaps = [b - a for a, b in zip(bursty, bursty[1:])]
    assert statistics.mean(bursty_gaps) == pytest.approx(1 / 300, rel=0.1)
    assert statistics.pstdev(bursty_gaps) == pytest.approx(2 / 300, rel=0.15)  # gamma shape 1/4: sd = 2 x mean
    assert arrival_times(LoadSpec(concurrency=4), 3) == [0.0, 0.0, 0.0]  # no pacing: all at once


def test_synthetic_prompts_have_the_asked_tokens_of_the_tokenizer(tmp_path):
    """--input-len 128 sends 128 tokens: random ids decoded encode back to many more (~200 with this byte-level
    tokenizer, as with Llama 3's), so the text is brought to the length in the tokenizer's own count."""
    from transformers import AutoTokenizer

    from launcher.tiny import build_tokenizer

    build_tokenizer(1000).save_pretrained(tmp_path)
    tokens = datasets.TokenCounter(str(tmp_path))
    fixed = datasets.load_synthetic(16, tokens, seed=2, input_len=128, output_len=8)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert [len(again(s.prompt, add_special_tokens=False).input_ids) for s in fixed] == [128] * 16
    assert {s.prompt_len for s in fixed} == {128} and len({s.prompt for s in fixed}) == 16
    ranged = datasets.load_synthetic(32, tokens, seed=3, input_len=40, range_ratio=0.5)
    assert all(len(again(s.prompt, add_special_tokens=False).input_ids) == s.prompt_len for s in ranged)
    assert all(20 <= s.prompt_len <= 60 for s in ranged) and len({s.prompt_len for s in ranged}) > 3


def test_the_ready_bench_command_is_a_synthetic_run_of_the_bench(tmp_path, monkeypatch):
    """The `bench:` line llmlaunch prints at READY parses as llmlaunch-bench's arguments and reads no file."""
    import shlex
    import sys

    from launcher.bench.cli import build_parser
    from launcher.schedulers.base import bench_command

    argv = shlex.split(bench_command("grpc://127.0.0.1:8001", "hf_model"))
    assert argv[:3] == [sys.executable, "-m", "launcher.bench"]
    args = build_parser().parse_args(argv[3:])
    monkeypatch.chdir(tmp_path)
    kind = datasets.detect_kind(args.dataset) if args.dataset_name == "auto" else args.dataset_name
    assert (kind, args.input_len, args.url, args.model) == ("synthetic", 128, "grpc://127.0.0.1:8001", "hf_model")
    samples = datasets.load(kind, args.dataset, args.num_prompts, datasets.TokenCounter(), input_len=args.input_len)
    assert len(samples) == args.num_prompts


def test_dataset_synthetic_names_the_synthetic_kind_unless_such_a_file_is_there(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert datasets.detect_kind("synthetic") == "synthetic"
    (tmp_path / "synthetic").write_text("not json")
    with pytest.raises(ValueError, match="cannot read dataset synthetic"):
        datasets.detect_kind("synthetic")


def test_reported_tokens_are_the_servers_counts_where_it_sends_them():
    from launcher.client.response import StreamRecord

    def payload(text: str) -> bytes:  # a raw BYTES tensor of one element, as the client receives text_output
        return len(text.encode()).to_bytes(4, "little") + text.encode()

    sample = datasets.Sample("a b c", prompt_len=3, output_len=4)
    chunks = [payload("hello"), payload(" world")]
    counted = StreamRecord("r0", sent=0.0, times=[0.1, 0.2], chunks=chunks, input_tokens=129, output_tokens=4)
    r = metrics.from_record(0, sample, counted, 0.0, datasets.TokenCounter())
    assert (r.input_tokens, r.output_tokens, r.output_tokens_source) == (129, 4, "server")
    silent = StreamRecord("r1", sent=0.0, times=[0.1, 0.2], chunks=chunks)
    r = metrics.from_record(0, sample, silent, 0.0, datasets.TokenCounter())
    assert (r.input_tokens, r.output_tokens, r.output_tokens_source) == (
        3,
        datasets.estimate_tokens("hello world"),
        "estimate",
    )


def test_the_prefix_dataset_shares_each_groups_prefix_and_takes_the_groups_in_turn(tiny_model_dir):
    from launcher.bench import datasets

    tokens = datasets.TokenCounter(str(tiny_model_dir))
    samples = datasets.load("prefix", None, 12, tokens, seed=1, input_len=10, prefix_groups=3, prefix_len=40)
    assert len(samples) == 12 and all(s.output_len == 128 for s in samples)
    heads = [s.prompt[:60] for s in samples]
    assert heads[0] == heads[3] == heads[6] == heads[9] and len({heads[0], heads[1], heads[2]}) == 3
    assert len({s.prompt for s in samples}) == 12  # every request its own suffix
    assert all(45 <= s.prompt_len <= 55 for s in samples), [
        s.prompt_len for s in samples
    ]  # 40 + 10, give or take a join


def test_a_multi_turn_conversation_sends_its_whole_history_turn_by_turn(tmp_path):
    import json

    from launcher.bench import datasets

    tokens = datasets.TokenCounter()
    synthetic = datasets.load("multiturn", None, 6, tokens, seed=0, input_len=5, output_len=7, turns=3)
    assert len(synthetic) == 6  # two conversations of three turns, turn by turn
    first, second = synthetic[0], synthetic[2]  # conversation 0, turns 1 and 2
    assert second.prompt.startswith(first.prompt) and first.prompt.endswith("Assistant:")
    assert second.prompt_len > first.prompt_len and all(s.output_len == 7 for s in synthetic)
    # each turn carries its conversation's id, which the clients send (the session_id parameter, X-Session-ID)
    assert [s.session for s in synthetic] == ["s0-c0", "s0-c1"] * 3
    assert datasets.load("multiturn", None, 2, tokens, seed=5, turns=1)[0].session == "s5-c0"
    assert datasets.load("synthetic", None, 2, tokens, input_len=5)[0].session is None
    sharegpt = tmp_path / "chat.json"
    conv = [{"from": "human" if i % 2 == 0 else "gpt", "value": f"message {i} " * (i + 1)} for i in range(6)]
    sharegpt.write_text(json.dumps([{"conversations": conv}, {"conversations": conv[:2]}]))
    turns = datasets.load("multiturn", str(sharegpt), None, tokens, turns=3, max_total_len=10_000)
    assert len(turns) == 4  # 3 turns of the first conversation, 1 of the second, turn by turn
    assert turns[0].reference == "message 1 " * 2 and turns[2].prompt.startswith(turns[0].prompt)
    assert "message 3" in turns[3].prompt and turns[3].output_len == tokens.count("message 5 " * 6)
