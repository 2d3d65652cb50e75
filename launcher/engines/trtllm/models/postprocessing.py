"""llmlaunch `postprocessing` for the TensorRT-LLM ensemble: token ids -> text and the contract's counts.

Implements exactly the inputs/outputs `launcher/engines/trtllm/ensemble.py` renders for this
model, reading the tensors TensorRT-LLM's C++ `tensorrtllm` backend returns
(tensorrtllm_backend v0.9+ / TensorRT-LLM `triton_backend`, inflight_batcher_llm):
`output_ids` [B, beams, T] and `sequence_length` [B, beams], with
exclude_input_in_output=true so both cover generated tokens only. Written for
llmlaunch; no upstream code is copied.

    TOKENS_BATCH [B,beams,T], SEQUENCE_LENGTH [B,beams] -> OUTPUT [B,beams] BYTES,
                                                           OUTPUT_TOKENS [B,1] (beam 0)
    REQUEST_INPUT_LEN [B,1]   (optional) -> INPUT_TOKENS [B,1] (0 when absent)
    REQUEST_OUTPUT_LEN [B,1]  (optional) -> FINISH_REASON [B,1]: "length" when the engine
                                 produced max_tokens tokens, else "stop"; "" when absent
    STREAM [B,1] BOOL         (optional) -> how OUTPUT is made (below)

Why three inputs are optional: with a decoupled (streaming) `tensorrt_llm`, Triton only
accepts an ensemble whose later steps and outputs take tensors that originate from that
one decoupled model ("step ... receives inputs originated from different decoupled
models"), so the ensemble cannot hand this step the prompt length, max_tokens or the
stream flag; TensorRT-LLM's own ensemble wires only tensorrt_llm outputs here. They are
used when present (ensembles with decoupled=false).

OUTPUT is the exact bytes the tokens contribute to the text: for byte-level BPE (GPT-2,
Llama 3, Qwen) the byte table of the vocabulary, for SentencePiece pieces "\u2581" -> " "
and byte-fallback "<0xNN>" -> that byte, special tokens skipped (skip_special_tokens).
The engine streams one response per new token (sometimes a few), and an ensemble step
keeps no memory of a request's earlier responses (Triton may route them to different
instances of this model), so decoding tokens one at a time would corrupt text: a
character whose UTF-8 bytes span two tokens (CJK, emoji) would decode to U+FFFD twice,
and SentencePiece would drop the space of a lone "\u2581word". With exact bytes,
concatenating the streamed OUTPUTs gives exactly the UTF-8 of the completion, and the
one non-streamed OUTPUT is the completion (for byte-level BPE: equal to
`tokenizer.decode(ids, skip_special_tokens=True)`). A streamed chunk may end inside a
character: clients join the bytes (or use an incremental UTF-8 decoder) instead of
decoding each chunk on its own. When STREAM=false is sent, OUTPUT is
`tokenizer.decode(...)` instead. OUTPUT_TOKENS counts the tokens of this response (in
streaming the ensemble cannot know the running total). The `tensorrt_llm_bls` model
(engine.bls=true) keeps per-request state and serves the whole contract: whole
characters per chunk, cumulative counts, finish reasons, stop words removed.

Stop words: TensorRT-LLM returns the tokens of a matched stop word; this step never
sees the stop words, so it cannot remove them.

Parameters (config.pbtxt): tokenizer_dir (required), tokenizer_type (informational),
skip_special_tokens (default true), trust_remote_code (default false).
"""

import json
import re

import numpy as np
import triton_python_backend_utils as pb_utils

from launcher.python_backend.triton_io import model_parameters

_TRUE = ("1", "true", "yes", "y", "t", "on")
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _flag(params, key, default):
    value = params.get(key)
    return default if value is None else value.strip().lower() in _TRUE


class TokenBytes:
    """token id -> the exact bytes it contributes to the text (stateless, cached per id)."""

    def __init__(self, tokenizer, skip_special_tokens=True):
        from launcher.hf.detok import TokenTable

        self.tokenizer = tokenizer
        self.skip = frozenset(tokenizer.all_special_ids) if skip_special_tokens else frozenset()
        table = TokenTable(tokenizer)
        # TokenTable's byte table leaves special tokens empty (skip_special_tokens=True)
        self.table = table.byte_table
        self.kind = "byte-level" if self.table is not None else "sentencepiece-or-other"
        self.cache = {}

    def __call__(self, token_id):
        token_id = int(token_id)
        if token_id < 0 or token_id in self.skip:
            return b""
        if self.table is not None and token_id < len(self.table):
            value = self.table[token_id]
            if value or token_id not in self.tokenizer.all_special_ids:
                return value
        cached = self.cache.get(token_id)
        if cached is None:
            cached = self.cache[token_id] = self._piece_bytes(token_id)
        return cached

    def _piece_bytes(self, token_id):
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if piece is None:
            return b""
        m = _BYTE_PIECE.match(piece)
        if m:  # SentencePiece byte fallback
            return bytes([int(m.group(1), 16)])
        if "\u2581" in piece:  # SentencePiece word boundary
            return piece.replace("\u2581", " ").encode("utf-8")
        # Anything else (WordPiece, added tokens): what decode gives for the token alone
        return self.tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False).encode(
            "utf-8"
        )


class TritonPythonModel:
    def initialize(self, args):
        from transformers import AutoTokenizer

        config = json.loads(args["model_config"])
        params = model_parameters(config)
        tokenizer_dir = params.get("tokenizer_dir")
        if not tokenizer_dir:
            raise ValueError(
                "postprocessing: parameter tokenizer_dir is empty; set engine.tokenizer_dir (or model.tokenizer / model.path)"
            )
        self.skip_special_tokens = _flag(params, "skip_special_tokens", True)
        self.tokenizer = AutoTokenizer.from_pretrained(
            tokenizer_dir, trust_remote_code=_flag(params, "trust_remote_code", False)
        )
        self.token_bytes = TokenBytes(self.tokenizer, self.skip_special_tokens)
        pb_utils.Logger.log_info(
            f"postprocessing: tokenizer {tokenizer_dir}, streamed text as {self.token_bytes.kind} token bytes"
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._one(request)))
            except ValueError as exc:
                responses.append(
                    pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(f"postprocessing: {exc}"))
                )
        return responses

    def _one(self, request):
        tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
        lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
        if tokens.ndim == 2:  # [B, T] from a client that leaves out the beam dimension
            tokens = tokens[:, None, :]
        batch, beams = tokens.shape[0], tokens.shape[1]
        lengths = lengths.reshape(batch, -1)
        # None = not sent (decoupled ensembles cannot send them): exact token bytes, no finish reason
        stream = _optional(request, "STREAM", batch)
        in_len = _optional(request, "REQUEST_INPUT_LEN", batch)
        in_len = np.zeros(batch, np.int32) if in_len is None else in_len.astype(np.int32)
        max_tokens = _optional(request, "REQUEST_OUTPUT_LEN", batch)

        texts = np.empty((batch, beams), dtype=np.object_)
        reasons = np.empty((batch, 1), dtype=np.object_)
        for b in range(batch):
            for k in range(beams):
                n = int(lengths[b, k]) if k < lengths.shape[1] else 0
                ids = [int(t) for t in tokens[b, k, : max(0, n)]]
                if stream is not None and not stream[b]:
                    texts[b, k] = self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens).encode(
                        "utf-8"
                    )
                else:
                    texts[b, k] = b"".join(self.token_bytes(t) for t in ids)
            produced = int(lengths[b, 0])
            if max_tokens is None or (stream is not None and stream[b]):
                reasons[b, 0] = b""  # unknown here: not the last response, or max_tokens not sent
            else:
                reasons[b, 0] = b"length" if produced >= int(max_tokens[b]) else b"stop"
        return [
            pb_utils.Tensor("OUTPUT", texts),
            pb_utils.Tensor("INPUT_TOKENS", in_len.reshape(batch, 1)),
            pb_utils.Tensor("OUTPUT_TOKENS", lengths[:, :1].astype(np.int32)),
            pb_utils.Tensor("FINISH_REASON", reasons),
        ]

    def finalize(self):
        self.tokenizer = None


def _optional(request, name, batch):
    """An optional [B,1] (or [B,-1]: first column) input as a length-B vector; None when absent."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    arr = tensor.as_numpy().reshape(batch, -1)
    return arr[:, 0]
