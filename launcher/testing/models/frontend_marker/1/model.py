"""Test fixture `frontend_marker`: decoupled, async execute (many requests at once). Streams
max_tokens responses " <tag><i>" one every inter_token_delay_ms (request parameter of the same name
overrides), the last with finish_reason "length". Writes <marker_dir>/<request id>.start, then .done,
or .cancelled as soon as request.is_cancelled() turns true (then it stops sending). Request
parameter final_apart=true sends the final flag on its own after the last token, as engines that
learn of the end late do.  While <marker_dir>/BROKEN exists every request fails with an engine error (a broken
engine whose server still answers its health probe); max_tokens < 1 is refused as the request's fault."""

import asyncio
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        params = {k: v["string_value"] for k, v in json.loads(args["model_config"]).get("parameters", {}).items()}
        self.tag = params.get("tag", "r")
        self.marker_dir = params.get("marker_dir", "")
        self.delay_ms = float(params.get("inter_token_delay_ms", "10"))

    def _mark(self, request_id, event):
        if self.marker_dir:
            name = "".join(c if c.isalnum() or c in "-_" else "_" for c in request_id) or "_"
            with open(os.path.join(self.marker_dir, f"{name}.{event}"), "w") as f:
                f.write(self.tag)

    async def execute(self, requests):
        await asyncio.gather(*(self._serve(r) for r in requests))
        return None

    def _response(self, text, n, finish):
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=np.object_)),
                pb_utils.Tensor("output_tokens", np.array([[n]], dtype=np.int32)),
                pb_utils.Tensor("finish_reason", np.array([[finish.encode()]], dtype=np.object_)),
            ]
        )

    async def _serve(self, request):
        sender = request.get_response_sender()
        rid = request.request_id()
        self._mark(rid, "start")
        n = int(pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy().reshape(-1)[0])
        broken = self.marker_dir and os.path.exists(os.path.join(self.marker_dir, "BROKEN"))
        if broken or n < 1:
            why = f"frontend_marker {self.tag}: the engine failed (BROKEN)" if broken else "max_tokens must be >= 1"
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(why)), flags=FINAL)
            return
        params = json.loads(request.parameters() or "{}")
        delay = float(params.get("inter_token_delay_ms", self.delay_ms)) / 1000
        final_apart = bool(params.get("final_apart", False))
        for i in range(n):
            if i:
                await asyncio.sleep(delay)
            if request.is_cancelled():
                self._mark(rid, "cancelled")
                sender.send(self._response("", i, "cancelled"), flags=FINAL)
                return
            last = i == n - 1
            sender.send(
                self._response(f" {self.tag}{i}", i + 1, "length" if last else ""),
                flags=FINAL if last and not final_apart else 0,
            )
        if final_apart:  # the final flag alone, no response (clients see it only if they ask for empty finals)
            sender.send(flags=FINAL)
        self._mark(rid, "done")
