"""How the engines' shared runtime (launcher.python_backend.async_runtime) sends a request's responses.

Triton's `triton_python_backend_utils` exists only inside the python backend stub; here a module of the
same name records responses, so the sender threads run as they do in the stub. What is checked: text that
a request makes while its previous response is being sent goes out merged in its next response, in order,
and the final response carries what is left; other requests' senders do not wait for a slow one.
"""

from __future__ import annotations

import sys
import threading
import types

import pytest


class _Tensor:
    def __init__(self, name, array):
        self.name, self.value = name, array.reshape(-1)[0]
        self.values = array.reshape(-1).tolist()


class _Response:
    def __init__(self, output_tensors, error=None):
        self.outputs = {
            t.name: (t.value.decode() if isinstance(t.value, bytes) else int(t.value)) for t in output_tensors
        }
        self.ids = next((t.values for t in output_tensors if t.name == "output_ids"), None)
        self.error = error


@pytest.fixture
def pb_utils(monkeypatch):
    mod = types.ModuleType("triton_python_backend_utils")
    mod.Tensor, mod.InferenceResponse = _Tensor, _Response
    mod.TritonError = lambda message: message
    mod.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", mod)
    return mod


class Sender:
    """A response sender whose first send blocks until `release` is set (a slow round trip)."""

    def __init__(self, block_first=False):
        self.sent, self.entered, self.release = [], threading.Event(), threading.Event()
        self.ids = []  # each response's output_ids (None: it had none)
        self.block_first = block_first
        self.done = threading.Event()

    def send(self, response, flags=0):
        if self.block_first and not self.sent:
            self.entered.set()
            assert self.release.wait(10)
        self.sent.append(
            (response.outputs.get("text_output"), response.outputs.get("output_tokens"), flags, response.error)
        )
        self.ids.append(response.ids)
        if flags:
            self.done.set()


@pytest.fixture
def runtime(pb_utils):
    from launcher.python_backend import triton_io
    from launcher.python_backend.adapter import EngineAdapter
    from launcher.python_backend.async_runtime import AsyncEngineRuntime

    rt = AsyncEngineRuntime(EngineAdapter())
    rt._responder = triton_io.Responder()
    threads = [threading.Thread(target=rt._send_loop, args=(q,), daemon=True) for q in rt._send_queues]
    for t in threads:
        t.start()
    yield rt
    for q in rt._send_queues:
        q.put(None)
    for t in threads:
        t.join(5)


def test_text_made_during_a_send_goes_out_merged_in_order(runtime):
    from launcher.python_backend.outbox import Outbox

    slow = Sender(block_first=True)
    out = Outbox(slow, shard=0)
    runtime._post(out, " a", 5, 1)
    assert slow.entered.wait(5)  # " a" is on its way; the next pieces wait for it
    runtime._post(out, " b", 5, 2)
    runtime._post(out, " c", 5, 3)
    runtime._post_final(out, ("done", " d", "length", None), 5, 4)
    slow.release.set()
    assert slow.done.wait(5)
    assert slow.sent == [(" a", 1, 0, None), (" b c d", 4, 1, None)]


def test_a_slow_request_does_not_hold_up_another_shard(runtime):
    from launcher.python_backend.outbox import Outbox

    slow, fast = Sender(block_first=True), Sender()
    runtime._post(Outbox(slow, shard=0), " s", 1, 1)
    assert slow.entered.wait(5)
    quick = Outbox(fast, shard=1)
    runtime._post(quick, " x", 1, 1)
    runtime._post_final(quick, ("done", "", "stop", None), 1, 1)
    assert fast.done.wait(5), "a request on another sender waited for the slow one"
    assert fast.sent[-1][2] == 1
    slow.release.set()


def test_an_engine_error_sends_the_text_made_before_it_then_the_error(runtime):
    from launcher.python_backend.outbox import Outbox

    s = Sender(block_first=True)
    out = Outbox(s, shard=2)
    runtime._post(out, " a", 3, 1)
    assert s.entered.wait(5)
    runtime._post(out, " b", 3, 2)
    runtime._post_final(out, ("error", "vllm engine error: boom"))
    s.release.set()
    assert s.done.wait(5)
    assert s.sent == [(" a", 1, 0, None), (" b", 2, 0, None), (None, None, 1, "vllm engine error: boom")]


def test_final_counts_only_streams_text_alone(runtime):
    from launcher.python_backend.outbox import Outbox

    s = Sender()
    out = Outbox(s, shard=3)
    out.counts = False
    runtime._post(out, " a", 3, 1)
    runtime._post_final(out, ("done", " b", "length", None), 3, 2)
    assert s.done.wait(5)
    assert s.sent[0][1] is None and s.sent[-1] == (" b", 2, 1, None) or s.sent == [(" a b", 2, 1, None)]


TEXT = "naïve café: 日本語のテキスト 🙂🚀 ok — ∑ done"


def _released(tok, ids) -> str:
    """The text a detokenizer has released for ids: that of the longest prefix not ending in U+FFFD (vLLM's rule)."""
    for j in range(len(ids), -1, -1):
        text = tok.decode(ids[:j], skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            return text
    return ""


def _replayed(runtime, tokenizer, ids, continues=True):
    """Serve one streamed request that asked for output_ids (return_token_ids) through the runtime, its engine an
    adapter that gives one token a piece with the text a detokenizer releases; return its sender."""
    import asyncio

    from launcher.python_backend.adapter import EngineAdapter, Piece
    from launcher.python_backend.generation import GenerationRequest, SamplingParams

    class Replay(EngineAdapter):
        name = "replay"

        async def generate(self, request_id, request):
            sent = ""
            for k in range(1, len(ids) + 1):
                await asyncio.sleep(0.002)  # a step: the sender sends what came meanwhile
                text = _released(tokenizer, ids[:k])
                last = k == len(ids)
                yield Piece(text[len(sent) :], k, 3, "length" if last else None, token_ids=ids[k - 1 : k])
                sent = text

    runtime.adapter = Replay()
    runtime.adapter.continues, runtime.adapter.tokenizer = continues, tokenizer
    req = GenerationRequest("p", SamplingParams(max_tokens=len(ids)), True, return_token_ids=True)
    runtime._accept = lambda request, out: req
    sender = Sender()
    asyncio.run(runtime._serve(None, sender))
    assert sender.done.wait(5)
    return sender


def test_output_ids_go_with_the_response_that_sends_their_text(runtime, tiny_model_dir):
    """A request the front end may move: each response's output_ids are the tokens whose text is out by then, so the
    ids so far always decode to the text so far, characters split over tokens included."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok.encode(TEXT, add_special_tokens=False)
    s = _replayed(runtime, tok, ids)
    text, got = "", []
    for (piece, _, _, error), sent_ids in zip(s.sent, s.ids):
        assert error is None
        text += piece or ""
        got += sent_ids or []
        assert tok.decode(got) == text, (got, text)
    assert text == TEXT and got == ids and len(s.sent) > 10, s.sent


def test_a_request_its_engine_cannot_continue_says_so_on_its_first_response(runtime, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok.encode("plain words here", add_special_tokens=False)
    s = _replayed(runtime, tok, ids, continues=False)
    assert s.ids[0] == [-1] and all(i is None for i in s.ids[1:]), s.ids


def test_a_requests_task_starts_in_the_loop_callback_that_makes_it_where_asyncio_can():
    """The runtime's intake (`AsyncEngineRuntime._start_serving`): on Python 3.12 and later a request's task runs at
    once, up to its first wait (its parse and hand-over to the engine), not from the loop's next iteration; before
    3.12 it is an ordinary task.  Either way it runs to its end."""
    import asyncio

    from launcher.python_backend.async_runtime import _new_task

    ran = []

    async def serve():
        ran.append("parse")
        await asyncio.sleep(0)
        ran.append("rest")

    async def main():
        task = _new_task(serve(), asyncio.get_running_loop())
        before_any_wait = list(ran)
        await task
        return before_any_wait

    assert asyncio.run(main()) == (["parse"] if sys.version_info >= (3, 12) else [])
    assert ran == ["parse", "rest"]
