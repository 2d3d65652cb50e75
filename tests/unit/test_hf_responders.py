"""The hf model's response threads (launcher/engines/hf/streams.py, in launcher/engines/hf/model.py) outside
Triton, as many as launcher.python_backend.responders gives an engine process on a GPU.

Triton's `triton_python_backend_utils` exists only inside the python backend stub; here a module of the same name
records responses, so the receive thread's routing (`_route`) and the responder threads run as they do in the
stub.  What is checked: with more streams open than threads, the streams are spread over the threads, and each
stream's responses stay whole and in order, its last one final.  (The model under a real tritonserver, on CPU with
one thread: tests/integration/test_hf_serving.py.)
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from pathlib import Path

import pytest

pytest.importorskip("numpy")
pytest.importorskip("torch")  # model.py imports the engine's describe_features (launcher.hf.reporting)

ROOT = Path(__file__).resolve().parents[2]


class _Tensor:
    def __init__(self, name, array):
        self.name, self.value = name, array.reshape(-1)[0]


class _Response:
    def __init__(self, output_tensors, error=None):
        self.outputs = {
            t.name: (t.value.decode() if isinstance(t.value, bytes) else int(t.value)) for t in output_tensors
        }
        self.error = error


class _Sender:
    """A stream's response sender: records (text, output tokens, final) per response, from any thread."""

    def __init__(self):
        self.sent = []
        self.done = threading.Event()

    def send(self, response, flags=0):
        self.sent.append((response.outputs.get("text_output"), response.outputs.get("output_tokens"), bool(flags)))
        if flags:
            self.done.set()

    def is_cancelled(self):
        return False


@pytest.fixture
def model(monkeypatch):
    """(the model module, a TritonPythonModel with the GPU rule's response threads started, no engine)."""
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor, pb.InferenceResponse = _Tensor, _Response
    pb.TritonError = lambda message, code=0: message
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
    spec = importlib.util.find_spec("launcher.engines.hf.model")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    from launcher.python_backend import triton_io
    from launcher.python_backend.counters import FirstTokenTimes
    from launcher.python_backend.responders import responders

    m = object.__new__(module.TritonPythonModel)
    m.engine_process = True
    m._responders = responders("cuda", 16)
    m._responder = triton_io.Responder(False)
    m._streams, m._next_id = {}, 0
    m.stream_interval_s, m.cancel_check_s = 0.0, 1e9
    m._first_token = FirstTokenTimes()
    m._start_responders()
    yield module, m
    for q in m._queues:
        if q is not None:
            q.put(None)
    for t in m._threads:
        t.join(5)


def test_streams_spread_over_the_response_threads_keep_their_responses_whole_and_in_order(model):
    from launcher.engines.hf.streams import Stream
    from launcher.hf.outputs import Output

    _, m = model
    assert len(m._queues) == 4 and m._queues[0] is None and len(m._threads) == 3  # shard 0: the receive thread
    senders, shards = {}, {}
    for _ in range(10):  # as execute registers a request: more streams than threads
        m._next_id += 1
        rid = str(m._next_id)
        senders[rid] = _Sender()
        m._streams[rid] = Stream(senders[rid], True, m._shard())
        shards[rid] = m._streams[rid].shard
    assert set(shards.values()) == {0, 1, 2, 3}, shards
    steps = 12
    for k in range(1, steps + 1):  # one engine step's outputs per call, as the engine process's receive thread
        m._route([Output(rid, f"t{k} ", [k], 5, k, "length" if k == steps else None) for rid in senders])
    for rid, sender in senders.items():
        assert sender.done.wait(10), rid
        texts = [text for text, _, _ in sender.sent]
        counts = [n for _, n, _ in sender.sent]
        finals = [final for _, _, final in sender.sent]
        assert "".join(texts) == "".join(f"t{k} " for k in range(1, steps + 1)), (rid, texts)
        assert counts == sorted(set(counts)) and counts[-1] == steps, (rid, counts)  # in order, none twice
        assert finals == [False] * (len(finals) - 1) + [True], (rid, finals)
    assert not m._streams
