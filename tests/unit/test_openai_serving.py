"""The OpenAI API's counters over worker slots, its spliced SSE text events, how many API processes rank 0
starts."""

from __future__ import annotations

import pytest

from launcher.openai_api import translate as tr
from launcher.openai_api.app import TextChunks, _sse
from launcher.openai_api.counters import WIDTH, Counters, shared_size
from launcher.python_backend.responders import API_MAX_PROCESSES, api_processes


def test_each_worker_writes_its_slot_and_every_worker_reads_the_sums():
    store = [0] * shared_size(3)
    a, b, c = (Counters(store, slot, 3) for slot in range(3))
    a.answered("completions", 200)
    b.answered("completions", 200)
    b.answered("chat", 429)
    c.answered("chat", 418)  # a status outside the table counts as a server error
    a.begin()
    b.begin()
    b.end()
    c.tokens(5, 7)
    a.tokens(1, 2)
    for k in (a, b, c):
        assert k.requests() == {("completions", 200): 2, ("chat", 429): 1, ("chat", 500): 1}
        assert (k.running, k.prompt_tokens, k.completion_tokens) == (1, 6, 9)
    assert store[WIDTH : 2 * WIDTH].count(0) < WIDTH  # b wrote into its own slot only
    text = c.text()
    assert 'llmlaunch_openai_requests_total{route="completions",status="200"} 2' in text
    assert "llmlaunch_openai_requests_running 1" in text and "llmlaunch_openai_processes 3" in text


def test_health_waits_for_every_worker():
    store = [0] * shared_size(2)
    a, b = Counters(store, 0, 2), Counters(store, 1, 2)
    a.started()
    assert not a.all_started and not b.all_started
    b.started()
    assert a.all_started and Counters().workers == 1


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("with_usage", [False, True])
@pytest.mark.parametrize("text", [" the", 'a "quote" \\ back', "é 日本 \n\t", "\x00", "", "\u2028"])
def test_spliced_text_events_are_the_bytes_of_the_whole_event(chat, with_usage, text):
    if chat:

        def make(t):
            return tr.chat_chunk("chatcmpl-1", 7, "m", {"content": t}, None, with_usage)
    else:

        def make(t):
            return tr.completion_chunk("cmpl-1", 7, "m", t, None, with_usage)

    assert TextChunks(make)(text) == _sse(make(text))


def test_api_processes_one_per_four_cpus_within_bounds():
    assert [api_processes(n) for n in (1, 2, 4, 8, 12, 16, 64)] == [1, 1, 1, 2, 3, 4, API_MAX_PROCESSES]
