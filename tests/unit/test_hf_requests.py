"""The hf model's pure parts (no engine, no model): the stop-word matcher, request parsing and response arrays
(launcher.python_backend.triton_io), and the engine step split of the timing counters. The engine itself:
tests/integration/test_hf_engine.py."""

from __future__ import annotations

import pytest

pytest.importorskip("numpy")

from launcher.hf.detok import StopMatcher  # noqa: E402
from launcher.python_backend import triton_io  # noqa: E402


def test_stop_matcher_holds_back_partial_matches():
    m = StopMatcher(["STOP", "xyz"])
    assert m.push("abc ST") == ("abc ", False)
    assert m.push("O") == ("", False)
    assert m.push("P and more") == ("", True)
    m = StopMatcher(["STOP"])
    assert m.push("abc ST") == ("abc ", False)
    assert m.push("ART") == ("START", False)
    assert m.flush() == ""
    m = StopMatcher(["STOP"])
    assert m.push("xxST") == ("xx", False)
    assert m.flush() == "ST"


# ------------------------------------------------------------------------------------------ request parsing units
def _arrays(**kw):
    import numpy as np

    out = {"text_input": np.array([[b"Hello"]], dtype=object), "max_tokens": np.array([[8]], dtype=np.int32)}
    for k, v in kw.items():
        out[k] = v
    return out


def test_parse_inputs_defaults_and_values():
    import numpy as np

    req = triton_io.parse_inputs(_arrays())
    assert req.prompt == "Hello" and req.params.max_tokens == 8 and not req.stream and req.params.greedy
    req = triton_io.parse_inputs(
        _arrays(
            stream=np.array([[True]]),
            temperature=np.array([[0.5]], dtype=np.float32),
            stop_words=np.array([[b"a", b"bc"]], dtype=object),
            random_seed=np.array([[7]], dtype=np.uint64),
            pad_id=np.array([[0]], dtype=np.int32),
            beam_width=np.array([[1]], dtype=np.int32),
        ),
        supported=frozenset(triton_io.INPUT_NAMES) - {"pad_id"},
    )
    assert req.stream and req.params.temperature == 0.5 and req.params.stop == ("a", "bc")
    assert req.params.seed == 7 and req.ignored == ("pad_id",)
    # max_batch_size 0 layout (no batch dimension) works too
    assert (
        triton_io.parse_inputs(
            {"text_input": np.array([b"Hi"], dtype=object), "max_tokens": np.array([3], dtype=np.int32)}
        ).params.max_tokens
        == 3
    )


@pytest.mark.parametrize(
    "change, message",
    [
        ({"text_input": None}, "missing required input 'text_input'"),
        ({"max_tokens": None}, "missing required input 'max_tokens'"),
        ({"text_input": "EMPTY"}, "text_input is empty"),
        ({"text_input": "BATCH"}, "batch size 2 is not supported"),
        ({"max_tokens": "ZERO"}, "max_tokens must be >= 1"),
        ({"max_tokens": "FLOAT"}, "must be INT32"),
        ({"beam_width": "FOUR"}, "beam_width 4 is not supported"),
        ({"top_p": "BIG"}, "top_p must be in"),
        ({"seed": "OTHER"}, "disagree"),
        ({"text_input": "NOTUTF8"}, "not valid UTF-8"),
        ({"bogus": "X"}, "unknown inputs"),
    ],
)
def test_parse_inputs_rejects(change, message):
    import numpy as np

    values = {
        "EMPTY": np.array([[b""]], dtype=object),
        "BATCH": np.array([[b"a"], [b"b"]], dtype=object),
        "ZERO": np.array([[0]], dtype=np.int32),
        "FLOAT": np.array([[1.5]], dtype=np.float32),
        "FOUR": np.array([[4]], dtype=np.int32),
        "BIG": np.array([[1.5]], dtype=np.float32),
        "OTHER": np.array([[2]], dtype=np.uint64),
        "NOTUTF8": np.array([[b"\xff\xfe"]], dtype=object),
        "X": np.array([[1]]),
        None: None,
    }
    arrays = _arrays(random_seed=np.array([[1]], dtype=np.uint64))
    for k, v in change.items():
        arrays[k] = values[v]
    with pytest.raises(triton_io.InvalidRequest, match=message):
        triton_io.parse_inputs(arrays, max_model_len=2048)


def test_parse_parameters_reads_the_contracts_request_parameters():
    """pb_utils gives a request's parameters as JSON text; gRPC sends booleans, the generate endpoint and
    `--request-param` may send text.  Keys that are not the contract's belong to someone else: left alone."""
    off = {"final_counts_only": False, "return_token_ids": False}
    assert triton_io.parse_parameters("") == off
    got = triton_io.parse_parameters('{"final_counts_only": true, "triton_x": 1, "return_token_ids": true}')
    assert got == {"final_counts_only": True, "return_token_ids": True}
    assert triton_io.parse_parameters({"final_counts_only": "FALSE"}) == off
    assert triton_io.parse_parameters({"final_counts_only": "1"}) == {**off, "final_counts_only": True}
    with pytest.raises(triton_io.InvalidRequest, match="final_counts_only=2 must be true or false"):
        triton_io.parse_parameters({"final_counts_only": 2})
    with pytest.raises(triton_io.InvalidRequest, match="not a JSON object"):
        triton_io.parse_parameters("{oops")


def test_output_arrays_shapes():
    out = triton_io.output_arrays("hé", 3, 5, "length")
    assert out["text_output"].shape == (1, 1) and out["text_output"][0, 0] == "hé".encode()
    assert out["output_tokens"].dtype.name == "int32" and out["finish_reason"][0, 0] == b"length"
    assert triton_io.output_arrays("x", 1, 1, None, batched=False)["finish_reason"].shape == (1,)


def test_engine_step_split_of_gpu_totals():
    from launcher.python_backend.timings import engine_step_split, format_engine_split

    totals = {
        "steps": 4,
        "wall_s": 0.01,
        "launch_s": 0.002,
        "wait_s": 0.006,
        "gpu_s": 0.007,
        "gpu_idle_s": 0.0004,
        "gpu_steps": 4,
        "gpu_gaps": 3,
        "decode_tokens": 4,
        "prefill_tokens": 8,
        "ahead_steps": 3,
        "prompt_steps": 2,
        "prompt_graph_steps": 1,
    }
    split = engine_step_split({}, totals)
    assert split == {
        "steps": 4,
        "step_ms": 2.5,
        "launch_ms": 0.5,
        "wait_ms": 1.5,
        "host_ms": 0.5,
        "decode_rows": 1.0,
        "prefill_tokens": 2.0,
        "ahead": 0.75,
        "prompt": 0.5,
        "prompt_graph": 0.25,
        "mixed": 0.0,
        "gpu_ms": 1.75,
        "gpu_idle_ms": 0.1,
        "gpu_gap_seen": 0.75,
    }
    assert format_engine_split(split) == (
        "step 2.500 ms = launch 0.500 + wait 1.500 + host 0.500; GPU 1.750 busy + "
        "0.100 idle (idle measured on 75% of steps); 1 decode rows, 2 prompt tokens a step, 75% queued ahead, "
        "50.0% with prompts (25.0% prompts alone through a graph)"
    )
    assert "measured on" not in format_engine_split(engine_step_split({}, dict(totals, gpu_gaps=4)))
    eager = format_engine_split(engine_step_split({}, dict(totals, prompt_graph_steps=0)))
    assert eager.endswith("50.0% with prompts") and "graph" not in eager
    mixed = engine_step_split({}, dict(totals, mixed_steps=1))
    assert mixed["mixed"] == 0.25
    assert format_engine_split(mixed).endswith(
        "50.0% with prompts (25.0% prompts alone through a graph, 25.0% beside decode rows, mixed graph)"
    )
    assert "prompts" not in format_engine_split(engine_step_split({}, dict(totals, prompt_steps=0)))
    timed = engine_step_split({}, dict(totals, admitted=2, queued_s=0.003, first_tokens=2, to_first_token_s=0.02))
    assert timed["queue_ms"] == 1.5 and timed["first_token_ms"] == 10.0
    assert format_engine_split(timed).endswith("; a request: 1.500 ms to a slot, 10.000 ms to its first token")
    taken = engine_step_split({}, dict(totals, intake_calls=4, intake_requests=10))
    assert taken["per_intake"] == 2.5 and "per_intake" not in split
    assert format_engine_split(taken).endswith("; 2.5 requests a hand-over (one tokenizer call)")
