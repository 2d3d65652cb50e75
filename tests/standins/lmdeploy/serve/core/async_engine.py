"""Stand-in: lmdeploy.serve.core.async_engine.AsyncEngine (tests only; see tests/standins/_standin.py)."""

import dataclasses
from types import SimpleNamespace
from typing import Optional

import _standin
from lmdeploy.messages import GenerationConfig, TurbomindEngineConfig
from lmdeploy.serve.managers.session_manager import SessionManager

ENGINE = "lmdeploy"


@dataclasses.dataclass
class GenOut:
    response: str
    input_token_len: int
    generate_token_len: int
    finish_reason: Optional[str] = None
    token_ids: Optional[list] = None


@dataclasses.dataclass
class PreprocessedRequest:
    session: object
    inputs: dict
    input_token_len: int
    gen_config: GenerationConfig
    consumed: bool = False


class AsyncEngine:
    def __init__(self, model_path, model_name=None, backend="turbomind", backend_config=None, chat_template_config=None, **kwargs):
        self.backend_config = backend_config or TurbomindEngineConfig()
        self.session_len = self.backend_config.session_len or 4096
        self.session_mgr = SessionManager()
        self.loop = None
        _standin.record(ENGINE, "init", args={"model_path": model_path, "model_name": model_name, "backend": backend,
                                              "backend_config": dataclasses.asdict(self.backend_config)})

    def start_loop(self, loop, use_async_api=False):
        self.loop = loop
        self.session_mgr.attach_event_loop(loop)
        _standin.record(ENGINE, "start_loop", use_async_api=use_async_api, running=loop.is_running())
        return True

    async def preprocess(self, messages, session_id, gen_config=None, do_preprocess=True, **kwargs):
        if do_preprocess:
            raise AssertionError("llmlaunch sends raw prompts (do_preprocess=False)")
        gen_config = gen_config or GenerationConfig()
        return PreprocessedRequest(session_id, {"prompt": messages, "input_ids": _standin.prompt_ids(messages)},
                                   len(_standin.prompt_ids(messages)), gen_config)

    async def generate(self, request, stream_response=True):
        if request.consumed:
            raise RuntimeError("The preprocessed request has already been consumed.")
        request.consumed = True
        session, gc, prompt = request.session, request.gen_config, request.inputs["prompt"]
        _standin.record(ENGINE, "generate", request_id=session.session_id, prompt=prompt, sampling=dataclasses.asdict(gc))
        handle = session._handle = SimpleNamespace(cancelled=False)
        n_in, n_out = request.input_token_len, 0
        try:
            async for piece, tok, finish in _standin.script(prompt, gc.max_new_tokens, gc.min_new_tokens or 0, gc.ignore_eos,
                                                            gc.stop_words or [], cancelled=lambda: handle.cancelled):
                if tok is not None:
                    n_out += 1
                if piece:
                    yield GenOut(piece, n_in, n_out, None)
                if finish:
                    yield GenOut("", n_in, n_out, finish)
            if handle.cancelled:
                yield GenOut("", n_in, n_out, "abort")
        finally:
            session._handle = None
            self.session_mgr.remove(session)

    def close(self):
        _standin.record(ENGINE, "shutdown")
