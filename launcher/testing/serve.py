"""Start a real tritonserver on the fixture models (launcher/testing/models), for tests and benchmarks.

    repo = make_repository(tmp_path / "repo", {"timed": {"first_token_delay_ms": 50}})
    with serve(repo) as url:            # "127.0.0.1:PORT" (gRPC)
        ...

The server comes from the nvidia-pytriton wheel, started as launcher.triton does: a
private backend directory holding the python backend and the stub for the
running interpreter, the wheel's libraries and the interpreter's LIBDIR on
LD_LIBRARY_PATH, the venv's bin first on PATH, a unique shm prefix per server.
launcher.triton (the project's TritonServer: process group, readiness probe,
SIGTERM then SIGKILL, shm clean-up) is used when importable; set
LLMLAUNCH_TEST_OWN_SERVER=1 to use the by-hand start below instead.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from launcher.ports import RECONNECT_SOON, free_port
from launcher.procs.group import term_with_parent

MODELS = Path(__file__).resolve().parent / "models"  # the fixture models, shipped as package data
_counter = itertools.count()


def make_repository(dest: Path, models: dict[str, dict], instances: dict[str, int] | None = None) -> Path:
    """Copy fixture models (names of folders under MODELS) into `dest`,
    setting their config parameters from `models[name]` and the instance count
    from `instances[name]`."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name, params in models.items():
        target = dest / name
        shutil.copytree(MODELS / name, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
        config = (target / "config.pbtxt").read_text()
        for key, value in params.items():
            value = str(value).lower() if isinstance(value, bool) else str(value)
            line = f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
            config, n = re.subn(rf'parameters \{{ key: "{key}" .*\n', line + "\n", config)
            if not n:
                config += line + "\n"
        count = (instances or {}).get(name)
        if count:
            config = re.sub(r"instance_group \[.*\]", f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]", config)
        (target / "config.pbtxt").write_text(config)
    return dest


def variants_repository(dest: Path, fixture: str, params: dict[str, dict], instances: int = 1) -> Path:
    """One repository holding a copy of fixture model `fixture` per entry of `params` (model name -> its
    parameters), `instances` instances each: the variants a benchmark compares in one tritonserver."""
    repo = Path(dest) / "repo"
    repo.mkdir(parents=True)
    for name, model_params in params.items():
        one = make_repository(Path(dest) / f"src_{name}", {fixture: model_params}, instances={fixture: instances})
        shutil.move(str(one / fixture), str(repo / name))
    return repo


def chosen_variants(ap, text: str, known) -> list[str]:
    """A benchmark's --variants (comma-separated) checked against the names it knows (argparse error if not)."""
    variants = [v for v in text.split(",") if v]
    if not variants or any(v not in known for v in variants):
        ap.error(f"--variants {text!r}: choose among {', '.join(known)}")
    return variants


def measure_variants(prefix: str, make_repo, measure, table, json_path: str = "", header: dict | None = None) -> dict:
    """A variants benchmark's run: `make_repo(dir)` -> a repository (variants_repository), served by one
    tritonserver (its start announced on stdout); `measure(url)` -> {variant: result}; `table(result)` printed; the
    results also written to json_path (with `header` and the CPU count) if given."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        t0 = time.monotonic()
        with serve(make_repo(Path(tmp))) as url:
            print(f"tritonserver ready in {time.monotonic() - t0:.1f} s ({url}); {os.cpu_count()} CPUs", flush=True)
            result = measure(url)
    print(table(result))
    if json_path:
        Path(json_path).write_text(json.dumps({**(header or {}), "cpus": os.cpu_count(), "variants": result}, indent=2))
    return result


def hf_server(
    model_dir: str,
    workdir: Path,
    params: dict,
    model: str = "hf_model",
    env: dict | None = None,
    instances: int = 1,
    http: bool = False,
):
    """A launcher.triton.TritonServer (not started) serving the project's hf model (launcher/engines/hf/model.py; `params`:
    HFEngineArgs fields, written to its model.json) on free loopback ports, metrics on: `.metrics_url` is where the model's
    first-token split is read (launcher/python_backend/timings.py).  `env`: extra server environment.  `instances`:
    model instances sharing the engine process (engine.response_processes).  `http`: the HTTP endpoint too, on a free
    loopback port (`.http_url`: Triton's generate extension)."""
    import uuid

    from launcher import pbtxt
    from launcher.engines.hf.config import ARGS_FILE, HFEngineArgs
    from launcher.paths import REPO_SOURCES
    from launcher.triton import TritonServer
    from launcher.triton_install import resolve_tritonserver, server_env

    repo = Path(workdir) / "model_repository"
    (repo / model / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO_SOURCES / "hf" / "1" / "model.py", repo / model / "1" / "model.py")
    # the engine's arguments go to 1/model.json as the launcher writes them; None or "" keeps a default
    args = HFEngineArgs.from_dict({"model_path": model_dir, **{k: v for k, v in params.items() if v not in (None, "")}})
    (repo / model / "1" / ARGS_FILE).write_text(args.to_json())
    cfg = pbtxt.python_model(
        model, args.max_num_seqs, {"engine_args_file": ARGS_FILE}, instances=instances, continues=True
    )
    (repo / model / "config.pbtxt").write_text(pbtxt.to_text(cfg))
    install = resolve_tritonserver()
    port, metrics_port = free_port(), free_port()
    prefix = f"llmt{os.getpid()}{uuid.uuid4().hex[:6]}_"
    http_port = free_port() if http else None
    argv = [
        install.binary,
        f"--model-repository={repo}",
        "--allow-metrics=true",
        *(
            ["--allow-http=true", "--http-address=127.0.0.1", f"--http-port={http_port}"]
            if http
            else ["--allow-http=false"]
        ),
        f"--metrics-port={metrics_port}",
        "--metrics-address=127.0.0.1",
        "--allow-gpu-metrics=false",
        "--allow-cpu-metrics=false",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={port}",
        f"--backend-config=python,shm-region-prefix-name={prefix}",
    ]
    if install.backend_directory:
        argv.append(f"--backend-directory={install.backend_directory}")
    server = TritonServer(
        argv,
        env=server_env(install, env),
        log_path=Path(workdir) / "tritonserver.log",
        grpc_url=f"127.0.0.1:{port}",
        model=model,
        ready_timeout_s=300,
        shm_prefix=prefix,
    )
    server.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    server.http_url = f"http://127.0.0.1:{http_port}" if http else None
    return server


def _pytriton_root() -> Path:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.origin:
        raise RuntimeError("nvidia-pytriton is not installed in this environment (pip install nvidia-pytriton)")
    return Path(spec.origin).parent / "tritonserver"


def _backend_dir(workdir: Path) -> Path:
    """A backend directory whose python/ has the wheel's backend plus the stub
    for this interpreter (the wheel keeps stubs per Python version apart)."""
    root = _pytriton_root()
    python_dir = workdir / "backends" / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for item in (root / "backends" / "python").iterdir():
        if item.is_file() and not (python_dir / item.name).exists():
            (python_dir / item.name).symlink_to(item)
    stub = (
        root
        / "python_backend_stubs"
        / f"{sys.version_info.major}.{sys.version_info.minor}"
        / "triton_python_backend_stub"
    )
    if not (python_dir / stub.name).exists():
        shutil.copy2(stub, python_dir / stub.name)
    return workdir / "backends"


def server_env() -> dict:
    root = _pytriton_root()
    libs = [str(root.parent.parent / "nvidia_pytriton.libs"), sysconfig.get_config_var("LIBDIR") or ""]
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join([p for p in libs if p] + [env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    env["PATH"] = str(Path(sys.executable).parent) + ":" + env.get("PATH", "")
    env.setdefault("PYTHONIOENCODING", "UTF-8")
    return env


def wait_ready(url: str, models, proc: subprocess.Popen | None, timeout: float, log: Path | None = None) -> None:
    import tritonclient.grpc as grpcclient

    deadline = time.monotonic() + timeout
    client = grpcclient.InferenceServerClient(url, channel_args=RECONNECT_SOON)
    try:
        while True:
            if proc is not None and proc.poll() is not None:
                tail = log.read_text()[-3000:] if log and log.exists() else ""
                raise RuntimeError(f"tritonserver exited with {proc.returncode} before READY:\n{tail}")
            try:
                if client.is_server_ready() and all(client.is_model_ready(m) for m in models):
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                tail = log.read_text()[-3000:] if log and log.exists() else ""
                raise TimeoutError(f"tritonserver not READY after {timeout:.0f} s:\n{tail}")
            time.sleep(0.1)
    finally:
        client.close()


@contextlib.contextmanager
def serve(repo: Path, timeout: float = 60.0, log_verbose: int = 0):
    """Run tritonserver on `repo`; yield its gRPC address "127.0.0.1:PORT"."""
    repo = Path(repo)
    models = sorted(p.name for p in repo.iterdir() if (p / "config.pbtxt").exists())
    n = next(_counter)
    workdir = repo.parent / f"{repo.name}.server{n}"
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"127.0.0.1:{port}"
    log = workdir / "tritonserver.log"
    prefix = f"llt{os.getpid()}x{n}_"
    common = [
        f"--model-repository={repo}",
        f"--backend-config=python,shm-region-prefix-name={prefix}",
        f"--grpc-port={port}",
        "--allow-http=false",
        "--allow-metrics=false",
        f"--log-verbose={log_verbose}",
    ]
    lt = None
    if not os.environ.get("LLMLAUNCH_TEST_OWN_SERVER"):
        try:
            from launcher import triton as lt, triton_install
        except ImportError:
            lt = None
    if lt is not None:  # the project's own server handling
        install = triton_install.resolve_tritonserver()
        argv = [install.binary, *common]
        if install.backend_directory:
            argv.append(f"--backend-directory={install.backend_directory}")
        with lt.TritonServer(
            argv,
            env=triton_install.server_env(install),
            log_path=log,
            grpc_url=url,
            model=models[0],
            ready_timeout_s=timeout,
            drain_timeout_s=5,
            shm_prefix=prefix,
        ) as server:
            wait_ready(url, models, server.proc, timeout, log)
            yield url
        return
    argv = [
        str(_pytriton_root() / "bin" / "tritonserver"),
        *common,
        f"--backend-directory={_backend_dir(workdir)}",
        "--exit-timeout-secs=5",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv,
            env=server_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=term_with_parent,
        )
    try:
        wait_ready(url, models, proc, timeout, log)
        yield url
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
