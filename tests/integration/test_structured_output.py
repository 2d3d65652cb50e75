"""Structured output for real: the hf engine's xgrammar guides in-process (a guided row beside free rows in one
batch), and through a real tritonserver and the OpenAI API on the default model, SmolLM2-135M-Instruct (CPU, float32),
with the openai SDK: response_format json_schema / json_object, vLLM's structured_outputs choice and regex, streamed
and not, and a guide that does not compile refused with a 400 while the server keeps answering."""

from __future__ import annotations

import json
import re
import threading

import pytest

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("xgrammar")

from benchmark.openai_structured import CHOICES, REGEX, SCHEMA  # noqa: E402
from launcher.testing.serve import hf_server  # noqa: E402
from tests.integration.test_openai_api import MODEL, api, client  # noqa: E402

pytestmark = [pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from launcher.engines.hf.config import HFEngineArgs
    from launcher.hf.engine import Engine

    e = Engine.from_args(HFEngineArgs(model_path=str(tiny_model_dir), device="cpu", max_num_seqs=8)).start()
    yield e
    e.shutdown()


def test_guided_rows_keep_their_guide_and_leave_free_rows_in_the_batch_alone(engine):
    from launcher.python_backend.generation import InvalidRequest, SamplingParams

    free = SamplingParams(max_tokens=24, ignore_eos=True)
    alone = engine.generate("The capital of France is", free)
    guides = [("regex", "[ab]{3,6}"), ("ebnf_grammar", 'root ::= "yes" | "no" | "maybe"'), ("json", "")]
    results: dict = {}

    def run(key, prompt, params):
        results[key] = engine.generate(prompt, params, timeout=300)

    threads = [threading.Thread(target=run, args=("free", "The capital of France is", free))]
    for i, g in enumerate(guides):
        for seed in (1, 2):  # sampled too: the mask holds whatever is drawn
            p = SamplingParams(max_tokens=48, temperature=1.0, seed=seed, guide=g)
            threads.append(threading.Thread(target=run, args=((i, seed), f"Answer {i}:", p)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert results["free"].token_ids == alone.token_ids  # one batch with guided rows: the free row is untouched
    for seed in (1, 2):
        assert re.fullmatch("[ab]{3,6}", results[(0, seed)].text) and results[(0, seed)].finish_reason == "stop"
        assert results[(1, seed)].text in ("yes", "no", "maybe")
        out = results[(2, seed)]
        if out.finish_reason == "stop":  # the random model may run out of tokens inside the object
            assert isinstance(json.loads(out.text), dict)
    with pytest.raises(InvalidRequest, match=r"guided_decoding_guide \(regex\) does not compile"):
        engine.add_request("bad", "x", SamplingParams(max_tokens=4, guide=("regex", "(")), lambda o: None)
    assert engine.generate("Hello", SamplingParams(max_tokens=2)).output_tokens == 2  # the engine goes on


@pytest.fixture(scope="module")
def oa(smollm2_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("structured")
    with hf_server(str(smollm2_dir), workdir, {"device": "cpu", "max_num_seqs": 8}) as srv:
        proc = api(srv.grpc_url, str(smollm2_dir))
        try:
            proc.wait_ready(120)
            yield client(proc)
        finally:
            proc.stop()


def _customer(i: int) -> list:
    return [{"role": "user", "content": f"Make up customer number {i} of an online shop as a JSON record."}]


@pytest.mark.triton
def test_json_schema_answers_validate_streamed_and_not(oa):
    rf = {"type": "json_schema", "json_schema": {"name": "customer", "schema": SCHEMA, "strict": True}}
    r = oa.chat.completions.create(
        model=MODEL, messages=_customer(1), max_tokens=160, temperature=0, response_format=rf
    )
    content = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", content
    jsonschema.validate(json.loads(content), SCHEMA)
    stream = oa.chat.completions.create(
        model=MODEL, messages=_customer(1), max_tokens=160, temperature=0, response_format=rf, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == content
    r = oa.chat.completions.create(
        model=MODEL, messages=_customer(2), max_tokens=160, temperature=0, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.mark.triton
def test_choice_and_regex_hold_for_sampled_answers(oa):
    cases = [
        ("A phone number: ", 24, {"structured_outputs": {"regex": REGEX}}, lambda t: re.fullmatch(REGEX, t)),
        ("The review 'great product' is", 8, {"guided_choice": CHOICES}, lambda t: t in CHOICES),
    ]
    for seed in range(3):
        for prompt, max_tokens, extra, kept in cases:
            r = oa.completions.create(
                model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=1.0, seed=seed, extra_body=extra
            )
            assert kept(r.choices[0].text), r.choices[0].text


@pytest.mark.triton
def test_a_guide_that_does_not_compile_is_a_400_and_the_server_answers_after(oa):
    with pytest.raises(openai.BadRequestError) as e:
        oa.completions.create(
            model=MODEL, prompt="x", max_tokens=4, extra_body={"structured_outputs": {"regex": "(unclosed"}}
        )
    assert "guided_decoding_guide" in str(e.value) and "does not compile" in str(e.value)
    with pytest.raises(openai.BadRequestError, match="response_format"):
        oa.chat.completions.create(model=MODEL, messages=_customer(3), response_format={"type": "yaml"})
    assert oa.completions.create(model=MODEL, prompt="Hello", max_tokens=2).usage.completion_tokens == 2
