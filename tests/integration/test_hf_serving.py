"""The hf model under a real tritonserver (nvidia-pytriton wheel), driven with tritonclient's gRPC streaming API.

The server starts once for the module; every test checks the model keeps serving afterwards.
"""

from __future__ import annotations

import os
import queue
import re
import time
import uuid
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
grpcclient = pytest.importorskip("tritonclient.grpc")
pytest.importorskip("torch")

from launcher.client.request import Generation, build_inputs  # noqa: E402
from launcher.testing.serve import hf_server  # noqa: E402

MODEL = "hf_model"
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("hf_serving")
    # Two model instances sharing one engine process (engine.response_processes=2), each with the one responder
    # thread launcher.python_backend.responders gives an engine on CPU: the tests with many streams open (32 at once, 5 at
    # once) check that each stream's responses stay whole and in order, and metrics right, whichever instance has
    # it (several threads in one stub: tests/unit/test_hf_responders.py).  On CPU the response path keeps the
    # engine's priority: test_response_path_keeps_the_engine_priority_on_cpu.
    srv = hf_server(
        str(tiny_model_dir),
        workdir,
        {"device": "cpu", "max_num_seqs": 40, "cancel_check_ms": 20},
        model=MODEL,
        instances=2,
        http=True,
    )
    with srv:
        log = srv.log_path.read_text()
        assert log.count("response_threads=1") == 2, "the two instances did not each start one responder thread"
        pids = re.findall(r"instance \S+ (started|attached to) the engine process \(pid (\d+)\) that 2 instances", log)
        assert sorted(kind for kind, _ in pids) == ["attached to", "started"] and len({p for _, p in pids}) == 1, pids
        yield srv


class Stream:
    """One tritonclient gRPC stream; `run` sends a request and collects its responses until the final one."""

    def __init__(self, url: str):
        self.client = grpcclient.InferenceServerClient(url)
        self.results: dict[str, queue.Queue] = {}
        self.errors: queue.Queue = queue.Queue()
        self.client.start_stream(callback=self._callback)

    def _callback(self, result=None, error=None):
        if error is not None:
            # tritonclient does not say which request failed; tests send one at a time when they expect errors
            self.errors.put(str(error))
            for q in self.results.values():
                q.put(("error", str(error)))
            return
        rid = result.get_response().id
        self.results[rid].put(("ok", result))

    def send(self, inputs, rid: str | None = None) -> str:
        rid = rid or uuid.uuid4().hex
        self.results[rid] = queue.Queue()
        self.client.async_stream_infer(MODEL, inputs, request_id=rid, enable_empty_final_response=True)
        return rid

    def collect(self, rid: str, timeout: float = 120):
        """-> (list of (text, output_tokens, finish_reason) per response with outputs, error or None)."""
        parts = []
        q = self.results[rid]
        while True:
            kind, value = q.get(timeout=timeout)
            if kind == "error":
                del self.results[rid]
                return parts, value
            text = value.as_numpy("text_output")
            if text is not None:
                parts.append(
                    (
                        text.reshape(-1)[0].decode(),
                        int(value.as_numpy("output_tokens").reshape(-1)[0]),
                        value.as_numpy("finish_reason").reshape(-1)[0].decode(),
                        int(value.as_numpy("input_tokens").reshape(-1)[0]),
                    )
                )
            if value.get_response().parameters["triton_final_response"].bool_param:
                del self.results[rid]
                return parts, None

    def run(self, gen: Generation, extra=()):
        return self.collect(self.send(build_inputs(gen) + list(extra)))

    def close(self, cancel=False):
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


@pytest.fixture
def stream(server):
    s = Stream(server.grpc_url)
    yield s
    s.close()


def _input(name, dtype, value):
    arr = np.array(
        value, dtype=object if dtype == "BYTES" else {"INT32": np.int32, "BOOL": bool, "FP32": np.float32}[dtype]
    )
    t = grpcclient.InferInput(name, list(arr.shape), dtype)
    t.set_data_from_numpy(arr)
    return t


def _text(parts):
    return "".join(p[0] for p in parts)


def test_stream_equals_nonstream_equals_generate(stream, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    ref = tok.decode(
        model.generate(ids, max_new_tokens=32, do_sample=False)[0, ids.shape[1] :], skip_special_tokens=True
    )

    streamed, err = stream.run(Generation(PROMPT, max_tokens=32, stream=True))
    assert err is None, err
    whole, err = stream.run(Generation(PROMPT, max_tokens=32, stream=False))
    assert err is None, err
    assert len(whole) == 1 and whole[0][2] in ("length", "stop"), whole
    assert _text(streamed) == whole[0][0] == ref, (streamed, whole, ref)
    # really streamed (pieces of steps that queued up while the model was sending are merged, so not always 32)
    assert len(streamed) > 1, streamed
    assert [p[2] for p in streamed[:-1]] == [""] * (len(streamed) - 1) and streamed[-1][2] == whole[0][2]
    counts = [p[1] for p in streamed]
    assert counts == sorted(counts) and counts[-1] == whole[0][1]
    assert streamed[0][3] == whole[0][3] == ids.shape[1]


def test_32_concurrent_streams(server):
    s = Stream(server.grpc_url)
    try:
        wanted = {}
        for i in range(32):
            n = 16 + i
            rid = s.send(build_inputs(Generation(f"{PROMPT} {i}", max_tokens=n, stream=True, ignore_eos=True)))
            wanted[rid] = n
        for rid, n in wanted.items():
            parts, err = s.collect(rid)
            assert err is None
            assert parts[-1][1] == n and parts[-1][2] == "length"
            counts = [p[1] for p in parts]
            assert counts == sorted(set(counts)), counts  # in order, none twice (one responder per stream)
    finally:
        s.close()


def test_cancelled_stream_stops_and_server_keeps_serving(server, stream):
    s = Stream(server.grpc_url)
    rid = s.send(build_inputs(Generation(PROMPT, max_tokens=1900, stream=True, ignore_eos=True)))
    for _ in range(3):
        kind, _ = s.results[rid].get(timeout=60)
        assert kind == "ok"
    s.close(cancel=True)  # the client gives up on the stream: Triton marks the request cancelled
    log = Path(server.log_path)
    deadline = time.monotonic() + 30
    while "cancelled by the client" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, "the model never noticed the cancellation"
        time.sleep(0.1)
    parts, err = stream.run(Generation("Hello", max_tokens=8, stream=True))
    assert err is None and parts[-1][1] == 8


BAD = [
    (lambda: build_inputs(Generation("Hello", max_tokens=0)), "max_tokens must be >= 1"),
    (lambda: build_inputs(Generation("", max_tokens=4)), "text_input is empty"),
    (lambda: build_inputs(Generation("Hello", max_tokens=100000)), "exceeds the model limit"),
    (lambda: build_inputs(Generation("word " * 2100, max_tokens=4)), "exceeds the model context"),
    (
        lambda: build_inputs(Generation("Hello", max_tokens=4)) + [_input("beam_width", "INT32", [[2]])],
        "beam_width 2 is not supported",
    ),
    (lambda: [_input("max_tokens", "INT32", [[4]])], "missing required input"),  # Triton checks this one itself
    (
        lambda: [_input("text_input", "BYTES", [[b"a"], [b"b"]]), _input("max_tokens", "INT32", [[4], [4]])],
        "batch size 2 is not supported",
    ),
    (lambda: build_inputs(Generation("Hello", max_tokens=4, top_p=2.0)), "top_p must be in"),
]


@pytest.mark.parametrize("make, message", BAD, ids=[m for _, m in BAD])
def test_bad_request_gets_its_error_and_the_next_one_succeeds(stream, make, message):
    parts, err = stream.collect(stream.send(make()))
    assert err is not None and message in err, err
    parts, err = stream.run(Generation("Hello", max_tokens=4, stream=True))
    assert err is None and parts[-1][1] == 4


def test_stop_words(stream):
    full, _ = stream.run(Generation(PROMPT, max_tokens=40, stream=False, ignore_eos=True))
    text = full[0][0]
    stop = text[12:15]
    parts, err = stream.run(Generation(PROMPT, max_tokens=40, stream=True, ignore_eos=True, stop=(stop, "zzz")))
    assert err is None
    assert _text(parts) == text[: text.index(stop)]
    assert parts[-1][2] == "stop"


def test_seeded_sampling_is_repeatable(stream):
    gen = Generation(PROMPT, max_tokens=24, stream=True, temperature=1.0, top_p=0.95, seed=42, ignore_eos=True)
    a, _ = stream.run(gen)
    b, _ = stream.run(gen)
    c, _ = stream.run(
        Generation(PROMPT, max_tokens=24, stream=True, temperature=1.0, top_p=0.95, seed=7, ignore_eos=True)
    )
    assert _text(a) == _text(b) != _text(c)


def test_optional_inputs_are_accepted(stream):
    extra = [
        _input("pad_id", "INT32", [[2]]),
        _input("return_log_probs", "BOOL", [[True]]),
        _input("exclude_input_in_output", "BOOL", [[True]]),
    ]
    parts, err = stream.run(Generation(PROMPT, max_tokens=6, stream=False, min_tokens=6, repetition_penalty=1.2), extra)
    assert err is None and parts[-1][1] == 6 and not parts[-1][0].startswith(PROMPT)


def test_final_counts_only_sends_text_alone_until_the_last_response(server, stream):
    """Request parameter final_counts_only: every streamed response but the last carries text_output alone, the
    last all four outputs; the text and the counts are those of a request without it.  The benchmark's client
    (launcher.client.stream.TritonStream, what `llmlaunch-bench --final-counts-only` uses) reads it the same way."""
    from launcher.client.request import build_request
    from launcher.client.stream import TritonStream

    gen = Generation(PROMPT, max_tokens=24, stream=True, ignore_eos=True)
    plain, err = stream.run(gen)
    assert err is None, err
    rid = uuid.uuid4().hex
    stream.results[rid] = queue.Queue()
    stream.client.async_stream_infer(
        MODEL,
        build_inputs(gen),
        request_id=rid,
        enable_empty_final_response=True,
        parameters={"final_counts_only": True},
    )
    outputs, texts = [], []
    while True:
        kind, value = stream.results[rid].get(timeout=120)
        assert kind == "ok", value
        names = sorted(o.name for o in value.get_response().outputs)
        final = value.get_response().parameters["triton_final_response"].bool_param
        if names:
            outputs.append((names, final))
            texts.append(value.as_numpy("text_output").reshape(-1)[0].decode())
        if final:
            last = value
            break
    assert len(outputs) > 1, outputs
    assert all(names == ["text_output"] and not final for names, final in outputs[:-1]), outputs
    assert outputs[-1] == (["finish_reason", "input_tokens", "output_tokens", "text_output"], True), outputs
    assert "".join(texts) == _text(plain)
    assert int(last.as_numpy("output_tokens").reshape(-1)[0]) == plain[-1][1] == 24
    assert int(last.as_numpy("input_tokens").reshape(-1)[0]) == plain[-1][3]
    assert last.as_numpy("finish_reason").reshape(-1)[0].decode() == plain[-1][2] == "length"

    ts = TritonStream(server.grpc_url)
    try:
        recs = [
            ts.submit(build_request(MODEL, gen, str(i), parameters={"final_counts_only": flag}))
            for i, flag in enumerate((True, False, True))
        ]
        for rec in recs:
            ts.wait(rec, timeout=120)
            assert not rec.error, rec.error
            assert (rec.text, rec.output_tokens, rec.input_tokens, rec.finish_reason) == (
                _text(plain),
                24,
                plain[-1][3],
                "length",
            )
            assert len(rec.token_times) == len(rec.times) > 1
        bad = ts.wait(ts.submit(build_request(MODEL, gen, "bad", parameters={"final_counts_only": "maybe"})), 60)
        assert "final_counts_only='maybe' must be true or false" in bad.error, bad.error
    finally:
        ts.cancel("test done")


def test_in_thread_engine_variant(tiny_model_dir, tmp_path):
    """engine_process=false: the engine runs on a thread of the stub; same answers, errors and streaming."""
    srv = hf_server(
        str(tiny_model_dir),
        tmp_path,
        {"device": "cpu", "max_num_seqs": 8, "engine_process": "false", "stream_interval_ms": 30},
    )
    with srv:
        s = Stream(srv.grpc_url)
        try:
            streamed, err = s.run(Generation(PROMPT, max_tokens=64, stream=True, ignore_eos=True))
            assert err is None
            whole, err = s.run(Generation(PROMPT, max_tokens=64, stream=False, ignore_eos=True))
            assert err is None and _text(streamed) == whole[0][0] and whole[0][1] == 64
            assert streamed[0][1] == 1 and len(streamed) < 64  # stream_interval_ms merged tokens
            _, err = s.run(Generation("Hello", max_tokens=0))
            assert "max_tokens must be >= 1" in err
            rids = [s.send(build_inputs(Generation(f"{PROMPT} {i}", max_tokens=12, ignore_eos=True))) for i in range(8)]
            assert all(s.collect(r)[0][-1][1] == 12 for r in rids)
            # engine_process=false: the engine runs in the stub, with no engine process of its own
            from launcher.testing.processes import engine_pids, stub_pids

            assert engine_pids(srv.proc.pid) == [] and len(stub_pids(srv.proc.pid)) == 1
        finally:
            s.close()


def test_compiled_model_answers_as_the_uncompiled_one(server, tiny_model_dir, tmp_path):
    """torch_compile=true through tritonserver (auto turns it on only on a GPU): the engine process compiles
    before the model is READY and the server log says so (the module server's says off); streamed and whole
    answers equal the uncompiled server's, one at a time and eight at once."""
    srv = hf_server(str(tiny_model_dir), tmp_path, {"device": "cpu", "max_num_seqs": 8, "torch_compile": "true"})
    with srv:
        log = srv.log_path.read_text()
        assert "torch_compile on (" in log
        assert "llmlaunch-stage: hf engine: compiling the model" in log  # what the launcher shows while it waits
        assert "torch_compile off, " in server.log_path.read_text()
        gens = [Generation(f"{PROMPT} {i}" * (i + 1), max_tokens=10 + 3 * i) for i in range(8)]
        answers = {}
        for name, url in (("compiled", srv.grpc_url), ("uncompiled", server.grpc_url)):
            s = Stream(url)
            try:
                streamed, err = s.run(Generation(PROMPT, max_tokens=24, stream=True))
                assert err is None, err
                whole, err = s.run(Generation(PROMPT, max_tokens=24, stream=False))
                assert err is None and _text(streamed) == whole[0][0], (streamed, whole)
                rids = [s.send(build_inputs(g)) for g in gens]
                together = [s.collect(r) for r in rids]
                assert all(err is None for _, err in together), together
                answers[name] = (whole[0][:3], [(_text(parts), parts[-1][1]) for parts, _ in together])
            finally:
                s.close()
        assert answers["compiled"] == answers["uncompiled"]


def _first_token_metrics(server):
    from launcher.python_backend.timings import fetch_first_token_metrics

    return fetch_first_token_metrics(server.metrics_url, MODEL)


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    from pathlib import Path

    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(entry.name))
            except (OSError, ValueError):
                continue
    return kids


def test_response_path_keeps_the_engine_priority_on_cpu(server):
    """launcher.python_backend.responders lowers tritonserver and the stubs (nice 10) only for an engine process on a GPU:
    on CPU both stubs, tritonserver and the engine process they share keep the nice value the server started with
    (this test's), and no instance says it lowered them."""
    from launcher.python_backend.priority import thread_nice, thread_nices

    started = os.getpriority(os.PRIO_PROCESS, 0)
    server_pid = server.proc.pid
    stubs = [
        p for p in _children(server_pid) if b"triton_python_backend_stub" in open(f"/proc/{p}/cmdline", "rb").read()
    ]
    assert len(stubs) == 2, stubs
    assert [thread_nice(stub) for stub in stubs] == [started, started]
    engines = [p for stub in stubs for p in _children(stub)]
    assert len(engines) == 1, engines  # started by one instance, attached to by the other
    assert set(thread_nices(engines[0]).values()) == {started}
    assert thread_nice(server_pid) == started
    assert "response path at nice" not in server.log_path.read_text()


def test_first_token_times_are_exposed_as_metrics(server):
    """Streamed requests' first tokens are split into parse / add / engine / back / respond / send on the metrics
    port; the six add up to less than the TTFT the client saw, and non-streamed requests are not counted."""
    from launcher.python_backend.timings import mean_first_token_ms, settled_server_metrics

    # settled: an earlier test's last first tokens are pushed up to a second late
    before, _ = settled_server_metrics(server.metrics_url, MODEL)
    s = Stream(server.grpc_url)
    try:
        sent, ttft = {}, []
        for i in range(5):
            sent[s.send(build_inputs(Generation(f"{PROMPT} {i}", max_tokens=8, stream=True, ignore_eos=True)))] = (
                time.monotonic()
            )
        for rid, t0 in sent.items():
            kind, _ = s.results[rid].get(timeout=120)  # the first response
            assert kind == "ok"
            ttft.append(1000 * (time.monotonic() - t0))
            parts, err = s.collect(rid)
            assert err is None
        _, err = s.run(Generation(PROMPT, max_tokens=4, stream=False))
        assert err is None
    finally:
        s.close()
    deadline = time.monotonic() + 10  # the model pushes its sums once a second
    while True:
        after = _first_token_metrics(server)
        if after["count"] - before["count"] >= 5 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    means = mean_first_token_ms(before, after)
    assert means is not None and means["requests"] == 5, (before, after)
    assert means["engine"] > 0 and means["parse"] > 0 and means["back"] > 0 and means["respond"] > 0, means
    assert means["send"] > 0, means  # the send call's round trip to tritonserver, apart from building the response
    assert means["add"] >= 0, means
    assert means["inside_server"] < sum(ttft) / len(ttft), (means, ttft)


def test_engine_steps_are_exposed_as_metrics(server):
    """The engine's step totals reach the metrics port: every decode and prompt token of a run is counted,
    and the split of a step (launch, wait, host) is consistent."""
    from launcher.python_backend.cache_splits import prefix_cache_split
    from launcher.python_backend.timings import (
        engine_splits_after,
        engine_step_split,
        fetch_engine_metrics,
        settled_engine_metrics,
    )

    url = server.metrics_url
    before = settled_engine_metrics(url, MODEL, wait_s=10)  # earlier tests' last steps in
    s = Stream(server.grpc_url)
    try:
        for i in range(3):
            _, err = s.run(Generation(f"{PROMPT} {i}", max_tokens=7, stream=True, ignore_eos=True))
            assert err is None
    finally:
        s.close()
    split, prefix, _ = engine_splits_after(url, MODEL, before, wait_s=10)
    after = fetch_engine_metrics(url, MODEL)
    assert prefix == prefix_cache_split(before, after) and prefix["prompt_tokens"] > 0, prefix
    assert after["decode_tokens"] - before["decode_tokens"] == 3 * 6, (before, after)
    assert after["prefill_tokens"] - before["prefill_tokens"] >= 3
    assert after["admitted"] - before["admitted"] == after["first_tokens"] - before["first_tokens"] == 3
    # one request at a time: three hand-overs of one
    assert after["intake_requests"] - before["intake_requests"] == after["intake_calls"] - before["intake_calls"] == 3
    assert split["per_intake"] == 1
    assert 0 < after["to_first_token_s"] - before["to_first_token_s"] and split["queue_ms"] < split["first_token_ms"]
    assert split == engine_step_split(before, after) and split["steps"] >= 7, split
    assert split["step_ms"] > 0 and split["host_ms"] >= 0 and split["launch_ms"] > 0, split
    assert "gpu_ms" not in split  # CPU: no step is timed on a GPU
    assert fetch_engine_metrics(url, "another-model") == {k: 0.0 for k in after}


def test_bench_reports_where_the_ttft_goes(server, tmp_path, capsys):
    """llmlaunch-bench --server-metrics: the split of the mean TTFT comes with the table and in the JSON."""
    import json

    from launcher.bench.cli import main

    out = tmp_path / "r.json"
    url = server.metrics_url
    rc = main(
        [
            "--url",
            server.grpc_url,
            "--dataset-name",
            "synthetic",
            "--input-len",
            "8",
            "--output-len",
            "6",
            "--num-prompts",
            "6",
            "--concurrency",
            "3",
            "--ignore-eos",
            "--no-progress",
            "--warmup",
            "1",
            "--server-metrics",
            url,
            "--result-json",
            str(out),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "engine: queue, prefill (ms):" in printed and "tritonserver, gRPC, client (ms):" in printed, printed
    doc = json.loads(out.read_text())
    split = doc["server_first_token_ms"]
    # the measured requests alone, on the model's side as on the client's: the warm-up's first token is not counted
    assert split["requests"] == split["client_requests"] == 6, split
    assert split["engine"] > 0 and split["outside_server"] > 0 and split["send"] > 0, split
    assert split["inside_server"] + split["outside_server"] == pytest.approx(
        doc["metrics"]["ttft_ms"]["mean"], abs=0.01
    )
    assert "response sent to tritonserver (ms):" in printed, printed
    # and how the engine spent its steps meanwhile: 6 requests of 6 tokens, 5 decoded after each first token
    assert "engine steps: step " in printed, printed
    steps = doc["server_engine_steps"]
    assert steps["steps"] >= 6 and steps["step_ms"] > 0 and steps["decode_rows"] > 0, steps
    # and the prefix cache: the 6 prompts' tokens, the share of them served from it
    cache = doc["server_prefix_cache"]
    assert cache["prompt_tokens"] >= 6 * 8 and 0 <= cache["prefix_hit_rate"] <= 1, cache
    assert f"prefix cache: {100 * cache['prefix_hit_rate']:.1f}% of {cache['prompt_tokens']:,} prompt tokens" in printed
    assert (
        main(
            [
                "--url",
                server.grpc_url,
                "--num-prompts",
                "1",
                "--concurrency",
                "1",
                "--dataset-name",
                "synthetic",
                "--no-progress",
                "--server-metrics",
                "http://127.0.0.1:9/metrics",
            ]
        )
        == 2
    )
    assert "--server-metrics http://127.0.0.1:9/metrics: cannot read it" in capsys.readouterr().err


def test_generate_endpoint_passes_final_counts_only(server):
    """Triton's HTTP generate extension: the request parameter as a top-level JSON key or under "parameters" reaches
    the model, which streams text alone until the last event; a bad value comes back as the event's error."""
    import json
    import urllib.error
    import urllib.request

    def events(body):
        req = urllib.request.Request(
            f"{server.http_url}/v2/models/{MODEL}/generate_stream",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        try:
            resp = urllib.request.urlopen(req, timeout=120)
        except urllib.error.HTTPError as exc:  # (a request the model rejects: status 400, the error as an event)
            resp = exc
        with resp:
            text = resp.read().decode()
        return resp.status, [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]

    base = {"text_input": PROMPT, "max_tokens": 8, "stream": True, "ignore_eos": True}
    status, plain = events(base)
    assert status == 200 and all("output_tokens" in e for e in plain) and plain[-1]["output_tokens"] == 8, plain
    for body in (dict(base, final_counts_only=True), dict(base, parameters={"final_counts_only": True})):
        status, got = events(body)
        assert (
            status == 200
            and len(got) > 1
            and all(set(e) == {"model_name", "model_version", "text_output"} for e in got[:-1])
        ), got
        assert (got[-1]["output_tokens"], got[-1]["input_tokens"], got[-1]["finish_reason"]) == (
            8,
            plain[-1]["input_tokens"],
            "length",
        )
        assert "".join(e["text_output"] for e in got) == "".join(e["text_output"] for e in plain)
    status, (bad,) = events(dict(base, parameters={"final_counts_only": "maybe"}))
    assert status == 400 and "final_counts_only='maybe' must be true or false" in bad["error"], bad


def test_bench_final_counts_only_measures_the_same_tokens(server, tmp_path):
    """llmlaunch-bench and final_counts_only: the hf model's config says it honours the parameter
    (launcher.client.control.honoured_parameters), so by default a streamed run asks for it; --no-final-counts-only
    and --no-stream do not, --final-counts-only does, and --request-param final_counts_only=... wins.  The server's counts
    still reach every request's figures (from its final response), and every token's time is measured either way."""
    import json

    from launcher.bench.cli import main
    from launcher.client.control import honoured_parameters

    assert honoured_parameters(server.grpc_url, MODEL) == frozenset({"final_counts_only", "return_token_ids"})
    docs = []
    flags = (
        (),
        ("--no-final-counts-only",),
        ("--final-counts-only",),
        ("--no-stream",),
        ("--request-param", "final_counts_only=false"),
    )
    for flag in flags:
        out = tmp_path / f"r{len(docs)}.json"
        assert (
            main(
                [
                    "--url",
                    server.grpc_url,
                    "--dataset-name",
                    "synthetic",
                    "--input-len",
                    "8",
                    "--output-len",
                    "6",
                    "--num-prompts",
                    "6",
                    "--concurrency",
                    "3",
                    "--ignore-eos",
                    "--no-progress",
                    "--result-json",
                    str(out),
                    *flag,
                ]
            )
            == 0
        )
        docs.append(json.loads(out.read_text()))
    sent = [doc["config"]["request"]["parameters"].get("final_counts_only") for doc in docs]
    assert sent == [True, None, True, None, False], sent
    for doc, flag in zip(docs, flags):
        assert doc["metrics"]["total_output_tokens"] == 36 and doc["metrics"]["completed"] == 6
        assert all(r["output_tokens_source"] == "server" and r["input_tokens"] > 0 for r in doc["requests"])
        if "--no-stream" not in flag:  # one response a request: no gaps between tokens to time
            assert doc["metrics"]["itl_ms"]["mean"] > 0 and doc["metrics"]["tpot_ms"]["mean"] > 0


def test_shared_engine_that_fails_to_start_fails_the_load_at_once(tiny_model_dir, tmp_path):
    """Two instances, and the engine cannot start (max_model_len beyond the model's context): the instance that
    started it says why, and the one waiting to attach fails at once with that reason (not after the 900 s attach
    timeout), so tritonserver gives up on the model and exits; ServerDied's message leads with that reason (the log's
    error lines), not only the log's last lines."""
    from launcher.triton import ServerDied

    srv = hf_server(
        str(tiny_model_dir),
        tmp_path,
        {"device": "cpu", "max_num_seqs": 4, "max_model_len": 999999},
        model=MODEL,
        instances=2,
    )
    t0 = time.monotonic()
    with pytest.raises(ServerDied) as died:
        with srv:
            pass
    assert time.monotonic() - t0 < 120
    # the error says why, though tritonserver printed its tables and shut down after the failure (log_excerpt)
    message = str(died.value)
    assert "errors:\n" in message and "exceeds the model's context" in message.split("last lines:")[0], message
    log = srv.log_path.read_text()
    assert "exceeds the model's context" in log
    assert "the model instance that starts the shared hf engine process failed" in log, log[-3000:]


def test_the_second_of_two_requests_sharing_a_prefix_prefills_only_its_suffix(server, tiny_model_dir, reference):
    """The prefix cache through the server: a request whose prompt starts with another's (a shared system prompt)
    finds those blocks cached; the engine's own counters (llmlaunch_engine_prompt_tokens on the metrics port) say
    that every full block of the shared part was not prefilled again, and both answers are transformers'
    `generate`."""
    from transformers import AutoTokenizer

    from launcher.python_backend.timings import fetch_engine_metrics, settled_engine_metrics

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    shared = "You are a careful assistant. Answer in one short sentence. " * 6
    prompts = [shared + "What colour is the sky?", shared + "Name a prime number."]
    ids = [tok(p).input_ids for p in prompts]
    common = next(i for i, (a, b) in enumerate(zip(*ids)) if a != b)  # tokens the two prompts start with
    assert common >= 48  # three full blocks of 16 at least
    url = server.metrics_url
    s = Stream(server.grpc_url)
    try:
        counted = []
        for prompt in prompts:
            before = settled_engine_metrics(url, MODEL, wait_s=10)
            parts, err = s.run(Generation(prompt, max_tokens=6, stream=True))
            assert err is None
            assert _text(parts) == reference(prompt, 6)[1], prompt
            after = settled_engine_metrics(url, MODEL, wait_s=10)
            admitted = after["prompt_tokens"] - before["prompt_tokens"]
            assert admitted == parts[-1][3], (admitted, parts[-1])  # the prompt's tokens, as the engine counted them
            counted.append(after["cached_prompt_tokens"] - before["cached_prompt_tokens"])
    finally:
        s.close()
    # the second prompt: every full block of the shared part from the cache, only the rest prefilled
    assert counted == [0, common // 16 * 16], (counted, common)
    assert fetch_engine_metrics(url, MODEL)["preempted"] == 0
