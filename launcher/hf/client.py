"""The `hf` engine in its own process, behind the same API as `Engine`: the client side, in the Triton stub.

Why: inside a Triton python model the engine thread shares one GIL with the
thread that builds and sends responses.  Every response costs tens of
microseconds of Python (numpy arrays, pb_utils tensors) plus GIL hand-offs, and
at 32-64 streams that is thousands of responses per second taken straight out
of the engine loop (measured on CPU: -25% tokens/s at 32 streams).  With the
engine in a child process, its loop runs exactly as in-process; the parent
only checks the sampling parameters and turns outputs into responses.  The
parent imports neither torch nor transformers: tokenization happens in the
child, and a prompt that is too long comes back as an output with
finish_reason "error" instead of an exception from `add_request`.

Protocol (pickled tuples over one socketpair, `multiprocessing.connection` framing):
  parent -> child: ("add", rid, prompt_ids, SamplingParams) | ("abort", rid) | ("stop",)
  child -> parent: ("ready", info dict) | ("error", message) once, then one list of
                   (rid, text, token_ids, input_tokens, output_tokens, finish_reason, error, times, logprobs,
                   prompt_logprobs, settled) per engine step; times = (request received, first output made) on a
                   request's first output, else None; the log probabilities and `settled` as
                   launcher.hf.outputs.Output has them;
                   and ("stats", EngineStats as a dict) at most once a second while busy and when it goes idle.
The child exits when the parent's end closes (parent died), so no orphan
keeps a GPU.

Shared by several model instances (`listen=` / `EngineProcess.attach`): Triton's python backend runs
each model instance in its own stub process, and one stub sent ~4.6-6k streamed responses/s on the H100
host whatever its threads (each response is built under its GIL; four stubs: ~12k/s), while a step of 128 streams makes 128 responses.  So several instances may share the one
engine: the instance that started it passes `listen=<unix socket path>`, the others connect there
("attach" -> ("ready", info)) and speak the same protocol.  Inside the engine an attached connection k's
request ids become "k/<id>", and each connection gets only its own requests' outputs (engine stats go to
the first connection only).  An attached connection that closes has its running requests aborted; the
engine stops with the first.  If the first instance fails to start the engine it writes the reason to
`<path>.failed` (`write_attach_failure`), and instances waiting to attach fail with it at once.

The engine process is launcher/hf/multiplexer.py (a tensor-parallel worker rank's: launcher/hf/worker.py).

Environment: the child runs the launcher's interpreter with the launcher's library path, not the stub's
(launcher.python_backend.engine_env says why).
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from typing import Callable

from launcher.engines.hf.config import HFEngineArgs
from launcher.hf.outputs import Output
from launcher.python_backend.engine_env import start_engine_process
from launcher.python_backend.generation import InvalidRequest, SamplingParams  # pure Python: no torch in the parent

log = logging.getLogger(__name__)


class EngineProcess:
    """`Engine` API (start, add_request, abort, shutdown, max_model_len) with the engine in a child process."""

    def __init__(
        self,
        args: HFEngineArgs | None,
        *,
        worker: bool = False,
        listen: str = "",
        startup_timeout: float = 900.0,
        on_batch: Callable | None = None,
        on_exit: Callable[[str], None] | None = None,
    ):
        """args (an launcher.engines.hf.config.HFEngineArgs) build the `Engine` in the child (Engine.from_args); its streamed outputs
        are merged over args.stream_interval_ms.  `listen`: a unix socket path where other model instances attach.
        `on_batch(list[Output])`, if given, receives the outputs of each engine step (and of any steps that queued
        up meanwhile) in one call on the receive thread, instead of one `on_output` call per output.
        `on_exit(message)`, if given, is called once when the engine process ends on its own (not through
        `shutdown`).

        worker=True (with tp > 1) runs a tensor-parallel worker rank (launcher.hf.worker) instead of the
        Engine: it takes no requests; the process exits when the leader stops, or fails when it dies."""
        self.model_path = args.model_path if args is not None else ""
        self._init = (
            args.to_dict() if args is not None else {},
            {"role": "worker" if worker else "leader", "listen": listen},
        )
        self._attach = ""  # set by `attach`: the socket of an engine process another instance started
        self._timeout = startup_timeout
        self._on_batch = on_batch
        self._on_exit = on_exit
        self._stopping = False
        self._callbacks: dict[str, Callable] = {}
        self._send_lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._conn = None
        self._dead: str = ""
        self.info: dict = {}
        self.stats: dict = {}  # the engine's EngineStats, as the engine process last sent them

    @classmethod
    def from_args(
        cls,
        args: HFEngineArgs,
        worker: bool = False,
        listen: str = "",
        startup_timeout: float = 900.0,
        on_batch: Callable | None = None,
        on_exit: Callable[[str], None] | None = None,
    ) -> "EngineProcess":
        """An engine process (not started) for `args`, as Engine.from_args makes an engine: see __init__."""
        return cls(
            args, worker=worker, listen=listen, startup_timeout=startup_timeout, on_batch=on_batch, on_exit=on_exit
        )

    @classmethod
    def attach(
        cls,
        path: str,
        startup_timeout: float = 900.0,
        on_batch: Callable | None = None,
        on_exit: Callable[[str], None] | None = None,
    ) -> "EngineProcess":
        """An `EngineProcess` (not started) that, on `start`, connects to the engine process another model instance
        started with `listen=path` instead of starting one; it waits up to startup_timeout for that engine."""
        self = cls(None, startup_timeout=startup_timeout, on_batch=on_batch, on_exit=on_exit)
        self._attach = str(path)
        return self

    # -- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> "EngineProcess":
        if self._attach:
            return self._start_attached()
        self._proc, self._conn = start_engine_process("launcher.hf.multiplexer")
        self._conn.send(("init", *self._init))
        if not self._conn.poll(self._timeout):
            self._kill()
            raise RuntimeError(f"the hf engine process did not start within {self._timeout:.0f} s")
        try:
            kind, payload = self._conn.recv()
        except EOFError:
            code = self._proc.wait()
            raise RuntimeError(
                f"the hf engine process exited with status {code} while starting (its error is in the server log)"
            ) from None
        if kind != "ready":
            self._kill()
            raise RuntimeError(f"the hf engine process failed to start: {payload}")
        return self._ready(payload)

    def _start_attached(self) -> "EngineProcess":
        """Connect to a shared engine process (retrying while it starts: the instance that owns it may still be
        loading the model), then the same handshake as a started one."""
        from multiprocessing.connection import Client

        deadline = time.monotonic() + self._timeout
        said = time.monotonic()
        while True:
            try:
                self._conn = Client(self._attach, family="AF_UNIX")
                break
            except (FileNotFoundError, ConnectionRefusedError):
                try:
                    with open(self._attach + ".failed") as f:
                        why = f.read().strip()
                except OSError:
                    why = None
                if why is not None:
                    raise RuntimeError(
                        f"the model instance that starts the shared hf engine process failed: {why}"
                    ) from None
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"no hf engine process to attach to at {self._attach} within "
                        f"{self._timeout:.0f} s (the model instance that starts it failed or is "
                        f"still loading; see its lines in the server log)"
                    ) from None
                if time.monotonic() - said > 30:
                    said = time.monotonic()
                    log.info("hf engine: waiting for the shared engine process at %s", self._attach)
                time.sleep(0.2)
        self._conn.send(("attach",))
        try:
            kind, payload = self._conn.recv()
        except (EOFError, OSError):
            raise RuntimeError("the shared hf engine process closed the connection while attaching") from None
        if kind != "ready":
            raise RuntimeError(f"the shared hf engine process refused to attach: {payload}")
        return self._ready(payload)

    @staticmethod
    def write_attach_failure(path: str, message: str | None) -> None:
        """The instance that starts a shared engine: `message` (why it failed) for the instances waiting to attach at
        `path`, or None to clear a stale one before starting."""
        if message is None:
            try:
                os.unlink(path + ".failed")
            except FileNotFoundError:
                pass
            return
        with open(path + ".failed", "w") as f:
            f.write(message)

    def _ready(self, payload: dict) -> "EngineProcess":
        self.info = payload
        self.max_model_len = payload["max_model_len"]
        self.max_num_seqs = payload["max_num_seqs"]
        self.vocab_size = payload["vocab_size"]
        self.device, self.dtype = payload["device"], payload["dtype"]
        self.features = payload.get("features", {})  # Engine.features (none from a tensor-parallel worker)
        self._rx = threading.Thread(target=self._receive, name="hf-engine-rx", daemon=True)
        self._rx.start()
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        if self._attach:  # the engine stays with the instance that started it; our requests are aborted there
            if self._conn is not None and not self._stopping:
                self._stopping = True
                try:  # the engine process aborts this connection's running requests and closes its end
                    self._send(("detach",))
                except OSError:
                    pass
                self._rx.join(timeout=timeout)
                self._conn.close()
            return
        if self._proc is None:
            return
        self._stopping = True
        try:
            self._send(("stop",))
        except OSError:
            pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill()
        self._rx.join(timeout=5)
        self._proc = None

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    # -- requests ------------------------------------------------------------------------------------------
    def add_request(
        self, request_id: str, prompt: str | list[int], params: SamplingParams, on_output: Callable
    ) -> None:
        """Check the parameters here (InvalidRequest at once), then queue in the engine process.

        Problems only the tokenizer can see (prompt longer than the context) come back as an output with
        finish_reason "error"; the prompt's token count comes with every output."""
        if self._dead:
            raise RuntimeError(self._dead)
        params.validate(self.max_model_len)
        if not prompt:
            raise InvalidRequest("the prompt is empty")
        if request_id in self._callbacks:
            raise InvalidRequest(f"request id {request_id!r} is already running")
        self._callbacks[request_id] = on_output
        try:
            self._send(("add", request_id, prompt, params))
        except OSError as exc:
            self._callbacks.pop(request_id, None)
            raise RuntimeError(f"the hf engine process is gone: {exc}") from None

    def abort(self, request_id: str) -> None:
        try:
            self._send(("abort", request_id))
        except OSError:
            pass

    def _send(self, msg) -> None:
        with self._send_lock:
            self._conn.send(msg)

    @property
    def num_running(self) -> int:
        return len(self._callbacks)

    def stats_dict(self) -> dict:
        """The engine's EngineStats as a dict, as last sent (at most a second old while busy; {} before any)."""
        return dict(self.stats)

    def _receive(self) -> None:
        conn, callbacks, on_batch = self._conn, self._callbacks, self._on_batch
        try:
            while True:
                batch: list = []
                msg = conn.recv()
                while True:
                    if isinstance(msg, tuple):  # ("stats", dict): not an output
                        self.stats = msg[1]
                    else:
                        batch.extend(msg)
                    if not conn.poll():  # steps that finished while we were busy: handle them together
                        break
                    msg = conn.recv()
                outs = []
                for item in batch:
                    rid, reason = item[0], item[5]
                    cb = callbacks.get(rid)
                    if cb is None:
                        continue
                    if reason is not None:
                        del callbacks[rid]
                    out = Output(*item)
                    if on_batch is not None:
                        outs.append(out)
                        continue
                    try:
                        cb(out)
                    except Exception:
                        log.exception("on_output callback of request %s failed", rid)
                if outs:
                    on_batch(outs)
        except (EOFError, OSError):
            pass
        if self._attach:
            self._dead = "the shared hf engine process is gone (the model instance that started it stopped)"
        else:
            code = self._proc.poll() if self._proc is not None else None
            self._dead = f"the hf engine process exited (status {code})"
        dead = [Output(rid, "", [], 0, 0, "error", self._dead) for rid in list(callbacks)]
        for out in dead:
            cb = callbacks.pop(out.request_id, None)
            try:
                if on_batch is None:
                    cb(out)
            except Exception:
                pass
        if on_batch is not None and dead:
            on_batch(dead)
        if self._on_exit is not None and not self._stopping:
            try:
                self._on_exit(self._dead)
            except Exception:
                log.exception("on_exit callback failed")
