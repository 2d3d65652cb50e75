"""The data-parallel front end's pure parts (no server): the byte patches on requests and responses read back as
protobuf (how many front-end processes rank 0 runs: tests/unit/test_responders.py). The front end against real
tritonservers: tests/integration/test_frontend.py."""


def test_wire_patches_decode_as_protobuf_says():
    from tritonclient.grpc import service_pb2

    from launcher.frontend.wire import _ASK_EMPTY_FINAL, _request_id_patch, _response_id_patch

    req = service_pb2.ModelInferRequest(model_name="m", id="a")
    req.parameters["triton_enable_empty_final_response"].bool_param = False
    t = req.inputs.add()
    t.name = "text_input"
    req.raw_input_contents.append(b"\x01\x00\x00\x00x")
    patched = service_pb2.ModelInferRequest.FromString(
        req.SerializeToString() + _request_id_patch("a~fe1") + _ASK_EMPTY_FINAL
    )
    assert patched.id == "a~fe1" and patched.parameters["triton_enable_empty_final_response"].bool_param
    assert patched.raw_input_contents == req.raw_input_contents and patched.inputs == req.inputs
    resp = service_pb2.ModelStreamInferResponse()
    resp.infer_response.id = "a~fe1"
    resp.infer_response.raw_output_contents.append(b"y" * 300)
    restored = service_pb2.ModelStreamInferResponse.FromString(resp.SerializeToString() + _response_id_patch(""))
    assert restored.infer_response.id == "" and restored.infer_response.raw_output_contents == [b"y" * 300]
