"""launcher.python_backend.timings: the engine and first-token counters read back from a Prometheus metrics text (no
server). The hf model exposing them under a real tritonserver: tests/integration/test_hf_serving.py."""

import pytest


def test_read_engine_metrics_maps_counters_to_engine_fields():
    from launcher.python_backend.timings import read_engine_metrics

    text = """# TYPE llmlaunch_engine_seconds counter
llmlaunch_engine_seconds{model="a",part="step"} 2.5
llmlaunch_engine_seconds{model="a",part="launch"} 0.5
llmlaunch_engine_seconds{model="a",part="gpu_idle"} 0.01
llmlaunch_engine_seconds{model="b",part="step"} 7
llmlaunch_engine_steps{model="a",kind="all"} 1000
llmlaunch_engine_steps{model="a",kind="ahead"} 900
llmlaunch_engine_steps{model="a",kind="prompt_graph"} 12
llmlaunch_engine_steps{model="a",kind="mixed"} 5
llmlaunch_engine_tokens{model="a",kind="decode"} 64000
llmlaunch_first_tokens{model="a"} 10
"""
    a = read_engine_metrics(text, "a")
    assert a["wall_s"] == 2.5 and a["launch_s"] == 0.5 and a["gpu_idle_s"] == 0.01 and a["wait_s"] == 0
    assert a["steps"] == 1000 and a["ahead_steps"] == 900 and a["decode_tokens"] == 64000
    assert a["prompt_graph_steps"] == 12 and a["mixed_steps"] == 5
    assert read_engine_metrics(text)["wall_s"] == 9.5


def test_read_first_token_metrics_sums_one_model_and_skips_the_rest():
    from launcher.python_backend.timings import mean_first_token_ms, read_first_token_metrics

    text = """# HELP llmlaunch_first_token_seconds seconds ...
# TYPE llmlaunch_first_token_seconds counter
llmlaunch_first_token_seconds{model="a",part="parse"} 0.001
llmlaunch_first_token_seconds{model="a",part="add"} 0.002
llmlaunch_first_token_seconds{model="a",part="engine"} 0.5
llmlaunch_first_token_seconds{model="a",part="back"} 0.003
llmlaunch_first_token_seconds{model="a",part="respond"} 1e-2
llmlaunch_first_token_seconds{model="a",part="send"} 0.004
llmlaunch_first_token_seconds{model="b",part="engine"} 9
llmlaunch_first_tokens{model="a"} 10
llmlaunch_first_tokens{model="b"} 3
nv_inference_count{model="a",version="1"} 77
"""
    a = read_first_token_metrics(text, "a")
    assert a == {
        "count": 10,
        "parse": 0.001,
        "add": 0.002,
        "engine": 0.5,
        "back": 0.003,
        "respond": 0.01,
        "send": 0.004,
    }
    assert read_first_token_metrics(text)["count"] == 13
    zero = read_first_token_metrics("", "a")
    assert mean_first_token_ms(zero, a) == {
        "parse": 0.1,
        "add": 0.2,
        "engine": 50.0,
        "back": 0.3,
        "respond": 1.0,
        "send": 0.4,
        "inside_server": 52.0,
        "requests": 10,
    }
    assert mean_first_token_ms(a, a) is None


def metrics_server(text):
    """A real HTTP server answering every GET with `text` (a tritonserver's /metrics); (server, its URL)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f"http://127.0.0.1:{srv.server_address[1]}/metrics"


def test_several_servers_metrics_are_summed():
    """With replicas the bench reads every replica leader's server (comma-separated URLs): the totals are the job's."""
    from launcher.python_backend.timings import fetch_engine_metrics, fetch_first_token_metrics

    server = metrics_server
    a, url_a = server(
        'llmlaunch_first_tokens{model="m"} 4\nllmlaunch_first_token_seconds{model="m",part="engine"} 0.4\n'
        'llmlaunch_engine_prompt_tokens{model="m",kind="admitted"} 1000\n'
        'llmlaunch_engine_prompt_tokens{model="m",kind="cached"} 600\n'
    )
    b, url_b = server(
        'llmlaunch_first_tokens{model="m"} 6\nllmlaunch_first_token_seconds{model="m",part="engine"} 0.2\n'
        'llmlaunch_engine_prompt_tokens{model="m",kind="admitted"} 1000\n'
    )
    try:
        first = fetch_first_token_metrics(f"{url_a}, {url_b}", "m")
        assert first["count"] == 10 and abs(first["engine"] - 0.6) < 1e-9
        engine = fetch_engine_metrics(f"{url_a},{url_b}", "m")
        assert engine["prompt_tokens"] == 2000 and engine["cached_prompt_tokens"] == 600
        assert fetch_first_token_metrics(url_a, "m")["count"] == 4
    finally:
        a.shutdown()
        b.shutdown()


def test_the_front_ends_page_shows_each_replicas_engine_prompt_tokens():
    """The front end's /metrics page: its own counters, then per replica the prompt tokens its engine admitted and
    served from its prefix cache, read from the replica leader's metrics as the page is asked for; a replica whose
    metrics cannot be read, or that has none, or no URL, is left out (the page still answers)."""
    import asyncio

    from launcher.frontend.metrics import with_engines
    from launcher.ports import free_port

    a, url_a = metrics_server(
        'llmlaunch_engine_prompt_tokens{model="m",kind="admitted"} 1000\n'
        'llmlaunch_engine_prompt_tokens{model="m",kind="cached"} 600\n'
    )
    b, url_b = metrics_server('llmlaunch_first_tokens{model="m"} 6\n')  # an engine that counts no prompt tokens
    down = f"http://127.0.0.1:{free_port()}/metrics"
    addrs = ["h:1", "h:2", "h:3", "h:4"]
    try:
        page = with_engines(lambda: "own 1\n", addrs, [url_a, url_b, down, ""])
        text = asyncio.run(page())
    finally:
        a.shutdown()
        b.shutdown()
    assert text.startswith("own 1\n"), text
    rows = [ln for ln in text.splitlines() if ln.startswith("llmlaunch_frontend_replica_prompt_tokens_total{")]
    assert rows == [
        'llmlaunch_frontend_replica_prompt_tokens_total{replica="0",addr="h:1",kind="admitted"} 1000',
        'llmlaunch_frontend_replica_prompt_tokens_total{replica="0",addr="h:1",kind="cached"} 600',
    ], text
    assert asyncio.run(with_engines(lambda: "own\n", addrs, ["", "", "", ""])()) == "own\n"


def test_the_front_ends_page_shows_the_keys_and_values_each_decode_replica_moved():
    """With disaggregated serving, a decode replica's engine counts its transfers from prefill replicas
    (llmlaunch_kv_transfer*): the front end's page shows them per replica; replicas that moved none have no lines."""
    import asyncio

    from launcher.frontend.metrics import with_engines

    prefill, url_p = metrics_server('llmlaunch_engine_prompt_tokens{model="m",kind="admitted"} 300\n')
    decode, url_d = metrics_server(
        'llmlaunch_kv_transfers{model="m",kind="done"} 3\n'
        'llmlaunch_kv_transfers{model="m",kind="failed"} 1\n'
        'llmlaunch_kv_transfer_bytes{model="m"} 196608\n'
        'llmlaunch_kv_transfer_seconds{model="m"} 0.006\n'
    )
    try:
        text = asyncio.run(with_engines(lambda: "", ["h:1", "h:2"], [url_p, url_d])())
    finally:
        prefill.shutdown()
        decode.shutdown()
    rows = [ln for ln in text.splitlines() if ln.startswith("llmlaunch_frontend_replica_kv_")]
    assert rows == [
        'llmlaunch_frontend_replica_kv_transfers_total{replica="1",addr="h:2",kind="done"} 3',
        'llmlaunch_frontend_replica_kv_transfers_total{replica="1",addr="h:2",kind="failed"} 1',
        'llmlaunch_frontend_replica_kv_transfer_bytes_total{replica="1",addr="h:2"} 196608',
        'llmlaunch_frontend_replica_kv_transfer_seconds_total{replica="1",addr="h:2"} 0.006',
    ], text


class _FakeModel:
    """A served model's first-token counters as its /metrics text says them, moved by the requests a fake load
    sends: `serve(n, engine_s)` counts n first tokens of engine_s each (the other parts 0)."""

    def __init__(self):
        self.count, self.engine = 0, 0.0

    def serve(self, n: int, engine_s: float) -> None:
        self.count += n
        self.engine += n * engine_s

    def text(self, url=None, timeout=None) -> str:
        return (
            f'llmlaunch_first_token_seconds{{model="m",part="engine"}} {self.engine}\n'
            f'llmlaunch_first_tokens{{model="m"}} {self.count}\n'
        )


def test_the_first_token_split_is_taken_over_the_measured_requests_on_both_sides(monkeypatch):
    """llmlaunch-bench --server-metrics: the model counts every streamed request's first token, the warm-up's too,
    while the client's mean TTFT is over the measured requests alone.  The model's totals are read once the warm-up
    has ended, so the two means are over the same requests and the parts add up to the client's mean: here a slow
    warm-up (100 ms in the engine) before 32 requests of 5 ms in the engine and 7 ms at the client leaves 2 ms
    outside the model, not a negative part."""
    import launcher.bench.cli as cli
    from launcher.bench import datasets
    from launcher.bench.runner import RunOutput
    from launcher.client.response import StreamRecord
    from launcher.python_backend import timings

    model = _FakeModel()
    monkeypatch.setattr(timings, "fetch_metrics_text", model.text)
    monkeypatch.setattr(timings, "settle", lambda read, *a, **k: read())  # the fake's totals are settled at once
    monkeypatch.setattr(cli, "_request_parameters", lambda args, url, name: {})

    def run_load(job, progress=None, after_warmup=None):
        model.serve(job.spec.warmup, 0.100)  # the warm-up: a cold start, every prompt at once
        if after_warmup is not None:
            after_warmup()
        model.serve(job.spec.num_requests, 0.005)
        text = b"\x02\x00\x00\x00hi"
        recs = [
            (i, StreamRecord(f"r{i}", sent=i, times=[i + 0.007, i + 0.01], chunks=[text, b""], output_tokens=2))
            for i in range(job.spec.num_requests)
        ]
        return RunOutput(recs, 0.0, [])

    monkeypatch.setattr(cli, "run_load", run_load)
    args = cli.build_parser().parse_args(
        ["--url", "localhost:1", "--dataset-name", "synthetic", "--input-len", "8", "--output-len", "2"]
        + ["--num-prompts", "32", "--concurrency", "1", "--warmup", "1", "--ignore-eos", "--no-progress"]
        + ["--server-metrics", "http://127.0.0.1:1/metrics"]
    )
    args.argv = []
    samples, kind, tokens = cli.prepare(args)
    assert isinstance(tokens, datasets.TokenCounter)
    doc = cli.bench_one(args, "localhost:1", "m", samples, kind, tokens, server_metrics=args.server_metrics)
    split = doc["server_first_token_ms"]
    client = doc["metrics"]["ttft_ms"]["mean"]
    assert client == pytest.approx(7.0)
    assert split["requests"] == split["client_requests"] == 32, split
    assert split["engine"] == pytest.approx(5.0) and split["outside_server"] == pytest.approx(2.0), split
    assert split["inside_server"] + split["outside_server"] == pytest.approx(client)


def test_a_disaggregated_runs_first_token_split_shows_each_role_and_what_lies_outside_both(monkeypatch):
    """llmlaunch-bench --server-metrics P,D --prefill-metrics P: a request's first token is a prefill replica's
    one-token request, then its decode replica's; the decode replica's parts are the split's rows, the prefill
    replica's inside sits under "prefill", and outside = the client's mean TTFT minus both (the front end's two legs,
    gRPC, the client): 20 ms prefill + 3 ms decode of a 25 ms TTFT leave 2 ms.  A prefill that failed (its decode
    computed the prompt) makes the counts differ, and outside is then not split."""
    import launcher.bench.cli as cli
    from launcher.bench.metrics import format_first_token_split
    from launcher.bench.runner import RunOutput
    from launcher.client.response import StreamRecord
    from launcher.python_backend import timings

    pre, dec = _FakeModel(), _FakeModel()
    servers = {"http://p/metrics": pre, "http://d/metrics": dec}
    text = lambda url, timeout=None: "\n".join(servers[u].text() for u in url.split(","))  # noqa: E731
    monkeypatch.setattr(timings, "fetch_metrics_text", text)
    monkeypatch.setattr(timings, "settle", lambda read, *a, **k: read())
    monkeypatch.setattr(cli, "_request_parameters", lambda args, url, name: {})
    lost = []  # requests whose prefill failed: the decode replica counts them, the prefill replica does not

    def run_load(job, progress=None, after_warmup=None):
        pre.serve(job.spec.warmup, 0.5)
        dec.serve(job.spec.warmup, 0.5)
        after_warmup()
        n = job.spec.num_requests
        pre.serve(n - len(lost), 0.020)
        dec.serve(n, 0.003)
        chunk = b"\x02\x00\x00\x00hi"
        recs = [
            (i, StreamRecord(f"r{i}", sent=i, times=[i + 0.025, i + 0.03], chunks=[chunk, b""], output_tokens=2))
            for i in range(n)
        ]
        return RunOutput(recs, 0.0, [])

    monkeypatch.setattr(cli, "run_load", run_load)
    argv = ["--url", "localhost:1", "--dataset-name", "synthetic", "--input-len", "8", "--output-len", "2"]
    argv += ["--num-prompts", "16", "--concurrency", "1", "--warmup", "1", "--ignore-eos", "--no-progress"]
    argv += ["--server-metrics", "http://p/metrics,http://d/metrics", "--prefill-metrics", "http://p/metrics"]
    args = cli.build_parser().parse_args(argv)
    args.argv = []
    samples, kind, tokens = cli.prepare(args)

    def split():
        doc = cli.bench_one(
            args,
            "localhost:1",
            "m",
            samples,
            kind,
            tokens,
            server_metrics=args.server_metrics,
            prefill_metrics=args.prefill_metrics,
        )
        return doc["server_first_token_ms"]

    got = split()
    assert got["engine"] == pytest.approx(3.0) and got["requests"] == 16, got
    assert got["prefill"]["inside_server"] == pytest.approx(20.0) and got["prefill"]["requests"] == 16, got
    assert got["outside_server"] == pytest.approx(2.0), got
    shown = format_first_token_split(got)
    assert "prefill replica, inside (ms):" in shown and "front end, gRPC, client (ms):" in shown, shown
    lost.append(0)
    got = split()
    assert got["prefill"]["requests"] == 15 and got["outside_server"] is None, got
    assert "not split" in format_first_token_split(got)


def test_prefill_metrics_must_name_some_of_the_server_metrics_servers():
    """--prefill-metrics without --server-metrics, or naming every one of its servers, is refused before any
    request, naming the value and the fix."""
    import launcher.bench.cli as cli

    base = ["--url", "localhost:1", "--dataset-name", "synthetic", "--num-prompts", "1"]
    for extra, why in (
        (["--prefill-metrics", "http://p/metrics"], "--server-metrics is not given"),
        (["--server-metrics", "http://p/metrics", "--prefill-metrics", "http://p/metrics"], "no decode replica"),
    ):
        args = cli.build_parser().parse_args(base + extra)
        with pytest.raises(ValueError, match=why):
            cli._check_prefill_metrics(args)
    assert cli.decode_metrics("http://p/m, http://d/m", "http://p/m") == "http://d/m"


def test_the_first_token_split_leaves_outside_unsplit_where_the_model_counted_other_requests(monkeypatch):
    """Means over different requests do not subtract: where the model counted more first tokens than the client
    timed (another client's, a warm-up counted late), `outside_server` is None, said so under the table."""
    from launcher.bench.metrics import format_first_token_split
    from launcher.python_backend import timings

    model = _FakeModel()
    monkeypatch.setattr(timings, "fetch_metrics_text", model.text)
    before = timings.fetch_first_token_metrics("u", "m")
    model.serve(33, 0.005)
    split = timings.first_token_split("u", "m", before, 32, 7.0, wait_s=0)
    assert split["requests"] == 33 and split["client_requests"] == 32 and split["outside_server"] is None
    assert "not split" in format_first_token_split(split)
    model.serve(0, 0)
    exact = timings.first_token_split("u", "m", timings.fetch_first_token_metrics("u", "m"), 0, 7.0, wait_s=0)
    assert exact is None  # nothing counted between


def test_after_warmup_runs_between_the_warmup_and_the_first_measured_request(monkeypatch):
    """launcher.bench.runner.run_load(after_warmup=): called once, after the warm-up's requests ended and before the
    measured ones are sent (one client process; several: once every process is ready, before the start instant)."""
    from launcher.bench import runner

    calls = []

    class Driver:
        def __init__(self, job):
            pass

        def warmup(self):
            calls.append("warmup")
            return []

        def counts(self, state):
            return 0, 0, 0

        def run(self, start_at, queue=None):
            calls.append("run")
            return []

        def close(self):
            calls.append("close")

    monkeypatch.setattr(runner, "_Driver", Driver)
    job = runner.Job("u", "m", [], runner.LoadSpec(concurrency=1, num_requests=1, warmup=1))
    runner.run_load(job, after_warmup=lambda: calls.append("after_warmup"))
    assert calls == ["warmup", "after_warmup", "run", "close"]


def test_kv_transfers_are_read_back_as_transfers_bytes_and_time_and_none_without_any():
    from launcher.python_backend.cache_splits import format_kv_transfer, kv_transfer_split
    from launcher.python_backend.timings import read_engine_metrics

    text = """llmlaunch_kv_transfers{model="a",kind="done"} 4
llmlaunch_kv_transfers{model="a",kind="failed"} 1
llmlaunch_kv_transfer_bytes{model="a"} 268435456
llmlaunch_kv_transfer_seconds{model="a"} 0.02
"""
    after = read_engine_metrics(text, "a")
    split = kv_transfer_split({}, after)
    assert split == {
        "transfers": 4,
        "failed": 1,
        "bytes": 268435456,
        "mib": 256.0,
        "mib_per_transfer": 64.0,
        "ms_per_transfer": 5.0,
        "gib_per_s": 12.5,
    }
    assert format_kv_transfer(split) == "4 transfers (1 failed), 64.00 MiB and 5.000 ms each, 12.5 GiB/s"
    assert kv_transfer_split(after, after) is None
    assert kv_transfer_split({}, read_engine_metrics("", "a")) is None


def test_vllms_connector_statistics_add_up_per_transfer_also_inside_a_multi_connector():
    """SchedulerStats.kv_connector_stats as vLLM 0.25 sends it: NixlKVConnectorStats.data (lists, one entry a
    transfer), or a MultiConnector's mapping of such by connector."""
    from launcher.python_backend.counters import KVTransfers

    moved = KVTransfers()
    nixl = {
        "transfer_duration": [0.001, 0.003],
        "post_duration": [0.0001, 0.0001],
        "bytes_transferred": [1024, 3072],
        "num_descriptors": [8, 8],
        "num_failed_transfers": [1],
        "num_failed_notifications": [],
        "num_kv_expired_reqs": [],
    }
    moved.add_vllm(nixl)
    moved.add_vllm({"NixlConnector": nixl, "LMCacheConnector": {"hits": 3}})
    moved.add_vllm(None)
    got = moved.totals_map()
    assert (got["kv_transfers"], got["kv_transfer_failures"], got["kv_transfer_bytes"]) == (4, 2, 8192)
    assert got["kv_transfer_s"] == pytest.approx(0.008)


def _vllm_step(running, waiting=0, skipped=0, graph=None, kv_usage=0.5):
    """SchedulerStats as vLLM 0.25's scheduler makes it (make_stats), reduced to what the model reads; `graph`
    (tokens, runtime mode): its CUDAGraphStat, which only cudagraph_metrics=True adds."""
    from types import SimpleNamespace

    cudagraph = None
    if graph is not None:
        tokens, mode = graph
        cudagraph = SimpleNamespace(
            num_unpadded_tokens=tokens, num_padded_tokens=tokens + 1, num_paddings=1, runtime_mode=mode
        )
    return SimpleNamespace(
        num_running_reqs=running,
        num_waiting_reqs=waiting,
        num_skipped_waiting_reqs=skipped,
        kv_cache_usage=kv_usage,
        kv_connector_stats=None,
        cudagraph_stats=cudagraph,
    )


def _vllm_outputs(generated, computed=None, total=0, first=0):
    """IterationStats of one batch of outputs as vLLM 0.25's output processor fills it: tokens generated, the
    prompts that finished their prefill (PromptTokenStats; None: a vLLM without the breakdown) and their first
    tokens' latencies."""
    from types import SimpleNamespace

    out = SimpleNamespace(num_generation_tokens=generated, num_prompt_tokens=total)
    if computed is not None:
        out.prompt_token_stats = SimpleNamespace(computed=computed, cached_tokens=total - computed, total=total)
        out.time_to_first_tokens_iter = [0.05] * first
    return out


def test_vllms_engine_steps_add_up_from_the_stat_loggers_calls():
    """counters.EngineSteps.add_vllm with what vLLM 0.25's output handler gives a stat logger: a step for each
    SchedulerStats (a batch without them is none), running and waiting requests summed, each batch's generated
    tokens less its first tokens as decode tokens and its computed prompt tokens as prefill tokens, and the steps with
    a CUDAGraphStat by runtime mode (an unknown mode as none)."""
    from launcher.python_backend.counters import EngineSteps

    steps = EngineSteps()
    steps.add_vllm(_vllm_step(3, waiting=1, skipped=1, graph=(3, "FULL")), _vllm_outputs(3, computed=0))
    # two prompts finish their prefill beside 2 decode rows; 16 of their 48 tokens came from the prefix cache
    steps.add_vllm(_vllm_step(4, graph=(34, "PIECEWISE")), _vllm_outputs(4, computed=32, total=48, first=2))
    steps.add_vllm(_vllm_step(4), None)  # a step without outputs, and without cudagraph_metrics
    # an older vLLM: no prompt breakdown (the prompts' total counts), no first tokens' list; a mode it may add
    steps.add_vllm(_vllm_step(3, graph=(4, "FULL_DECODE_ONLY")), _vllm_outputs(4, total=10))
    steps.add_vllm(None, _vllm_outputs(1, computed=0))  # outputs of a batch without scheduler statistics
    steps.add_vllm(None, None)
    assert steps.totals_map() == {
        "steps": 4,
        "running_sum": 14,
        "waiting_sum": 2,
        "decode_tokens": 3 + 2 + 4 + 1,
        "prefill_tokens": 32 + 10,
        "scheduled_tokens": 3 + 34 + 4,
        "graph_steps": 3,
        "graph_full_steps": 1,
        "graph_piecewise_steps": 1,
        "graph_none_steps": 1,
    }


def test_vllms_engine_steps_reach_the_metrics_port_and_split_without_step_times():
    """The vLLM model's step counters (VLLM_STEP_COUNTERS, every EngineSteps key) read back from /metrics and split
    into means a step with none of the hf engine's times or shares (vLLM reports none: zeros would read as
    measured); the hf model keeps pushing ENGINE_COUNTERS, none of vLLM's own among them."""
    from launcher.python_backend.counters import EngineSteps
    from launcher.python_backend.timings import (
        ENGINE_COUNTERS,
        VLLM_ONLY_COUNTERS,
        VLLM_STEP_COUNTERS,
        engine_step_split,
        format_engine_split,
        read_engine_metrics,
    )

    assert {row[3] for row in VLLM_STEP_COUNTERS} == set(EngineSteps().totals_map())
    assert not set(VLLM_ONLY_COUNTERS) & set(ENGINE_COUNTERS)
    totals = {
        "steps": 1000,
        "running_sum": 63200,
        "waiting_sum": 400,
        "decode_tokens": 61900,
        "prefill_tokens": 98000,
        "scheduled_tokens": 160000,
        "graph_steps": 1000,
        "graph_full_steps": 880,
        "graph_piecewise_steps": 120,
        "graph_none_steps": 0,
    }
    text = "\n".join(
        f'{family}{{model="m",{label}="{value}"}} {totals[key]}' for family, label, value, key, _ in VLLM_STEP_COUNTERS
    )
    after = read_engine_metrics(text + '\nllmlaunch_engine_prompt_tokens{model="m",kind="admitted"} 5000\n', "m")
    assert {k: after[k] for k in totals} == totals and after["wall_s"] == 0
    split = engine_step_split({}, after)
    assert split == {
        "steps": 1000,
        "decode_rows": 61.9,
        "prefill_tokens": 98.0,
        "running": 63.2,
        "waiting": 0.4,
        "scheduled_tokens": 160.0,
        "graph_full": 0.88,
        "graph_piecewise": 0.12,
        "graph_none": 0.0,
        "prefix_hit_rate": 0.0,
        "cached_prompt_tokens": 0,
    }
    assert format_engine_split(split) == (
        "1000 steps; 63.2 running, 0.4 waiting a step; 61.9 decode rows, 98.0 prompt tokens a step; 160.0 tokens "
        "scheduled a step; CUDA graphs: 88% full, 12% piecewise, 0% none; prefix cache: 0.0% of prompt tokens "
        "(0 cached, not prefilled)"
    )
    # without cudagraph_metrics: no graph shares; a benchmark's wall time a step where it added one
    plain = engine_step_split({}, {k: v for k, v in totals.items() if not k.startswith(("graph", "scheduled"))})
    assert "graph_full" not in plain and "scheduled_tokens" not in plain
    assert format_engine_split({**plain, "wall_step_ms": 12.5}) == (
        "1000 steps, 12.500 ms of the run's wall time a step; 63.2 running, 0.4 waiting a step; 61.9 decode rows, "
        "98.0 prompt tokens a step"
    )
    assert engine_step_split(after, after) is None


def test_llmlaunch_bench_adds_the_runs_wall_time_a_step_where_the_engine_times_none():
    """vLLM's split has no step_ms: llmlaunch-bench adds the measured phase's wall time over one engine's steps (the
    steps of the servers it read shared out among them), which summary.csv's engine_step_ms then shows; the hf
    engine's own step_ms is left alone."""
    from pathlib import Path

    from launcher.bench.report import Point, summary_rows
    from launcher.python_backend.step_splits import with_wall_step

    vllm = {"steps": 400, "decode_rows": 8.0, "prefill_tokens": 1.0}
    assert with_wall_step(vllm, 2.0)["wall_step_ms"] == 5.0
    assert with_wall_step(vllm, 2.0, 2)["wall_step_ms"] == 10.0
    hf = {"steps": 400, "step_ms": 1.5}
    assert with_wall_step(hf, 2.0) == hf and with_wall_step(None, 2.0) is None
    points = [("v", with_wall_step(vllm, 2.0)), ("h", hf), ("none", vllm)]
    rows = summary_rows([Point(Path(p), result={"metrics": {}, "server_engine_steps": s}) for p, s in points])
    assert [r["engine_step_ms"] for r in rows] == ["5", "1.5", ""]
