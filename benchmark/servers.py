"""Starting and stopping what the benchmarks measure, one way for all of them: `llmlaunch` as a user runs it (a
local run, or a job on the local Slurm cluster), tritonservers on the fixture models (launcher/testing/models), and
the front end and the OpenAI API in front of a server.

Each helper returns only once what it started answers, so no figure is taken against a server still loading, and
stops it however the benchmark ends (an exception, SIGTERM turned into one, Ctrl-C), so no server outlives the run
that started it and holds its ports, GPU or shared memory.  The hf model under tritonserver alone is
launcher.testing.serve.hf_server (a TritonServer, itself a context manager), shared with the tests.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]


def checkout_env() -> dict:
    """This environment with the checkout first on PYTHONPATH: the processes a benchmark starts (`python -m
    launcher.frontend`, `launcher.openai_api`) then import the same launcher as the benchmark, whatever is installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHECKOUT), env.get("PYTHONPATH", "")) if p)
    return env


# ----------------------------------------------------------------------------- llmlaunch, cluster=local
@dataclass
class Served:
    """A running `llmlaunch`: its process (a session of its own) and the endpoint it printed."""

    proc: subprocess.Popen
    url: str
    model: str


def start_llmlaunch(overrides: list[str], log_path: Path, timeout_s: float) -> Served:
    """`llmlaunch <overrides>` in a session of its own (stderr to `log_path`), returned once it prints its endpoint
    and model.  One that exits first, or prints nothing more after `timeout_s`, raises with the log's last lines."""
    log_path = Path(log_path)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "launcher.cli", *overrides],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            start_new_session=True,
            cwd=CHECKOUT,
        )
    url = model = ""
    t0 = time.monotonic()
    while not (url and model):
        line = proc.stdout.readline()
        if not line:
            proc.wait()
            raise RuntimeError(
                f"llmlaunch exited ({proc.returncode}) before serving; see {log_path}:\n"
                + "\n".join(log_path.read_text().splitlines()[-30:])
            )
        if line.startswith("endpoint: "):
            url = line.split(None, 1)[1].strip()
        elif line.startswith("model: "):
            model = line.split(None, 1)[1].strip()
        if time.monotonic() - t0 > timeout_s:
            stop_llmlaunch(proc)
            raise TimeoutError(f"no endpoint after {timeout_s:.0f} s; see {log_path}")
    return Served(proc, url, model)


def stop_llmlaunch(proc: subprocess.Popen) -> int | None:
    """Ctrl-C's signal to llmlaunch's session (it drains and stops its servers as for a user), SIGKILL to the session
    after 120 s; its exit status."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


@contextlib.contextmanager
def llmlaunch(overrides: list[str], log_path: Path, timeout_s: float = 600.0):
    """start_llmlaunch for the length of a `with` block: yields the Served, stops it on the way out."""
    served = start_llmlaunch(overrides, log_path, timeout_s)
    try:
        yield served
    finally:
        stop_llmlaunch(served.proc)


# ----------------------------------------------------------------------------- llmlaunch on the local Slurm cluster
@dataclass
class SlurmRun:
    """A job `llmlaunch` submitted and followed to READY."""

    job: str
    run: object  # launcher.rundir.RunDir: the job's ready records, run record and endpoint
    seconds: float  # `llmlaunch` started -> it printed READY and returned


def run_dir_of(job: str):
    """The run folder (launcher.rundir.RunDir) of a job llmlaunch submitted, from the job index."""
    from launcher import jobindex
    from launcher.rundir import RunDir

    return RunDir(jobindex.find(job)["run_dir"])


def launch_to_ready(overrides: list[str]) -> SlurmRun:
    """`llmlaunch <overrides>` on a Slurm cluster (the local one's environment set), which returns once the job
    serves.  One that fails exits this script with llmlaunch's output."""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "launcher.cli", *overrides], capture_output=True, text=True)
    seconds = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(
            f"llmlaunch {' '.join(overrides)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        )
    job = next(ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("job:"))
    return SlurmRun(job, run_dir_of(job), seconds)


def submit(overrides: list[str]) -> tuple[subprocess.Popen, str]:
    """`llmlaunch <overrides>` on a Slurm cluster, returned as soon as it prints the job it submitted, while it still
    follows the job to READY: for a benchmark that acts on a job before it serves.  The process (stdout and stderr
    piped together) and the job id; the caller ends the process and stop_job()s the job."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher.cli", *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in proc.stdout:
        m = re.search(r"submitted job (\d+)", line)
        if m:
            return proc, m.group(1)
    proc.wait()
    raise SystemExit(f"llmlaunch {' '.join(overrides)} printed no job id ({proc.returncode})")


def stop_job(job: str) -> None:
    """llmlaunch-stop: the job drains and ends, and is gone from the queue when this returns."""
    from launcher.schedulers import slurm_jobs

    slurm_jobs.stop(job)


# ----------------------------------------------------------------------------- tritonservers on fixture models
@contextlib.contextmanager
def fixture_servers(n: int, instances: int, models: dict, timeout_s: float = 180.0):
    """n tritonservers, each serving the fixture models `models` (folder name under launcher/testing/models -> its
    config parameters) with `instances` instances each; yields their gRPC addresses once all are ready."""
    from launcher.testing.serve import make_repository, serve

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        urls = []
        for i in range(n):
            repo = make_repository(Path(tmp) / f"repo{i}", models, instances={m: instances for m in models})
            urls.append(stack.enter_context(serve(repo, timeout=timeout_s)))
        yield urls


# ----------------------------------------------------------------------------- in front of a server
@contextlib.contextmanager
def frontend(
    addrs: list[str],
    processes: int = 1,
    loop: str = "auto",
    model: str = "",
    routing: str = "least_outstanding",
    tokenizer: str = "",
    kv_blocks_per_s: int = 0,
    max_migrations: int = 0,
):
    """The data-parallel front end (`python -m launcher.frontend`) over the gRPC addresses `addrs`, on free loopback
    ports; yields (its gRPC address, its metrics port, its process group id) once every replica answers through it.
    `routing` kv: the fixture models keep no KV cache, so a publisher per replica stands in for their engines' events
    and says only the block size (16 tokens, and one block no prompt has): the front end then cuts every prompt into
    token blocks with `tokenizer` and looks them up, as against real engines, and finds no engine holding them.
    `kv_blocks_per_s`: each publisher then goes on storing that many new blocks a second and evicting them a second
    later, in a batch every 10 ms (an engine's steps), so the front end's subscriber thread works while it serves.
    `max_migrations` > 0: it keeps the output ids of `model`'s streams to move them (launcher/frontend/migration.py)."""
    from launcher.frontend import FrontendConfig, FrontendProcess
    from launcher.kv_events import Publisher, stored
    from launcher.ports import free_port

    port, metrics_port = free_port(), free_port()
    events = tempfile.TemporaryDirectory(prefix="llmlaunch-kv-") if routing == "kv" else None
    endpoints = [f"ipc://{events.name}/{i}.ipc" for i in range(len(addrs))] if events else []
    publishers = [Publisher(e) for e in endpoints]
    cfg = FrontendConfig(
        [(host, int(p)) for host, p in (a.rsplit(":", 1) for a in addrs)],
        "127.0.0.1",
        port,
        metrics_port,
        model,
        processes,
        drain_timeout_s=5,
        loop=loop,
        routing=routing,
        kv_events=endpoints,
        tokenizer=tokenizer,
        max_migrations=max_migrations,
    )
    fe = FrontendProcess(cfg, env=checkout_env()).start()
    try:
        fe.wait_ready(60)
        for _ in range(20 if publishers else 0):  # every process's subscriber joins by then (ZMQ drops what precedes)
            for pub in publishers:
                pub.send([stored([-1], None, [-1] * 16, 16)])
            time.sleep(0.05)
        with kv_churn(publishers, kv_blocks_per_s) if publishers and kv_blocks_per_s > 0 else contextlib.nullcontext():
            yield f"127.0.0.1:{port}", metrics_port, fe.proc.pid
    finally:
        fe.stop()
        for pub in publishers:
            pub.close()
        if events is not None:
            events.cleanup()


def churn_batches(per_batch: int, block_size: int = 16, held_batches: int = 100):
    """Endless batches of KV-cache events as an engine's cache makes them under load: each stores `per_batch` new
    blocks (one chain, tokens never seen before) and, once `held_batches` batches are held, evicts the oldest
    batch's blocks, so whoever reads them holds per_batch x held_batches blocks."""
    import collections

    from launcher.kv_events import removed, stored

    held: collections.deque = collections.deque()
    token, next_hash = 1_000_000, 1
    while True:
        hashes = list(range(next_hash, next_hash + per_batch))
        next_hash += per_batch
        tokens = list(range(token, token + per_batch * block_size))
        token += len(tokens)
        events = [stored(hashes, None, tokens, block_size)]
        held.append(hashes)
        if len(held) > held_batches:
            events.append(removed(held.popleft()))
        yield events


@contextlib.contextmanager
def kv_churn(publishers: list, blocks_per_s: int):
    """While in the block, a thread that owns `publishers` (a ZMQ socket is one thread's) has each publish what an
    engine's cache does under load (`churn_batches`): a batch every 10 ms (an engine's steps), blocks_per_s new
    blocks a second, each evicted a second after it was stored, so the index the front end keeps stays its size."""
    import threading

    batches = [churn_batches(max(1, blocks_per_s // 100)) for _ in publishers]
    stop = threading.Event()

    def run() -> None:
        tick = time.monotonic()
        while not stop.is_set():
            for pub, made in zip(publishers, batches):
                pub.send(next(made))
            tick += 0.01
            stop.wait(max(0.0, tick - time.monotonic()))

    thread = threading.Thread(target=run, name="kv-churn", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


@contextlib.contextmanager
def openai_api(grpc_url: str, model: str, processes: int = 1, tokenizer: str = "", timeout_s: float = 120.0):
    """The OpenAI API (`python -m launcher.openai_api`) in front of `grpc_url` as rank 0 runs it, `processes` worker
    processes on a free loopback port; yields the OpenAIProcess (`.cfg.url`, `.proc.pid`) once GET /health answers.
    `tokenizer`: the model's folder, for chat requests."""
    from launcher.openai_api.process import OpenAIConfig, OpenAIProcess
    from launcher.ports import free_port

    cfg = OpenAIConfig(
        grpc_url=grpc_url,
        model=model,
        host="127.0.0.1",
        port=free_port(),
        tokenizer=tokenizer,
        drain_timeout_s=2,  # nothing runs when a benchmark stops it
        processes=processes,
    )
    api = OpenAIProcess(cfg, env=checkout_env()).start()
    try:
        api.wait_ready(timeout_s)
        yield api
    finally:
        api.stop()
