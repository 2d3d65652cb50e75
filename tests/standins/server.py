"""Start a real tritonserver on a rendered repository for the engine tests.

Uses the project's own pieces (launcher.triton: resolve_tritonserver, server_env,
TritonServer) so the tests exercise the same start/stop path as `llmlaunch`.

The stand-in engine packages are put on the server's PYTHONPATH (`pythonpath=`). The
python backend stub of Triton 2.51 does not read PYTHONPATH itself (its sys.path is the
interpreter's, site-packages and the model's folders); llmlaunch's model.py files append
PYTHONPATH's entries to sys.path before importing anything, so this exercises that too.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Dict, Iterable, Optional

STANDINS = Path(__file__).resolve().parent


def write_repository(files: Dict[str, str], dest: Path) -> Path:
    """`launcher.render.repository_files` output -> a folder."""
    dest = Path(dest)
    for rel, text in files.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return dest


@contextlib.contextmanager
def serve(
    repo: Path,
    models: Iterable[str],
    log_path: Path,
    ready_model: str,
    extra_env: Optional[Dict[str, str]] = None,
    ready_timeout_s: float = 120.0,
    pythonpath: Iterable[str] = (),
    metrics: bool = False,
):
    """Yield a tritonserver that loaded `models` from `repo` (explicit model control); with `metrics`, its metrics
    port is on and `server.metrics_url` names it."""
    from launcher.ports import free_port
    from launcher.triton import TritonServer
    from launcher.triton_install import resolve_tritonserver, server_env

    install = resolve_tritonserver()
    prefix = f"llmt{os.getpid()}{uuid.uuid4().hex[:6]}_"
    ports = [free_port() for _ in range(3)]
    argv = [
        install.binary,
        f"--model-repository={repo}",
        "--disable-auto-complete-config",
        f"--backend-config=python,shm-region-prefix-name={prefix}",
        "--model-control-mode=explicit",
        *[f"--load-model={m}" for m in models],
        "--grpc-address=127.0.0.1",
        f"--grpc-port={ports[0]}",
        "--http-address=127.0.0.1",
        f"--http-port={ports[1]}",
        *(["--metrics-address=127.0.0.1", f"--metrics-port={ports[2]}"] if metrics else ["--allow-metrics=false"]),
        "--log-verbose=0",
    ]
    if install.backend_directory:
        argv.append(f"--backend-directory={install.backend_directory}")
    env = server_env(install, extra_env)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    server = TritonServer(
        argv,
        env=env,
        log_path=log_path,
        grpc_url=f"127.0.0.1:{ports[0]}",
        model=ready_model,
        ready_timeout_s=ready_timeout_s,
        drain_timeout_s=10,
        shm_prefix=prefix,
        probe=False,
    )
    server.metrics_url = f"http://127.0.0.1:{ports[2]}/metrics" if metrics else ""
    with server:
        yield server


@contextlib.contextmanager
def serve_standin(spec, dest: Path, extra_env: Optional[Dict[str, str]] = None, metrics: bool = False):
    """Yield a tritonserver on the repository `llmlaunch` renders for `spec` (written to dest/repo), its engine the
    stand-in on the server's PYTHONPATH, logging to dest/server.log.  The stand-in records every call it gets in
    dest/calls.jsonl (`server.calls`) and takes 0.01 s a token; `extra_env` adds to or overrides that environment.
    `server.model` and `server.spec` name what it serves."""
    from launcher.render import repository_files

    repo = write_repository(repository_files(spec), dest / "repo")
    calls = dest / "calls.jsonl"
    env = {"LLMLAUNCH_STANDIN_LOG": str(calls), "LLMLAUNCH_STANDIN_DELAY_S": "0.01", **(extra_env or {})}
    with serve(
        repo,
        [spec.model_name],
        dest / "server.log",
        spec.model_name,
        extra_env=env,
        pythonpath=[STANDINS],
        metrics=metrics,
    ) as server:
        server.model, server.calls, server.spec = spec.model_name, calls, spec
        yield server


def failed_load_log(repo: Path, model: str, log_path: Path, extra_env: Optional[Dict[str, str]] = None) -> str:
    """Start a tritonserver on `repo` whose `model` must fail to load (it never gets READY); the server's log."""
    import pytest

    with pytest.raises((RuntimeError, TimeoutError)):
        with serve(repo, [model], log_path, model, extra_env=extra_env, ready_timeout_s=60, pythonpath=[STANDINS]):
            pass
    return log_path.read_text()
