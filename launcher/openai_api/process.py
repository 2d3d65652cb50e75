"""The OpenAI API as a child process of rank 0: the command line `python -m launcher.openai_api` runs (`main`), and
the handle that starts it, waits until it answers and stops it (`OpenAIProcess`)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional


def log(msg: str) -> None:
    print(f"[llmlaunch openai {os.getpid()}] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class OpenAIConfig:
    grpc_url: str  # host:port of the gRPC endpoint rank 0 serves (its tritonserver or the replicas front end)
    model: str  # the Triton model name requests go to; also the name /v1/models lists
    host: str  # address the HTTP server binds (serve.host)
    port: int  # serve.openai_port
    tokenizer: str = ""  # folder with the model's tokenizer (its chat template); "" = chat refused
    aliases: tuple = ()  # more names a request's `model` may use (the model config's name)
    drain_timeout_s: float = 30.0  # on SIGTERM, how long running requests may finish

    def argv(self) -> List[str]:
        argv = [sys.executable, "-m", "launcher.openai_api", "--grpc-url", self.grpc_url, "--model", self.model,
                "--host", self.host, "--port", str(self.port), "--drain-timeout", str(self.drain_timeout_s)]
        if self.tokenizer:
            argv += ["--tokenizer", self.tokenizer]
        for a in self.aliases:
            argv += ["--alias", a]
        return argv + ["--die-with-parent"]

    @property
    def url(self) -> str:
        from launcher.frontend.process import connect_host

        return f"http://{connect_host(self.host)}:{self.port}"


class OpenAIProcess:
    """`python -m launcher.openai_api` supervised by whoever starts it (rank 0, or a local single-rank run)."""

    def __init__(self, cfg: OpenAIConfig, env: Optional[Dict[str, str]] = None):
        self.cfg = cfg
        self.env = env
        self.proc = None

    def start(self) -> "OpenAIProcess":
        import subprocess

        sys.stdout.flush()
        # Own session: a terminal's Ctrl-C reaches the parent, which decides how the API stops.
        self.proc = subprocess.Popen(self.cfg.argv(), env=self.env, start_new_session=True)
        return self

    def poll(self) -> Optional[int]:
        return None if self.proc is None else self.proc.poll()

    def wait_ready(self, timeout_s: float) -> float:
        """Until GET /health answers 200 (the model is ready through the gRPC endpoint); raises if it exits."""
        import urllib.error
        import urllib.request

        t0 = time.monotonic()
        while True:
            if self.poll() is not None:
                raise RuntimeError(f"the OpenAI API server exited with status {self.poll()} before it was ready")
            try:
                with urllib.request.urlopen(self.cfg.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"the OpenAI API on {self.cfg.url} not ready after {timeout_s:.0f}s")
            time.sleep(0.1)

    def terminate(self) -> None:
        if self.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def stop(self) -> Optional[int]:
        """SIGTERM (uvicorn finishes running requests), SIGKILL after the drain deadline."""
        from launcher.triton import stop_group

        if self.proc is None:
            return None
        if self.proc.poll() is None:
            stop_group(self.proc, self.cfg.drain_timeout_s + 5)
        return self.proc.returncode


def start_api(spec, grpc_url: str, bind_host: str, port: int, say=log, timeout_s: float = 120.0) -> OpenAIProcess:
    """Start the OpenAI API for `spec`'s model in front of `grpc_url` on `bind_host:port`, and wait until it
    answers.  Rank 0 calls this once its gRPC side (its server, or the replicas front end) is ready."""
    from pathlib import Path

    model = spec.model
    aliases = tuple(n for n in (model.name,) if n and n != spec.model_name)
    cfg = OpenAIConfig(grpc_url=grpc_url, model=spec.model_name, host=bind_host, port=int(port),
                       tokenizer=str(model.tokenizer or model.path or ""), aliases=aliases,
                       drain_timeout_s=float(spec.serve.drain_timeout_s))
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # `python -m launcher.openai_api` from this checkout
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = OpenAIProcess(cfg, env=env).start()
    try:
        waited = proc.wait_ready(timeout_s)
    except BaseException:
        proc.stop()
        raise
    say(f"OpenAI API READY on {cfg.url}/v1 ({waited:.1f}s)")
    return proc


def _die_with_parent() -> None:
    """SIGTERM when the parent dies (even by SIGKILL): no API server outlives the rank that started it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass
    if os.getppid() == 1:
        raise SystemExit("OpenAI API: the parent is already gone")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launcher.openai_api",
                                description="An OpenAI-compatible HTTP API in front of an llmlaunch gRPC endpoint.")
    p.add_argument("--grpc-url", required=True, help="HOST:PORT of the Triton gRPC endpoint serving the model")
    p.add_argument("--model", required=True, help="the Triton model name (the name /v1/models lists)")
    p.add_argument("--alias", action="append", default=[], help="another name requests may use for the model (repeat)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, required=True, help="HTTP port")
    p.add_argument("--tokenizer", default="", help="tokenizer folder whose chat template /v1/chat/completions applies")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="on SIGTERM, seconds running requests may take")
    p.add_argument("--die-with-parent", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.die_with_parent:
        _die_with_parent()
    import uvicorn

    from launcher.client import honoured_parameters
    from launcher.openai_api.app import ChatTemplate, make_app
    from launcher.openai_api.backend import GrpcBackend

    # final_counts_only where the model takes it: a quarter of the tensors per streamed token to parse
    params = {"final_counts_only": True} if "final_counts_only" in honoured_parameters(args.grpc_url, args.model) else {}
    template = ChatTemplate(args.tokenizer, args.model)
    template.load()
    app = make_app(GrpcBackend(args.grpc_url, args.model, params), (args.model, *args.alias), template)
    log(f"serving {args.model!r} from grpc://{args.grpc_url} on http://{args.host}:{args.port}/v1")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=int(args.drain_timeout), loop="auto", http="auto")
    return 0
