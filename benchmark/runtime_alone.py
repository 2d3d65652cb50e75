"""The served models' runtime (launcher.python_backend.async_runtime.AsyncEngineRuntime) driven in this process,
without tritonserver: the yardstick's path that tells the stub's own cost (its event loop, the request parsing, the
sender threads, the GIL they share with the engine's front end) from tritonserver's and gRPC's.

The runtime runs as it does inside the stub: `submit` takes a request as `execute` hands it over, its loop drives the
adapter, its sender threads build the contract's responses and send them.  What stands in for Triton is the module
`triton_python_backend_utils`, which exists only inside the python backend stub: here its tensors are numpy arrays
held by name, a request holds the inputs llmlaunch-bench sends (`launcher.client.request.input_arrays`, decoded as
tritonserver hands them to the model), and a response sender passes each response to the client's event loop where
tritonserver would copy it into shared memory and on to gRPC.  Nothing of the served path is skipped but those hops.
"""

from __future__ import annotations

import asyncio
import sys
import time
import types

FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL


class _Tensor:
    """pb_utils.Tensor: a named numpy array."""

    __slots__ = ("_name", "_array")

    def __init__(self, name: str, array):
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self):
        return self._array


class _Response:
    """pb_utils.InferenceResponse: output tensors, or an error."""

    __slots__ = ("tensors", "error")

    def __init__(self, output_tensors=(), error=None):
        self.tensors, self.error = list(output_tensors), error

    def output(self, name: str):
        for t in self.tensors:
            if t.name() == name:
                return t.as_numpy().reshape(-1)[0]
        return None


class _Sender:
    """A decoupled request's response sender: each response goes to `deliver` (the client's loop, thread-safe)."""

    def __init__(self, deliver):
        self._deliver = deliver

    def send(self, response=None, flags: int = 0) -> None:
        self._deliver(response, bool(flags & FINAL))

    def is_cancelled(self) -> bool:
        return False


class _Request:
    """pb_utils.InferenceRequest: the contract's inputs, no request parameters (llmlaunch-bench sends none)."""

    def __init__(self, arrays, deliver):
        self._inputs = [_Tensor(name, array) for name, _, array in arrays]
        self._sender = _Sender(deliver)

    def inputs(self):
        return self._inputs

    def parameters(self) -> str:
        return "{}"  # a JSON object, as pb_utils gives them

    def get_response_sender(self):
        return self._sender


def install_pb_utils() -> types.ModuleType:
    """Make `import triton_python_backend_utils` give the stand-in (outside a stub there is none to shadow)."""
    if "triton_python_backend_utils" in sys.modules:
        return sys.modules["triton_python_backend_utils"]
    mod = types.ModuleType("triton_python_backend_utils")
    mod.Tensor, mod.InferenceResponse = _Tensor, _Response
    mod.TritonError = str
    mod.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL
    sys.modules[mod.__name__] = mod
    return mod


def start_runtime(adapter):
    """An AsyncEngineRuntime on `adapter`, started as the stub's `initialize` starts it (the adapter's engine is
    built on the runtime's loop thread)."""
    install_pb_utils()
    from launcher.python_backend.adapter import Log
    from launcher.python_backend.async_runtime import AsyncEngineRuntime

    runtime = AsyncEngineRuntime(adapter, Log(f"{adapter.name} runtime"))
    runtime.start()
    return runtime


def runtime_stream(runtime, sampling: dict | None = None):
    """stream_of for benchmark.yardstick_loop.closed_loop through `runtime`: llmlaunch-bench's request for the sample
    (its prompt's text, max_tokens, stream, ignore_eos and min_length = max_tokens, `sampling` on top), submitted as
    `execute` submits it; yields (new tokens, prompt tokens, finish reason) per response, from the counts each
    response carries.  A response with an error ends the stream with that error raised.  `stream_of.requests` counts
    the requests it submitted."""
    from launcher.bench.runner import generations
    from launcher.client.request import input_arrays

    async def stream_of(sample):
        stream_of.requests += 1
        loop = asyncio.get_running_loop()
        got: asyncio.Queue = asyncio.Queue()

        def deliver(response, final: bool) -> None:  # a sender thread of the runtime
            loop.call_soon_threadsafe(got.put_nowait, (response, final))

        (gen,) = generations([sample], dict(sampling or {}), stream=True, ignore_eos=True)
        runtime.submit(_Request(input_arrays(gen), deliver))
        made = 0
        while True:
            response, final = await got.get()
            if response is not None:
                if response.error is not None:
                    raise RuntimeError(f"the runtime answered with an error: {response.error}")
                count = response.output("output_tokens")
                new = int(count) - made if count is not None else 0
                made += new
                reason = response.output("finish_reason")
                n_in = response.output("input_tokens")
                yield new, int(n_in) if n_in is not None else 0, reason.decode() if reason else ""
            if final:
                return

    stream_of.requests = 0  # requests submitted through it (settled_first_tokens waits for their counts)
    return stream_of


def settled_first_tokens(runtime, requests: int, timeout: float = 10.0) -> dict:
    """The runtime's first-token totals once they count `requests` requests: a sender thread counts a request's first
    token just after sending it, so the client can hold a request's last response before its count is in."""
    deadline = time.monotonic() + timeout
    while True:
        totals = runtime.first_token.totals_map()
        if totals["count"] >= requests or time.monotonic() > deadline:
            return totals
        time.sleep(0.001)
