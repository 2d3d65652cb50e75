"""Tensor parallelism of the hf engine (launcher/hf/tp.py): leader + worker ranks over gloo on CPU.

* engine level: a tp=2 leader Engine and a worker process give the same greedy tokens as tp=1;
* a tp that does not divide the heads is refused with a clear error;
* end to end: `llmlaunch engine=hf tp=2` on cluster=local serves the same greedy text as transformers' generate,
  and SIGINT leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["Once upon a time", "The quick brown fox jumps over", "hello"]

# One rank of the engine-level test: argv = role tp port model_dir.  The leader prints the greedy tokens per
# prompt (three concurrent requests, small prefill chunks: decode and chunked prefill share steps).
_RANK = r"""
import json, os, sys, threading
from launcher.engines.hf.config import HFEngineArgs
from launcher.hf.engine import Engine, SamplingParams
from launcher.hf.tp import TPGroup
from launcher.hf.worker import run_worker
role, tp, port, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
prompts = json.loads(sys.argv[5])
kw = dict(device="cpu", max_num_seqs=4, max_model_len=int(os.environ.get("TEST_MAX_MODEL_LEN", "128")), threads=1)
rank = 0 if role == "leader" else int(os.environ.get("TEST_RANK", "1"))
group = TPGroup(tp, rank=rank, addr="127.0.0.1", port=port, timeout=60) if tp > 1 else None
if role == "worker":
    run_worker(path, tp=tp, group=group, **kw)
    print("worker done", flush=True)
    os._exit(0)  # like the hf engine process: gloo's threads can abort interpreter teardown (pytorch#179291)
args = HFEngineArgs(model_path=path, tp_size=tp, prefill_chunk=4, device=kw["device"], max_num_seqs=kw["max_num_seqs"],
                    max_model_len=kw["max_model_len"], torch_threads=kw["threads"])
eng = Engine.from_args(args, tp_group=group).start()
res = {}
def go(p):
    res[p] = eng.generate(p, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)).token_ids
ts = [threading.Thread(target=go, args=(p,)) for p in prompts]
[t.start() for t in ts]
[t.join() for t in ts]
eng.shutdown()
print(f"AHEAD {eng.stats.ahead_steps}", flush=True)
print("RESULT " + json.dumps(res), flush=True)
os._exit(0)
"""


def _rank(role: str, tp: int, port: int, model_dir, env: dict | None = None, prompts=PROMPTS) -> subprocess.Popen:
    """One rank as a process; a worker's rank in the group is env TEST_RANK (default 1)."""
    return subprocess.Popen(
        [sys.executable, "-c", _RANK, role, str(tp), str(port), str(model_dir), json.dumps(prompts)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )


def _result(proc: subprocess.Popen, timeout: float = 180, ahead: list | None = None) -> dict:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert line, out
    if ahead is not None:
        ahead.extend(int(ln.split()[1]) for ln in out.splitlines() if ln.startswith("AHEAD "))
    return json.loads(line[-1][len("RESULT ") :])


def test_tp2_engine_equals_tp1_greedy(tiny_model_dir):
    """The leader launches decode steps ahead and sends their tokens to the worker as a tensor (gloo here, NCCL on
    GPUs); other steps' tokens come in their broadcast StepInputs."""
    from launcher.ports import free_port

    ref = _result(_rank("leader", 1, 0, tiny_model_dir))
    port = free_port()
    worker = _rank("worker", 2, port, tiny_model_dir)
    leader = _rank("leader", 2, port, tiny_model_dir)
    ahead: list = []
    try:
        got = _result(leader, ahead=ahead)
        wout, _ = worker.communicate(timeout=60)
        assert worker.returncode == 0 and "worker done" in wout, wout  # the leader's shutdown stops the worker
    finally:
        for p in (leader, worker):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert got == ref
    assert all(len(v) == 16 for v in got.values())
    assert ahead[0] > 0, ahead


def test_ranks_with_different_settings_fail_at_warm_up_on_both_sides(tiny_model_dir):
    """Ranks compare their warm-up plans (compile, graphs, cache shape) before any collective step: a worker started
    with another max_model_len would otherwise run steps whose shapes, or on a GPU whose graphs, its peer lacks."""
    from launcher.ports import free_port

    port = free_port()
    worker = _rank("worker", 2, port, tiny_model_dir, env={"TEST_MAX_MODEL_LEN": "64"})
    leader = _rank("leader", 2, port, tiny_model_dir)
    try:
        outs = [p.communicate(timeout=120)[0] for p in (leader, worker)]
    finally:
        for p in (leader, worker):
            if p.poll() is None:
                p.kill()
                p.wait()
    for out, proc in zip(outs, (leader, worker)):
        assert proc.returncode != 0, out
        assert "warm-up plans differ (rank 0: max_model_len=128; rank 1: max_model_len=64)" in out, out
        assert "give all ranks the same engine settings" in out, out


def test_tp_that_does_not_divide_heads_is_refused(tiny_model_dir):
    from launcher.hf.runner import HFModelRunner

    with pytest.raises(ValueError, match=r"tp=3 does not divide the model's attention heads \(4\)"):
        HFModelRunner(str(tiny_model_dir), device="cpu", max_num_seqs=2, max_model_len=64, tp=3)


def test_plan_accepts_hf_tp2():
    from launcher.cli import plan

    cfg, spec = plan(["engine=hf", "model=tiny", "cluster=local", "tp=2"])
    assert spec.world_size == 2
    assert [r.role for r in spec.ranks] == ["leader", "worker"]


# ------------------------------------------------------------------------------------------- end to end
def _processes_mentioning(marker: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            blob = Path(f"/proc/{pid}/cmdline").read_bytes() + Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in blob:
            found.append(f"{pid}: {Path(f'/proc/{pid}/cmdline').read_bytes()[:200]!r}")
    return found


def test_llmlaunch_tp2_local_serves_generate_greedy_and_sigint_cleans_up(tiny_model_dir, tmp_path):
    pytest.importorskip("tritonclient.grpc")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from launcher.client.request import Generation
    from launcher.client.stream import generate
    from launcher.ports import free_port
    from launcher.triton_install import resolve_tritonserver

    try:
        resolve_tritonserver()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no tritonserver: {exc}")
    prompt, n = "The quick brown fox", 24
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = tok(prompt, return_tensors="pt").input_ids
    ref = tok.decode(
        model.generate(ids, max_new_tokens=n, do_sample=False)[0, ids.shape[1] :], skip_special_tokens=True
    )

    grpc, http, metrics = free_port(), free_port(), free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "launcher.cli",
            "engine=hf",
            "model=tiny",
            "cluster=local",
            "tp=2",
            "engine.device=cpu",
            f"model.path={tiny_model_dir}",
            "engine.max_num_seqs=8",
            "model.max_model_len=256",
            f"serve.grpc_port={grpc}",
            f"serve.http_port={http}",
            f"serve.metrics_port={metrics}",
            f"serve.openai_port={free_port()}",
            f"cluster.jobs_dir={tmp_path}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        url = None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("endpoint:"):
                url = line.split(None, 1)[1].strip()
                break
        assert url, "".join(lines)
        assert url.endswith(f":{grpc}")
        rec = generate(url, "hf_model", Generation(prompt, max_tokens=n, temperature=0.0), timeout=120)
        assert not rec.error, rec.error
        assert rec.text == ref, (rec.text, ref)
        assert rec.output_tokens == n or rec.finish_reason == "stop"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rest, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            rest, _ = proc.communicate()
        lines.append(rest or "")
    time.sleep(1)
    left = _processes_mentioning(str(tmp_path))
    assert not left, (left, "".join(lines)[-3000:])


# ------------------------------------------------------------------------------------------- Slurm
@pytest.mark.slurm
@pytest.mark.skipif(os.geteuid() != 0, reason="the local Slurm cluster needs root")
@pytest.mark.timeout(600)
def test_slurm_tp2_two_nodes_leader_serves_generate_greedy(local_slurm, tmp_path):
    """cluster=local_slurm tp=2 nodes=2: one rank per node, gloo across the nodes, rank 0 serves."""
    pytest.importorskip("tritonclient.grpc")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.integration.test_slurm_launch import greedy, launch, prefixes_of, stop

    spec, job_id, run, ep = launch(tmp_path, "tp=2", "nodes=2")
    try:
        assert [(r.node, r.role) for r in spec.ranks] == [(0, "leader"), (1, "worker")]
        text, n = greedy(ep.url, ep.model)
        path = spec.model.path
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
        ids = tok("The capital of France is", return_tensors="pt").input_ids
        ref = tok.decode(
            model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :], skip_special_tokens=True
        )
        assert text == ref and n == 8, (text, ref, n)
    finally:
        stop(job_id)
    time.sleep(1)
    assert prefixes_of(job_id) == []


def test_slurm_tp4_two_nodes_two_tasks_generate_greedy(local_slurm, tmp_path):
    """cluster=local_slurm tp=4 nodes=2: 2 nodes x 2 tasks, one leader and three workers, gloo across
    the nodes. The default tiny model has 2 kv heads, so this one is made with 4."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from launcher.tiny import ensure_tiny_model
    from tests.integration.test_slurm_launch import greedy, launch, prefixes_of, stop

    path = str(ensure_tiny_model(kv_heads=4))
    spec, job_id, run, ep = launch(tmp_path, "tp=4", "nodes=2", f"model.path={path}")
    try:
        assert [(r.node, r.role) for r in spec.ranks] == [(0, "leader"), (0, "worker"), (1, "worker"), (1, "worker")]
        text, n = greedy(ep.url, ep.model)
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path)
        ids = tok("The capital of France is", return_tensors="pt").input_ids
        ref = tok.decode(
            model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :], skip_special_tokens=True
        )
        assert text == ref and n == 8, (text, ref, n)
        assert prefixes_of(job_id) == [f"llm{job_id}r{i}_" for i in range(4)]
    finally:
        stop(job_id)
    time.sleep(1)
    assert prefixes_of(job_id) == []


_HEARTBEAT = r"""
import os, sys, time
from launcher.engines.hf.config import HFEngineArgs
from launcher.hf.engine import Engine, SamplingParams
from launcher.hf.tp import TPGroup
from launcher.hf.worker import run_worker
role, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
kw = dict(device="cpu", max_num_seqs=2, max_model_len=64, threads=1)
g = TPGroup(2, rank=0 if role == "leader" else 1, addr="127.0.0.1", port=port, timeout=2)
if role == "worker":
    try:
        run_worker(path, tp=2, group=g, **kw)
        print("worker stopped cleanly")
    except Exception as e:
        print("worker failed: " + repr(e)[:300])
    sys.exit(0)
args = HFEngineArgs(model_path=path, tp_size=2, device=kw["device"], max_num_seqs=kw["max_num_seqs"],
                    max_model_len=kw["max_model_len"], torch_threads=kw["threads"])
eng = Engine.from_args(args, tp_group=g).start()
time.sleep(5)  # idle for more than twice the collective timeout: the leader's heartbeats keep workers alive
print("tokens", eng.generate("hello", SamplingParams(max_tokens=4, temperature=0.0)).token_ids, flush=True)
os.kill(os.getpid(), 19)  # SIGSTOP: a hung leader
"""


def test_idle_leader_keeps_workers_alive_and_a_hung_leader_fails_them(tiny_model_dir):
    """Heartbeats cover idle time; a leader that stops answering fails the worker within the timeout."""
    from launcher.ports import free_port

    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _HEARTBEAT, role, str(port), str(tiny_model_dir)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for role in ("worker", "leader")
    ]
    try:
        wout, _ = procs[0].communicate(timeout=120)
        assert "worker failed" in wout and "Timed out" in wout, wout
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        lout, _ = procs[1].communicate()
    assert "tokens [" in lout, lout


def test_tp_graphs_benchmark_runs_its_ranks_and_reports(tiny_model_dir, tmp_path):
    """benchmark/gpu/tp_graphs.py on CPU (gloo, so no graphs): it starts each config's ranks fresh, measures every
    concurrency, and the float32 greedy tokens of tp=2 equal tp=1's; the GPU figures come from the same code."""
    out = tmp_path / "tp.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmark.gpu.tp_graphs",
            "--model",
            str(tiny_model_dir),
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--configs",
            "tp1-eager",
            "tp2-eager",
            "--concurrency",
            "1",
            "3",
            "--tokens",
            "8",
            "--prompt-tokens",
            "12",
            "--greedy-tokens",
            "12",
            "--max-num-seqs",
            "4",
            "--max-model-len",
            "128",
            "--timeout",
            "240",
            "--workdir",
            str(tmp_path / "w"),
            "--json",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert results["tp2-eager"]["tp"] == 2 and not results["tp2-eager"]["cuda_graphs"]
    for r in results.values():
        assert [row["concurrency"] for row in r["rows"]] == [1, 3]
        assert all(row["output_tokens_per_s"] > 0 and row["steps"] >= 8 for row in r["rows"])
        assert r["rows"][0]["decode_steps_per_s"] > 0
        assert len(r["greedy"]) == 4 and all(len(t) == 12 for t in r["greedy"])
    assert results["tp2-eager"]["greedy_equals_first"] is True
    assert "tp2-eager         3" in proc.stdout, proc.stdout


def test_tp_graphs_benchmark_names_a_bad_config():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmark.gpu.tp_graphs", "--model", "x", "--configs", "tp2-fast"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "config 'tp2-fast' is not tpN, tpN-graphs, tpN-eager or tpN-compile" in proc.stderr
