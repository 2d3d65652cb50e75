"""The echo engine's Triton python model (decoupled): the prompt's words, after the config's `prefix`, one a
response, up to max_tokens, in the common contract's outputs."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name, default):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return default if t is None else t.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.prefix = params.get("prefix", {}).get("string_value", "").split()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = _scalar(request, "text_input", b"")
            words = self.prefix + (text.decode() if isinstance(text, bytes) else str(text)).split()
            n = min(len(words), int(_scalar(request, "max_tokens", 1))) or 1
            for i in range(n):
                last = i == n - 1
                out = [
                    pb_utils.Tensor(
                        "text_output", np.array([[(" " + words[i] if words else "").encode()]], np.object_)
                    ),
                    pb_utils.Tensor("input_tokens", np.array([[len(words)]], np.int32)),
                    pb_utils.Tensor("output_tokens", np.array([[i + 1]], np.int32)),
                    pb_utils.Tensor("finish_reason", np.array([[b"length" if last else b""]], np.object_)),
                ]
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0
                sender.send(pb_utils.InferenceResponse(output_tensors=out), flags=flags)
        return None
