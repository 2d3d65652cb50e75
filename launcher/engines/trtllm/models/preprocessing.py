"""llmlaunch `preprocessing` for the TensorRT-LLM ensemble: text and words -> token ids.

Implements exactly the inputs/outputs `launcher/engines/trtllm/ensemble.py` renders for this
model, in the tensor formats of TensorRT-LLM's C++ `tensorrtllm` backend
(inflight_batcher_llm layout, tensorrtllm_backend v0.9 and later, i.e. the model
that now lives in NVIDIA/TensorRT-LLM `triton_backend/all_models/inflight_batcher_llm`).
Written for llmlaunch from that format description; no upstream code is copied.

    QUERY [B,1] BYTES              -> INPUT_ID [B,L] INT32 (right-padded with the pad id)
                                      REQUEST_INPUT_LEN [B,1] INT32
    REQUEST_OUTPUT_LEN [B,1]       -> REQUEST_OUTPUT_LEN (checked >= 1, passed on)
    BAD_WORDS_DICT / STOP_WORDS_DICT [B,n] BYTES (one word or phrase per element)
                                   -> BAD_WORDS_IDS / STOP_WORDS_IDS [B,2,N] INT32
    END_ID, PAD_ID [B,1]           -> OUT_END_ID, OUT_PAD_ID (default: the tokenizer's EOS / PAD)
    IGNORE_EOS [B,1] BOOL          -> OUT_END_ID = -1
    RANDOM_SEED, SEED [B,1] UINT64 -> OUT_RANDOM_SEED (one value; they must agree when both are sent)
    EXCLUDE_INPUT_IN_OUTPUT        -> accepted and ignored (the tensorrt_llm model is rendered with
                                      exclude_input_in_output=true; llmlaunch never echoes prompts)

Word lists (TensorRT-LLM's `stop_words_list` / `bad_words_list` format): for each batch
item, row 0 holds the token ids of all its words concatenated, row 1 the cumulative end
offset of each word; both rows are padded to the batch's longest row, ids with 0 and
offsets with -1. No words gives a [B,2,0] tensor.

`ignore_eos`: TensorRT-LLM stops a sequence when it samples `end_id`, and sampled ids
are always >= 0, so end_id = -1 never matches: the engine generates exactly
`max_tokens` (`request_output_len`) tokens unless a stop word ends it first. That is
how TensorRT-LLM's own benchmarks disable EOS. When the model's
`generation_config.json` lists several EOS ids (Llama 3: <|end_of_text|> and
<|eot_id|>), the ones other than `end_id` are added to the stop words so the engine
stops on any of them, as vLLM/SGLang/LMDeploy do (not when ignore_eos is set).

`OUT_RANDOM_SEED` is always sent (the ensemble wires it unconditionally): requests
without a seed get 0, which is also the executor's own default.

Parameters (config.pbtxt): tokenizer_dir (required), tokenizer_type (auto | llama | t5:
older backends' names; every tokenizer is loaded with AutoTokenizer), add_special_tokens
(default true: a BOS is prepended as for HF models), trust_remote_code (default false).
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

from launcher.python_backend.triton_io import model_parameters

_TRUE = ("1", "true", "yes", "y", "t", "on")


def _flag(params, key, default):
    value = params.get(key)
    return default if value is None else value.strip().lower() in _TRUE


def word_list(tokenizer, words_per_item):
    """Words per batch item -> the [B, 2, N] int32 id/offset tensor TensorRT-LLM expects."""
    ids_rows, off_rows = [], []
    for words in words_per_item:
        ids, offsets = [], []
        for word in words:
            if isinstance(word, (list, tuple)):  # already token ids (extra EOS ids)
                toks = [int(t) for t in word]
            else:
                toks = tokenizer.encode(word, add_special_tokens=False) if word else []
            if not toks:
                continue
            ids.extend(toks)
            offsets.append(len(ids))
        ids_rows.append(ids)
        off_rows.append(offsets)
    width = max((len(r) for r in ids_rows), default=0)
    out = np.zeros((len(ids_rows), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for i, (ids, offsets) in enumerate(zip(ids_rows, off_rows)):
        out[i, 0, : len(ids)] = ids
        out[i, 1, : len(offsets)] = offsets
    return out


def _texts(arr, name):
    """A BYTES tensor [B, n] -> per batch item a list of str (empty elements dropped)."""
    rows = []
    for row in np.asarray(arr).reshape(arr.shape[0], -1):
        words = []
        for item in row:
            if isinstance(item, (bytes, bytearray)):
                try:
                    item = bytes(item).decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ValueError(f"{name} is not valid UTF-8: {exc}") from None
            item = str(item)
            if item:
                words.append(item)
        rows.append(words)
    return rows


def _column(request, name, batch, dtype, default=None):
    """Optional [B,1] input as a length-B numpy vector, or None when absent."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None if default is None else np.full(batch, default, dtype=dtype)
    arr = tensor.as_numpy().reshape(-1)
    if arr.size == 1 and batch > 1:
        arr = np.repeat(arr, batch)
    if arr.size != batch:
        raise ValueError(f"{name} has {arr.size} values for a batch of {batch}")
    return arr.astype(dtype)


class TritonPythonModel:
    def initialize(self, args):
        from transformers import AutoTokenizer

        config = json.loads(args["model_config"])
        params = model_parameters(config)
        tokenizer_dir = params.get("tokenizer_dir")
        if not tokenizer_dir:
            raise ValueError(
                "preprocessing: parameter tokenizer_dir is empty; set engine.tokenizer_dir (or model.tokenizer / model.path)"
            )
        self.add_special_tokens = _flag(params, "add_special_tokens", True)
        self.tokenizer = AutoTokenizer.from_pretrained(
            tokenizer_dir, padding_side="left", trust_remote_code=_flag(params, "trust_remote_code", False)
        )
        tok = self.tokenizer
        if tok.eos_token_id is None:
            raise ValueError(
                f"preprocessing: the tokenizer in {tokenizer_dir} has no EOS token; send end_id with every request or fix the tokenizer"
            )
        self.end_id = int(tok.eos_token_id)
        self.pad_id = int(tok.pad_token_id) if tok.pad_token_id is not None else self.end_id
        self.extra_eos = [[i] for i in _generation_eos_ids(tokenizer_dir) if i != self.end_id]
        pb_utils.Logger.log_info(
            f"preprocessing: tokenizer {tokenizer_dir} (type {params.get('tokenizer_type', 'auto')}), end_id {self.end_id}, "
            f"pad_id {self.pad_id}, extra EOS stop ids {self.extra_eos}, add_special_tokens {self.add_special_tokens}"
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._one(request)))
            except ValueError as exc:
                responses.append(
                    pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"preprocessing: {exc}"))
                )
        return responses

    def _one(self, request):
        query = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy()
        batch = query.shape[0]
        prompts = [row[0] if row else "" for row in _texts(query, "QUERY")]
        if any(not p for p in prompts):
            raise ValueError("text_input is empty; send a non-empty prompt")
        ids = [self.tokenizer.encode(p, add_special_tokens=self.add_special_tokens) for p in prompts]
        lengths = np.array([[len(x)] for x in ids], dtype=np.int32)
        input_id = np.full((batch, int(lengths.max())), self.pad_id, dtype=np.int32)
        for i, x in enumerate(ids):
            input_id[i, : len(x)] = x

        out_len = (
            pb_utils.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN")
            .as_numpy()
            .astype(np.int32)
            .reshape(batch, -1)
        )
        if (out_len < 1).any():
            raise ValueError(f"max_tokens must be >= 1, got {int(out_len.min())}")

        ignore_eos = _column(request, "IGNORE_EOS", batch, bool, False)
        end_id = _column(request, "END_ID", batch, np.int32, self.end_id)
        end_id = np.where(ignore_eos, -1, end_id).astype(np.int32)
        pad_id = _column(request, "PAD_ID", batch, np.int32, self.pad_id)

        seed = _column(request, "RANDOM_SEED", batch, np.uint64)
        alias = _column(request, "SEED", batch, np.uint64)
        if seed is not None and alias is not None and (seed != alias).any():
            raise ValueError(f"random_seed ({seed.tolist()}) and seed ({alias.tolist()}) disagree; send one of them")
        seed = seed if seed is not None else alias if alias is not None else np.zeros(batch, dtype=np.uint64)

        # EXCLUDE_INPUT_IN_OUTPUT is accepted for compatibility: read, never acted on.
        pb_utils.get_input_tensor_by_name(request, "EXCLUDE_INPUT_IN_OUTPUT")

        bad = pb_utils.get_input_tensor_by_name(request, "BAD_WORDS_DICT")
        stop = pb_utils.get_input_tensor_by_name(request, "STOP_WORDS_DICT")
        bad_words = _texts(bad.as_numpy(), "bad_words") if bad is not None else [[] for _ in range(batch)]
        stop_words = _texts(stop.as_numpy(), "stop_words") if stop is not None else [[] for _ in range(batch)]
        if len(bad_words) != batch or len(stop_words) != batch:
            raise ValueError("bad_words/stop_words must have one row per prompt")
        stop_words = [words + ([] if ignore_eos[i] else self.extra_eos) for i, words in enumerate(stop_words)]

        return [
            pb_utils.Tensor("INPUT_ID", input_id),
            pb_utils.Tensor("REQUEST_INPUT_LEN", lengths),
            pb_utils.Tensor("BAD_WORDS_IDS", word_list(self.tokenizer, bad_words)),
            pb_utils.Tensor("STOP_WORDS_IDS", word_list(self.tokenizer, stop_words)),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", out_len),
            pb_utils.Tensor("OUT_END_ID", end_id.reshape(batch, 1)),
            pb_utils.Tensor("OUT_PAD_ID", pad_id.astype(np.int32).reshape(batch, 1)),
            pb_utils.Tensor("OUT_RANDOM_SEED", seed.astype(np.uint64).reshape(batch, 1)),
        ]

    def finalize(self):
        self.tokenizer = None


def _generation_eos_ids(folder):
    """EOS ids from generation_config.json (an int or a list); [] when absent."""
    path = os.path.join(folder, "generation_config.json")
    try:
        with open(path) as f:
            value = json.load(f).get("eos_token_id")
    except (OSError, ValueError):
        return []
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]
