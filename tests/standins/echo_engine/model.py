"""The echo engine's Triton python model (decoupled): the prompt's words after the config's `prefix`, up to
max_tokens, a word a token, in the common contract's outputs: one response a word when the request streams, else one
response with the whole answer."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name, default):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return default if t is None else t.as_numpy().reshape(-1)[0]


def _response(text: str, prompt_words: int, made: int, finish: str):
    return pb_utils.InferenceResponse(
        output_tensors=[
            pb_utils.Tensor("text_output", np.array([[text.encode()]], np.object_)),
            pb_utils.Tensor("input_tokens", np.array([[prompt_words]], np.int32)),
            pb_utils.Tensor("output_tokens", np.array([[made]], np.int32)),
            pb_utils.Tensor("finish_reason", np.array([[finish.encode()]], np.object_)),
        ]
    )


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.prefix = params.get("prefix", {}).get("string_value", "").split()

    def execute(self, requests):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request in requests:
            sender = request.get_response_sender()
            text = _scalar(request, "text_input", b"")
            prompt = (text.decode() if isinstance(text, bytes) else str(text)).split()
            words = (self.prefix + prompt)[: max(1, int(_scalar(request, "max_tokens", 1)))]
            if not bool(_scalar(request, "stream", False)):
                sender.send(_response("".join(" " + w for w in words), len(prompt), len(words), "length"), flags=final)
                continue
            for i, word in enumerate(words):
                last = i == len(words) - 1
                sender.send(
                    _response(" " + word, len(prompt), i + 1, "length" if last else ""), flags=final if last else 0
                )
        return None
