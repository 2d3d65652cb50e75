"""Test fixture `frontend_echo`: not decoupled (ModelInfer works), echoes text_input as
"<tag>:<text>", where the config parameter `tag` names the replica serving it."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"]).get("parameters", {}).items()}
        self.tag = params.get("tag", "r")

    def execute(self, requests):
        out = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            text = text.decode() if isinstance(text, bytes) else str(text)
            out.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("text_output", np.array([[f"{self.tag}:{text}".encode()]], dtype=np.object_)),
                        pb_utils.Tensor("output_tokens", np.array([[1]], dtype=np.int32)),
                        pb_utils.Tensor("finish_reason", np.array([[b"stop"]], dtype=np.object_)),
                    ]
                )
            )
        return out
