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

from launcher.paths import PACKAGE_ROOT
from launcher.rank.child import ChildService, die_with_parent


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
    processes: int = 1  # worker processes sharing the port (SO_REUSEPORT); launcher.python_backend.responders picks it
    api_key_file: str = ""  # file whose first line is the key every route but /health requires; "" = no key

    def argv(self) -> List[str]:
        argv = [
            sys.executable,
            "-m",
            "launcher.openai_api",
            "--grpc-url",
            self.grpc_url,
            "--model",
            self.model,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--drain-timeout",
            str(self.drain_timeout_s),
            "--processes",
            str(self.processes),
        ]
        if self.tokenizer:
            argv += ["--tokenizer", self.tokenizer]
        for a in self.aliases:
            argv += ["--alias", a]
        if self.api_key_file:  # the file's path: the key itself never goes on a command line
            argv += ["--api-key-file", self.api_key_file]
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
    from launcher.python_backend.responders import api_processes

    model = spec.model
    aliases = tuple(n for n in (model.name,) if n and n != spec.model_name)
    cfg = OpenAIConfig(
        grpc_url=grpc_url,
        model=spec.model_name,
        host=bind_host,
        port=int(port),
        tokenizer=str(model.tokenizer or model.path or ""),
        aliases=aliases,
        drain_timeout_s=float(spec.serve.drain_timeout_s),
        processes=api_processes(len(os.sched_getaffinity(0))),
        api_key_file=str(spec.serve.api_key_file or ""),
    )
    env = dict(os.environ)
    root = str(PACKAGE_ROOT)  # `python -m launcher.openai_api` from this checkout
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = OpenAIProcess(cfg, env=env).start()
    try:
        waited = proc.wait_ready(timeout_s)
    except BaseException:
        proc.stop()
        raise
    say(f"OpenAI API READY on {cfg.url}/v1 ({waited:.1f}s, {cfg.processes} process(es))")
    return proc


def _on_drain_notice() -> dict:
    """The drain notice (launcher/rank/drain.py): from DRAIN_SIGNAL on, new requests are refused with 503 naming
    the reason while running ones finish.  Installed in each process that serves (every worker gets the notice: the
    rank signals the API's process group)."""
    from launcher.rank.drain import DRAIN_SIGNAL, reason

    draining = {"reason": ""}

    def drain(_signum, _frame) -> None:
        if not draining["reason"]:  # Slurm's signal and the rank's notice both come
            draining["reason"] = reason()
            log(f"draining: {draining['reason']}")

    signal.signal(DRAIN_SIGNAL, drain)
    return draining


def _build_app(args, counters):
    from launcher.client.control import honoured_parameters
    from launcher.openai_api.app import make_app
    from launcher.openai_api.auth import read_key
    from launcher.openai_api.backend import GrpcBackend
    from launcher.openai_api.chat import ChatTemplate
    from launcher.openai_api.tokens import TokenText

    # final_counts_only where the model takes it: a quarter of the tensors per streamed token to parse
    params = (
        {"final_counts_only": True} if "final_counts_only" in honoured_parameters(args.grpc_url, args.model) else {}
    )
    template = ChatTemplate(args.tokenizer, args.model)
    template.load()
    api_key = ""
    if args.api_key_file:
        try:
            api_key = read_key(args.api_key_file)
        except ValueError as e:
            raise SystemExit(f"OpenAI API: {e}; fix serve.api_key_file") from None
    return make_app(
        GrpcBackend(args.grpc_url, args.model, params),
        (args.model, *args.alias),
        template,
        counters,
        draining=_on_drain_notice(),
        api_key=api_key,
        token_text=TokenText(args.tokenizer),
    )


def _uvicorn_config(app, args):
    import uvicorn

    # loop "auto": uvloop where installed (the `frontend` extra)
    return uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=int(args.drain_timeout),
        loop="auto",
        http="auto",
    )


def _worker_main(args, slot: int, shared) -> None:
    """One of several workers: its own socket on the shared port (SO_REUSEPORT: the kernel spreads connections over
    the workers), its counters in slot `slot` of `shared`."""
    import socket

    import uvicorn

    from launcher.openai_api.counters import Counters

    die_with_parent("OpenAI API worker")
    app = _build_app(args, Counters(shared, slot, args.processes))
    family = socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((args.host, args.port))
    uvicorn.Server(_uvicorn_config(app, args)).run(sockets=[sock])


def _supervise(args) -> int:
    """Start the workers; stop them all (SIGTERM, then SIGKILL after the drain time) when one dies or on SIGTERM."""
    import multiprocessing as mp

    from launcher.openai_api.counters import shared_size
    from launcher.ports import in_use_text, port_free

    if not port_free(args.host, args.port):
        raise SystemExit(f"OpenAI API: {in_use_text(args.host, args.port)}")
    from launcher.rank.drain import DRAIN_SIGNAL

    # The drain notice reaches the whole process group: the workers handle it, this process and multiprocessing's
    # resource tracker (started with the shared array, inheriting this) ignore it
    signal.signal(DRAIN_SIGNAL, signal.SIG_IGN)
    ctx = mp.get_context("spawn")  # gRPC does not survive fork
    shared = ctx.RawArray("q", shared_size(args.processes))
    workers = [
        ctx.Process(target=_worker_main, args=(args, w, shared), name=f"openai-worker{w}", daemon=True)
        for w in range(args.processes)
    ]
    for w in workers:
        w.start()
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    log(f"{args.processes} worker processes share {args.host}:{args.port}")
    code = 0
    while not stop:
        dead = [w for w in workers if not w.is_alive()]
        if dead:
            log(f"worker {dead[0].name} exited with status {dead[0].exitcode}: stopping")
            code = 1
            break
        time.sleep(0.2)
    for w in workers:
        if w.is_alive():
            os.kill(w.pid, signal.SIGTERM)
    deadline = time.monotonic() + args.drain_timeout + 5
    for w in workers:
        w.join(max(0.1, deadline - time.monotonic()))
        if w.is_alive():
            w.kill()
            w.join()
    return code


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m launcher.openai_api",
        description="An OpenAI-compatible HTTP API in front of an llmlaunch gRPC endpoint.",
    )
    p.add_argument("--grpc-url", required=True, help="HOST:PORT of the Triton gRPC endpoint serving the model")
    p.add_argument("--model", required=True, help="the Triton model name (the name /v1/models lists)")
    p.add_argument("--alias", action="append", default=[], help="another name requests may use for the model (repeat)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, required=True, help="HTTP port")
    p.add_argument("--tokenizer", default="", help="tokenizer folder whose chat template /v1/chat/completions applies")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="on SIGTERM, seconds running requests may take")
    p.add_argument("--processes", type=int, default=1, help="worker processes sharing the port (default 1)")
    p.add_argument(
        "--api-key-file", default="", help="file whose first line is the key every route but /health requires"
    )
    p.add_argument("--die-with-parent", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.processes < 1:
        p.error("--processes must be >= 1")
    if args.die_with_parent:
        die_with_parent("OpenAI API")
    log(f"serving {args.model!r} from grpc://{args.grpc_url} on http://{args.host}:{args.port}/v1")
    if args.processes > 1:
        return _supervise(args)
    import uvicorn

    from launcher.openai_api.counters import Counters

    uvicorn.Server(_uvicorn_config(_build_app(args, Counters()), args)).run()
    return 0
