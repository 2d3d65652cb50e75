"""Stand-in: sglang.srt.managers.tokenizer_manager.TokenizerManager (generate_request, abort_request, context_len: the
context SGLang resolved, the model's max_position_embeddings unless ServerArgs.context_length is set, and tokenizer:
the model's)."""

import json
import os
import re

import _standin


class Tokenizer:
    """The stand-in model's tokenizer: a word with the space before it is one token; the script's " t<i>" (and "t<i>")
    is token 100 + i, as the script numbers what it generates, any other word 1000 + its length."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list:
        words = re.findall(r" ?\S+", text)
        return [100 + int(w.strip()[1:]) if re.fullmatch(r" ?t\d+", w) else 1000 + len(w) for w in words]


def model_context(server_args) -> int:
    """ServerArgs.context_length, else the model folder's max_position_embeddings (32768 where it has no config.json),
    as SGLang's ModelConfig reads it."""
    if server_args.context_length:
        return server_args.context_length
    path = os.path.join(server_args.model_path or "", "config.json")
    if not os.path.exists(path):
        return 32768
    with open(path) as f:
        return int(json.load(f).get("max_position_embeddings", 32768))


class TokenizerManager:
    def __init__(self, server_args, port_args=None):
        self.server_args = server_args
        self.context_len = model_context(server_args)
        self.tokenizer = Tokenizer()
        self.rid_to_state = {}
        self.aborted = set()

    def abort_request(self, rid: str = "", abort_all: bool = False):
        if not abort_all and rid not in self.rid_to_state:
            return
        self.aborted.add(rid)
        _standin.record("sglang", "abort", request_id=rid)

    async def generate_request(self, obj, request=None):
        """obj: GenerateReqInput. Chunks of {"text", "output_ids", "meta_info"}; "text" is the whole text so far unless
        incremental_streaming_output is set."""
        sp = dict(obj.sampling_params or {})
        _standin.record("sglang", "generate", request_id=obj.rid, prompt=obj.text, sampling=sp, stream=obj.stream)
        rid, prompt = obj.rid, obj.text
        self.rid_to_state[rid] = True
        stop = sp.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        n_in = len(_standin.prompt_ids(prompt))
        cached = _standin.cached_tokens(prompt)
        text, ids = "", []
        try:
            async for piece, tok, finish in _standin.script(
                prompt,
                sp.get("max_new_tokens", 128),
                sp.get("min_new_tokens", 0),
                sp.get("ignore_eos", False),
                stop,
                cancelled=lambda: rid in self.aborted,
            ):
                text += piece
                if tok is not None:
                    ids.append(tok)
                yield {
                    "text": piece if self.server_args.incremental_streaming_output else text,
                    "output_ids": list(ids),
                    "meta_info": {
                        "id": rid,
                        "prompt_tokens": n_in,
                        "completion_tokens": len(ids),
                        "cached_tokens": cached,
                        "finish_reason": None if finish is None else {"type": finish},
                    },
                }
            if rid in self.aborted:
                yield {
                    "text": text,
                    "output_ids": ids,
                    "meta_info": {
                        "id": rid,
                        "prompt_tokens": n_in,
                        "completion_tokens": len(ids),
                        "finish_reason": {"type": "abort", "message": "Abort request"},
                    },
                }
        finally:
            self.rid_to_state.pop(rid, None)  # SGLang does not abort on close: the caller must
