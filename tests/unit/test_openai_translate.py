"""The OpenAI API's pure translation (launcher/openai_api/translate.py): request bodies onto the request contract,
refusals naming the field, engine errors onto OpenAI's statuses."""

import pytest

from launcher.openai_api import translate as tr

SERVED = ("hf_model", "tiny")


def _template(messages):
    return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def test_a_completion_body_maps_every_sampling_field_onto_the_contract():
    gen, opts = tr.completion_generation(
        {
            "model": "tiny",
            "prompt": ["Hello"],
            "max_tokens": 7,
            "stop": "x",
            "temperature": 0.5,
            "top_p": 0.9,
            "seed": 3,
            "top_k": -1,
            "min_tokens": 2,
            "ignore_eos": True,
            "repetition_penalty": 1.1,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.5,
            "stream": True,
            "stream_options": {"include_usage": True},
            "n": 1,
            "user": "someone",
        },
        SERVED,
    )
    assert (gen.prompt, gen.max_tokens, gen.stop, gen.temperature, gen.top_p, gen.seed) == (
        "Hello",
        7,
        ("x",),
        0.5,
        pytest.approx(0.9),
        3,
    )
    assert (gen.top_k, gen.min_tokens, gen.ignore_eos, gen.repetition_penalty) == (0, 2, True, pytest.approx(1.1))
    assert (gen.presence_penalty, gen.frequency_penalty, gen.stream) == (0.5, -0.5, True)
    assert opts == tr.Options("tiny", True, True, prompts=("Hello",))


def test_defaults_leave_sampling_to_the_server_and_usage_chunks_only_when_streaming():
    gen, opts = tr.completion_generation(
        {"model": "hf_model", "prompt": "Hi", "stream_options": {"include_usage": True}}, SERVED
    )
    assert gen.max_tokens == tr.COMPLETIONS_DEFAULT_MAX_TOKENS and gen.temperature is None and gen.stop == ()
    assert opts == tr.Options("hf_model", False, False, prompts=("Hi",)) and opts.plain
    gen, _ = tr.chat_generation(
        {"model": "hf_model", "messages": [{"role": "user", "content": "Hi"}]}, SERVED, _template
    )
    assert gen.max_tokens == tr.CHAT_DEFAULT_MAX_TOKENS


def test_chat_applies_the_template_and_prefers_max_completion_tokens():
    body = {
        "model": "hf_model",
        "max_tokens": 50,
        "max_completion_tokens": 9,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Capital "}, {"type": "text", "text": "of France?"}]},
        ],
    }
    gen, _ = tr.chat_generation(body, SERVED, _template)
    assert gen.prompt == "<system>Be brief.<user>Capital of France?<assistant>" and gen.max_tokens == 9


BAD = [
    ({"prompt": "x"}, 400, "model"),
    ({"model": "gpt-4", "prompt": "x"}, 404, "model"),
    ({"model": "tiny"}, 400, "prompt"),
    ({"model": "tiny", "prompt": ["a", 2]}, 400, "prompt"),
    ({"model": "tiny", "prompt": [[1, 2], []]}, 400, "prompt"),
    ({"model": "tiny", "prompt": [1, -2]}, 400, "prompt"),
    ({"model": "tiny", "prompt": [True]}, 400, "prompt"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "tiny", "prompt": "x", "max_tokens": "8"}, 400, "max_tokens"),
    ({"model": "tiny", "prompt": "x", "temperature": 2.5}, 400, "temperature"),
    ({"model": "tiny", "prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"model": "tiny", "prompt": "x", "seed": -1}, 400, "seed"),
    ({"model": "tiny", "prompt": "x", "stop": [""]}, 400, "stop"),
    ({"model": "tiny", "prompt": "x", "stop": 5}, 400, "stop"),
    ({"model": "tiny", "prompt": "x", "n": 0}, 400, "n"),
    ({"model": "tiny", "prompt": "x", "n": 3, "best_of": 2}, 400, "best_of"),
    ({"model": "tiny", "prompt": "x", "best_of": 3, "stream": True}, 400, "best_of"),
    ({"model": "tiny", "prompt": ["x"] * 200, "n": 2}, 400, "prompt"),
    ({"model": "tiny", "prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ({"model": "tiny", "prompt": "x", "logprobs": True}, 400, "logprobs"),
    ({"model": "tiny", "prompt": "x", "echo": "yes"}, 400, "echo"),
    ({"model": "tiny", "prompt": "x", "ignore_eos": "yes"}, 400, "ignore_eos"),
    ({"model": "tiny", "prompt": "x", "stream_options": 1, "stream": True}, 400, "stream_options"),
]


@pytest.mark.parametrize("body, status, param", BAD, ids=[f"{p}-{i}" for i, (_, _, p) in enumerate(BAD)])
def test_a_bad_completion_body_is_refused_naming_the_field(body, status, param):
    with pytest.raises(tr.ApiError) as e:
        tr.completion_generation(body, SERVED)
    err = e.value.body()["error"]
    assert e.value.status == status and err["param"] == param and param in err["message"], err
    assert set(err) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content"),
        ({"logprobs": 1}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"best_of": 2}, "best_of"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"n": 0}, "n"),
    ],
)
def test_a_bad_chat_body_is_refused_naming_the_field(extra, param):
    body = {"model": "hf_model", "messages": [{"role": "user", "content": "Hi"}], **extra}
    with pytest.raises(tr.ApiError) as e:
        tr.chat_generation(body, SERVED, _template)
    assert e.value.status == 400 and e.value.param == param, e.value.body()


@pytest.mark.parametrize(
    "message, code, status",
    [
        ("max_tokens 100000 exceeds the model limit of 2048 tokens (max_model_len); ask for fewer tokens", "", 400),
        ("top_p must be in (0, 1]", "", 400),
        ("Exceeds maximum queue size", "", 429),
        ("too busy", "RESOURCE_EXHAUSTED", 429),
        ("failed to connect to all addresses", "UNAVAILABLE", 503),
        ("Request for unknown model: 'hf_model' is not ready", "", 503),
        ("no replica is up (replica 0 (10.0.0.1:8001): health probe failed)", "", 503),
        ("CUDA error: an illegal memory access was encountered", "", 500),
    ],
)
def test_engine_errors_get_openais_status(message, code, status):
    err = tr.engine_error(message, code)
    assert err.status == status and message in err.message and err.body()["error"]["type"]


def test_response_shapes():
    counts = tr.usage(5, 3)
    assert counts == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert (
        tr.finish_reason("length") == "length" and tr.finish_reason("stop") == tr.finish_reason("cancelled") == "stop"
    )
    chunk = tr.chat_chunk("id", 1, "m", {"content": "a"}, None, True)
    assert (
        chunk["object"] == "chat.completion.chunk"
        and chunk["usage"] is None
        and chunk["choices"][0]["delta"] == {"content": "a"}
    )
    assert "usage" not in tr.completion_chunk("id", 1, "m", "a", None, False)
    last = tr.usage_chunk("id", 1, "m", False, counts)
    assert last["choices"] == [] and last["usage"] == counts and last["object"] == "text_completion"
    body = tr.chat_body("id", "m", "Paris", "stop", counts)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Paris"} and body["usage"] == counts
    assert tr.models_body("hf_model", 1)["data"][0]["id"] == "hf_model"


@pytest.mark.parametrize("chat", [False, True])
def test_a_generation_sent_as_a_body_comes_back_the_same(chat):
    from launcher.client.request import Generation

    gen = Generation(
        "Hello there",
        max_tokens=9,
        stream=True,
        temperature=0.7,
        top_p=0.5,
        top_k=4,
        seed=11,
        stop=("a", "b"),
        min_tokens=9,
        ignore_eos=True,
        repetition_penalty=1.2,
    )
    body = tr.request_body(gen, "hf_model", chat)
    assert body["stream_options"] == {"include_usage": True}
    back, opts = (
        tr.chat_generation(body, SERVED, lambda m: m[0]["content"]) if chat else tr.completion_generation(body, SERVED)
    )
    assert back == gen and opts.plain and (opts.model, opts.stream, opts.include_usage) == ("hf_model", True, True)


def test_choices_are_a_request_each_with_seeds_apart():
    """n samples of each prompt of a list (token ids too), choice i*n+j answering prompt i; seed + j per sample."""
    gen, opts = tr.completion_generation(
        {"model": "tiny", "prompt": [[5, 6], [7]], "n": 2, "seed": 10, "max_tokens": 3}, SERVED
    )
    gens = tr.choice_generations(gen, opts)
    assert [(g.prompt, g.seed) for g in gens] == [([5, 6], 10), ([5, 6], 11), ([7], 10), ([7], 11)]
    assert not opts.plain and opts.n == opts.best_of == 2 and gen.logprobs is None
    # best_of ranks candidates by their tokens' log probabilities: asked of the engine even when the client did not
    gen, opts = tr.completion_generation({"model": "tiny", "prompt": "x", "n": 2, "best_of": 4}, SERVED)
    assert len(tr.choice_generations(gen, opts)) == 4 and gen.logprobs == 0 and opts.logprobs is None


def test_log_probability_fields_map_onto_the_contract():
    gen, opts = tr.completion_generation({"model": "tiny", "prompt": "x", "logprobs": 3, "echo": True}, SERVED)
    assert (gen.logprobs, gen.prompt_logprobs, opts.logprobs, opts.echo) == (3, 3, 3, True)
    gen, opts = tr.completion_generation({"model": "tiny", "prompt": "x", "echo": True}, SERVED)
    assert (gen.logprobs, gen.prompt_logprobs, opts.echo, opts.plain) == (None, None, True, False)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": 5}
    gen, opts = tr.chat_generation(body, SERVED, _template)
    assert (gen.logprobs, gen.prompt_logprobs, opts.logprobs) == (5, None, 5)
    body["logprobs"], body["top_logprobs"] = False, None
    gen, opts = tr.chat_generation(body, SERVED, _template)
    assert gen.logprobs is None and opts.plain
