"""Stand-in: sglang.srt.managers.multi_tokenizer_mixin (SGLang's multi-tokenizer mode, tokenizer_worker_num > 1).

MultiTokenizerRouter takes the place of the Engine's tokenizer manager and generates nothing; each TokenizerWorker is
a TokenizerManager of its own process, bound to the IPC address in its PortArgs.tokenizer_ipc_name, where the
detokenizer sends the outputs of the requests it sent. Here each worker generates its requests itself, as the
stand-in Engine's tokenizer manager does, and records the address it was given."""

import os

import _standin
from sglang.srt.managers.tokenizer_manager import TokenizerManager


class MultiTokenizerRouter:
    def __init__(self, server_args, port_args):
        self.server_args = server_args
        self.max_req_input_len = None


class TokenizerWorker(TokenizerManager):
    def __init__(self, server_args, port_args):
        if server_args.tokenizer_worker_num <= 1 or not port_args.tokenizer_worker_ipc_name:
            raise AssertionError("a TokenizerWorker runs only in multi-tokenizer mode (tokenizer_worker_num > 1)")
        super().__init__(server_args, port_args)
        self.worker_id = os.getpid()
        _standin.record(
            "sglang",
            "tokenizer_worker",
            tokenizer_ipc_name=port_args.tokenizer_ipc_name,
            router=port_args.tokenizer_worker_ipc_name,
            tokenizer_worker_num=server_args.tokenizer_worker_num,
        )
