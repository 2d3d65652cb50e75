"""launcher.python_backend.timings: the engine and first-token counters read back from a Prometheus metrics text (no
server). The hf model exposing them under a real tritonserver: tests/integration/test_hf_serving.py."""


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
