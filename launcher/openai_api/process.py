"""The OpenAI API as a child process of rank 0: the command line `python -m launcher.openai_api` runs (`main`), and
the handle that starts it, waits until it answers and stops it (`OpenAIProcess`)."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional

from launcher.serving.child import ChildService, die_with_parent


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


class OpenAIProcess(ChildService):
    """`python -m launcher.openai_api` supervised by whoever starts it (rank 0, or a local single-rank run)."""

    what = "OpenAI API server"

    def __init__(self, cfg: OpenAIConfig, env: Optional[Dict[str, str]] = None):
        super().__init__(env)
        self.cfg = cfg

    @property
    def drain_s(self) -> float:
        return self.cfg.drain_timeout_s + 5  # uvicorn finishes running requests first

    def argv(self) -> List[str]:
        return self.cfg.argv()

    def wait_ready(self, timeout_s: float) -> float:
        """Until GET /health answers 200 (the model is ready through the gRPC endpoint); raises if it exits."""
        import urllib.request

        def healthy() -> bool:
            with urllib.request.urlopen(self.cfg.url + "/health", timeout=5) as r:
                return r.status == 200

        return self.wait_until(healthy, timeout_s, self.cfg.url)


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
        die_with_parent("OpenAI API")
    import uvicorn

    from launcher.client import honoured_parameters
    from launcher.openai_api.app import ChatTemplate, make_app
    from launcher.openai_api.backend import GrpcBackend

    # final_counts_only where the model takes it: a quarter of the tensors per streamed token to parse
    params = {"final_counts_only": True} if "final_counts_only" in honoured_parameters(args.grpc_url, args.model) else {}
    template = ChatTemplate(args.tokenizer, args.model)
    template.load()
    import signal

    from launcher.serving.drain import DRAIN_SIGNAL, reason

    draining = {"reason": ""}

    def drain(_signum, _frame) -> None:  # the drain notice: refuse new requests, let running ones finish
        if not draining["reason"]:  # Slurm's signal and the rank's notice both come
            draining["reason"] = reason()
            log(f"draining: {draining['reason']}")

    signal.signal(DRAIN_SIGNAL, drain)
    app = make_app(GrpcBackend(args.grpc_url, args.model, params), (args.model, *args.alias), template, draining=draining)
    log(f"serving {args.model!r} from grpc://{args.grpc_url} on http://{args.host}:{args.port}/v1")
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=int(args.drain_timeout), loop="auto", http="auto")
    return 0
