"""Stand-in for the `tensorrt_llm` model of the TensorRT-LLM ensemble (tests only).

The real model is TensorRT-LLM's C++ `tensorrtllm` backend, which needs a GPU and a
built engine. This python model has the same inputs and outputs as the config
`launcher/engines/trtllm/ensemble.py` renders (only `backend` is changed to "python"), and
follows the backend's response format (tensorrtllm_backend v0.9+ / TensorRT-LLM
`triton_backend`): `output_ids` [1, beams, T] and `sequence_length` [1, beams] with
only generated tokens; in streaming mode one response per new token, else one
response with all of them.

What it "generates" is deterministic: the prompt's tokens after the first one (the
BOS) once, then EOS (not returned); with end_id = -1 (ignore_eos) the echo repeats.
It stops early at `request_output_len` tokens, at `end_id`, or at a stop word (given in
TensorRT-LLM's [2, N] ids/offsets format; the matched stop word's tokens are
returned, as TensorRT-LLM does). `end_id` counts as generated only when it is one of
the echoed tokens, so `end_id = -1` (ignore_eos) always yields exactly
`request_output_len` tokens. Every request's decoded arguments are appended as a JSON
line to the file named by $LLMLAUNCH_STANDIN_LOG, so tests can check what the
preprocessing model sent.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _get(request, name):
    t = pb_utils.get_input_tensor_by_name(request, name)
    return None if t is None else t.as_numpy()


def _words(arr):
    """[1, 2, N] ids/offsets -> list of token-id lists."""
    if arr is None or arr.size == 0:
        return []
    arr = arr.reshape(2, -1)
    ids, offsets = arr[0].tolist(), [o for o in arr[1].tolist() if o >= 0]
    words, start = [], 0
    for end in offsets:
        words.append(ids[start:end])
        start = end
    return words


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.environ.get("LLMLAUNCH_STANDIN_LOG")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            ids = _get(request, "input_ids").reshape(-1).tolist()
            n_in = int(_get(request, "input_lengths").reshape(-1)[0])
            max_out = int(_get(request, "request_output_len").reshape(-1)[0])
            end = _get(request, "end_id")
            end_id = int(end.reshape(-1)[0]) if end is not None else -1
            pad = _get(request, "pad_id")
            stop = _words(_get(request, "stop_words_list"))
            bad = _words(_get(request, "bad_words_list"))
            seed = _get(request, "random_seed")
            stream = _get(request, "streaming")
            stream = bool(stream.reshape(-1)[0]) if stream is not None else False
            if self.log:
                with open(self.log, "a") as f:
                    f.write(
                        json.dumps(
                            {
                                "input_ids": ids[:n_in],
                                "request_output_len": max_out,
                                "end_id": end_id,
                                "pad_id": None if pad is None else int(pad.reshape(-1)[0]),
                                "stop_words": stop,
                                "bad_words": bad,
                                "streaming": stream,
                                "random_seed": None if seed is None else int(seed.reshape(-1)[0]),
                            }
                        )
                        + "\n"
                    )
            source = ids[1:n_in] or ids[:n_in]
            out = []
            while len(out) < max_out:
                if len(out) >= len(source) and end_id >= 0:
                    break  # the echo is done: "EOS" (not returned)
                tok = source[len(out) % len(source)]
                if tok == end_id:
                    break
                out.append(tok)
                if any(w and out[-len(w) :] == w for w in stop):
                    break
            if not stream:
                sender.send(self._response(out), flags=FINAL)
            elif not out:
                sender.send(flags=FINAL)
            for i, tok in enumerate(out if stream else []):
                # like the C++ backend: the last token's response carries the final flag
                sender.send(self._response([tok]), flags=FINAL if i == len(out) - 1 else 0)
        return None

    @staticmethod
    def _response(tokens):
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("output_ids", np.array(tokens, dtype=np.int32).reshape(1, 1, -1)),
                pb_utils.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.int32)),
            ]
        )
