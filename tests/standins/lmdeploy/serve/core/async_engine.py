"""Stand-in: lmdeploy.serve.core.async_engine.AsyncEngine (tests only; see tests/standins/_standin.py)."""

import copy
import dataclasses
import random
from types import SimpleNamespace
from typing import Optional

import _standin
from lmdeploy.messages import GenerationConfig, TurbomindEngineConfig
from lmdeploy.serve.core.exceptions import ErrorCode, RequestError
from lmdeploy.serve.managers.session_manager import Session, SessionManager

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
    session: Session
    inputs: dict
    input_token_len: int
    gen_config: GenerationConfig
    adapter_name: Optional[str]
    consumed: bool = False


class AsyncEngine:
    def __init__(
        self, model_path, model_name=None, backend="turbomind", backend_config=None, chat_template_config=None, **kwargs
    ):
        self.backend_config = backend_config or TurbomindEngineConfig()
        self.session_len = self.backend_config.session_len or 4096
        self.session_mgr = SessionManager()
        self.loop = None
        _standin.record(
            ENGINE,
            "init",
            args={
                "model_path": model_path,
                "model_name": model_name,
                "backend": backend,
                "backend_config": dataclasses.asdict(self.backend_config),
            },
        )

    def start_loop(self, loop, use_async_api=False):
        self.loop = loop
        self.session_mgr.attach_event_loop(loop)
        _standin.record(ENGINE, "start_loop", use_async_api=use_async_api, running=loop.is_running())
        return True

    def _determine_gen_config(self, input_ids, gen_config):
        """As LMDeploy: a copy; greedy (do_sample=False) forces top_k=1, temperature=1, repetition_penalty=1."""
        gen_config = copy.deepcopy(gen_config) or GenerationConfig()
        if not gen_config.do_sample:
            gen_config.top_k, gen_config.temperature, gen_config.repetition_penalty = 1, 1.0, 1.0
        elif gen_config.random_seed is None:
            gen_config.random_seed = random.getrandbits(64)
        return gen_config

    async def preprocess(self, messages, session_id, gen_config=None, do_preprocess=True, input_ids=None, **kwargs):
        if do_preprocess:
            raise AssertionError("llmlaunch sends raw prompts (do_preprocess=False)")
        session = session_id if isinstance(session_id, Session) else self.session_mgr.get(session_id)
        try:
            if session._handle is not None:
                raise RequestError(
                    ErrorCode.REQUEST_CONFLICT, f"Session {session.session_id} already has an active request."
                )
            ids = _standin.prompt_ids(messages)
            if len(ids) >= self.session_len:
                raise RequestError(
                    ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                    f"Input length ({len(ids)}) must be smaller than the model context length ({self.session_len}).",
                )
            gen_config = self._determine_gen_config(ids, gen_config)
            if gen_config.max_new_tokens < 1:
                raise RequestError(
                    ErrorCode.INVALID_REQUEST, f"max_new_tokens must be at least 1, got {gen_config.max_new_tokens}."
                )
        except RequestError:
            self.session_mgr.remove(session)
            raise
        return PreprocessedRequest(session, {"prompt": messages, "input_ids": ids}, len(ids), gen_config, None)

    async def generate(self, request, stream_response=True):
        if not isinstance(request, PreprocessedRequest):
            raise TypeError("generate requires a PreprocessedRequest returned by preprocess")
        if request.consumed:
            raise RequestError(ErrorCode.REQUEST_CONFLICT, "The preprocessed request has already been consumed.")
        request.consumed = True
        session, gc, prompt = request.session, request.gen_config, request.inputs["prompt"]
        _standin.record(
            ENGINE, "generate", request_id=session.session_id, prompt=prompt, sampling=dataclasses.asdict(gc)
        )
        handle = session._handle = SimpleNamespace(cancelled=False)
        n_in, n_out = request.input_token_len, 0
        # ignore_eos: LMDeploy bans the stop tokens (stop words' included), so a stop word never ends the request
        stops = [] if gc.ignore_eos else (gc.stop_words or [])
        try:
            script = _standin.script(
                prompt,
                gc.max_new_tokens,
                gc.min_new_tokens or 0,
                gc.ignore_eos,
                stops,
                cancelled=lambda: handle.cancelled,
            )
            try:
                async for piece, tok, finish in script:
                    if tok is not None:
                        n_out += 1
                    if piece:
                        yield GenOut(piece, n_in, n_out, None)
                    if finish:
                        yield GenOut("", n_in, n_out, finish)
            except Exception as exc:  # as LMDeploy's safe_run: an engine failure becomes RequestError(INTERNAL_ERROR)
                raise RequestError(ErrorCode.INTERNAL_ERROR) from exc
            if handle.cancelled:
                yield GenOut("", n_in, n_out, "abort")
        finally:
            session._handle = None
            self.session_mgr.remove(session)

    def close(self):
        self.session_mgr.clear()
        _standin.record(ENGINE, "shutdown")
