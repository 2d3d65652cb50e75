"""The OpenAI API (launcher/openai_api) against a real tritonserver serving the tiny hf model, through the real
`openai` SDK: completions and chat, streaming and not, usage, every error class, a bad request beside a running
stream, a client that goes away; then `llmlaunch replicas=2` on this machine and a Slurm launch, each serving it."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")

from launcher.openai_api.process import OpenAIConfig, OpenAIProcess  # noqa: E402
from launcher.ports import free_port  # noqa: E402
from launcher.testing.serve import hf_server  # noqa: E402

pytestmark = [pytest.mark.triton, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
MODEL = "hf_model"
PROMPT = "The capital of France is"
EOS = {"ignore_eos": True}  # vLLM's extension, which the SDK sends in extra_body
# A Llama-style template, enough to show the messages go through the tokenizer's own chat template.
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}


def templated_tokenizer(model_dir: Path, dest: Path) -> Path:
    """The tiny model's tokenizer with a chat template (the tiny model has none)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "config.json"):
        shutil.copy(model_dir / name, dest / name)
    cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    (dest / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    return dest


def api(grpc_url: str, tokenizer: str = "", aliases=("tiny",), processes: int = 1) -> OpenAIProcess:
    proc = OpenAIProcess(
        OpenAIConfig(grpc_url, MODEL, "127.0.0.1", free_port(), tokenizer, tuple(aliases), 5.0, processes), env=_env()
    ).start()
    return proc


def client(proc: OpenAIProcess) -> "openai.OpenAI":
    return openai.OpenAI(base_url=proc.cfg.url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("openai")
    srv = hf_server(str(tiny_model_dir), workdir, {"device": "cpu", "max_num_seqs": 16, "cancel_check_ms": 20})
    with srv:
        yield srv


@pytest.fixture(scope="module")
def chat_api(server, tiny_model_dir, tmp_path_factory):
    tok = templated_tokenizer(Path(tiny_model_dir), tmp_path_factory.mktemp("tok"))
    proc = api(server.grpc_url, str(tok))
    try:
        proc.wait_ready(120)
        yield proc
    finally:
        proc.stop()


@pytest.fixture()
def oa(chat_api):
    return client(chat_api)


def _metric(proc: OpenAIProcess, name: str) -> float:
    text = urllib.request.urlopen(proc.cfg.url + "/metrics", timeout=10).read().decode()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name))


# ----------------------------------------------------------------------------- answers
def test_models_lists_the_served_model_and_health_answers(oa, chat_api):
    assert [m.id for m in oa.models.list().data] == [MODEL]
    assert urllib.request.urlopen(chat_api.cfg.url + "/health", timeout=10).status == 200


def test_completion_streamed_and_not_give_the_same_text_and_usage(oa):
    whole = oa.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, extra_body=EOS)
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 12
    assert whole.usage.prompt_tokens > 0 and whole.usage.total_tokens == whole.usage.prompt_tokens + 12
    chunks = list(
        oa.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=12,
            temperature=0,
            extra_body=EOS,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert len([c for c in chunks if c.choices and c.choices[0].text]) >= 2  # it streamed, not one piece


def test_chat_uses_the_template_streamed_and_not(oa):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    whole = oa.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=10, temperature=0, extra_body=EOS
    )
    msg = whole.choices[0].message
    assert (
        msg.role == "assistant" and whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 10
    )
    # the template's tags are counted in the prompt: more tokens than the two contents alone
    plain = oa.completions.create(model=MODEL, prompt="Be brief.What is the capital of France?", max_tokens=1)
    assert whole.usage.prompt_tokens > plain.usage.prompt_tokens
    chunks = list(
        oa.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=10,
            temperature=0,
            extra_body=EOS,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == msg.content
    assert chunks[-1].usage.completion_tokens == 10 and chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_stop_seed_and_extensions_reach_the_engine(oa):
    base = (
        oa.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, extra_body=EOS).choices[0].text
    )
    word = base.split()[2] if len(base.split()) > 2 else base.split()[-1]
    stopped = oa.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, stop=[word])
    assert word not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop"
    a, b = (
        oa.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=8,
            temperature=1.0,
            top_p=0.9,
            seed=7,
            extra_body={"top_k": 20, "repetition_penalty": 1.1, "min_tokens": 8},
        )
        .choices[0]
        .text
        for _ in range(2)
    )
    assert a == b


# ----------------------------------------------------------------------------- errors
def _error(fn):
    with pytest.raises(openai.APIStatusError) as e:
        fn()
    err = e.value.body if isinstance(e.value.body, dict) else {}
    err = err.get("error", err)
    assert set(err) >= {"message", "type", "param", "code"}, e.value.body
    return e.value.status_code, err


def test_each_error_class_has_its_status_and_openais_shape(oa, chat_api, server, tiny_model_dir):
    status, err = _error(lambda: oa.completions.create(model="gpt-4o", prompt=PROMPT, max_tokens=4))
    assert status == 404 and err["code"] == "model_not_found"
    for kwargs, param in (
        ({"temperature": 3.0}, "temperature"),
        ({"n": 0}, "n"),
        ({"logprobs": 21}, "logprobs"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"extra_body": {"top_k": "many"}}, "top_k"),
    ):
        status, err = _error(
            lambda kw=kwargs: oa.completions.create(model=MODEL, prompt=PROMPT, **{"max_tokens": 4, **kw})
        )
        assert status == 400 and err["param"] == param and param in err["message"], err
    status, err = _error(
        lambda: oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], top_logprobs=2)
    )
    assert status == 400 and err["param"] == "top_logprobs"
    # the engine's own check (the model's context) is the request's fault too
    status, err = _error(lambda: oa.completions.create(model=MODEL, prompt=PROMPT, max_tokens=100000))
    assert status == 400 and "exceeds the model limit" in err["message"]
    req = urllib.request.Request(
        chat_api.cfg.url + "/v1/completions", data=b"{not json", headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400 and json.loads(e.value.read())["error"]["code"] == "invalid_json"
    # a body over serve.max_request_bytes (4 MiB) is refused before it is read whole: from its Content-Length, and
    # a chunked one (no length) as its bytes pass the limit
    import http.client
    from urllib.parse import urlsplit

    big = json.dumps({"model": MODEL, "prompt": "word " * (1 << 20), "max_tokens": 1}).encode()
    req = urllib.request.Request(
        chat_api.cfg.url + "/v1/completions", data=big, headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    err = json.loads(e.value.read())["error"]
    assert e.value.code == 413 and err["code"] == "request_too_large" and "serve.max_request_bytes" in err["message"]
    where = urlsplit(chat_api.cfg.url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    pieces = (big[i : i + 65536] for i in range(0, len(big), 65536))
    conn.request(
        "POST", "/v1/completions", body=pieces, headers={"Content-Type": "application/json"}, encode_chunked=True
    )
    resp = conn.getresponse()
    assert resp.status == 413 and json.loads(resp.read())["error"]["code"] == "request_too_large"
    conn.close()
    # a model without a chat template: chat is a clear 400, completions still serve
    plain = api(server.grpc_url, str(tiny_model_dir))
    try:
        plain.wait_ready(120)
        status, err = _error(
            lambda: client(plain).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
        )
        assert status == 400 and "no chat template" in err["message"] and err["code"] == "no_chat_template"
        assert client(plain).completions.create(model=MODEL, prompt=PROMPT, max_tokens=2).usage.completion_tokens >= 1
    finally:
        plain.stop()
    # nothing serves gRPC behind it: 503, and /health says so
    dead = api(f"127.0.0.1:{free_port()}")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(dead.cfg.url + "/health", timeout=5)
                raise AssertionError("/health answered 200 with no gRPC server behind it")
            except urllib.error.HTTPError as e:
                assert e.code == 503
                break
            except urllib.error.URLError:
                assert time.monotonic() < deadline and dead.poll() is None, "the API server never started"
                time.sleep(0.2)
        status, err = _error(lambda: client(dead).completions.create(model=MODEL, prompt=PROMPT, max_tokens=2))
        assert status == 503 and err["code"] == "unavailable"
    finally:
        dead.stop()


def test_a_bad_request_beside_a_running_stream_leaves_it_whole(oa):
    got: dict = {}

    def long_stream():
        chunks = list(
            oa.completions.create(
                model=MODEL,
                prompt=PROMPT,
                max_tokens=300,
                extra_body=EOS,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        got["usage"] = chunks[-1].usage
        got["reason"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]

    t = threading.Thread(target=long_stream)
    t.start()
    time.sleep(0.3)
    for bad in ({"max_tokens": 100000}, {"temperature": -1}, {"model": "nope"}, {"prompt": [[]]}):
        with pytest.raises(openai.APIStatusError):
            oa.completions.create(**{"model": MODEL, "prompt": PROMPT, "max_tokens": 4, **bad})
    assert t.is_alive(), "the long stream ended before the bad requests were sent: make it longer"
    t.join(300)
    assert got["usage"].completion_tokens == 300 and got["reason"] == "length"


def test_a_client_that_goes_away_cancels_its_request_on_the_engine(oa, chat_api, server):
    log = Path(server.log_path)
    before = log.read_text(errors="replace").count("cancelled by the client")
    stream = oa.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1900, extra_body=EOS, stream=True)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()  # the HTTP connection closes mid-stream
    deadline = time.monotonic() + 30
    while log.read_text(errors="replace").count("cancelled by the client") == before:
        assert time.monotonic() < deadline, "the engine never saw the cancellation"
        time.sleep(0.1)
    while _metric(chat_api, "llmlaunch_openai_requests_running") != 0:
        assert time.monotonic() < deadline, "the API still counts the request as running"
        time.sleep(0.1)
    assert oa.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, extra_body=EOS).usage.completion_tokens == 4


def test_with_an_api_key_every_route_but_health_needs_it_and_the_key_is_on_no_command_line(server, tmp_path):
    """serve.api_key_file: the API reads the key from the file; without `Authorization: Bearer <key>`, or with
    another key, a route answers 401 in OpenAI's shape (the openai SDK raises AuthenticationError); /health answers
    without it (rank 0 and load balancers poll it); llmlaunch-bench's OpenAI client sends OPENAI_API_KEY."""
    from launcher.bench.openai_stream import served_model

    key = "k-" + os.urandom(12).hex()
    key_file = tmp_path / "api.key"
    key_file.write_text(key + "\n")
    proc = OpenAIProcess(
        OpenAIConfig(server.grpc_url, MODEL, "127.0.0.1", free_port(), "", ("tiny",), 5.0, 2, str(key_file)),
        env=_env(),
    ).start()
    try:
        proc.wait_ready(120)  # through /health, with no key
        for route in ("/v1/models", "/metrics"):
            for given, why in ((None, "no API key was given"), ("Bearer wrong", "the API key is not valid")):
                headers = {"Authorization": given} if given else {}
                with pytest.raises(urllib.error.HTTPError) as e:
                    urllib.request.urlopen(urllib.request.Request(proc.cfg.url + route, headers=headers), timeout=10)
                body = json.loads(e.value.read())
                assert e.value.code == 401 and body["error"]["code"] == "invalid_api_key", body
                assert why in body["error"]["message"]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=proc.cfg.url + "/v1", api_key="wrong", max_retries=0).completions.create(
                model=MODEL, prompt="The capital of France is", max_tokens=4
            )
        ok = openai.OpenAI(base_url=proc.cfg.url + "/v1", api_key=key, max_retries=0, timeout=120)
        done = ok.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4)
        assert done.usage.completion_tokens == 4
        os.environ["OPENAI_API_KEY"] = key
        try:
            assert served_model(proc.cfg.url) == MODEL
        finally:
            del os.environ["OPENAI_API_KEY"]
        # the config file names the key's file, never the key; neither the supervisor nor its worker processes carry
        # the key in their command lines
        given = proc.config_path.read_text()
        assert json.loads(given)["api_key_file"] == str(key_file) and key not in given
        pids = [proc.proc.pid, *_children(proc.proc.pid)]
        assert len(pids) >= 3, pids  # the supervisor and its two workers
        assert str(proc.config_path).encode() in Path(f"/proc/{proc.proc.pid}/cmdline").read_bytes()
        for pid in pids:
            assert key.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes(), pid
    finally:
        proc.stop()


def _children(pid: int) -> list:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, ValueError):
            pass
    return out


def test_two_worker_processes_share_the_port_sum_their_metrics_and_stop_together(server):
    proc = api(server.grpc_url, processes=2)
    try:
        proc.wait_ready(120)
        children = Path(f"/proc/{proc.proc.pid}/task/{proc.proc.pid}/children").read_text().split()
        workers = [int(p) for p in children if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(workers) == 2  # (multiprocessing's resource tracker is a child too)
        body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "ignore_eos": True}).encode()
        for _ in range(12):  # a connection each: the kernel spreads them over the two workers' sockets
            req = urllib.request.Request(proc.cfg.url + "/v1/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                assert json.loads(r.read())["usage"]["completion_tokens"] == 2
        # whichever worker answers /metrics counts every worker's requests
        for _ in range(4):
            assert _metric(proc, 'llmlaunch_openai_requests_total{route="completions",status="200"}') == 12
            assert _metric(proc, "llmlaunch_openai_completion_tokens_total") == 24
        os.kill(workers[0], signal.SIGKILL)  # a worker lost: the API stops rather than serve at half capacity
        deadline = time.monotonic() + 30
        while proc.poll() is None:
            assert time.monotonic() < deadline, "the API kept running with a worker gone"
            time.sleep(0.1)
        assert proc.poll() == 1
        assert not Path(f"/proc/{workers[1]}").exists() or "zombie" in Path(f"/proc/{workers[1]}/status").read_text()
    finally:
        proc.stop()


class _AnotherJobsApi(http.server.BaseHTTPRequestHandler):
    """Another job's server on the port: /health answers 200, without this start's instance header."""

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, *args):
        pass


def test_a_port_another_job_took_after_the_pick_is_not_mistaken_for_the_api_which_starts_on_a_fresh_one(server):
    """Two jobs starting on one node at once can pick the same free port for their OpenAI APIs.  The one that binds
    second must not take the other's /health answer for its own (it would say READY and then fail the job when its
    bind fails): it starts again on a fresh port, says so, and its handle names the port it serves on."""
    from launcher.compose import compose
    from launcher.openai_api.process import start_api
    from launcher.schedulers.registry import validated

    spec = validated(compose(["model=tiny"]))
    taken = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _AnotherJobsApi)
    threading.Thread(target=taken.serve_forever, daemon=True).start()
    said = []
    try:
        proc = start_api(spec, server.grpc_url, "127.0.0.1", taken.server_port, said.append, 120.0)
        try:
            assert proc.cfg.port != taken.server_port
            assert any(f"port {taken.server_port} was taken" in m for m in said), said
            assert said[-1].startswith(f"OpenAI API READY on {proc.cfg.url}/v1")
            with urllib.request.urlopen(proc.cfg.url + "/health", timeout=10) as r:
                assert r.headers["x-llmlaunch-instance"] == proc.cfg.instance != ""
            body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "ignore_eos": True}).encode()
            req = urllib.request.Request(proc.cfg.url + "/v1/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                assert json.loads(r.read())["usage"]["completion_tokens"] == 2
        finally:
            proc.stop()
    finally:
        taken.shutdown()
        taken.server_close()


# ----------------------------------------------------------------------------- launched by llmlaunch
def test_llmlaunch_replicas_2_serves_the_openai_api_through_the_front_end(tmp_path, tiny_model_dir):
    import tests.integration.test_frontend as fe

    tok = templated_tokenizer(Path(tiny_model_dir), tmp_path / "tok")
    port = free_port()
    job = fe.LocalLaunch(tmp_path, f"serve.openai_port={port}", f"model.tokenizer={tok}")
    try:
        ep = job.wait_endpoint()
        assert ep.openai_url == f"http://127.0.0.1:{port}/v1" and ep.openai_port == port
        oa = openai.OpenAI(base_url=ep.openai_url, api_key="none", max_retries=0, timeout=120)
        assert [m.id for m in oa.models.list().data] == [ep.model]
        for i in range(4):
            r = oa.completions.create(model=ep.model, prompt=f"{PROMPT} {i}", max_tokens=5, extra_body=EOS)
            assert r.usage.completion_tokens == 5
        chunks = list(
            oa.chat.completions.create(
                model=ep.model,
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=6,
                extra_body=EOS,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[-1].usage.completion_tokens == 6
        text = urllib.request.urlopen(ep.metrics_url, timeout=10).read().decode()
        served = [
            float(ln.rsplit(" ", 1)[1])
            for ln in text.splitlines()
            if ln.startswith("llmlaunch_frontend_requests_total{")
        ]
        assert sum(served) >= 5 and all(n >= 1 for n in served), text  # both replicas answered
        job.proc.send_signal(signal.SIGINT)
        assert job.proc.wait(90) == 0, job.tail()
    finally:
        job.kill()
    job.assert_nothing_left(ep)
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(ep.openai_url + "/models", timeout=5)  # it stopped with the rank


@pytest.mark.slurm
@pytest.mark.skipif(os.geteuid() != 0, reason="the local Slurm cluster needs root")
def test_a_slurm_launch_serves_the_openai_api_on_rank_0_and_stops_it(local_slurm, tmp_path):
    import tests.integration.test_slurm_launch as sl

    spec, job_id, run, ep = sl.launch(tmp_path)
    try:
        host = ep.url.split("//")[1].rsplit(":", 1)[0]
        assert ep.openai_url == f"http://{host}:{ep.openai_port}/v1", ep
        oa = openai.OpenAI(base_url=ep.openai_url, api_key="none", max_retries=0, timeout=120)
        assert [m.id for m in oa.models.list().data] == [ep.model]
        chunks = list(
            oa.completions.create(
                model=ep.model,
                prompt=PROMPT,
                max_tokens=6,
                extra_body=EOS,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[-1].usage.completion_tokens == 6
        assert (
            oa.completions.create(model=ep.model, prompt=PROMPT, max_tokens=3, extra_body=EOS).usage.completion_tokens
            == 3
        )
    finally:
        sl.stop_drained(job_id)
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(ep.openai_url + "/models", timeout=5)  # it stopped with rank 0


# ----------------------------------------------------------------------------- llmlaunch-bench over either protocol
@pytest.mark.parametrize("backend", ["triton-grpc", "openai-completions", "openai-chat"])
def test_bench_measures_the_same_load_over_either_protocol(server, chat_api, tmp_path, backend):
    from launcher.bench import cli

    url = server.grpc_url if backend == "triton-grpc" else chat_api.cfg.url + "/v1"
    out = tmp_path / "result.json"
    code = cli.main(
        [
            "--no-progress",
            "--result-json",
            str(out),
            "--backend",
            backend,
            "--url",
            url,
            "--dataset-name",
            "synthetic",
            "--input-len",
            16,
            "--output-len",
            8,
            "--num-prompts",
            12,
            "--concurrency",
            4,
            "--ignore-eos",
            "--warmup",
            1,
        ]
    )
    doc = json.loads(out.read_text())
    assert code == 0, doc["metrics"].get("errors")
    m = doc["metrics"]
    assert (m["completed"], m["failed"], m["total_output_tokens"]) == (12, 0, 96), m
    assert doc["config"]["backend"] == backend and doc["config"]["model"] == MODEL  # found through /v1/models too
    for r in doc["requests"]:
        # the server's counts (the usage chunk over OpenAI), and a time for every streamed piece of text
        assert r["output_tokens"] == 8 and r["output_tokens_source"] == "server" and r["input_tokens"] > 0
        assert r["finish_reason"] == "length" and len(r["token_times"]) >= 2 and r["ttft"] > 0
