"""The hf engine process (launcher/hf/client.py starts it): one `Engine`, served to the model instance that started it
and to the instances that attach later, each over its own connection (the protocol: launcher/hf/client.py).

One thread reads every connection; outputs of each engine step go back in one message per connection, request
ids translated to each instance's own. A tensor-parallel worker rank runs launcher/hf/worker.py instead.

    python -m launcher.hf.multiplexer FD        # FD: the socket the client passed
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

from launcher.engines.hf.config import HFEngineArgs
from launcher.hf import worker
from launcher.hf.engine import Engine
from launcher.python_backend.logprob_io import merged

log = logging.getLogger(__name__)


class Peers:
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
                sends = [
                    (k, self.conns[k], self.send_locks[k], share) for k, share in shares.items() if k in self.conns
                ]
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


def serve(fd: int) -> int:
    from multiprocessing.connection import Connection, Pipe

    conn = Connection(fd)
    _, raw, extra = conn.recv()
    args = HFEngineArgs.from_dict(raw, source="the engine process's arguments")
    if extra["role"] == "worker":
        return worker.serve(conn, args)
    listen = extra["listen"] or ""  # a unix socket path: other model instances attach there
    try:
        peers = Peers(conn)
        outputs = _Outputs(peers, args.stream_interval_ms / 1000.0)
        engine = outputs.engine = Engine.from_args(args, after_step=outputs.flush)
        engine.start()  # after `outputs.engine` is set: flush runs on its thread
    except Exception as exc:  # report, then exit: the parent raises with this message
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return 1
    if engine._tp is not None:
        _exit_when_engine_fails(engine)
    info = _engine_info(engine)
    # Attaching instances are accepted on a thread of `_listen`, which wakes the reading loop through `wake`.
    wake_r, wake_w = Pipe(duplex=False)
    close_listener = _listen(listen, info, peers, wake_w) if listen else None
    kv_server = _serve_prefixes(engine, conn)
    if kv_server is False:
        return 1
    peers.send(0, ("ready", info))
    reader = _Reader(engine, peers, outputs)
    try:
        reader.run(wake_r)
    finally:
        if close_listener is not None:
            close_listener()
        if kv_server is not None:
            kv_server.shutdown()
        reader.fetcher.shutdown()
        try:
            engine.shutdown()  # running requests end 'cancelled'; the engine flushes them
        except OSError:
            pass
    return 0


def _serve_prefixes(engine: Engine, conn):
    """A prefill replica's engine (RankEnv.kv_transfer set: host:port) serves its computed prompts' keys and values
    there (launcher/hf/kv_transfer.py); None where it serves none, False where it cannot (reported to the parent)."""
    from launcher.handoff.rank_env import RankEnv

    address = RankEnv.from_environ(os.environ).kv_transfer
    if not address:
        return None
    from launcher.hf.kv_transfer import serve_prefixes

    try:
        server = serve_prefixes(engine, address)
    except (OSError, ValueError) as exc:
        conn.send(("error", f"serving keys and values on {address}: {exc}"))
        engine.shutdown()
        return False
    log.info("hf engine process: keys and values of computed prompts served on %s", address)
    return server


class _Outputs:
    """The engine's outputs on their way to the connections, sent in one message per engine step (`flush`).

    With `interval` (seconds; the args' stream_interval_ms) a request's new text is held and merged until that long
    after its previous output was sent; its first token and its end go at once.  Fewer messages and responses leave
    the CPU to the engine."""

    def __init__(self, peers: Peers, interval: float):
        self.peers = peers
        self.interval = interval
        self.engine: Engine | None = None  # set before the engine's thread starts
        self.pending: dict = {}  # request id -> [output fields..., urgent]
        self.last_sent: dict = {}  # request id -> time its last output was sent
        self.received: dict = {}  # request id -> when its "add" arrived, until its first output (Output.times)
        self._stats_sent = 0.0

    def on_output(self, out) -> None:
        """The engine's output of one request (engine thread): merged into what waits to be sent."""
        urgent = out.finish_reason is not None or out.output_tokens <= 1
        t0 = self.received.pop(out.request_id, None)
        times = None if t0 is None else (t0, time.monotonic())
        prev = self.pending.get(out.request_id)
        if prev is None:
            self.pending[out.request_id] = [
                out.request_id,
                out.text,
                list(out.token_ids),
                out.input_tokens,
                out.output_tokens,
                out.finish_reason,
                out.error,
                times,
                out.logprobs,
                out.prompt_logprobs,
                out.settled,
                urgent,
            ]
        else:
            prev[1] += out.text
            prev[2].extend(out.token_ids)
            prev[3:7] = out.input_tokens, out.output_tokens, out.finish_reason, out.error
            prev[8] = merged(prev[8], out.logprobs)
            prev[9] = prev[9] or out.prompt_logprobs
            prev[10] = out.settled  # cumulative: the latest output's
            prev[11] = prev[11] or urgent

    def flush(self) -> None:
        """Called by the engine after each loop iteration: its statistics (each second, and once idle) and the
        outputs that are due."""
        engine, pending, last_sent = self.engine, self.pending, self.last_sent
        now = time.monotonic()
        if now - self._stats_sent >= 1.0 or engine.idle:
            self._stats_sent = now
            self.peers.send(0, ("stats", engine.stats_dict()))
        if not pending:
            return
        if self.interval <= 0:
            batch = [tuple(v[:11]) for v in pending.values()]
            pending.clear()
        else:
            now = time.monotonic()
            batch = []
            for rid, v in list(pending.items()):
                if v[11] or now - last_sent.get(rid, 0.0) >= self.interval:
                    batch.append(tuple(v[:11]))
                    del pending[rid]
                    if v[5] is None:
                        last_sent[rid] = now
                    else:
                        last_sent.pop(rid, None)
            if not batch:
                return
        self.peers.send_outputs(batch)


def _exit_when_engine_fails(engine: Engine) -> None:
    """tp > 1: a dead engine loop (a failed collective) ends the process: fail fast."""

    def watch() -> None:
        engine._thread.join()
        if engine._error is not None:
            log.error("hf engine (tp leader) failed: %r; exiting", engine._error)
            time.sleep(0.2)  # let the final outputs go out
            os._exit(3)

    threading.Thread(target=watch, name="hf-tp-watch", daemon=True).start()


def _engine_info(engine: Engine) -> dict:
    """What the "ready" message tells each model instance of the engine."""
    return {
        "max_model_len": engine.max_model_len,
        "max_num_seqs": engine.max_num_seqs,
        "vocab_size": engine.vocab_size,
        "device": str(engine.runner.device),
        "dtype": str(engine.runner.dtype).replace("torch.", ""),
        "pid": os.getpid(),
        "features": engine.features,
    }


class _Reader:
    """The one thread that reads every connection, as it read the one connection before: requests are tokenized with
    no lock, and no more threads take turns at the GIL with the engine loop.  It reads all that a connection has sent
    so far before tokenizing: the successors of requests that ended in one step arrive as a burst, and their prompts
    go to the tokenizer in one call (`add_all`), one call a connection (eight model instances are eight
    connections)."""

    def __init__(self, engine: Engine, peers: Peers, outputs: _Outputs):
        from launcher.hf.kv_transfer import PrefixFetcher

        self.engine = engine
        self.peers = peers
        self.outputs = outputs
        self.fetcher = PrefixFetcher(engine, log)  # requests with a kv_from wait for their prefix there

    def run(self, wake) -> None:
        """Serve the connections until the instance that started us goes (or says "stop"); `wake`: readable when a
        connection was attached."""
        from multiprocessing.connection import wait

        peers, engine = self.peers, self.engine
        while True:
            by_conn = peers.by_conn()
            for c in wait(list(by_conn) + [wake]):
                if c is wake:
                    wake.recv_bytes()
                    continue
                k = by_conn[c]
                adds: list = []
                done = self.read(c, k, adds)
                if done != "gone":  # nobody to answer a gone one: its requests read just now are not started
                    self.add_all(adds)
                if done is None:
                    continue
                if not k:  # the instance that started us: when it goes, the engine stops
                    return
                for rid in peers.drop(k):  # an attached instance left: its running requests end
                    engine.abort(rid)
                c.close()
                log.info("hf engine process: model instance %d detached", k)

    def read(self, c, k: int, adds: list) -> str | None:
        """Read the messages waiting on connection c (k; at most 1,024, then the others get a turn): "add"s join
        `adds` (tokenized later, together); any other message first hands `adds` to the engine (an abort may be
        for one of them).  Why the connection is done, if it is."""
        try:
            for _ in range(1024):
                msg = c.recv()
                if msg[0] == "add":
                    adds.append((k, msg, time.monotonic()))
                else:
                    self.add_all(adds)
                    adds.clear()
                    done = self.handle(k, msg)
                    if done is not None:
                        return done
                if not c.poll():
                    break
        except (EOFError, OSError):  # that instance is gone (its requests end with it)
            return "gone"
        return None

    def add_all(self, adds: list) -> None:
        """("add" messages, as (k, message, when received)) -> the engine, text prompts tokenized together."""
        if not adds:
            return
        peers, received, on_output = self.peers, self.outputs.received, self.outputs.on_output
        requests, here = [], []
        for k, (_, local, prompt, params), t in adds:
            rid = f"{k}/{local}" if k else local
            received[rid] = t
            peers.started(k, rid)
            if params.kv_from:  # its prompt's keys and values come from a prefill engine first
                self.fetcher.add(
                    rid,
                    prompt,
                    params,
                    on_output,
                    lambda exc, k=k, local=local, rid=rid: self.refused(k, local, rid, exc),
                )
            else:
                requests.append((rid, prompt, params, on_output))
                here.append((k, local))
        for (k, local), (rid, *_), exc in zip(here, requests, self.engine.add_requests(requests)):
            if exc is not None:  # InvalidRequest (prompt too long, ...): that request's error
                self.refused(k, local, rid, exc)

    def refused(self, k: int, local: str, rid: str, exc: Exception) -> None:
        """Request `rid` (connection k's `local`) was refused by the engine: its error is its one output."""
        self.outputs.received.pop(rid, None)
        self.peers.finished(k, rid)
        try:
            self.peers.send(k, [(local, "", [], 0, 0, "error", str(exc), None)])
        except OSError:  # that instance is gone: the reading loop sees it at its next read
            pass

    def handle(self, k: int, msg) -> str | None:
        """One message of connection k; "stop" / "detach" when the connection is done."""
        kind = msg[0]
        if kind == "add":
            self.add_all([(k, msg, time.monotonic())])
        elif kind == "abort":
            rid = f"{k}/{msg[1]}" if k else msg[1]
            if not self.fetcher.abort(rid):
                self.engine.abort(rid)
        elif kind == "stop" and not k:
            return "stop"
        elif kind == "detach" and k:
            return "detach"
        return None


def _listen(path: str, info: dict, peers: Peers, wake):
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


if __name__ == "__main__":
    code = serve(int(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown (seconds with torch loaded): nothing is left to clean up
