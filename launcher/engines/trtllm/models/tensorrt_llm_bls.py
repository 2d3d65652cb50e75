"""llmlaunch `tensorrt_llm_bls`: the whole contract on TensorRT-LLM, with per-request state.

Rendered when engine.bls=true. A decoupled python model with the contract's inputs and
outputs (launcher/contract.py) that calls, per request, our `preprocessing` model and then
the `tensorrt_llm` model through Triton's BLS API (`pb_utils.InferenceRequest(...)
.async_exec()`, decoupled=True for the engine; python backend r23.10+, async `execute`),
and does what an ensemble step cannot because it keeps no state between responses:

* incremental detokenization over the request's whole token stream
  (launcher.hf.detok: byte-level BPE through an incremental UTF-8 decoder, other
  tokenizers through a sliding window), so every streamed piece is whole characters and
  the pieces concatenate to the completion's text;
* cumulative `output_tokens`, the prompt's `input_tokens`, and `finish_reason` on the last
  response ("length" at max_tokens, else "stop", "cancelled" when the client cancelled);
* stop words removed: TensorRT-LLM stops on them (the ids come from preprocessing) but
  returns their tokens; the text is cut before the first stop string;
* client cancellation cancels the engine request (`ResponseIterator.cancel()`, python
  backend r24.07+; older stubs just stop reading).

Targets the tensors of TensorRT-LLM's C++ `tensorrtllm` backend (tensorrtllm_backend
v0.9+ / TensorRT-LLM `triton_backend`, inflight_batcher_llm): it always asks the engine to
stream (`streaming`=true), so one code path serves both modes. Learned from the BLS model of
tensorrtllm_backend (all_models/inflight_batcher_llm/tensorrt_llm_bls); written for llmlaunch.

Parameters (config.pbtxt): tensorrt_llm_model_name (default tensorrt_llm),
preprocessing_model_name (default preprocessing), tokenizer_dir (required).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from launcher.contract import INPUT_NAMES
from launcher.python_backend import triton_io

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL

# contract input -> tensorrt_llm input, passed straight through when the client sends it
ENGINE_INPUTS = {
    "temperature": ("temperature", np.float32),
    "top_k": ("runtime_top_k", np.int32),
    "top_p": ("runtime_top_p", np.float32),
    "repetition_penalty": ("repetition_penalty", np.float32),
    "presence_penalty": ("presence_penalty", np.float32),
    "frequency_penalty": ("frequency_penalty", np.float32),
    "min_length": ("min_length", np.int32),
    "beam_width": ("beam_width", np.int32),
}


def _tensor(name, value, dtype):
    return pb_utils.Tensor(name, np.array([[value]], dtype=dtype))


def _words_tensor(name, words):
    return pb_utils.Tensor(name, np.array([[w.encode("utf-8") for w in words]], dtype=np.object_))


async def _in_thread(iterator):
    """The BLS ResponseIterator blocks until the next response; wait for it off the stub's event loop
    so concurrent requests keep flowing."""
    import asyncio

    loop = asyncio.get_running_loop()
    done = object()
    while True:
        item = await loop.run_in_executor(None, next, iterator, done)
        if item is done:
            return
        yield item


class TritonPythonModel:
    def initialize(self, args):
        from transformers import AutoTokenizer

        from launcher.hf.detok import TokenTable

        config = json.loads(args["model_config"])
        params = triton_io.model_parameters(config)
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise ValueError("tensorrt_llm_bls must be decoupled: it streams")
        tokenizer_dir = params.get("tokenizer_dir")
        if not tokenizer_dir:
            raise ValueError(
                "tensorrt_llm_bls: parameter tokenizer_dir is empty; set engine.tokenizer_dir (or model.tokenizer / model.path)"
            )
        self.engine_model = params.get("tensorrt_llm_model_name", "tensorrt_llm")
        self.pre_model = params.get("preprocessing_model_name", "preprocessing")
        self.tokens = TokenTable(AutoTokenizer.from_pretrained(tokenizer_dir))
        self.supported = frozenset(INPUT_NAMES) - set(triton_io.MUST_HONOUR)

    async def execute(self, requests):
        import asyncio

        await asyncio.gather(*(self._serve(r) for r in requests))
        return None

    async def _serve(self, request):
        sender = request.get_response_sender()
        try:
            greq = triton_io.parse_request(request, self.supported)
        except triton_io.InvalidRequest as exc:
            sender.send(triton_io.error_response(f"tensorrt_llm_bls: {exc}"), flags=FINAL)
            return
        p = greq.params
        n_in = n_out = 0
        try:
            pre = await self._preprocess(greq)
            ids = pre["INPUT_ID"].reshape(-1)[: int(pre["REQUEST_INPUT_LEN"].reshape(-1)[0])].tolist()
            n_in = len(ids)
            decoder = self.tokens.decoder(ids)
            from launcher.hf.detok import StopMatcher

            stops = StopMatcher(p.stop)
            responses = await pb_utils.InferenceRequest(
                model_name=self.engine_model,
                inputs=self._engine_inputs(request, pre),
                requested_output_names=["output_ids", "sequence_length"],
            ).async_exec(decoupled=True)
            text_parts, finish = [], None
            async for resp in _in_thread(responses):
                if resp.has_error():
                    raise RuntimeError(resp.error().message())
                if sender.is_cancelled():
                    if hasattr(responses, "cancel"):
                        responses.cancel()
                    sender.send(triton_io.response("", n_in, n_out, "cancelled"), flags=FINAL)
                    return
                out_ids = pb_utils.get_output_tensor_by_name(resp, "output_ids")
                if out_ids is None:  # an empty final response
                    continue
                length = int(pb_utils.get_output_tensor_by_name(resp, "sequence_length").as_numpy().reshape(-1)[0])
                new = out_ids.as_numpy().reshape(-1)[:length].tolist()
                n_out += len(new)
                piece = "".join(decoder.push(int(t)) for t in new)
                piece, matched = stops.push(piece, can_stop=n_out >= p.min_tokens) if stops.stops else (piece, False)
                if matched:
                    finish = "stop"
                    if hasattr(responses, "cancel"):
                        responses.cancel()
                if greq.stream and piece and not matched:
                    sender.send(triton_io.response(piece, n_in, n_out, None, counts=not greq.final_counts_only))
                else:
                    text_parts.append(piece)
                if matched:
                    break
            if finish is None:
                text_parts.append(stops.push(decoder.flush(), can_stop=True)[0] if stops.stops else decoder.flush())
                text_parts.append(stops.flush() if stops.stops else "")
                finish = "length" if n_out >= p.max_tokens else "stop"
            sender.send(triton_io.response("".join(text_parts), n_in, n_out, finish), flags=FINAL)
        except Exception as exc:  # the engine's or a step's error: answer this request, keep serving
            pb_utils.Logger.log_error(f"tensorrt_llm_bls: request failed: {exc!r}")
            sender.send(triton_io.error_response(f"tensorrt_llm_bls: {exc}"), flags=FINAL)

    async def _preprocess(self, greq):
        p = greq.params
        inputs = [
            pb_utils.Tensor("QUERY", np.array([[greq.prompt.encode("utf-8")]], dtype=np.object_)),
            _tensor("REQUEST_OUTPUT_LEN", p.max_tokens, np.int32),
            _tensor("IGNORE_EOS", p.ignore_eos, bool),
        ]
        if p.stop:
            inputs.append(_words_tensor("STOP_WORDS_DICT", p.stop))
        if p.bad_words:
            inputs.append(_words_tensor("BAD_WORDS_DICT", p.bad_words))
        if p.end_id is not None:
            inputs.append(_tensor("END_ID", p.end_id, np.int32))
        if p.seed is not None:
            inputs.append(_tensor("RANDOM_SEED", p.seed, np.uint64))
        names = [
            "INPUT_ID",
            "REQUEST_INPUT_LEN",
            "BAD_WORDS_IDS",
            "STOP_WORDS_IDS",
            "REQUEST_OUTPUT_LEN",
            "OUT_END_ID",
            "OUT_PAD_ID",
            "OUT_RANDOM_SEED",
        ]
        resp = await pb_utils.InferenceRequest(
            model_name=self.pre_model, inputs=inputs, requested_output_names=names
        ).async_exec()
        if resp.has_error():
            raise ValueError(resp.error().message())
        return {n: pb_utils.get_output_tensor_by_name(resp, n).as_numpy() for n in names}

    def _engine_inputs(self, request, pre):
        inputs = [
            pb_utils.Tensor("input_ids", pre["INPUT_ID"].astype(np.int32)),
            pb_utils.Tensor("input_lengths", pre["REQUEST_INPUT_LEN"].astype(np.int32)),
            pb_utils.Tensor("request_output_len", pre["REQUEST_OUTPUT_LEN"].astype(np.int32)),
            pb_utils.Tensor("end_id", pre["OUT_END_ID"].astype(np.int32)),
            pb_utils.Tensor("pad_id", pre["OUT_PAD_ID"].astype(np.int32)),
            pb_utils.Tensor("random_seed", pre["OUT_RANDOM_SEED"].astype(np.uint64)),
            _tensor("streaming", True, bool),
        ]
        for key in ("STOP_WORDS_IDS", "BAD_WORDS_IDS"):
            if pre[key].size:
                inputs.append(
                    pb_utils.Tensor(
                        "stop_words_list" if key == "STOP_WORDS_IDS" else "bad_words_list", pre[key].astype(np.int32)
                    )
                )
        for name, (engine_name, dtype) in ENGINE_INPUTS.items():
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            if tensor is not None:
                inputs.append(pb_utils.Tensor(engine_name, tensor.as_numpy().astype(dtype).reshape(1, 1)))
        return inputs
