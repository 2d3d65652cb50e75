"""launcher.client: URLs and request encoding against the contract (no server). The CLI against a real
tritonserver: tests/integration/test_client.py."""

from __future__ import annotations

import struct

import pytest

from launcher import contract
from launcher.client.connection import parse_url
from launcher.client.request import Generation, build_inputs, build_request, encode_inputs


@pytest.mark.parametrize(
    "given, expected",
    [
        ("grpc://localhost:8001", "localhost:8001"),
        ("10.0.0.5:33337", "10.0.0.5:33337"),
        ("node12", "node12:8001"),
        ("grpc://[::1]:9001/", "[::1]:9001"),
    ],
)
def test_parse_url(given, expected):
    assert parse_url(given) == expected


def test_parse_url_rejects_http():
    with pytest.raises(ValueError, match="grpc://HOST:PORT"):
        parse_url("http://localhost:8000")


def test_inputs_follow_the_contract():
    gen = Generation(
        "Hello",
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        seed=3,
        stop=("\n\n", "END"),
        min_tokens=2,
        ignore_eos=True,
    )
    tensors = {name: (dtype, shape, raw) for name, dtype, shape, raw in encode_inputs(gen)}
    declared = {t.name: t.dtype for t in contract.INPUTS}
    assert all(declared[name] == dtype for name, (dtype, _, _) in tensors.items())
    assert tensors["text_input"] == ("BYTES", [1, 1], struct.pack("<I", 5) + b"Hello")
    assert tensors["max_tokens"] == ("INT32", [1, 1], struct.pack("<i", 7))
    assert tensors["random_seed"][2] == struct.pack("<Q", 3) and tensors["stream"][2] == b"\x01"
    assert tensors["stop_words"][:2] == ("BYTES", [1, 2])
    assert "repetition_penalty" not in tensors  # unset fields are not sent
    inputs = {i.name(): i for i in build_inputs(gen)}
    assert inputs["stop_words"].shape() == [1, 2] and inputs["top_p"].datatype() == "FP32"
    req = build_request("m", gen, "r1", {"first_token_delay_ms": 5})
    assert req.model_name == "m" and req.id == "r1" and req.parameters["first_token_delay_ms"].int64_param == 5
    assert req.parameters["triton_enable_empty_final_response"].bool_param
