"""Several Triton stubs as the front ends of one engine (`engine.frontends`), each engine replaced by its stand-in
(tests/standins, at the engines' API boundary as in test_engine_adapters.py): vLLM's engine core with one AsyncLLM
client a stub, SGLang's Engine in multi-tokenizer mode with one TokenizerWorker a stub. Checked: the first stub
starts the engine for all, every stub attaches on an address of its own, requests spread over the stubs without
mixing, and a failed engine fails every stub's load with the reason."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from tests.integration.test_engine_adapters import check_concurrent_streams, events, wait_for

pytestmark = pytest.mark.triton


def test_vllm_front_ends_share_one_engine_core(tmp_path):
    """engine.frontends=3: three stubs, one engine core started for them by the first (vLLM's launch_core_engines for
    three clients) from a process of the launcher's interpreter, not from the stub; each stub a client on its own
    address pair; requests spread over them and none mix; the engine's steps on the metrics port are the core's (each
    step's statistics go to one front end: the stubs' sums)."""
    from launcher.cli import plan
    from launcher.render import repository_files
    from tests.standins.server import serve_standin

    _, spec = plan(["engine=vllm", "model.path=/models/standin-llm", "engine.frontends=3"])
    assert "count: 3" in repository_files(spec)[f"{spec.model_name}/config.pbtxt"]
    # the core takes a second to load: the other front ends wait for it
    with serve_standin(spec, tmp_path, extra_env={"LLMLAUNCH_STANDIN_CORE_LOAD_S": "1"}, metrics=True) as server:
        (launch,) = events(server, "launch_core")
        # the core's own process, as vLLM's API-server launcher configures it (rank -1: no front end of its own)
        assert launch["clients"] == 3 and launch["api_process_rank"] == -1
        assert launch["executable"] == sys.executable  # the launcher's interpreter (RankEnv.python), not the stub's
        clients = wait_for(lambda: len(events(server, "client")) == 3 and events(server, "client"))
        assert launch["pid"] not in {c["pid"] for c in clients}
        assert sorted(c["client_index"] for c in clients) == [0, 1, 2] and {c["client_count"] for c in clients} == {3}
        assert sorted(c["api_process_rank"] for c in clients) == [0, 1, 2]  # each config knows its front end
        for c in clients:  # each client binds the address pair the core was launched for, at its index
            i = c["client_index"]
            assert c["addresses"] == {"input_address": launch["inputs"][i], "output_address": launch["outputs"][i]}
        assert len({c["pid"] for c in clients}) == 3  # three stub processes
        # the first front end logs vLLM's statistics; the others keep their requests' (for the first-token split)
        # through a logger that logs nothing; each keeps the KV cache's use and the steps its scheduler statistics give
        stats = [(c["disable_log_stats"], c["stat_loggers"]) for c in sorted(clients, key=lambda c: c["client_index"])]
        kv = ["EngineStatsLogger"]
        assert stats == [(False, kv), (True, kv), (True, kv)], stats
        check_concurrent_streams(server, 9, 4)
        served_by = {e["pid"] for e in events(server, "generate")}
        assert served_by <= {c["pid"] for c in clients} and len(served_by) >= 2, served_by
        # 9 streams of 4..12 tokens over the stubs: the stand-in steps each token alone, the first from its prompt
        from launcher.python_backend.timings import settled_engine_metrics

        totals = wait_for(lambda: (t := settled_engine_metrics(server.metrics_url, server.model))["steps"] >= 72 and t)
        assert (totals["steps"], totals["decode_tokens"]) == (72, 72 - 9), totals
    # the core went with the server's process group (a stop, not a failure) and is not left running
    text = (tmp_path / "server.log").read_text()
    assert "vLLM's engine core stopped" in text or events(server, "core_shutdown"), text[-2000:]
    assert "stopping this tritonserver so the launcher sees the rank fail" not in text
    (started,) = events(server, "core_started")
    assert (
        not os.path.exists(f"/proc/{started['core_pid']}")
        or open(f"/proc/{started['core_pid']}/stat").read().split()[2] == "Z"
    )


def test_vllm_engine_core_death_stops_the_server(tmp_path):
    """vLLM's engine core dies while the server runs (killed): the process that started it reports its exit code to
    the first stub, which stops tritonserver, so the launcher sees the rank fail instead of a server that looks
    healthy and fails every request."""
    from launcher.cli import plan
    from tests.standins.server import serve_standin

    _, spec = plan(["engine=vllm", "model.path=/models/standin-llm", "engine.frontends=2"])
    with serve_standin(spec, tmp_path) as server:
        (started,) = events(server, "core_started")
        check_concurrent_streams(server, 2, 2)
        os.kill(started["core_pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while server.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.proc.poll() is not None, "tritonserver still runs with its engine core dead"
    text = (tmp_path / "server.log").read_text()
    assert "vLLM's engine core exited ({'EngineCore_DP0': -9})" in text, text[-2000:]


def test_vllm_core_process_stops_the_core_when_the_stub_goes(tmp_path):
    """The process that holds vLLM's engine core stops it when the stub that started it goes (its end of the socket
    closes, as when the stub is killed): no engine core is left holding a GPU."""
    from launcher.engines.vllm.core_process import CoreProcess
    from tests.standins.server import STANDINS

    calls = tmp_path / "calls.jsonl"
    env = {"PYTHONPATH": os.pathsep.join([str(STANDINS), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    env["LLMLAUNCH_STANDIN_LOG"] = str(calls)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        core = CoreProcess({"model": "/models/standin-llm"}, 2, timeout=60)
        info = core.start()
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    assert len(info["inputs"]) == 2 and len(info["outputs"]) == 2
    rows = [json.loads(line) for line in calls.read_text().splitlines()]
    (started,) = [r for r in rows if r["event"] == "core_started"]
    assert os.path.exists(f"/proc/{started['core_pid']}")
    core.conn.close()  # the stub's end goes
    assert core.proc.wait(30) == 0
    assert [r for r in map(json.loads, calls.read_text().splitlines()) if r["event"] == "core_shutdown"]
    assert not os.path.exists(f"/proc/{started['core_pid']}")


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_front_ends_fail_together_when_the_engine_fails(tmp_path, name):
    """The first stub's engine fails to load: every other stub fails its load with that reason, none waits."""
    from launcher.cli import plan
    from launcher.render import repository_files
    from tests.standins.server import failed_load_log, write_repository

    _, spec = plan([f"engine={name}", "model.path=/models/standin-llm", "engine.frontends=2"])
    repo = write_repository(repository_files(spec), tmp_path / "repo")
    env = {"LLMLAUNCH_STANDIN_CORE_FAIL": "CUDA out of memory (stand-in)"}
    text = failed_load_log(repo, spec.model_name, tmp_path / "server.log", env)
    # vLLM's core loads in a process of its own, which hands its error to the first stub
    reason = {"vllm": f"RuntimeError: vLLM's engine core failed to start under {sys.executable}: "}.get(name, "")
    reason += "RuntimeError: CUDA out of memory (stand-in)"
    assert f"the instance that starts the shared engine failed: {reason}" in text


def test_sglang_front_ends_are_tokenizer_workers_of_one_engine(tmp_path):
    """engine.frontends=3 for SGLang: the first stub builds the Engine in multi-tokenizer mode for three workers, every
    stub (the first too) a TokenizerWorker on an IPC address of its own in the private directory; requests spread
    over the stubs and none mix, an abort reaches the worker that runs the request."""
    from launcher.cli import plan
    from launcher.render import repository_files
    from tests.contract_client import Stream
    from tests.standins.server import serve_standin

    _, spec = plan(["engine=sglang", "model.path=/models/standin-llm", "engine.frontends=3"])
    assert "count: 3" in repository_files(spec)[f"{spec.model_name}/config.pbtxt"]
    with serve_standin(spec, tmp_path) as server:
        (init,) = events(server, "init")
        assert init["args"]["tokenizer_worker_num"] == 3
        workers = wait_for(lambda: len(events(server, "tokenizer_worker")) == 3 and events(server, "tokenizer_worker"))
        assert len({w["pid"] for w in workers}) == 3 and init["pid"] in {w["pid"] for w in workers}
        addresses = {w["tokenizer_ipc_name"] for w in workers}
        assert len(addresses) == 3 and all(a.startswith(f"ipc:///tmp/llmlaunch-{os.getuid()}/") for a in addresses)
        assert {w["router"] for w in workers} == {workers[0]["router"]} and workers[0]["router"]
        check_concurrent_streams(server, 9, 4)
        served_by = {e["pid"] for e in events(server, "generate")}
        assert served_by <= {w["pid"] for w in workers} and len(served_by) >= 2, served_by
        prompt = "please cancel me " * 3
        stream = Stream(server)
        try:
            stream.send(prompt, max_tokens=3000, ignore_eos=True)
            for _ in range(3):
                assert stream.next()[1] is None
        finally:
            stream.close(cancel=True)
        (request,) = [e for e in events(server, "generate") if e.get("prompt") == prompt]
        (abort,) = wait_for(lambda: [e for e in events(server, "abort") if e["request_id"] == request["request_id"]])
        assert abort["pid"] == request["pid"]  # the worker that runs the request aborts it
    (shutdown,) = events(server, "shutdown")  # the engine goes down once, with the stub that started it
    assert shutdown["pid"] == init["pid"]
