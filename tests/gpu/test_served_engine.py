"""The request contract against a real engine served by llmlaunch (vLLM, LMDeploy, SGLang, hf on a GPU machine).

Skipped unless LLMLAUNCH_TEST_URL names a running llmlaunch endpoint (grpc://HOST:PORT) and
LLMLAUNCH_TEST_TOKENIZER the served model's tokenizer folder. `benchmark/gpu/serve_bench.py --check` runs
this module against the server it starts, before measuring it:

    LLMLAUNCH_TEST_URL=grpc://127.0.0.1:8001 LLMLAUNCH_TEST_TOKENIZER=/tmp/llama-1b pytest tests/gpu

The model may be random-weight: every check takes its expectation from the model's own greedy output
(a stop word, a banned word, an end token are picked from what it generated), so none depends on the text
being sensible. Greedy output must be repeatable, so run the server alone.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from tests.contract_client import Stream, generate

URL = os.environ.get("LLMLAUNCH_TEST_URL", "")
pytestmark = pytest.mark.skipif(
    not URL, reason="needs a served engine: LLMLAUNCH_TEST_URL (GPU machine; benchmark/gpu/serve_bench.py --check)"
)

PROMPT = "The history of the city begins with a small harbour where fishermen traded"


@pytest.fixture(scope="module")
def server():
    from launcher.client.connection import parse_url
    from launcher.client.control import default_model

    url = parse_url(URL)
    return SimpleNamespace(grpc_url=url, model=default_model(url))


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.environ["LLMLAUNCH_TEST_TOKENIZER"])


def whole(server, prompt=PROMPT, max_tokens=32, **extra):
    responses, error = generate(server, prompt, max_tokens, stream=False, **extra)
    assert error is None, error
    (r,) = responses
    return r


@pytest.fixture(scope="module")
def greedy(server):
    """The model's greedy answer to PROMPT, 48 tokens, EOS ignored: what the other checks take apart."""
    return whole(server, max_tokens=48, ignore_eos=True)


def test_streamed_pieces_add_up_to_the_whole_answer(server, greedy, tok):
    responses, error = generate(server, PROMPT, 48, ignore_eos=True)
    assert error is None, error
    assert "".join(r["text_output"] for r in responses) == greedy["text_output"]
    assert len([r for r in responses if r["text_output"]]) > 1  # streamed, not one piece
    last = responses[-1]
    assert (last["output_tokens"], last["finish_reason"]) == (48, "length")
    assert last["input_tokens"] == len(tok(PROMPT).input_ids)  # the engine's count: the prompt with its BOS
    assert [r["output_tokens"] for r in responses] == sorted(r["output_tokens"] for r in responses)


def test_greedy_is_repeatable(server, greedy):
    assert whole(server, max_tokens=48, ignore_eos=True)["text_output"] == greedy["text_output"]


def test_ignore_eos_generates_exactly_max_tokens(server):
    r = whole(server, max_tokens=40, ignore_eos=True)
    assert (r["output_tokens"], r["finish_reason"]) == (40, "length")


def test_a_stop_word_ends_the_answer_before_it(server, greedy):
    text = greedy["text_output"]
    words = [w for w in text.split() if len(w) >= 3 and text.count(w) == 1]
    assert words, f"no word in the greedy text to stop at: {text!r}"
    stop = words[len(words) // 2]
    r = whole(server, max_tokens=48, stop_words=[stop])
    assert r["finish_reason"] == "stop"
    assert r["text_output"] == text[: text.index(stop)]


def test_end_id_ends_the_answer_and_min_length_holds_it_off(server, greedy, tok):
    # the text re-tokenized need not be the ids generated (byte pieces, merges): try its tokens in turn until
    # one is an id the model generates
    ids = tok(greedy["text_output"], add_special_tokens=False).input_ids
    for end in dict.fromkeys(ids[:12]):
        r = whole(server, max_tokens=48, end_id=end)
        if r["finish_reason"] == "stop":
            break
    else:
        pytest.fail(f"none of the answer's first tokens {ids[:12]} ended it as end_id")
    assert r["output_tokens"] < 48 and greedy["text_output"].startswith(r["text_output"])
    held = whole(server, max_tokens=48, end_id=end, min_length=r["output_tokens"] + 10)
    assert held["output_tokens"] >= r["output_tokens"] + 10


def test_a_banned_word_changes_the_answer(server, greedy, tok):
    # the answer re-tokenized need not be the ids generated (a random model's byte pieces): ban its first tokens
    # in turn; banning the one the model generated first must change the answer's start
    ids = tok(greedy["text_output"], add_special_tokens=False).input_ids
    tried = []
    for i in dict.fromkeys(ids[:8]):
        word = tok.decode([i]).strip()
        if not word or "\ufffd" in word or word in tried:  # a piece of a character is no word anyone bans
            continue
        tried.append(word)
        r = whole(server, max_tokens=8, ignore_eos=True, bad_words=[word])
        assert r["output_tokens"] == 8
        if not greedy["text_output"].startswith(r["text_output"]):
            return
    pytest.fail(f"banning each of {tried} left the greedy answer as it was")


def test_a_seed_makes_sampling_repeatable(server):
    a = whole(server, max_tokens=24, ignore_eos=True, temperature=1.0, random_seed=1234)["text_output"]
    b = whole(server, max_tokens=24, ignore_eos=True, temperature=1.0, random_seed=1234)["text_output"]
    c = whole(server, max_tokens=24, ignore_eos=True, temperature=1.0, random_seed=4321)["text_output"]
    assert a == b and a != c


def test_penalties_are_taken_and_change_a_repetitive_answer(server, greedy, tok):
    ids = tok(greedy["text_output"], add_special_tokens=False).input_ids
    r = whole(server, max_tokens=48, ignore_eos=True, repetition_penalty=2.0)
    assert r["output_tokens"] == 48
    if len(set(ids)) < len(ids):  # the greedy answer repeats a token: a strong penalty must change it
        assert r["text_output"] != greedy["text_output"]
    for extra in ({"presence_penalty": 1.5}, {"frequency_penalty": 1.5}):
        assert whole(server, max_tokens=16, ignore_eos=True, **extra)["output_tokens"] == 16


def test_final_counts_only_sends_the_counts_once(server, greedy):
    responses, error = generate(server, PROMPT, 48, ignore_eos=True, parameters={"final_counts_only": True})
    assert error is None, error
    # text alone before the final response; output_ids too where the front end asks the replicas for them, so a
    # stream can move to another replica mid-generation (several replicas: launcher/frontend/migration.py)
    assert all(set(r) - {"output_ids"} == {"text_output"} for r in responses[:-1]), responses[:2]
    assert (responses[-1]["output_tokens"], responses[-1]["finish_reason"]) == (48, "length")
    assert "".join(r["text_output"] for r in responses) == greedy["text_output"]


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"max_tokens": 0}, "max_tokens must be >= 1"),
        ({"top_p": 2.0}, "top_p must be in (0, 1]"),
        ({"temperature": -1.0}, "temperature must be >= 0"),
        ({"beam_width": 2}, "beam_width 2 is not supported"),
        ({"max_tokens": 10_000_000}, "exceeds the model limit"),
    ],
)
def test_a_bad_request_gets_a_clear_error_and_others_go_on(server, greedy, extra, message):
    s = Stream(server)  # a long request in flight meanwhile must not notice
    try:
        s.send(PROMPT, 64, ignore_eos=True)
        extra = dict(extra)
        _, error = generate(server, PROMPT, extra.pop("max_tokens", 8), **extra)
        assert error is not None and message in str(error), error
        responses, error = s.collect(timeout=60)
        assert error is None and responses[-1]["output_tokens"] == 64
    finally:
        s.close()
    assert whole(server, max_tokens=48, ignore_eos=True)["text_output"] == greedy["text_output"]


def test_a_prompt_longer_than_the_context_is_refused_and_the_server_goes_on(server, greedy):
    _, error = generate(server, "word " * 200_000, 8)
    assert error is not None, "a 200,000-word prompt was accepted"
    assert whole(server, max_tokens=48, ignore_eos=True)["text_output"] == greedy["text_output"]


def test_a_cancelled_stream_ends_and_the_server_goes_on(server, greedy):
    streams = [Stream(server) for _ in range(8)]
    try:
        for s in streams:
            s.send(PROMPT, 1000, ignore_eos=True)
        for s in streams:
            for _ in range(3):
                out, error, final = s.next(timeout=60)
                assert error is None and not final
    finally:
        for s in streams:
            s.close(cancel=True)
    t0 = time.monotonic()
    assert whole(server, max_tokens=48, ignore_eos=True)["text_output"] == greedy["text_output"]
    # eight cancelled 1,000-token requests no longer hold the engine: one short request is not held behind them
    assert time.monotonic() - t0 < 10


def test_concurrent_streams_do_not_mix(server):
    prompts = [f"{PROMPT} number {i}" for i in range(16)]
    alone = [whole(server, p, max_tokens=24, ignore_eos=True)["text_output"] for p in prompts]
    streams = [Stream(server) for _ in prompts]
    try:
        for p, s in zip(prompts, streams):
            s.send(p, 24, ignore_eos=True)
        together = []
        for s in streams:
            responses, error = s.collect(timeout=60)
            assert error is None, error
            together.append("".join(r["text_output"] for r in responses))
    finally:
        for s in streams:
            s.close()
    # batched with others, a request's greedy tokens may differ in a near-tie (bf16 kernels differ by batch
    # size); the texts must still be each request's own: most equal, none empty
    same = sum(a == b for a, b in zip(alone, together))
    assert all(together) and same >= len(prompts) // 2, (same, list(zip(alone, together)))
