"""Test/benchmark fixture `emitter`: follows launcher/contract.py and sends
`max_tokens` one-token responses as fast as the python backend allows, to
measure how many streamed responses/s a client can consume
(benchmark/client_capacity.py).

Each request is served in a tight loop (sync execute), so one instance serves
one request at a time: set the instance_group count to serve several streams
in parallel. Parameter `full_outputs` ("true" by default) sends all four
contract outputs on every response; "false" sends only text_output on the
intermediate responses (all four on the last one), which is cheaper for the
server, so the client is the bottleneck sooner.

Parameter `responder` ("" by default) builds every response with the hf
model's launcher.python_backend.triton_io.Responder instead, all four outputs:
"cached" as the hf model does (tensors that repeat are kept and resent),
"fresh" with every tensor built afresh (what keeping them saves;
`pythonpath` is where `launcher` imports from; `max_texts` sets the Responder's
bound on kept texts).  Parameter `pieces` (default 1:
always " x") cycles the text of the intermediate responses through that many
distinct pieces, " t0", " t1", ..., so a client can check every response's
text and the cache meets as many distinct texts as a model's tokens would.

Request parameters (Triton request parameters, optional):
  stamp        true: every text_output is " <t>", t = time.monotonic() just
               before the send (the clock of the client's perf_counter on the
               same machine), to measure the response path's latency
  interval_us  pace the responses: one every interval_us microseconds
               (absolute schedule; sleeps, then spins the last 300 us); 0 = flat out
  return_token_ids  true: every intermediate response carries an output_ids tensor too (one id), as the hf model's
               do for the front end that moves streams (launcher/frontend/migration.py)
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else value.item()


def _wait_until(deadline: float) -> None:
    """Sleep most of the way (leave the CPU to others), spin the last 300 us (precision)."""
    left = deadline - time.monotonic() - 0.0003
    if left > 0:
        time.sleep(left)
    while time.monotonic() < deadline:
        pass


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.full = params.get("full_outputs", "true").lower() == "true"
        self.piece = pb_utils.Tensor("text_output", np.array([[b" x"]], dtype=np.object_))
        self.pieces = int(params.get("pieces", "1") or 1)
        self.responder = None
        kind = params.get("responder", "")
        if kind:
            if kind not in ("cached", "fresh"):
                raise pb_utils.TritonModelException(f"responder={kind!r}: use cached or fresh")
            import sys

            path = params.get("pythonpath", "")
            if path and path not in sys.path:
                sys.path.append(path)
            from launcher.python_backend.triton_io import Responder

            kw = {"max_texts": int(params["max_texts"])} if params.get("max_texts") else {}
            self.responder = Responder(batched=True, cache=kind == "cached", **kw)
        self.empty = pb_utils.Tensor("finish_reason", np.array([[b""]], dtype=np.object_))
        self.one_id = pb_utils.Tensor("output_ids", np.array([[7]], dtype=np.int32))

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                prompt = _scalar(request, "text_input", "")
                n = int(_scalar(request, "max_tokens", 0))
                if n < 1:
                    raise ValueError("max_tokens must be >= 1")
            except Exception as exc:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=FINAL)
                continue
            params = json.loads(request.parameters() or "{}")
            stamp = bool(params.get("stamp", False))
            interval = float(params.get("interval_us", 0)) / 1e6
            ids = [self.one_id] if params.get("return_token_ids") in (True, "true") else []
            n_in = pb_utils.Tensor("input_tokens", np.array([[len(prompt.split())]], dtype=np.int32))
            clock = time.monotonic
            t_next = clock()
            for i in range(1, n):
                # Every 128 responses, stop if the client cancelled (cheap enough not to distort the
                # rate; lets capacity benchmarks end endless streams at the end of a window).
                if not i & 127 and request.is_cancelled():
                    break
                if interval:
                    t_next += interval
                    _wait_until(t_next)
                if self.responder is not None:
                    text = " x" if self.pieces == 1 else f" t{i % self.pieces}"
                    sender.send(self.responder.build(text, n_in, i, extra=ids))
                    continue
                piece = self.piece
                if self.pieces > 1:
                    piece = pb_utils.Tensor(
                        "text_output", np.array([[f" t{i % self.pieces}".encode()]], dtype=np.object_)
                    )
                if stamp:
                    piece = pb_utils.Tensor("text_output", np.array([[f" {clock():.7f}".encode()]], dtype=np.object_))
                tensors = [piece]
                if self.full:
                    tensors += [n_in, pb_utils.Tensor("output_tokens", np.array([[i]], dtype=np.int32)), self.empty]
                sender.send(pb_utils.InferenceResponse(output_tensors=tensors + ids))
            else:
                if interval:
                    t_next += interval
                    _wait_until(t_next)
            last = [
                pb_utils.Tensor("text_output", np.array([[f" {clock():.7f}".encode()]], dtype=np.object_))
                if stamp
                else self.piece,
                n_in,
                pb_utils.Tensor("output_tokens", np.array([[n]], dtype=np.int32)),
                pb_utils.Tensor("finish_reason", np.array([[b"length"]], dtype=np.object_)),
            ]
            sender.send(pb_utils.InferenceResponse(output_tensors=last), flags=FINAL)
        return None
