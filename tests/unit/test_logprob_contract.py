"""Token-id prompts and log probabilities on the request contract: parsing and refusal (triton_io), the response
tensors and their reading back (logprob_io, client.response), and OpenAI's logprobs shapes (openai_api.choices)."""

import math

import numpy as np
import pytest

from launcher.openai_api import choices as ch
from launcher.python_backend import logprob_io, triton_io
from launcher.python_backend.logprob_io import LogProbRows


def _arrays(**kw):
    out = {"max_tokens": np.array([[4]], dtype=np.int32)}
    out.update(kw)
    return out


def test_a_token_id_prompt_and_log_probability_inputs_parse():
    req = triton_io.parse_inputs(
        _arrays(
            input_ids=np.array([[1, 7, 9]], dtype=np.int32),
            return_log_probs=np.array([[True]]),
            return_prompt_log_probs=np.array([[True]]),
            top_log_probs=np.array([[5]], dtype=np.int32),
        )
    )
    assert req.prompt == [1, 7, 9] and req.params.logprobs == 5 and req.params.prompt_logprobs == 5
    req = triton_io.parse_inputs(
        _arrays(text_input=np.array([[b"Hi"]], dtype=object), return_log_probs=np.array([[1]], dtype=bool))
    )
    assert req.prompt == "Hi" and req.params.logprobs == 0 and req.params.prompt_logprobs is None
    # an empty text_input beside input_ids is what TensorRT-LLM clients send for "no text"
    req = triton_io.parse_inputs(
        _arrays(text_input=np.array([[b""]], dtype=object), input_ids=np.array([[3]], dtype=np.int32))
    )
    assert req.prompt == [3]


@pytest.mark.parametrize(
    "change, message",
    [
        ({}, "missing required input 'text_input'"),
        ({"input_ids": np.array([[]], dtype=np.int32)}, "input_ids is empty"),
        ({"input_ids": np.array([[1, -4]], dtype=np.int32)}, "negative token id"),
        ({"input_ids": np.array([[1.0]], dtype=np.float32)}, "must be INT32 token ids"),
        (
            {"input_ids": np.array([[1]], dtype=np.int32), "text_input": np.array([[b"a"]], dtype=object)},
            "not both",
        ),
        (
            {"text_input": np.array([[b"a"]], dtype=object), "top_log_probs": np.array([[2]], dtype=np.int32)},
            "asks for nothing",
        ),
        (
            {
                "text_input": np.array([[b"a"]], dtype=object),
                "return_log_probs": np.array([[True]]),
                "top_log_probs": np.array([[21]], dtype=np.int32),
            },
            r"top_log_probs must be in \[0, 20\]",
        ),
    ],
)
def test_bad_token_id_and_log_probability_inputs_are_refused(change, message):
    with pytest.raises(triton_io.InvalidRequest, match=message):
        triton_io.parse_inputs(_arrays(**change))


@pytest.mark.parametrize("name", triton_io.MUST_HONOUR)
def test_an_engine_refuses_what_it_cannot_honour_naming_itself(name):
    """Ignoring these would answer something else than was asked: refused before the engine sees the request."""
    arrays = _arrays(text_input=np.array([[b"a"]], dtype=object))
    if name in ("input_ids", "top_log_probs"):
        arrays[name] = np.array([[3]], dtype=np.int32)
    elif name.startswith("guided_"):
        arrays[name] = np.array([[b"regex"]], dtype=object)
    else:
        arrays[name] = np.array([[True]])
    if name == "input_ids":
        del arrays["text_input"]
    supported = frozenset(triton_io.INPUT_NAMES) - {name}
    with pytest.raises(triton_io.InvalidRequest, match=f"{name} is not supported by engine=lmdeploy"):
        triton_io.parse_inputs(arrays, supported, engine="engine=lmdeploy")
    # false flags ask for nothing: accepted
    if name.startswith("return_"):
        arrays[name] = np.array([[False]])
        triton_io.parse_inputs(arrays, supported, engine="engine=lmdeploy")


def test_rows_go_on_the_wire_and_come_back():
    """Rows of different widths (the prompt's first token has no top) pad with -1 / -inf and read back unpadded."""
    from tritonclient.grpc import service_pb2

    from launcher.client.response import read_log_probs

    rows = LogProbRows([[5, 5, 2], [7, 1, 7]], [[-0.1, -0.1, -3.0], [-2.0, -0.5, -2.0]])
    prompt = LogProbRows([[9], [4, 4, 8]], [[float("nan")], [-1.5, -1.5, -2.5]])
    arrays = {**logprob_io.arrays(rows), **logprob_io.arrays(prompt, prompt=True)}
    assert arrays["log_prob_ids"].shape == (1, 2, 3) and arrays["prompt_log_probs"][0, 0, 1] == -np.inf
    ir = service_pb2.ModelInferResponse()
    for name, a in arrays.items():
        out = ir.outputs.add()
        out.name, out.datatype = name, "INT32" if a.dtype == np.int32 else "FP32"
        out.shape.extend(a.shape)
        ir.raw_output_contents.append(a.tobytes())
    got, got_prompt = read_log_probs(ir)
    assert got.ids == rows.ids and np.allclose(got.lps, rows.lps)
    assert got_prompt.ids == prompt.ids and math.isnan(got_prompt.lps[0][0]) and got_prompt.lps[1] == [-1.5, -1.5, -2.5]
    assert read_log_probs(service_pb2.ModelInferResponse()) == (None, None)
    assert logprob_io.merged(None, rows) is rows and len(logprob_io.merged(rows, prompt)) == 4


def test_openai_logprobs_shapes():
    names = {1: "<s>", 5: " the", 2: " a", 7: " cat", 9: " dog"}

    def text(i, context):
        return names[i]

    rows = LogProbRows([[5, 2], [7, 9]], [[-0.2, -1.9], [-1.0, -0.9]])
    prompt = LogProbRows([[1], [5, 2]], [[float("nan")], [-0.3, -1.2]])
    out = ch.completion_logprobs(text, rows, prompt)
    assert out["tokens"] == ["<s>", " the", " the", " cat"]
    assert out["token_logprobs"] == [None, -0.3, -0.2, -1.0] and out["top_logprobs"][0] is None
    # the token itself is in its top_logprobs (as vLLM's server answers), so a greedy check is max(top) == own
    assert out["top_logprobs"][3] == {" dog": -0.9, " cat": -1.0} and out["text_offset"] == [0, 3, 7, 11]
    chat = ch.chat_logprobs(text, rows)["content"]
    assert chat[1]["token"] == " cat" and chat[1]["bytes"] == list(b" cat")
    assert [t["token"] for t in chat[1]["top_logprobs"]] == [" dog"]
    floor = ch.completion_logprobs(text, LogProbRows([[5, 2]], [[-math.inf, -math.inf]]))
    assert floor["token_logprobs"] == [ch.FLOOR]  # JSON has no -inf


def test_best_of_keeps_the_most_likely_answers():
    a = ch.Answer(text="a", logprobs=LogProbRows([[1], [2]], [[-1.0], [-1.0]]))
    b = ch.Answer(text="b", logprobs=LogProbRows([[1], [2]], [[-0.5], [-0.2]]))
    c = ch.Answer(text="c", logprobs=LogProbRows([[3]], [[-3.0]]))
    assert [x.text for x in ch.best([a, b, c], 2)] == ["b", "a"]


def test_a_character_split_over_tokens_shows_whole_on_the_token_that_completes_it(tiny_model_dir):
    """As vLLM's server shows it: the byte pieces before show as "", the completing token as the whole character."""
    from tokenizers import Tokenizer

    from launcher.openai_api.tokens import REPLACEMENT, TokenText

    ids = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")).encode("a 🙂", add_special_tokens=False).ids
    text = TokenText(str(tiny_model_dir))
    pieces = [text.in_context(t, ids[:i]) for i, t in enumerate(ids)]
    assert "".join(pieces) == "a 🙂" and not any(REPLACEMENT in p for p in pieces)
    split = [i for i, t in enumerate(ids) if text.piece(t).endswith(REPLACEMENT)]
    # the tokenizer splits the emoji into bytes: the pieces before its last show "", the last the emoji
    assert len(split) > 1 and all(pieces[i] == "" for i in split[:-1]) and pieces[split[-1]] == "🙂"
