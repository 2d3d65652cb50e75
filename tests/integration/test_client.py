"""launcher.client: the CLI against a real tritonserver serving the `timed` fixture model
(launcher/testing/models/timed). URLs and request encoding: tests/unit/test_client_encoding.py."""

from __future__ import annotations

import importlib
import importlib.util
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.client.request import Generation

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    if importlib.util.find_spec("pytriton") is None:
        pytest.skip("needs nvidia-pytriton (tritonserver)")
    from launcher.testing.serve import make_repository, serve

    # inter-token gap long enough to see the CLI print tokens one at a time
    repo = make_repository(
        tmp_path_factory.mktemp("client") / "repo", {"timed": {"first_token_delay_ms": 5, "inter_token_delay_ms": 60}}
    )
    with serve(repo) as address:
        yield address


def client(*args, timeout=60, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "launcher.client", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=kw.get("cwd", ROOT),
    )


# --------------------------------------------------------------------------- CLI against tritonserver


@pytest.mark.triton
def test_stream_reads_text_wherever_the_final_response_puts_it():
    """TritonStream's receive path on Triton's own wire messages (ModelStreamInferResponse protobufs, no server):
    a final_counts_only request's responses carry text_output alone, then all four outputs in the server's order;
    every piece of text and the final counts are read, whatever index text_output has in the last one."""
    import queue
    import threading

    from tritonclient.grpc import service_pb2

    from launcher.client.response import StreamRecord
    from launcher.client.stream import TritonStream

    def response(outputs, final):
        r = service_pb2.ModelStreamInferResponse()
        ir = r.infer_response
        ir.id = "r1"
        ir.parameters["triton_final_response"].bool_param = final
        for name, dtype, raw in outputs:
            o = ir.outputs.add()
            o.name, o.datatype = name, dtype
            ir.raw_output_contents.append(raw)
        return r

    def text(t):
        return ("text_output", "BYTES", struct.pack("<I", len(t)) + t)

    counts = [
        ("finish_reason", "BYTES", struct.pack("<I", 6) + b"length"),
        ("input_tokens", "INT32", struct.pack("<i", 5)),
        ("output_tokens", "INT32", struct.pack("<i", 3)),
    ]
    stream = object.__new__(TritonStream)  # the receive loop alone: no channel
    stream._responses = [
        response([text(b"a")], False),
        response([text(b"b")], False),
        response(counts + [text(b"c")], True),
    ]
    stream._pending, stream._on_done, stream._dead = {}, None, ""
    stream._outbox, stream._cond, stream.url = queue.Queue(), threading.Condition(), "test"
    rec = stream._pending["r1"] = StreamRecord("r1")
    stream._receive()
    assert rec.done and not rec.error
    assert (rec.text, rec.input_tokens, rec.output_tokens, rec.finish_reason) == ("abc", 5, 3, "length")
    assert len(rec.token_times) == 3


def test_cli_streams_tokens_as_they_arrive(url):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "launcher.client",
            "--url",
            f"grpc://{url}",
            "--prompt",
            "I am going to",
            "--max-tokens",
            "8",
            "--temperature",
            "0.7",
            "--top-p",
            "0.9",
            "--top-k",
            "5",
            "--seed",
            "1",
            "--stop",
            "END",
            "--min-tokens",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    arrivals = []
    out = b""
    while True:
        chunk = proc.stdout.read1(4096)
        if not chunk:
            break
        arrivals.append(time.monotonic())
        out += chunk
    assert proc.wait(30) == 0, proc.stderr.read().decode()
    assert out.decode() == " w0 w1 w2 w3 w4 w5 w6 w7\n"
    # 8 tokens 60 ms apart come out in several pieces spread over the generation, not at once
    assert len(arrivals) >= 4 and arrivals[-1] - arrivals[0] > 0.25


@pytest.mark.triton
def test_cli_no_stream_and_verbose(url):
    r = client("--url", url, "--model", "timed", "--prompt", "a b c", "--max-tokens", "3", "--no-stream", "-v")
    assert r.returncode == 0, r.stderr
    assert r.stdout == " w0 w1 w2\n"
    assert "tokens in/out 3/3" in r.stderr and "finish_reason 'length'" in r.stderr


@pytest.mark.triton
def test_cli_server_error_exits_1(url):
    r = client("--url", url, "--prompt", "please ERROR now", "--max-tokens", "3")
    assert r.returncode == 1
    assert "error: model 'timed'" in r.stderr and "injected failure" in r.stderr
    r = client("--url", url, "--model", "nope", "--prompt", "x")
    assert r.returncode == 1 and "unknown model" in r.stderr


@pytest.mark.triton
def test_cli_prompts_file_writes_results_in_order(url, tmp_path):
    prompts = [f"prompt {i} " + "word " * (i % 4) for i in range(12)]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts) + "\n\n")
    r = client(
        "--url",
        url,
        "--prompts-file",
        "prompts.txt",
        "--output",
        "results.txt",
        "--concurrency",
        "6",
        "--max-tokens",
        "2",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "Loading inputs from `prompts.txt`" in r.stderr and "PASS" in r.stderr
    blocks = (tmp_path / "results.txt").read_text().split("\n\n=========\n\n")
    assert blocks[-1] == ""
    assert blocks[:-1] == [p + " w0 w1" for p in prompts]


@pytest.mark.triton
def test_cli_prompts_file_with_failures_exits_1(url, tmp_path):
    (tmp_path / "prompts.txt").write_text("fine\nan ERROR here\nalso fine\n")
    r = client(
        "--url", url, "--prompts-file", tmp_path / "prompts.txt", "--output", tmp_path / "out.txt", "--max-tokens", "1"
    )
    assert r.returncode == 1 and "1 of 3 requests failed" in r.stderr
    assert "[error: timed: injected failure" in (tmp_path / "out.txt").read_text()


@pytest.mark.triton
def test_library_records_every_response_and_empty_final(url):
    from launcher.client.stream import generate, generate_many

    rec = generate(url, "timed", Generation("a b c d", max_tokens=4), parameters={"inter_token_delay_ms": 1})
    assert (rec.text, rec.input_tokens, rec.output_tokens, rec.finish_reason, rec.error) == (
        " w0 w1 w2 w3",
        4,
        4,
        "length",
        "",
    )
    assert len(rec.times) == 4 and rec.times == sorted(rec.times) and rec.times[0] > rec.sent
    # sent: stamped again by gRPC's sending thread as it took the request, after submit() queued it
    assert 0 < rec.queued < rec.sent
    # the final flag alone: one more (empty) response; counts come from the last token's response
    rec = generate(
        url, "timed", Generation("a b", max_tokens=3), parameters={"inter_token_delay_ms": 1, "separate_final": True}
    )
    assert len(rec.times) == 4 and rec.chunks[-1] == b"" and len(rec.token_times) == 3
    assert (rec.output_tokens, rec.finish_reason) == (3, "length")
    recs = generate_many(
        url,
        "timed",
        [Generation(f"p {i}", max_tokens=2) for i in range(10)] + [Generation("ERROR", 2)],
        concurrency=4,
        parameters={"inter_token_delay_ms": 1},
    )
    assert [r.request_id for r in recs] == [str(i) for i in range(11)]
    assert all(r.output_tokens == 2 for r in recs[:10]) and "injected failure" in recs[10].error


def test_cli_unreachable_server_exits_1():
    from launcher.ports import free_port

    r = client("--url", f"127.0.0.1:{free_port()}", "--prompt", "x")
    assert r.returncode == 1 and r.stderr.startswith("error: cannot list models")


# --------------------------------------------------------------------------- the streaming Responder's kept tensors


def _emitter_request(url: str, n: int, pieces: int):
    """One streamed request of n responses to the emitter fixture; checks the text of every response but the last
    (piece i is " t<i % pieces>"; RuntimeError names the first that carries another) and the final count."""
    from launcher.client.request import Generation, build_request
    from launcher.client.response import StreamRecord
    from launcher.client.stream import TritonStream

    with TritonStream(url) as stream:
        rec = stream.submit(build_request("emitter", Generation("a b c", n, stream=True), "r0"), StreamRecord("r0"))
        stream.wait(rec, timeout=600)
    assert not rec.error and len(rec.times) == n, (rec.error, len(rec.times))
    for i in range(1, n):
        if rec.piece(i - 1) != f" t{i % pieces}":
            raise RuntimeError(f"response {i} carries {rec.piece(i - 1)!r}, expected {f' t{i % pieces}'!r}")
    assert rec.output_tokens == n and rec.finish_reason == "length", (rec.output_tokens, rec.finish_reason)


@pytest.mark.triton
def test_responder_resends_kept_tensors_with_their_own_text(tmp_path):
    """launcher.python_backend.triton_io.Responder keeps the tensors that repeat (texts, counts) and sends them again.
    In a real tritonserver, through the emitter fixture built on the real Responder: two requests, 7 distinct
    texts cycled, at most 5 kept (so the kept set is dropped and refilled mid-request); every response of both
    requests must carry its own text, and the final count must be right."""
    if importlib.util.find_spec("pytriton") is None:
        pytest.skip("needs nvidia-pytriton (tritonserver)")
    from launcher.testing.serve import make_repository, serve

    repo = make_repository(
        tmp_path / "repo", {"emitter": {"responder": "cached", "pieces": 7, "max_texts": 5, "pythonpath": str(ROOT)}}
    )
    with serve(repo) as address:
        for n in (40, 61):  # the second request resends tensors the first one kept
            _emitter_request(address, n, 7)
        # a wrong expectation fails: the check reads every response
        with pytest.raises(RuntimeError, match="response 1 carries ' t1', expected ' t0'"):
            _emitter_request(address, 10, 1)


# --------------------------------------------------------------------------- the serving path's own first-token cost


def _triton_benchmark(name: str):
    """benchmark/<name>.py as a module, for a test that runs it in a real tritonserver (skipped without one)."""
    if importlib.util.find_spec("pytriton") is None:
        pytest.skip("needs nvidia-pytriton (tritonserver)")
    return importlib.import_module(f"benchmark.{name}")


@pytest.mark.triton
def test_first_response_splits_the_serving_path(tmp_path):
    """benchmark/first_response.py end to end in a real tritonserver: the first_echo fixture answers through the
    hf model's own parsing and Responder, inline, from a responder thread and from a real child process over a
    socketpair (the engine process's framing).  Every variant's first response is " x" and its final one carries
    five stamps that must lie in order between the client's send and receive; the split's parts add up to the
    TTFT; a bad request (temperature -1) gets the hf model's own error message."""
    import json

    first_response = _triton_benchmark("first_response")
    from launcher.client.request import Generation, build_request
    from launcher.client.response import StreamRecord
    from launcher.client.stream import TritonStream
    from launcher.testing.serve import serve

    variants = list(first_response.VARIANTS)
    repo = first_response.make_repo(tmp_path, variants)
    with serve(repo) as address, TritonStream(address) as stream:
        for v in variants:
            rows = first_response.run_variant(stream, f"first_{v}", 5, v)
            for r in rows:
                assert all(r[k] >= 0 for k in first_response.PARTS), (v, r)
                assert r["ttft"] == pytest.approx(r["request"] + r["parse"] + r["hop"] + r["build"] + r["response"]), r
                assert r["handoff"] > 0, r  # TritonStream: gRPC's sending thread stamps `sent` after submit()
            if v == "inline":
                assert all(r["hop"] < 1.0 for r in rows), rows  # nothing between parse and answer
        rec = stream.submit(
            build_request("first_process", Generation("a b c", 1, temperature=-1.0), "bad"), StreamRecord("bad")
        )
        stream.wait(rec, timeout=30)
        assert "temperature" in rec.error, rec.error

    out = tmp_path / "first.json"
    assert (
        first_response.main(
            [
                "--requests",
                "20",
                "--warmup",
                "2",
                "--rounds",
                "2",
                "--variants",
                "inline,process",
                "--clients",
                "sync,aio",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())["variants"]
    assert set(doc) == {"inline", "process", "inline aio", "process aio"}
    assert doc["inline"]["vs_inline"] == 1.0 and doc["inline aio"]["vs_inline"] == 1.0
    assert all(v["n"] == 40 and len(v["rounds"]) == 2 and v["p50"]["ttft"] > 0 for v in doc.values())
    # the grpc.aio client writes from the thread that stamps: no hand-off; TritonStream has one
    assert doc["inline aio"]["p50"]["handoff"] == 0 and doc["inline"]["p50"]["handoff"] > 0
    for bad in (["--variants", "inline,bogus"], ["--clients", "sync,bogus"]):
        with pytest.raises(SystemExit):
            first_response.main(bad)
