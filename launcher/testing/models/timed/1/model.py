"""Test fixture `timed`: a decoupled python model that follows launcher/contract.py
and streams fake tokens on a known schedule, so the benchmark's measurements
can be checked against the truth.

Schedule: the first token is sent `first_token_delay_ms` after the request
reaches `execute`, token i (0-based) at `first_token_delay_ms + i *
inter_token_delay_ms`. Sleeps aim at absolute deadlines, so per-token overhead
does not accumulate into the measured gaps.

Parameters (config.pbtxt `parameters`, string values; each can also be
overridden per request through a Triton request parameter of the same name):
  first_token_delay_ms   delay before the first token (default 0)
  inter_token_delay_ms   delay between tokens (default 0)
  natural_length         tokens after which the fake model "hits EOS" unless
                         the request sets ignore_eos (or min_length is larger);
                         0 = never, always max_tokens
  error_after_tokens     a prompt containing "ERROR" fails with an error
                         response after this many tokens (default 0: at once)
  report_token_counts    "false" leaves out input_tokens/output_tokens, to
                         exercise the client's re-tokenizing fallback

Request parameter separate_final=true sends the final flag on its own after
the last token (as some engines do). Other behaviour: input_tokens = number of whitespace-separated words in the
prompt; each token is the text " w<i>" (" w<i>:<execute start>:<send time>"
with the request parameter stamp=true; times are time.monotonic(), the
clock of the client's time.perf_counter() on the same machine); a prompt containing "EMPTY" finishes
at once with zero tokens; stop_words are ignored; cancellation is honoured.
"""

import asyncio
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


async def _sleep_until(deadline: float) -> None:
    """asyncio.sleep wakes up to ~1 ms late (epoll's millisecond timeout); sleep
    to 1.5 ms before the deadline, then yield to the loop until it passes."""
    delay = deadline - time.monotonic() - 0.0015
    if delay > 0:
        await asyncio.sleep(delay)
    while time.monotonic() < deadline:
        await asyncio.sleep(0)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.first_delay_ms = float(params.get("first_token_delay_ms", "0"))
        self.inter_delay_ms = float(params.get("inter_token_delay_ms", "0"))
        self.natural_length = int(params.get("natural_length", "0"))
        self.error_after = int(params.get("error_after_tokens", "0"))
        self.report_counts = params.get("report_token_counts", "true").lower() == "true"

    async def execute(self, requests):
        # async execute: the python backend runs many requests at once on its
        # event loop, like a continuous-batching engine would.
        await asyncio.gather(*(self._serve(r) for r in requests))
        return None

    def _response(self, text, n_in, n_out, finish, report_counts=True):
        tensors = [pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=np.object_))]
        if report_counts:
            tensors.append(pb_utils.Tensor("input_tokens", np.array([[n_in]], dtype=np.int32)))
            tensors.append(pb_utils.Tensor("output_tokens", np.array([[n_out]], dtype=np.int32)))
        tensors.append(pb_utils.Tensor("finish_reason", np.array([[finish.encode()]], dtype=np.object_)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    async def _serve(self, request):
        start = time.monotonic()
        sender = request.get_response_sender()
        try:
            prompt = _scalar(request, "text_input", None)
            max_tokens = int(_scalar(request, "max_tokens", 0))
            stream = bool(_scalar(request, "stream", False))
            ignore_eos = bool(_scalar(request, "ignore_eos", False))
            min_length = int(_scalar(request, "min_length", 0))
            overrides = json.loads(request.parameters() or "{}")
            first_delay = float(overrides.get("first_token_delay_ms", self.first_delay_ms)) / 1000
            inter_delay = float(overrides.get("inter_token_delay_ms", self.inter_delay_ms)) / 1000
            stamp = bool(overrides.get("stamp", False))
            separate_final = bool(overrides.get("separate_final", False))
            natural_length = int(overrides.get("natural_length", self.natural_length))
            error_after = int(overrides.get("error_after_tokens", self.error_after))
            report_counts = overrides.get("report_token_counts", self.report_counts)
            report_counts = report_counts if isinstance(report_counts, bool) else str(report_counts).lower() == "true"
            if prompt is None or max_tokens < 1:
                raise ValueError("text_input is required and max_tokens must be >= 1")
        except Exception as exc:  # a bad request is answered, not fatal
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=FINAL)
            return

        n_in = len(prompt.split())
        n_out = max_tokens
        if natural_length and not ignore_eos:
            n_out = min(max_tokens, max(natural_length, min_length))
        finish = "length" if n_out == max_tokens else "stop"
        if "EMPTY" in prompt:
            n_out, finish = 0, "stop"
        fail_at = error_after if "ERROR" in prompt else None
        if fail_at is not None and n_out == 0:
            n_out = 1  # an injected failure needs a token slot to fail in

        pieces = []
        for i in range(n_out):
            await _sleep_until(start + first_delay + i * inter_delay)
            if request.is_cancelled():
                sender.send(self._response("", n_in, i, "cancelled", report_counts), flags=FINAL)
                return
            if fail_at is not None and i == fail_at:
                break
            piece = f" w{i}"
            if stamp:  # execute start and send time, CLOCK_MONOTONIC seconds (same clock as the client's perf_counter)
                piece += f":{start:.6f}:{time.monotonic():.6f}"
            if stream:
                last = i == n_out - 1
                flags = FINAL if last and not separate_final else 0
                sender.send(self._response(piece, n_in, i + 1, finish if last else "", report_counts), flags=flags)
            else:
                pieces.append(piece)
        if fail_at is not None and fail_at < n_out:
            error = pb_utils.TritonError(f"timed: injected failure after {fail_at} tokens (prompt contains ERROR)")
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
            return
        if stream and separate_final and n_out > 0:
            sender.send(flags=FINAL)  # the final flag on its own: the client gets an empty final response
            return
        if not stream or n_out == 0:
            sender.send(self._response("".join(pieces), n_in, n_out, finish, report_counts), flags=FINAL)
