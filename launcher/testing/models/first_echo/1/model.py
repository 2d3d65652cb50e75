"""Test/benchmark fixture `first_echo`: answers each request at once through the hf model's own parts, to
measure what the serving path costs a first token (benchmark/first_response.py).

The hf model's first token goes client -> gRPC -> tritonserver -> this stub's `execute` (parse) -> the engine
process (a socketpair) -> the engine -> back on the stub's receive thread -> a response -> tritonserver -> gRPC
-> client.  This model keeps every part of that but the engine.  Parameter `via`:

  inline   `execute` answers itself: tritonserver, the stub, gRPC and the client alone (the floor)
  thread   `execute` hands the request to a responder thread, which answers (a thread hand-off, as the hf
           model's responder threads)
  process  `execute` sends ("add", id, prompt) to a child process over a socketpair with
           multiprocessing.connection framing, as launcher.hf.client.EngineProcess does; the child
           at once sends back a list with one one-token output tuple, the shape of the engine process's
           per-step message; the stub's receive thread answers (the hf model's default path, engine aside)

Parameter `delay_ms` (default 0): the answering side sleeps that long first, as an engine's prefill keeps it
waiting (inline and thread: the answering thread; process: the child), so that the threads along the path
have slept as long as they do around a real first token before they are woken.

Parameter `spin` (default false): with via=process, the stub's receive thread and the child poll their socket in a
loop instead of blocking on it (a thread that blocks for milliseconds is slow to wake, above all on a virtual
machine whose idle vCPU the host deschedules).

Parameter `parse`: `once` reads the inputs with launcher.python_backend.triton_io.request_arrays, as the hf model
does; `each` looks every contract input up by name with pb_utils.get_input_tensor_by_name (each
lookup lists the request's inputs again: the cost request_arrays avoids).  parse_inputs then validates
them, as in the hf model.  Parameter `pythonpath`: where `launcher` imports from.

Responses are built by the hf model's triton_io.Responder: one with the text " x" (output_tokens 1), then
the final one, whose text_output carries five stamps " e p h s f": time.monotonic() when `execute` began,
when the request was parsed, when the answering thread had the output, when the first response's send
began and when it returned (CLOCK_MONOTONIC: the clock of the client's time.perf_counter on one machine).
"""

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

# The child of `via=process`: one output per "add", sent back at once; exits when the stub's end closes.
CHILD = """
import sys, time
from multiprocessing.connection import Connection
conn = Connection(int(sys.argv[1]))
delay = float(sys.argv[2])
spin = sys.argv[3] == "1"
while True:
    try:
        while spin and not conn.poll(0):
            pass
        msg = conn.recv()
    except EOFError:
        break
    t = time.monotonic()
    if delay:
        time.sleep(delay)
    conn.send([(msg[1], " x", [1], len(msg[2].split()), 1, None, None, (t, time.monotonic()))])
"""


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        path = params.get("pythonpath", "")
        if path and path not in sys.path:
            sys.path.append(path)
        from launcher.python_backend import triton_io

        self.io = triton_io
        self.via = params.get("via", "inline")
        self.parse = params.get("parse", "once")
        self.delay = float(params.get("delay_ms", "0") or 0) / 1000.0
        self.spin = params.get("spin", "false") == "true"
        if self.via not in ("inline", "thread", "process") or self.parse not in ("once", "each"):
            raise pb_utils.TritonModelException(
                f"via={self.via!r} parse={self.parse!r}: use via inline | thread | process, parse once | each"
            )
        self.responder = triton_io.Responder(batched=True)
        self.requests = {}  # id -> [sender, input_tokens tensor, execute began, parsed]
        self.next_id = 0
        self.child = None
        if self.via == "thread":
            self.inbox = queue.SimpleQueue()
            threading.Thread(target=self._thread_loop, daemon=True).start()
        elif self.via == "process":
            from multiprocessing.connection import Connection

            from launcher.python_backend.engine_env import engine_python

            ours, theirs = socket.socketpair()
            env = dict(os.environ, PYTHONPATH=path)
            self.child = subprocess.Popen(
                [engine_python(), "-c", CHILD, str(theirs.fileno()), str(self.delay), "1" if self.spin else "0"],
                pass_fds=[theirs.fileno()],
                env=env,
            )
            theirs.close()
            self.conn = Connection(ours.detach())
            threading.Thread(target=self._receive_loop, daemon=True).start()

    def _arrays(self, request):
        if self.parse == "once":
            return self.io.request_arrays(request)
        arrays = {}
        for name in self.io.INPUT_NAMES:
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                arrays[name] = tensor.as_numpy()
        return arrays

    def execute(self, requests):
        for request in requests:
            began = time.monotonic()
            sender = request.get_response_sender()
            try:
                req = self.io.parse_inputs(self._arrays(request))
            except self.io.InvalidRequest as exc:
                sender.send(self.io.error_response(str(exc)), flags=FINAL)
                continue
            self.next_id += 1
            rid = str(self.next_id)
            n_in = self.responder.input_tokens(len(req.prompt.split()))
            self.requests[rid] = [sender, n_in, began, time.monotonic()]
            if self.via == "inline":
                if self.delay:
                    time.sleep(self.delay)
                self._answer(rid)
            elif self.via == "thread":
                self.inbox.put(rid)
            else:
                self.conn.send(("add", rid, req.prompt))
        return None

    def _thread_loop(self):
        while True:
            rid = self.inbox.get()
            if self.delay:
                time.sleep(self.delay)
            self._answer(rid)

    def _receive_loop(self):
        while True:
            try:
                while self.spin and not self.conn.poll(0):
                    pass
                outputs = self.conn.recv()
            except (EOFError, OSError):
                return
            for out in outputs:
                self._answer(out[0])

    def _answer(self, rid):
        had = time.monotonic()
        sender, n_in, began, parsed = self.requests.pop(rid)
        first = self.responder.build(" x", n_in, 1)
        start = time.monotonic()
        sender.send(first)
        done = time.monotonic()
        stamps = " " + " ".join(f"{t:.7f}" for t in (began, parsed, had, start, done))
        sender.send(self.io.response(stamps, 1, 2, "length"), flags=FINAL)

    def finalize(self):
        if self.child is not None:
            self.conn.close()
            try:
                self.child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.child.kill()
