"""What the front end keeps of a running request and sends in its place when its replica fails
(launcher/frontend/migration.py), on the wire's own messages."""

from __future__ import annotations

import struct
from array import array

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from launcher.frontend.migration import (
    ASK_OUTPUT_IDS,
    ASK_TOKEN_IDS,
    asks_token_ids,
    continued_request,
    names_outputs,
    take_ids,
)
from launcher.frontend.wire import _ASK_EMPTY_FINAL


def client_request(batched: bool = True, raw: bool = True) -> service_pb2.ModelInferRequest:
    """A request as tritonclient sends it (raw contents, [1, 1] shapes), or with typed contents / no batch dim."""
    req = service_pb2.ModelInferRequest(model_name="hf_model", id="r7")
    req.parameters["session_id"].string_param = "s1"
    shape = [1, 1] if batched else [1]
    inputs = [
        ("text_input", "BYTES", struct.pack("<I", 5) + b"Hello"),
        ("max_tokens", "INT32", struct.pack("<i", 40)),
        ("return_prompt_log_probs", "BOOL", b"\x01"),
        ("stream", "BOOL", b"\x01"),
    ]
    for name, dtype, content in inputs:
        t = req.inputs.add(name=name, datatype=dtype, shape=shape)
        if raw:
            req.raw_input_contents.append(content)
        elif dtype == "BYTES":
            t.contents.bytes_contents.append(content[4:])
        elif dtype == "INT32":
            t.contents.int_contents.append(struct.unpack("<i", content)[0])
        else:
            t.contents.bool_contents.append(True)
    return req


@pytest.mark.parametrize("batched", [True, False])
def test_a_continued_request_is_the_clients_with_its_ids_and_without_what_was_answered(batched):
    req = client_request(batched)
    out = service_pb2.ModelInferRequest.FromString(continued_request(req.SerializeToString(), array("i", [5, 9, 11])))
    names = [t.name for t in out.inputs]
    assert names == ["text_input", "max_tokens", "stream", "continue_ids"]  # prompt log probs came before the move
    contents = dict(zip(names, out.raw_input_contents))
    assert contents["text_input"] == struct.pack("<I", 5) + b"Hello" and contents["max_tokens"] == struct.pack("<i", 40)
    assert list(np.frombuffer(contents["continue_ids"], "<i4")) == [5, 9, 11]
    assert list(out.inputs[-1].shape) == ([1, 3] if batched else [3])
    assert (out.id, out.model_name, out.parameters["session_id"].string_param) == ("r7", "hf_model", "s1")


def test_typed_contents_stay_typed():
    out = service_pb2.ModelInferRequest.FromString(
        continued_request(client_request(raw=False).SerializeToString(), array("i", [3, 4]))
    )
    assert not out.raw_input_contents
    assert list(out.inputs[-1].contents.int_contents) == [3, 4] and out.inputs[0].contents.bytes_contents == [b"Hello"]


def test_a_request_with_nothing_settled_starts_again_without_continue_ids():
    out = service_pb2.ModelInferRequest.FromString(continued_request(client_request().SerializeToString(), array("i")))
    assert [t.name for t in out.inputs] == ["text_input", "max_tokens", "stream"]


def test_a_request_moved_twice_carries_every_id_once():
    first = continued_request(client_request().SerializeToString(), array("i", [1, 2]))
    again = service_pb2.ModelInferRequest.FromString(continued_request(first, array("i", [1, 2, 3])))
    assert [t.name for t in again.inputs].count("continue_ids") == 1
    assert list(np.frombuffer(again.raw_input_contents[-1], "<i4")) == [1, 2, 3]


def test_the_appended_parameter_asks_for_token_ids_and_the_clients_own_ask_is_seen():
    req = client_request()
    patched = service_pb2.ModelInferRequest.FromString(req.SerializeToString() + _ASK_EMPTY_FINAL + ASK_TOKEN_IDS)
    assert patched.parameters["return_token_ids"].bool_param and asks_token_ids(patched)
    assert patched.parameters["session_id"].string_param == "s1"  # the client's own parameters stay
    assert not asks_token_ids(req)


def test_output_ids_are_taken_from_the_responses_that_carry_them():
    ids = array("i")
    for chunk in ([4], [], [8, 15]):
        resp = service_pb2.ModelInferResponse(id="r7")
        for name, content in (("text_output", b"\x01\x00\x00\x00x"), ("output_tokens", struct.pack("<i", 1))):
            resp.outputs.add(name=name)
            resp.raw_output_contents.append(content)
        if chunk:
            resp.outputs.add(name="output_ids", datatype="INT32", shape=[1, len(chunk)])
            resp.raw_output_contents.append(np.array(chunk, "<i4").tobytes())
        take_ids(resp, ids)
    assert list(ids) == [4, 8, 15]


def test_a_request_that_names_its_outputs_is_asked_for_output_ids_too():
    req = client_request()
    assert not names_outputs(req)  # none named: tritonserver sends every output
    req.outputs.add(name="text_output")
    assert names_outputs(req)
    patched = service_pb2.ModelInferRequest.FromString(req.SerializeToString() + ASK_OUTPUT_IDS)
    assert [o.name for o in patched.outputs] == ["text_output", "output_ids"] and not names_outputs(patched)


def test_output_ids_anywhere_among_the_outputs_are_found():
    resp = service_pb2.ModelInferResponse(id="r")
    for name, content in (("output_ids", np.array([3], "<i4").tobytes()), ("text_output", b"\x01\x00\x00\x00y")):
        resp.outputs.add(name=name)
        resp.raw_output_contents.append(content)
    ids = array("i")
    take_ids(resp, ids)
    assert list(ids) == [3]
