"""The OpenAI API as a child process of rank 0: the command line `python -m launcher.openai_api --config FILE` runs
(`main`: FILE is an OpenAIConfig as JSON), and the handle that writes that file, starts it, waits until it answers and
stops it (`OpenAIProcess`)."""

from __future__ import annotations

import dataclasses
import errno
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

from launcher.paths import PACKAGE_ROOT
from launcher.procs.child import ChildService, child_config, die_with_parent
from launcher.procs.config import JsonConfig
from launcher.procs.drain import DRAIN_SIGNAL, reason

# The API's exit status when its port was taken between the pick and the bind: start_api then retries on a fresh port
PORT_TAKEN = 98
# The /health answer's header that names the OpenAIConfig.instance that answered
INSTANCE_HEADER = "x-llmlaunch-instance"


def log(msg: str) -> None:
    print(f"[llmlaunch openai {os.getpid()}] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class OpenAIConfig(JsonConfig):
    """Everything the API serves by: the one place of its defaults.  `start_api` fills it in from the spec,
    OpenAIProcess writes it as JSON, `python -m launcher.openai_api --config FILE` reads it back, and each worker
    process gets the same object."""

    grpc_url: str  # host:port of the gRPC endpoint rank 0 serves (its tritonserver or the replicas front end)
    model: str  # the Triton model name requests go to; also the name /v1/models lists
    host: str  # address the HTTP server binds (serve.host)
    port: int  # serve.openai_port
    tokenizer: str = ""  # folder with the model's tokenizer (its chat template); "" = chat refused
    aliases: Tuple[str, ...] = ()  # more names a request's `model` may use (the model config's name)
    drain_timeout_s: float = 30.0  # on SIGTERM, how long running requests may finish
    processes: int = 1  # worker processes sharing the port (SO_REUSEPORT); launcher.python_backend.responders picks it
    # file whose first line is the key every route but /health requires; "" = no key.  The path only: the key never
    # leaves its file (no command line, no config file carries it)
    api_key_file: str = ""
    max_request_bytes: int = 4 << 20  # a larger request body gets 413 before it is read whole (serve.max_request_bytes)
    # a token the handle makes for each start, sent back by /health: the handle counts only its own child's answer
    # as ready, never another job's API that took the port between the pick and the bind; "" = any answer counts
    instance: str = ""

    def __post_init__(self):
        object.__setattr__(self, "aliases", tuple(self.aliases))
        if not self.grpc_url or not self.model:
            raise ValueError(
                f"OpenAIConfig needs grpc_url and model (got {self.grpc_url!r}, {self.model!r}): give the gRPC "
                "endpoint's HOST:PORT and the Triton model name"
            )
        if self.processes < 1:
            raise ValueError(f"OpenAIConfig.processes is {self.processes}: at least 1 process serves; give 1 or more")

    @property
    def url(self) -> str:
        from launcher.frontend.process import connect_host

        return f"http://{connect_host(self.host)}:{self.port}"


class OpenAIProcess(ChildService):
    """`python -m launcher.openai_api` supervised by whoever starts it (rank 0, or a local single-rank run)."""

    what = "OpenAI API server"
    module = "launcher.openai_api"
    cfg: OpenAIConfig  # what the handle writes for the child (ChildService.__init__)

    @property
    def drain_s(self) -> float:
        return self.cfg.drain_timeout_s + 5  # uvicorn finishes running requests first

    def wait_ready(self, timeout_s: float) -> float:
        """Until GET /health answers 200 (the model is ready through the gRPC endpoint); raises if it exits."""
        import urllib.request

        def healthy() -> bool:
            with urllib.request.urlopen(self.cfg.url + "/health", timeout=5) as r:
                return r.status == 200 and r.headers.get(INSTANCE_HEADER, "") == self.cfg.instance

        return self.wait_until(healthy, timeout_s, self.cfg.url)


def start_api(
    spec,
    grpc_url: str,
    bind_host: str,
    port: int,
    say=log,
    timeout_s: float = 120.0,
    config_path: Union[str, os.PathLike, None] = None,
    avoid=(),
) -> OpenAIProcess:
    """Start the OpenAI API for `spec`'s model in front of `grpc_url` on `bind_host:port`, and wait until it
    answers.  Rank 0 calls this once its gRPC side (its server, or the replicas front end) is ready; `config_path`:
    where its OpenAIConfig is written (the run dir's, RunDir.openai_config; None: a temporary file).

    Another job on the node can take `port` between the rendezvous' pick and the API's bind (two jobs starting on
    one node at once pick the same free port): the API then exits with PORT_TAKEN and starts again on a fresh port
    (never one of `avoid`, the ports the caller keeps for something else), up to three times.  The handle's
    `cfg.port` is the port it serves on."""
    from launcher.ports import pick_ports
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
        max_request_bytes=int(spec.serve.max_request_bytes),
        instance=secrets.token_hex(8),
    )
    env = dict(os.environ)
    root = str(PACKAGE_ROOT)  # `python -m launcher.openai_api` from this checkout
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for tries in range(3):
        proc = OpenAIProcess(cfg, env=env, config_path=config_path).start()
        try:
            waited = proc.wait_ready(timeout_s)
            break
        except BaseException:
            proc.stop()
            if tries == 2 or proc.poll() != PORT_TAKEN:
                raise
        fresh = pick_ports(bind_host, {"openai_port": 0}, avoid=[*avoid, cfg.port])["openai_port"]
        say(f"port {cfg.port} was taken while the OpenAI API started; retrying on {fresh}")
        cfg = dataclasses.replace(cfg, port=fresh, instance=secrets.token_hex(8))
    say(f"OpenAI API READY on {cfg.url}/v1 ({waited:.1f}s, {cfg.processes} process(es))")
    return proc


def _on_drain_notice() -> dict:
    """The drain notice (launcher/procs/drain.py): from DRAIN_SIGNAL on, new requests are refused with 503 naming
    the reason while running ones finish.  Installed in each process that serves (every worker gets the notice: the
    rank signals the API's process group)."""
    draining = {"reason": ""}

    def drain(_signum, _frame) -> None:
        if not draining["reason"]:  # Slurm's signal and the rank's notice both come
            draining["reason"] = reason()
            log(f"draining: {draining['reason']}")

    signal.signal(DRAIN_SIGNAL, drain)
    return draining


def _build_app(cfg: OpenAIConfig, counters):
    from launcher.client.control import honoured_parameters
    from launcher.openai_api.app import make_app
    from launcher.openai_api.auth import read_key
    from launcher.openai_api.backend import GrpcBackend
    from launcher.openai_api.chat import ChatTemplate
    from launcher.openai_api.tokens import TokenText

    # final_counts_only where the model takes it: a quarter of the tensors per streamed token to parse
    params = {"final_counts_only": True} if "final_counts_only" in honoured_parameters(cfg.grpc_url, cfg.model) else {}
    template = ChatTemplate(cfg.tokenizer, cfg.model)
    template.load()
    api_key = ""
    if cfg.api_key_file:
        try:
            api_key = read_key(cfg.api_key_file)
        except ValueError as e:
            raise SystemExit(f"OpenAI API: {e}; fix serve.api_key_file") from None
    return make_app(
        GrpcBackend(cfg.grpc_url, cfg.model, params),
        (cfg.model, *cfg.aliases),
        template,
        counters,
        draining=_on_drain_notice(),
        api_key=api_key,
        token_text=TokenText(cfg.tokenizer),
        max_request_bytes=cfg.max_request_bytes,
        instance=cfg.instance,
    )


def _uvicorn_config(app, cfg: OpenAIConfig):
    import uvicorn

    # loop "auto": uvloop where installed (the `frontend` extra)
    return uvicorn.Config(
        app,
        host=cfg.host,
        port=cfg.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=int(cfg.drain_timeout_s),
        loop="auto",
        http="auto",
    )


def _bound(cfg: OpenAIConfig, shared_port: bool):
    """The API's socket, bound to cfg.host:cfg.port by this process (not by uvicorn, so a port taken since the pick
    ends the process with PORT_TAKEN, which start_api answers with a fresh port).  `shared_port`: SO_REUSEPORT, for
    workers that share the port (the supervisor checked it free first)."""
    import socket

    from launcher.ports import in_use_text

    family = socket.getaddrinfo(cfg.host, cfg.port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if shared_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((cfg.host, cfg.port))
    except OSError as e:
        sock.close()
        if e.errno != errno.EADDRINUSE:
            raise
        log(f"port taken: {in_use_text(cfg.host, cfg.port)}")
        raise SystemExit(PORT_TAKEN) from None
    return sock


def _worker_main(cfg: OpenAIConfig, slot: int, shared) -> None:
    """One of several workers: its own socket on the shared port (SO_REUSEPORT: the kernel spreads connections over
    the workers), its counters in slot `slot` of `shared`."""
    import uvicorn

    from launcher.openai_api.counters import Counters

    die_with_parent("OpenAI API worker")
    app = _build_app(cfg, Counters(shared, slot, cfg.processes))
    uvicorn.Server(_uvicorn_config(app, cfg)).run(sockets=[_bound(cfg, shared_port=True)])


def _supervise(cfg: OpenAIConfig) -> int:
    """Start the workers; stop them all (SIGTERM, then SIGKILL after the drain time) when one dies or on SIGTERM."""
    import multiprocessing as mp

    from launcher.openai_api.counters import shared_size
    from launcher.ports import in_use_text, port_free

    if not port_free(cfg.host, cfg.port):  # the workers' SO_REUSEPORT would share it with whoever has it
        log(f"port taken: {in_use_text(cfg.host, cfg.port)}")
        return PORT_TAKEN
    # The drain notice reaches the whole process group: the workers handle it, this process and multiprocessing's
    # resource tracker (started with the shared array, inheriting this) ignore it
    signal.signal(DRAIN_SIGNAL, signal.SIG_IGN)
    ctx = mp.get_context("spawn")  # gRPC does not survive fork
    shared = ctx.RawArray("q", shared_size(cfg.processes))
    workers = [
        ctx.Process(target=_worker_main, args=(cfg, w, shared), name=f"openai-worker{w}", daemon=True)
        for w in range(cfg.processes)
    ]
    for w in workers:
        w.start()
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    log(f"{cfg.processes} worker processes share {cfg.host}:{cfg.port}")
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
    deadline = time.monotonic() + cfg.drain_timeout_s + 5
    for w in workers:
        w.join(max(0.1, deadline - time.monotonic()))
        if w.is_alive():
            w.kill()
            w.join()
    return code


def main(argv: Optional[List[str]] = None) -> int:
    cfg = child_config(
        OpenAIConfig,
        OpenAIProcess.module,
        "An OpenAI-compatible HTTP API in front of an llmlaunch gRPC endpoint, serving the OpenAIConfig in FILE.",
        "OpenAI API",
        argv,
    )
    log(f"serving {cfg.model!r} from grpc://{cfg.grpc_url} on http://{cfg.host}:{cfg.port}/v1")
    if cfg.processes > 1:
        return _supervise(cfg)
    import uvicorn

    from launcher.openai_api.counters import Counters

    sock = _bound(cfg, shared_port=False)
    uvicorn.Server(_uvicorn_config(_build_app(cfg, Counters()), cfg)).run(sockets=[sock])
    return 0
