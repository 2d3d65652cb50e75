"""The requests the front end makes of a client's request for disaggregated prefill and decode
(launcher/frontend/disagg.py), on the wire's own messages, and the config that names the prefill replicas."""

from __future__ import annotations

import struct

import pytest
from tritonclient.grpc import service_pb2

from launcher.frontend import FrontendConfig
from launcher.frontend.disagg import output_text, prefill_request, with_kv_from
from launcher.frontend.wire import _ASK_EMPTY_FINAL
from tests.unit.test_frontend_migration import client_request


def inputs(req: service_pb2.ModelInferRequest) -> dict:
    """{name: (shape, content)} of a request's inputs (raw contents, or the typed ones)."""
    out = {}
    for i, t in enumerate(req.inputs):
        if req.raw_input_contents:
            content = req.raw_input_contents[i]
        else:
            c = t.contents
            content = list(c.int_contents) or list(c.bytes_contents) or list(c.bool_contents)
        out[t.name] = (list(t.shape), content)
    return out


@pytest.mark.parametrize("raw", [True, False])
def test_the_prefill_asks_one_token_of_the_prompt_and_nothing_streamed_or_logged(raw):
    sent = prefill_request(client_request(raw=raw))
    assert sent.endswith(_ASK_EMPTY_FINAL)
    req = service_pb2.ModelInferRequest.FromString(sent)
    got = inputs(req)
    assert set(got) == {"text_input", "max_tokens", "kv_export"}  # stream, return_prompt_log_probs: the decode's
    assert got["max_tokens"][1] == (struct.pack("<i", 1) if raw else [1])
    assert got["kv_export"] == ([1, 1], b"\x01" if raw else [True])  # keep the blocks for the decode
    assert req.id == "r7~prefill" and req.model_name == "hf_model"
    assert req.parameters["session_id"].string_param == "s1"  # routing by session still sees it


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("raw", [True, False])
def test_the_decode_request_is_the_clients_with_kv_from_shaped_like_its_inputs(batched, raw):
    client = client_request(batched=batched, raw=raw)
    req = service_pb2.ModelInferRequest.FromString(with_kv_from(client, "10.0.0.5:8006"))
    got = inputs(req)
    assert got["kv_from"] == (
        [1, 1] if batched else [1],
        struct.pack("<I", 13) + b"10.0.0.5:8006" if raw else [b"10.0.0.5:8006"],
    )
    assert {k: v for k, v in got.items() if k != "kv_from"} == inputs(client)
    again = service_pb2.ModelInferRequest.FromString(with_kv_from(req, "10.0.0.6:8006"))
    assert [t.name for t in again.inputs].count("kv_from") == 1  # another prefill replica's: replaced, not added


def test_the_prefill_replicas_are_named_once_a_replica_with_one_of_each_role():
    replicas = [("10.0.0.1", 8001), ("10.0.0.2", 8001)]
    assert FrontendConfig(replicas, kv_transfer=["10.0.0.1:8006", ""]).kv_transfer == ["10.0.0.1:8006", ""]
    for bad in (["10.0.0.1:8006"], ["10.0.0.1:8006", "10.0.0.2:8006"], ["", ""]):
        with pytest.raises(ValueError, match="at least one of each, and no members file"):
            FrontendConfig(replicas, kv_transfer=bad)


@pytest.mark.parametrize("raw", [True, False])
def test_the_prefills_handle_is_read_from_its_final_response_raw_or_typed(raw):
    handle = '{"do_remote_prefill": true, "remote_block_ids": [[3, 4]]}'
    resp = service_pb2.ModelInferResponse()
    resp.outputs.add(name="text_output", datatype="BYTES", shape=[1, 1])
    t = resp.outputs.add(name="kv_handle", datatype="BYTES", shape=[1, 1])
    if raw:
        resp.raw_output_contents.extend([struct.pack("<I", 1) + b"x", struct.pack("<I", len(handle)) + handle.encode()])
    else:
        resp.outputs[0].contents.bytes_contents.append(b"x")
        t.contents.bytes_contents.append(handle.encode())
    assert output_text(resp, "kv_handle") == handle
    assert output_text(resp, "kv_from") == ""  # none: the front end sends the replica's configured address
