"""Stand-in: sglang.srt.entrypoints.engine.Engine (tests only; see tests/standins/_standin.py)."""

import asyncio
import dataclasses
import os
import tempfile
import threading
from types import SimpleNamespace

import _standin
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.multi_tokenizer_mixin import MultiTokenizerRouter
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.server_args import PortArgs, ServerArgs

ENGINE = "sglang"


def _ipc() -> str:
    return f"ipc://{tempfile.NamedTemporaryFile(delete=False).name}"  # as SGLang's PortArgs.init_new names them


class Engine:
    def __init__(self, **kwargs):
        self.server_args = ServerArgs(**kwargs)  # unknown names raise TypeError, as in SGLang
        _standin.record(
            ENGINE, "init", args=dataclasses.asdict(self.server_args), thread=threading.current_thread().name
        )
        fail = os.environ.get("LLMLAUNCH_STANDIN_CORE_FAIL")  # the schedulers failing to load the model
        if fail:
            raise RuntimeError(fail)
        multi = self.server_args.tokenizer_worker_num > 1
        self.port_args = PortArgs(_ipc(), _ipc(), _ipc(), _ipc() if multi else None)
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
        elif multi:  # SGLang's multi-tokenizer mode: the workers generate, the router only forwards
            self.tokenizer_manager = MultiTokenizerRouter(self.server_args, self.port_args)
            self.tokenizer_manager.max_req_input_len = 4096
        else:
            self.tokenizer_manager = TokenizerManager(self.server_args, self.port_args)

    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, stream=False, rid=None, **kwargs):
        obj = GenerateReqInput(text=prompt, sampling_params=sampling_params, stream=stream, rid=rid)
        gen = self.tokenizer_manager.generate_request(obj, None)
        if stream:
            return gen
        last = None
        async for piece in gen:
            last = piece
        return last

    def shutdown(self):
        _standin.record(ENGINE, "shutdown")
        self._exited.set()
