"""An engine kept in another distribution (tests/standins/echo_engine, registered through the `llmlaunch.engines` entry
point group) served for real by `llmlaunch engine=echo`: the launch, the rank and Triton's python stub each find it
from the distribution alone, and it answers over gRPC and the OpenAI API like a built-in engine."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from launcher.ports import free_port
from tests.unit.test_engine_packages import ROOT, distribution_with_echo_engine

pytestmark = pytest.mark.timeout(300)


def test_an_engine_kept_elsewhere_serves_through_llmlaunch(tmp_path, tiny_model_dir):
    from launcher.client.request import Generation
    from launcher.client.stream import generate

    site = distribution_with_echo_engine(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    ports = [f"serve.{k}={free_port()}" for k in ("grpc_port", "http_port", "metrics_port", "openai_port")]
    argv = [sys.executable, "-c", "from launcher.cli import main; main()", "engine=echo", "engine.prefix=echo"]
    argv += ["model=tiny", f"cluster.jobs_dir={tmp_path / 'runs'}", "serve.drain_timeout_s=5", *ports]
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    lines: queue.Queue = queue.Queue()
    err: list = []
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True).start()
    threading.Thread(target=lambda: [err.append(ln) for ln in proc.stderr], daemon=True).start()
    banner = {}
    try:
        deadline = time.monotonic() + 240
        while "openai" not in banner:
            assert proc.poll() is None and time.monotonic() < deadline, "".join(err[-30:])
            try:
                key, _, value = lines.get(timeout=1).partition(": ")
            except queue.Empty:
                continue
            banner[key] = value.split()[0] if value else ""
        assert banner["model"] == "echo_model"
        rec = generate(banner["endpoint"], "echo_model", Generation("one two three", max_tokens=3))
        assert not rec.error and rec.text == " echo one two" and rec.output_tokens == 3, rec
        body = json.dumps({"model": "echo_model", "prompt": "four five", "max_tokens": 8}).encode()
        req = urllib.request.Request(
            banner["openai"] + "/completions", body, {"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            answer = json.loads(r.read())
        assert answer["choices"][0]["text"] == " echo four five" and answer["usage"]["completion_tokens"] == 3
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0, "".join(err[-30:])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert Path(tmp_path / "runs").exists()
