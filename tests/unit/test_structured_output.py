"""Structured output on the request contract: OpenAI's and vLLM's spellings -> the contract's guide
(openai_api.structured), the guide inputs on the wire and their checks (client.request, triton_io), vLLM's
StructuredOutputsParams and SGLang's sampling_params mappings (at their API boundaries: neither runs here), and the hf engine's bitmask against
xgrammar's own (launcher.hf.guided)."""

import asyncio
import json

import numpy as np
import pytest

from launcher.client.request import Generation, encode_inputs
from launcher.openai_api import translate as tr
from launcher.openai_api.structured import choice_grammar, guide_of
from launcher.python_backend import triton_io
from tests.unit.test_engine_launch import load_model_module

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(
    "body, guide",
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, ("json", "")),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}}, "schema"),
        ({"structured_outputs": {"json": SCHEMA}}, "schema"),
        ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, "schema"),
        ({"structured_outputs": {"json_object": True}}, ("json", "")),
        ({"structured_outputs": {"regex": r"\d+"}}, ("regex", r"\d+")),
        ({"structured_outputs": {"grammar": 'root ::= "a"'}}, ("ebnf_grammar", 'root ::= "a"')),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, ("ebnf_grammar", 'root ::= "yes" | "no"')),
        ({"guided_json": SCHEMA}, "schema"),
        ({"guided_regex": "a|b"}, ("regex", "a|b")),
        ({"guided_choice": ["x"]}, ("ebnf_grammar", 'root ::= "x"')),
    ],
)
def test_every_spelling_becomes_one_guide(body, guide):
    if guide == "schema":
        guide = ("json_schema", json.dumps(SCHEMA))
    assert guide_of(body) == guide
    gen, _ = tr.completion_generation({"model": "m", "prompt": "p", **body}, ("m",))
    assert gen.guide == guide
    gen, _ = tr.chat_generation(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}, ("m",), lambda m: "t"
    )
    assert gen.guide == guide


@pytest.mark.parametrize(
    "body, param",
    [
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}}, "response_format"),
        ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {}}, "structured_outputs"),
        ({"structured_outputs": {"json_object": False}}, "structured_outputs.json_object"),
        ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        ({"guided_regex": ""}, "guided_regex"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ],
)
def test_a_bad_or_doubled_constraint_is_refused_naming_the_field(body, param):
    with pytest.raises(tr.ApiError) as e:
        guide_of(body)
    assert e.value.status == 400 and e.value.param.startswith(param), e.value.body()


def test_choice_grammar_derives_exactly_the_choices_whatever_they_hold():
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string as accepts

    choices = ['say "hi"', "back\\slash", "two\nlines", "é ünicode", "yes"]
    grammar = xgr.Grammar.from_ebnf(choice_grammar(choices + ["yes"]))
    for c in choices:
        assert accepts(grammar, c), c
    for other in ("ye", "yes ", 'say "hi', "no"):
        assert not accepts(grammar, other), other


def _guide_arrays(kind, guide=None):
    out = {"max_tokens": np.array([[4]], dtype=np.int32), "text_input": np.array([[b"p"]], dtype=object)}
    if kind is not None:
        out["guided_decoding_guide_type"] = np.array([[kind.encode()]], dtype=object)
    if guide is not None:
        out["guided_decoding_guide"] = np.array([[guide.encode()]], dtype=object)
    return out


def test_a_guide_goes_on_the_wire_and_parses_back():
    for guide in (("json", ""), ("json_schema", json.dumps(SCHEMA)), ("regex", r"[a-z]+"), ("ebnf_grammar", "x")):
        arrays = {}
        for name, dtype, shape, raw in encode_inputs(Generation("p", 4, guide=guide)):
            if dtype == "BYTES":
                arrays[name] = np.array([[raw[4:]]], dtype=object)
            else:
                arrays[name] = np.frombuffer(raw, dtype={"INT32": np.int32, "BOOL": np.bool_}[dtype]).reshape(shape)
        assert triton_io.parse_inputs(arrays).params.guide == guide
    assert triton_io.parse_inputs(_guide_arrays(None)).params.guide is None


@pytest.mark.parametrize(
    "kind, guide, message",
    [
        ("yaml", "x", r"guided_decoding_guide_type 'yaml' is not one of \['ebnf_grammar', 'json', 'json_schema'"),
        ("json_schema", None, "needs guided_decoding_guide"),
        ("json_schema", "{nope", "is not a JSON schema: it is not JSON"),
        ("json_schema", "[1]", "a schema is an object"),
        ("json", "{}", "'json' takes no guide"),
        (None, "a+", "guided_decoding_guide needs guided_decoding_guide_type"),
    ],
)
def test_a_bad_guide_is_refused_naming_the_input(kind, guide, message):
    with pytest.raises(triton_io.InvalidRequest, match=message):
        triton_io.parse_inputs(_guide_arrays(kind, guide))


def test_the_api_answers_a_guide_the_engine_cannot_compile_with_400():
    err = tr.engine_error("engine=hf: guided_decoding_guide (regex) does not compile: parenthesis not closed")
    assert err.status == 400


def test_vllm_structured_outputs_map_each_kind():
    """At vLLM's API boundary: the keyword arguments of vllm.sampling_params.StructuredOutputsParams (one constraint
    each, as its __post_init__ demands), and vLLM's ValueError for a guide it refuses as the client's fault."""
    m = load_model_module("vllm")
    p = triton_io.SamplingParams(max_tokens=3, guide=("json_schema", "{}"))
    assert m.sampling_kwargs(p)["structured_outputs"] == {"json": "{}"}
    assert m.structured_outputs("json", "") == {"json_object": True}
    assert m.structured_outputs("regex", "a") == {"regex": "a"}
    assert m.structured_outputs("ebnf_grammar", "g") == {"grammar": "g"}
    assert "structured_outputs" not in m.sampling_kwargs(triton_io.SamplingParams(max_tokens=3))

    async def refused():
        raise ValueError("The provided JSON schema contains features not supported by xgrammar.")
        yield  # an async generator, as AsyncLLM.generate is

    async def later():
        yield 1
        raise ValueError("engine trouble")

    async def drain(gen):
        return [x async for x in m._guide_refused(gen)]

    with pytest.raises(triton_io.InvalidRequest, match="guided_decoding_guide: vLLM cannot compile it"):
        asyncio.run(drain(refused()))
    with pytest.raises(ValueError, match="engine trouble"):  # after an output it is the engine's failure
        asyncio.run(drain(later()))


def test_sglang_sampling_params_carry_each_kind():
    """At SGLang's API boundary (SGLang does not run here): its sampling_params keys json_schema, regex and ebnf;
    the guide inputs pass its adapter's refusal of what it cannot honour."""
    m = load_model_module("sglang")
    sp = m.sampling_params(triton_io.SamplingParams(max_tokens=3, guide=("json_schema", '{"type": "string"}')))
    assert sp["json_schema"] == '{"type": "string"}'
    assert json.loads(m.sampling_params(triton_io.SamplingParams(max_tokens=3, guide=("json", "")))["json_schema"])
    assert m.sampling_params(triton_io.SamplingParams(max_tokens=3, guide=("regex", "a+")))["regex"] == "a+"
    assert m.sampling_params(triton_io.SamplingParams(max_tokens=3, guide=("ebnf_grammar", "g")))["ebnf"] == "g"
    req = triton_io.parse_inputs(_guide_arrays("regex", "a+"), m.SGLangAdapter.supported, engine="engine=sglang")
    assert req.params.guide == ("regex", "a+")


def test_hf_masks_are_xgrammars_bitmask():
    """The hf engine's mask (bit i of word i // 32) sets exactly the logits xgrammar's own kernel sets to -inf."""
    torch = pytest.importorskip("torch")
    xgr = pytest.importorskip("xgrammar")
    from launcher.hf.guided import apply_masks

    vocab = 1000
    gen = torch.Generator().manual_seed(0)
    words = torch.randint(-(2**31), 2**31 - 1, (3, (vocab + 31) // 32), generator=gen, dtype=torch.int32)
    logits = torch.randn(5, vocab, generator=gen)
    ours = logits.clone()
    apply_masks(ours, [0, 2, 4], words.numpy().tobytes())
    theirs = logits.clone()
    full = torch.full((5, words.shape[1]), -1, dtype=torch.int32)  # xgrammar indexes logits and masks alike
    full[[0, 2, 4]] = words
    xgr.apply_token_bitmask_inplace(theirs, full, indices=[0, 2, 4])
    assert torch.equal(ours, theirs)
    assert torch.equal(ours[1], logits[1]) and torch.isinf(ours[0]).any()
