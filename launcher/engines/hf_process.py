"""The `hf` engine in its own process, behind the same API as `Engine`.

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
                   (rid, text, token_ids, input_tokens, output_tokens, finish_reason, error, times) per engine
                   step; times = (request received, first output made) on a request's first output, else None;
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

Environment: the child inherits the parent's, except that `LLMLAUNCH_ENGINE_PYTHONPATH`,
when set, replaces PYTHONPATH for the child, and `LLMLAUNCH_ENGINE_LD_LIBRARY_PATH`, unless it
is unset or "inherit", replaces LD_LIBRARY_PATH ("" removes it).  launcher.triton.server_env sets it to the
launcher's own path (launcher.triton.ENGINE_LD_LIBRARY_PATH says why).  Triton's python stub (2.51) needs
numpy < 2 while current CUDA builds of torch ship with numpy 2: the stub's
environment can then put numpy 1.x first on PYTHONPATH and the engine keep its own.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Callable

from launcher.engines.hf_args import HFEngineArgs
from launcher.serving.triton_io import InvalidRequest, SamplingParams  # pure Python: no torch in the parent

log = logging.getLogger(__name__)


def _python() -> str:
    """An interpreter of this environment (inside the Triton stub, sys.executable is the stub binary).

    `LLMLAUNCH_PYTHON` (set by launcher.triton.server_env to the launcher's own interpreter) comes first:
    an embedded stub does not know the virtual environment it was started from, and its sys.prefix
    may be the system Python's, which lacks torch."""
    forced = os.environ.get("LLMLAUNCH_PYTHON", "")
    if forced and os.access(forced, os.X_OK):
        return forced
    exe = sys.executable or ""
    if os.path.basename(exe).startswith("python"):
        return exe
    for name in (f"python{sys.version_info.major}.{sys.version_info.minor}", "python3", "python"):
        cand = os.path.join(sys.exec_prefix, "bin", name)
        if os.access(cand, os.X_OK):
            return cand
    raise RuntimeError(f"cannot find a python interpreter for the engine process under {sys.exec_prefix}/bin")


class EngineProcess:
    """`Engine` API (start, add_request, abort, shutdown, max_model_len) with the engine in a child process."""

    def __init__(self, args: HFEngineArgs | None, *, worker: bool = False, listen: str = "",
                 startup_timeout: float = 900.0, on_batch: Callable | None = None,
                 on_exit: Callable[[str], None] | None = None):
        """args (an hf_args.HFEngineArgs) build the `Engine` in the child (Engine.from_args); its streamed outputs
        are merged over args.stream_interval_ms.  `listen`: a unix socket path where other model instances attach.
        `on_batch(list[Output])`, if given, receives the outputs of each engine step (and of any steps that queued
        up meanwhile) in one call on the receive thread, instead of one `on_output` call per output.
        `on_exit(message)`, if given, is called once when the engine process ends on its own (not through
        `shutdown`).

        worker=True (with tp > 1) runs a tensor-parallel worker rank (hf_tp.run_worker) instead of the
        Engine: it takes no requests; the process exits when the leader stops, or fails when it dies."""
        self.model_path = args.model_path if args is not None else ""
        self._init = (dataclasses.asdict(args) if args is not None else {},
                      {"role": "worker" if worker else "leader", "listen": listen})
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
    def from_args(cls, args: HFEngineArgs, worker: bool = False, listen: str = "", startup_timeout: float = 900.0,
                  on_batch: Callable | None = None, on_exit: Callable[[str], None] | None = None) -> "EngineProcess":
        """An engine process (not started) for `args`, as Engine.from_args makes an engine: see __init__."""
        return cls(args, worker=worker, listen=listen, startup_timeout=startup_timeout, on_batch=on_batch,
                   on_exit=on_exit)

    @classmethod
    def attach(cls, path: str, startup_timeout: float = 900.0, on_batch: Callable | None = None,
               on_exit: Callable[[str], None] | None = None) -> "EngineProcess":
        """An `EngineProcess` (not started) that, on `start`, connects to the engine process another model instance
        started with `listen=path` instead of starting one; it waits up to startup_timeout for that engine."""
        self = cls(None, startup_timeout=startup_timeout, on_batch=on_batch, on_exit=on_exit)
        self._attach = str(path)
        return self

    # -- lifecycle ----------------------------------------------------------------------------------------
    def start(self) -> "EngineProcess":
        from multiprocessing.connection import Connection

        if self._attach:
            return self._start_attached()
        parent, child = socket.socketpair()
        env = dict(os.environ)
        if env.get("LLMLAUNCH_ENGINE_PYTHONPATH"):
            env["PYTHONPATH"] = env["LLMLAUNCH_ENGINE_PYTHONPATH"]
        lib = env.get("LLMLAUNCH_ENGINE_LD_LIBRARY_PATH", "inherit")  # see launcher.triton.ENGINE_LD_LIBRARY_PATH
        if lib != "inherit":
            if lib:
                env["LD_LIBRARY_PATH"] = lib
            else:
                env.pop("LD_LIBRARY_PATH", None)
        self._proc = subprocess.Popen(
            [_python(), "-m", "launcher.engines.hf_process", str(child.fileno())],
            pass_fds=(child.fileno(),), env=env, stdin=subprocess.DEVNULL)
        child.close()
        self._conn = Connection(parent.detach())
        self._conn.send(("init", *self._init))
        if not self._conn.poll(self._timeout):
            self._kill()
            raise RuntimeError(f"the hf engine process did not start within {self._timeout:.0f} s")
        try:
            kind, payload = self._conn.recv()
        except EOFError:
            code = self._proc.wait()
            raise RuntimeError(f"the hf engine process exited with status {code} while starting "
                               f"(its error is in the server log)") from None
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
                    raise RuntimeError(f"the model instance that starts the shared hf engine process failed: "
                                       f"{why}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no hf engine process to attach to at {self._attach} within "
                                       f"{self._timeout:.0f} s (the model instance that starts it failed or is "
                                       f"still loading; see its lines in the server log)") from None
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
    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    on_output: Callable) -> None:
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
        from launcher.engines.hf_engine import Output

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


# ------------------------------------------------------------------------------------------------ child
class _Peers:
    """The connections an engine process serves: index 0, the instance that started it (request ids as they come),
    and instances attached later through `listen` (index k: request id "k/<id>" inside the engine)."""

    def __init__(self, first):
        self.conns = {0: first}
        self.send_locks = {0: threading.Lock()}  # per connection: the engine thread and the reader both send
        self.running: dict[int, set] = {}  # k > 0 -> its engine request ids not finished yet (aborted if k goes)
        self._lock = threading.Lock()  # guards the tables above; never held while sending
        self._next = 1

    def add(self, conn) -> int:
        with self._lock:
            k = self._next
            self._next += 1
            self.conns[k] = conn
            self.send_locks[k] = threading.Lock()
            self.running[k] = set()
        return k

    def drop(self, k: int) -> set:
        """Forget connection k; its running request ids (to abort)."""
        with self._lock:
            self.conns.pop(k, None)
            self.send_locks.pop(k, None)
            return self.running.pop(k, set())

    def started(self, k: int, rid: str) -> None:
        if k:
            with self._lock:
                self.running[k].add(rid)

    def finished(self, k: int, rid: str) -> None:
        if k:
            with self._lock:
                self.running.get(k, set()).discard(rid)

    def by_conn(self) -> dict:
        """{connection: k} of the connections now served."""
        with self._lock:
            return {c: k for k, c in self.conns.items()}

    def send(self, k: int, msg) -> None:
        with self._lock:
            conn, lock = self.conns.get(k), self.send_locks.get(k)
        if conn is not None:
            with lock:
                conn.send(msg)

    def send_outputs(self, batch: list) -> None:
        """Output tuples of the engine (engine request ids) -> each to its connection, with the id it gave."""
        with self._lock:
            if len(self.conns) == 1:  # nobody attached: all of it is the first's
                sends = [(0, self.conns[0], self.send_locks[0], batch)]
            else:
                shares: dict[int, list] = {}
                for item in batch:
                    rid = item[0]
                    k, sep, local = rid.partition("/")
                    if not sep:
                        shares.setdefault(0, []).append(item)
                        continue
                    k = int(k)
                    if item[5] is not None and k in self.running:
                        self.running[k].discard(rid)
                    shares.setdefault(k, []).append((local,) + tuple(item[1:]))
                sends = [(k, self.conns[k], self.send_locks[k], share) for k, share in shares.items()
                         if k in self.conns]
                if len(sends) > 1:
                    # A first token (its TTFT) should not wait for the pickling and sending of the other instances'
                    # outputs (~10-20 us each; eight response processes are eight connections).
                    sends.sort(key=lambda s: all(item[7] is None for item in s[3]))
        for k, conn, lock, share in sends:
            try:
                with lock:
                    conn.send(share)
            except OSError:  # an attached instance went away: the reader drops it
                if not k:
                    raise


def _child(fd: int) -> int:
    from multiprocessing.connection import Connection, Pipe, wait

    conn = Connection(fd)
    _, raw, extra = conn.recv()
    args = HFEngineArgs.from_dict(raw, source="the engine process's arguments")
    if extra["role"] == "worker":
        return _worker_child(conn, args)
    listen = extra["listen"] or ""  # a unix socket path: other model instances attach there
    try:
        from launcher.engines.hf_engine import Engine

        peers = _Peers(conn)

        # Outputs are sent in one message per engine step.  With `output_interval` (seconds) a request's new
        # text is held and merged until that long after its previous output was sent; its first token and its
        # end go at once.  Fewer messages and responses leave the CPU to the engine.
        interval = args.stream_interval_ms / 1000.0
        pending: dict = {}  # request id -> [output fields..., urgent]
        last_sent: dict = {}  # request id -> time its last output was sent
        received: dict = {}  # request id -> when its "add" arrived, until its first output (Output.times)

        def on_output(out) -> None:
            urgent = out.finish_reason is not None or out.output_tokens <= 1
            t0 = received.pop(out.request_id, None)
            times = None if t0 is None else (t0, time.monotonic())
            prev = pending.get(out.request_id)
            if prev is None:
                pending[out.request_id] = [out.request_id, out.text, list(out.token_ids), out.input_tokens,
                                           out.output_tokens, out.finish_reason, out.error, times, urgent]
            else:
                prev[1] += out.text
                prev[2].extend(out.token_ids)
                prev[3:7] = out.input_tokens, out.output_tokens, out.finish_reason, out.error
                prev[8] = prev[8] or urgent

        stats_sent = [0.0]

        def flush() -> None:  # called by the engine after each loop iteration
            now = time.monotonic()
            if now - stats_sent[0] >= 1.0 or engine.idle:  # `engine` is set before its thread starts
                stats_sent[0] = now
                peers.send(0, ("stats", engine.stats_dict()))
            if not pending:
                return
            if interval <= 0:
                batch = [tuple(v[:8]) for v in pending.values()]
                pending.clear()
            else:
                now = time.monotonic()
                batch = []
                for rid, v in list(pending.items()):
                    if v[8] or now - last_sent.get(rid, 0.0) >= interval:
                        batch.append(tuple(v[:8]))
                        del pending[rid]
                        if v[5] is None:
                            last_sent[rid] = now
                        else:
                            last_sent.pop(rid, None)
                if not batch:
                    return
            peers.send_outputs(batch)

        engine = Engine.from_args(args, after_step=flush)
        engine.start()  # after `engine` is bound: flush runs on its thread
    except Exception as exc:  # report, then exit: the parent raises with this message
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return 1
    if engine._tp is not None:
        def watch() -> None:  # tp > 1: a dead engine loop (a failed collective) ends the process: fail fast
            engine._thread.join()
            if engine._error is not None:
                log.error("hf engine (tp leader) failed: %r; exiting", engine._error)
                time.sleep(0.2)  # let the final outputs go out
                os._exit(3)

        threading.Thread(target=watch, name="hf-tp-watch", daemon=True).start()
    info = {"max_model_len": engine.max_model_len, "max_num_seqs": engine.max_num_seqs,
            "vocab_size": engine.vocab_size, "device": str(engine.runner.device),
            "dtype": str(engine.runner.dtype).replace("torch.", ""), "pid": os.getpid(),
            "features": engine.features}

    def add_all(adds: list) -> None:
        """("add" messages, as (k, message, when received)) -> the engine, text prompts tokenized together."""
        if not adds:
            return
        requests = []
        for k, (_, local, prompt, params), t in adds:
            rid = f"{k}/{local}" if k else local
            received[rid] = t
            peers.started(k, rid)
            requests.append((rid, prompt, params, on_output))
        for (k, msg, _), (rid, *_), exc in zip(adds, requests, engine.add_requests(requests)):
            if exc is not None:  # InvalidRequest (prompt too long, ...): that request's error
                received.pop(rid, None)
                peers.finished(k, rid)
                try:
                    peers.send(k, [(msg[1], "", [], 0, 0, "error", str(exc), None)])
                except OSError:  # that instance is gone: the reading loop sees it at its next read
                    pass

    def handle(k: int, msg) -> str | None:
        """One message of connection k; "stop" / "detach" when the connection is done."""
        kind = msg[0]
        if kind == "add":
            add_all([(k, msg, time.monotonic())])
        elif kind == "abort":
            engine.abort(f"{k}/{msg[1]}" if k else msg[1])
        elif kind == "stop" and not k:
            return "stop"
        elif kind == "detach" and k:
            return "detach"
        return None

    # One thread reads every connection, as it read the one connection before: requests are tokenized with no lock,
    # and no more threads take turns at the GIL with the engine loop.  It reads all that a connection has sent so far
    # before tokenizing: the successors of requests that ended in one step arrive as a burst, and their prompts go to
    # the tokenizer in one call (`add_all`), one call a connection (eight model instances are eight connections).
    # Attaching instances are accepted on a thread of `_listen`, which wakes this loop through `wake`.
    wake_r, wake_w = Pipe(duplex=False)
    close_listener = _listen(listen, info, peers, wake_w) if listen else None
    peers.send(0, ("ready", info))

    def read(c, k: int, adds: list) -> str | None:
        """Read the messages waiting on connection c (k; at most 1,024, then the others get a turn): "add"s join
        `adds` (tokenized later, together); any other message first hands `adds` to the engine (an abort may be
        for one of them).  Why the connection is done, if it is."""
        try:
            for _ in range(1024):
                msg = c.recv()
                if msg[0] == "add":
                    adds.append((k, msg, time.monotonic()))
                else:
                    add_all(adds)
                    adds.clear()
                    done = handle(k, msg)
                    if done is not None:
                        return done
                if not c.poll():
                    break
        except (EOFError, OSError):  # that instance is gone (its requests end with it)
            return "gone"
        return None

    try:
        first_open = True  # the instance that started us: when it goes, the engine stops
        while first_open:
            by_conn = peers.by_conn()
            for c in wait(list(by_conn) + [wake_r]):
                if c is wake_r:
                    wake_r.recv_bytes()
                    continue
                k = by_conn[c]
                adds: list = []
                done = read(c, k, adds)
                if done != "gone":  # nobody to answer a gone one: its requests read just now are not started
                    add_all(adds)
                if done is None:
                    continue
                if not k:
                    first_open = False
                    break
                for rid in peers.drop(k):  # an attached instance left: its running requests end
                    engine.abort(rid)
                c.close()
                log.info("hf engine process: model instance %d detached", k)
    finally:
        if close_listener is not None:
            close_listener()
        try:
            engine.shutdown()  # running requests end 'cancelled'; the engine flushes them
        except OSError:
            pass
    return 0


def _listen(path: str, info: dict, peers: _Peers, wake):
    """Accept attaching instances at `path` (a unix socket; a stale one from a dead server is replaced): each gets
    ("ready", info), joins `peers` and wakes the reading loop through `wake`.  Returns close()."""
    from multiprocessing.connection import Listener

    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = Listener(path, family="AF_UNIX")
    os.chmod(path, 0o600)  # this user's instances only (the hf model also puts it in a 0700 directory)
    closing = threading.Event()

    def accept() -> None:
        while True:
            try:
                c = listener.accept()
                if c.recv()[0] != "attach":
                    c.close()
                    continue
                c.send(("ready", info))
            except (EOFError, OSError):
                if closing.is_set():
                    return
                continue
            k = peers.add(c)
            log.info("hf engine process: model instance %d attached", k)
            wake.send_bytes(b"")

    def close() -> None:  # removes the socket file; a thread still blocked in accept ends with the process
        closing.set()
        listener.close()

    threading.Thread(target=accept, name="hf-listen", daemon=True).start()
    return close


def _worker_child(conn, args: HFEngineArgs) -> int:
    """A tensor-parallel worker rank: hf_tp.run_worker on a thread; exits when it ends or the parent goes."""
    from launcher.engines import hf_tp
    lock = threading.Lock()
    ready = threading.Event()

    def on_ready(runner) -> None:
        ready.set()
        with lock:
            conn.send(("ready", {"max_model_len": runner.max_model_len, "max_num_seqs": runner.max_num_seqs,
                                 "vocab_size": runner.vocab_size, "device": str(runner.device),
                                 "dtype": str(runner.dtype).replace("torch.", ""), "pid": os.getpid(),
                                 "role": "worker", "tp_rank": runner.tp_group.rank}))

    def work() -> None:
        code = 0
        try:
            hf_tp.run_worker(args.model_path, on_ready=on_ready, threads=args.torch_threads or None,
                             **args.runner_kwargs())
        except BaseException as exc:
            code = 3
            log.error("hf tp worker failed: %r", exc)
            if not ready.is_set():
                try:
                    with lock:
                        conn.send(("error", f"{type(exc).__name__}: {exc}"))
                except OSError:
                    pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # leader stopped (0) or failed (3): this process ends either way

    threading.Thread(target=work, name="hf-tp-worker", daemon=True).start()
    try:
        while conn.recv()[0] != "stop":
            pass
    except (EOFError, OSError):
        pass
    return 0


if __name__ == "__main__":
    code = _child(int(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown (seconds with torch loaded): nothing is left to clean up
