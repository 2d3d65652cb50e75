"""Log probabilities, several choices and token-id prompts through the OpenAI API, against a real tritonserver
serving the tiny hf model (float32, CPU), checked against transformers' own log_softmax of the same tokens: the
requests an evaluation harness sends (lm-eval's local-completions loglikelihood: token-id prompts in a list, echo,
logprobs=1, max_tokens=1) and what sampling clients read (chat top_logprobs, n, best_of), streamed and not."""

from __future__ import annotations

from pathlib import Path

import pytest

openai = pytest.importorskip("openai")
torch = pytest.importorskip("torch")

from launcher.testing.serve import hf_server  # noqa: E402
from tests.integration.test_openai_api import MODEL, api, client, templated_tokenizer  # noqa: E402

pytestmark = [pytest.mark.triton, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def oa(tiny_model_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("logprobs")
    with hf_server(str(tiny_model_dir), workdir, {"device": "cpu", "max_num_seqs": 16}) as srv:
        proc = api(srv.grpc_url, str(templated_tokenizer(Path(tiny_model_dir), workdir / "tok")))
        try:
            proc.wait_ready(120)
            yield client(proc)
        finally:
            proc.stop()


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(tiny_model_dir)


def _ref(model, ids):
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].float().log_softmax(-1)


def test_loglikelihood_requests_as_lm_eval_sends_them_equal_transformers(oa, model):
    lm, tok = model
    prompts = [tok("The quick brown fox jumps").input_ids, tok("Hello there, how are you").input_ids]
    r = oa.completions.create(model=MODEL, prompt=prompts, echo=True, logprobs=1, max_tokens=1, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    for ids, choice in zip(prompts, r.choices):
        lp = choice.logprobs
        assert len(lp.token_logprobs) == len(ids) + 1 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        ref = _ref(lm, ids)
        for p in range(1, len(ids)):
            assert abs(lp.token_logprobs[p] - ref[p - 1, ids[p]].item()) < 1e-4
            greedy = max(lp.top_logprobs[p].values()) == lp.token_logprobs[p]  # lm-eval's is_greedy
            assert greedy == (ref[p - 1].argmax().item() == ids[p])
        # the one new token is the greedy one, its log probability the model's
        assert abs(lp.token_logprobs[-1] - ref[-1].max().item()) < 1e-4
        assert choice.text.startswith(tok.decode(ids))


def test_chat_top_logprobs_streamed_equal_not_streamed(oa):
    body = dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0)
    body["extra_body"] = {"ignore_eos": True}
    whole = oa.chat.completions.create(**body, logprobs=True, top_logprobs=3)
    content = whole.choices[0].logprobs.content
    # a token that is a byte of a character shows as "" (as vLLM's server shows it); the random model's answer holds
    # bytes that never make a character, which its text shows as U+FFFD
    text = whole.choices[0].message.content.replace("\ufffd", "")
    assert len(content) == 6 and "".join(t.token for t in content) == text
    for t in content:
        tops = [x.logprob for x in t.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and t.logprob == tops[0]  # greedy
    streamed = []
    for chunk in oa.chat.completions.create(**body, logprobs=True, top_logprobs=3, stream=True):
        for c in chunk.choices:
            if c.logprobs is not None:
                streamed.extend(c.logprobs.content)
    assert [(t.token, round(t.logprob, 5)) for t in streamed] == [(t.token, round(t.logprob, 5)) for t in content]
    plain = oa.chat.completions.create(**body)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == whole.choices[0].message.content


def test_n_choices_per_prompt_seeded_and_streamed(oa):
    body = dict(model=MODEL, prompt=["Once upon", "The end"], n=3, max_tokens=5, temperature=1.0, seed=7)
    body["extra_body"] = {"ignore_eos": True}
    r = oa.completions.create(**body)
    assert [c.index for c in r.choices] == list(range(6)) and r.usage.completion_tokens == 30
    texts = [c.text for c in r.choices]
    assert len(set(texts[:3])) > 1  # samples of one prompt differ (seed, seed + 1, ...)
    assert [c.text for c in oa.completions.create(**body).choices] == texts  # and repeat with the seed
    streamed = [""] * 6
    for chunk in oa.completions.create(**body, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert streamed == texts


def test_best_of_answers_the_most_likely_candidates(oa):
    body = dict(model=MODEL, prompt="Once upon", max_tokens=4, temperature=1.0, seed=3)
    body["extra_body"] = {"ignore_eos": True}
    four = oa.completions.create(**body, n=4, logprobs=0).choices
    total = sorted((sum(c.logprobs.token_logprobs), c.text) for c in four)
    best = oa.completions.create(**body, n=2, best_of=4)
    assert [c.text for c in best.choices] == [t for _, t in reversed(total[-2:])]
    assert best.usage.completion_tokens == 16  # every candidate's tokens


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
        ({"prompt": "x", "best_of": 2, "stream": True}, "best_of"),
        ({"prompt": [[]]}, "prompt"),
        ({"prompt": [10**6]}, None),  # past the vocabulary: the engine's check, a 400 all the same
    ],
)
def test_bad_requests_get_400_and_the_server_answers_after(oa, body, param):
    with pytest.raises(openai.BadRequestError) as e:
        oa.completions.create(model=MODEL, max_tokens=2, **body)
    if param:
        assert e.value.body["param"] == param
    assert oa.completions.create(model=MODEL, prompt="ok", max_tokens=2).choices[0].finish_reason


def test_echo_with_logprobs_streamed_equals_not_streamed(oa):
    body = dict(model=MODEL, prompt="Hello there", max_tokens=5, temperature=0, echo=True, logprobs=2)
    body["extra_body"] = {"ignore_eos": True}
    whole = oa.completions.create(**body).choices[0]
    text, tokens, lps, offsets = "", [], [], []
    for chunk in oa.completions.create(**body, stream=True):
        for c in chunk.choices:
            text += c.text
            if c.logprobs is not None:
                tokens += c.logprobs.tokens
                lps += c.logprobs.token_logprobs
                offsets += c.logprobs.text_offset
    assert text == whole.text and text.startswith("Hello there")
    assert tokens == whole.logprobs.tokens and offsets == whole.logprobs.text_offset
    assert [None if v is None else round(v, 5) for v in lps] == [
        None if v is None else round(v, 5) for v in whole.logprobs.token_logprobs
    ]
