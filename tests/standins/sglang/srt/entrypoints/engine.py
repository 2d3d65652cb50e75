"""Stand-in: sglang.srt.entrypoints.engine.Engine (tests only; see tests/standins/_standin.py)."""

import asyncio
import dataclasses
import os
import threading
from types import SimpleNamespace

import _standin
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import ServerArgs

ENGINE = "sglang"


def _model_context(kwargs) -> int:
    """The model folder's max_position_embeddings (32768 where it has no config.json), as SGLang's ModelConfig reads it."""
    import json

    path = os.path.join(kwargs.get("model_path", ""), "config.json")
    if not os.path.exists(path):
        return 32768
    with open(path) as f:
        return int(json.load(f).get("max_position_embeddings", 32768))


class Engine:
    def __init__(self, **kwargs):
        self.server_args = ServerArgs(**kwargs)  # unknown names raise TypeError, as in SGLang
        _standin.record(
            ENGINE, "init", args=dataclasses.asdict(self.server_args), thread=threading.current_thread().name
        )
        try:
            self.loop = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = asyncio.new_event_loop()
        self._exited = threading.Event()
        self._scheduler_init_result = SimpleNamespace(block_until_scheduler_exits=self._exited.wait)
        if self.server_args.node_rank >= 1:
            if os.environ.get("SGLANG_BLOCK_NONZERO_RANK_CHILDREN") != "0":
                self._exited.wait()  # what SGLang does in server mode: never returns while the schedulers live
            self.tokenizer_manager = None
        else:
            self.tokenizer_manager = TokenizerManager(self.server_args.context_length or _model_context(kwargs))

    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, stream=False, rid=None, **kwargs):
        sp = dict(sampling_params or {})
        _standin.record(ENGINE, "generate", request_id=rid, prompt=prompt, sampling=sp, stream=stream)
        gen = self._stream(prompt, sp, rid)
        if stream:
            return gen
        last = None
        async for piece in gen:
            last = piece
        return last

    async def _stream(self, prompt, sp, rid):
        tm = self.tokenizer_manager
        tm.rid_to_state[rid] = True
        stop = sp.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        n_in = len(_standin.prompt_ids(prompt))
        text, ids = "", []
        try:
            async for piece, tok, finish in _standin.script(
                prompt,
                sp.get("max_new_tokens", 128),
                sp.get("min_new_tokens", 0),
                sp.get("ignore_eos", False),
                stop,
                cancelled=lambda: rid in tm.aborted,
            ):
                text += piece
                if tok is not None:
                    ids.append(tok)
                chunk_text = piece if self.server_args.incremental_streaming_output else text
                yield {
                    "text": chunk_text,
                    "output_ids": list(ids),
                    "meta_info": {
                        "id": rid,
                        "prompt_tokens": n_in,
                        "completion_tokens": len(ids),
                        "finish_reason": None if finish is None else {"type": finish},
                    },
                }
            if rid in tm.aborted:
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
            tm.rid_to_state.pop(rid, None)  # SGLang does not abort on close: the caller must

    def shutdown(self):
        _standin.record(ENGINE, "shutdown")
        self._exited.set()
