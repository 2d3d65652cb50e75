"""The OpenAI-compatible HTTP API as a Starlette app (served by uvicorn, launcher/openai_api/process.py).

Routes: GET /v1/models, POST /v1/completions, POST /v1/chat/completions, GET /health, GET /metrics.  Every
request is translated to the contract (launcher/openai_api/translate.py) and streamed from the gRPC endpoint rank 0
serves (launcher/openai_api/backend.py).  Errors are OpenAI's JSON error object with its status; a request's error
never reaches another request, and a client that goes away cancels its request on the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Callable, Optional

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from launcher.contract import SESSION_HEADER
from launcher.openai_api import answers, translate as tr
from launcher.openai_api.auth import BearerAuth
from launcher.openai_api.backend import BackendError, Final, Utf8Pieces
from launcher.openai_api.counters import Counters
from launcher.openai_api.tokens import TokenText


def _error(e: tr.ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def _sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class TextChunks:
    """The SSE events of one stream's text chunks, which differ only in their text: the event is serialized once
    around a marker and each text spliced in (a tenth of the cost of building and serializing the object per
    chunk, and the same bytes)."""

    _MARK = "\x00llmlaunch-text\x00"

    def __init__(self, make: Callable[[str], dict]):
        self.head, self.tail = _sse(make(self._MARK)).split(json.dumps(self._MARK).encode())

    def __call__(self, text: str) -> bytes:
        return self.head + json.dumps(text, ensure_ascii=False).encode() + self.tail


_DONE = b"data: [DONE]\n\n"


def make_app(
    backend,
    served: tuple,
    chat_template: Callable[[list], str],
    counters: Optional[Counters] = None,
    draining: Optional[dict] = None,
    api_key: str = "",
    token_text: Optional[TokenText] = None,
    max_request_bytes: int = 4 << 20,
    instance: str = "",
):
    """The app.  `backend`: a GrpcBackend (generate, ready); `served`: the model names requests may use, the first
    the one /v1/models lists; `chat_template(messages) -> prompt`; `draining["reason"]`, once set (the drain notice,
    launcher/procs/drain.py), refuses new requests with 503 naming it while running ones finish; `api_key`: required as
    `Authorization: Bearer` on every route but /health (launcher/openai_api/auth.py); `token_text`: token ids as text
    (log probabilities, echo of token-id prompts), from the model's tokenizer; `max_request_bytes`: a larger body gets
    413 before it is read whole (serve.max_request_bytes); `instance`: sent back by /health in the
    x-llmlaunch-instance header, so the process that started this API knows the answer is its own."""
    counters = counters or Counters()
    draining = {"reason": ""} if draining is None else draining
    api = _Api(backend, served, chat_template, counters, draining, token_text or TokenText(""))
    api.max_request_bytes = max_request_bytes
    api.instance = instance
    routes = [
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/metrics", api.metrics, methods=["GET"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app):
        counters.started()
        yield

    app = Starlette(
        routes=routes,
        exception_handlers={404: _not_found, 405: _not_found, Exception: _server_error},
        lifespan=lifespan,
    )
    return BearerAuth(app, api_key) if api_key else app


async def _not_found(request: Request, exc) -> Response:
    status = getattr(exc, "status_code", 404)
    msg = (
        f"{request.method} {request.url.path} is not served here (routes: GET /v1/models, POST /v1/completions, "
        "POST /v1/chat/completions, GET /health, GET /metrics)"
    )
    return JSONResponse(tr.ApiError(status, msg, code="unknown_route").body(), status_code=status)


async def _bounded_body(request: Request, limit: int) -> bytes:
    """The request's body, or tr.ApiError 413 once it is known to be over `limit` bytes (from its Content-Length, or
    as a chunked one arrives), never holding more than `limit` of it.  The rest is read and dropped, up to
    _DRAIN_TIMES the limit, so the client, still sending, gets to read the 413 (a connection closed under a
    sender's feet is a broken pipe to it); a body larger still is cut off there."""

    def too_large(size: str) -> tr.ApiError:
        return tr.ApiError(
            413,
            f"the request body is {size} bytes, over serve.max_request_bytes={limit}; send a shorter prompt, or "
            "launch with a larger serve.max_request_bytes",
            code="request_too_large",
        )

    declared = request.headers.get("content-length", "")
    over = declared.isdigit() and int(declared) > limit
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            over = True
        if over:
            chunks.clear()
            if size > _DRAIN_TIMES * limit:
                break
        else:
            chunks.append(chunk)
    if over:
        raise too_large(declared if declared.isdigit() else f"over {limit}")
    return b"".join(chunks)


_DRAIN_TIMES = 16  # a body over serve.max_request_bytes is read and dropped up to this many times the limit


async def _server_error(request: Request, exc) -> Response:
    return _error(tr.ApiError(500, f"internal error: {exc.__class__.__name__}: {exc}", code="internal_error"))


class _Api:
    """The routes' handlers (make_app's arguments say what each field is): every request is counted in `counters`
    by route and status, and counts as running from its first piece to its end (counters.begin / end)."""

    def __init__(self, backend, served: tuple, chat_template, counters: Counters, draining: dict, token_text):
        self.backend = backend
        self.served = served
        self.chat_template = chat_template
        self.counters = counters
        self.draining = draining
        self.token_text = token_text
        self.created = int(time.time())  # /v1/models' "created": when the API started
        self.max_request_bytes = 4 << 20  # a larger body is refused (413) before it is read whole
        self.instance = ""  # /health's x-llmlaunch-instance header (OpenAIConfig.instance)

    async def models(self, request: Request) -> Response:
        return JSONResponse(tr.models_body(self.served[0], self.created))

    async def health(self, request: Request) -> Response:
        headers = {"x-llmlaunch-instance": self.instance} if self.instance else None
        if not self.counters.all_started:
            return PlainTextResponse("the API's worker processes are starting\n", status_code=503, headers=headers)
        if self.draining["reason"]:
            return PlainTextResponse(self.draining["reason"] + "\n", status_code=503, headers=headers)
        if await self.backend.ready():
            return PlainTextResponse("ok\n", headers=headers)
        text = f"model {self.backend.model} is not ready at {self.backend.url}\n"
        return PlainTextResponse(text, status_code=503, headers=headers)

    async def metrics(self, request: Request) -> Response:
        return PlainTextResponse(self.counters.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Request, chat: bool) -> Response:
        route = "chat" if chat else "completions"
        counters = self.counters
        if self.draining["reason"]:
            counters.answered(route, 503)
            return _error(tr.ApiError(503, self.draining["reason"], code="draining"))
        try:
            gen, opts = await self._translate(request, chat)
        except tr.ApiError as e:
            counters.answered(route, e.status)
            return _error(e)
        rid = tr.new_id(chat)
        # X-Session-ID: with replicas and serve.routing=prefix, the session's requests stay on one replica
        session = request.headers.get(SESSION_HEADER, "")[:256]
        if not opts.plain:
            return await self._choices(request, route, rid, tr.choice_generations(gen, opts), opts, chat, session)
        it = self.backend.generate(gen, session).__aiter__()
        first, refused = await self._start([it], route)
        if refused is not None:
            return refused
        if opts.stream:
            return self._events(route, self._stream(it, first, rid, opts, chat))
        try:
            ans = await _until_disconnect(request, answers.read(it, first))
        except BackendError as e:
            err = tr.engine_error(e.message, e.code)
            counters.answered(route, err.status)
            return _error(err)
        finally:
            counters.end()
        counters.answered(route, 200)
        counts = self._count(ans.input_tokens, ans.output_tokens)
        reason = tr.finish_reason(ans.finish_reason)
        make = tr.chat_body if chat else tr.completion_body
        return JSONResponse(make(rid, opts.model, ans.text, reason, counts))

    async def _translate(self, request: Request, chat: bool) -> tuple:
        """The request's body -> (the contract's generation, its options); tr.ApiError for a bad request."""
        raw = await _bounded_body(request, self.max_request_bytes)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise tr.ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
        if chat:
            return await _in_thread(tr.chat_generation, body, self.served, self.chat_template)
        return tr.completion_generation(body, self.served)

    async def _start(self, its: list, route: str) -> tuple:
        """(the first item of its[0], None), or (None, the error response): errors before the first piece get their
        HTTP status.  From here the request counts as running until it ends (counters.end)."""
        counters = self.counters
        counters.begin()
        try:
            return await its[0].__anext__(), None
        except BackendError as e:
            counters.end()
            for it in its:
                await it.aclose()
            err = tr.engine_error(e.message, e.code)
            counters.answered(route, err.status)
            return None, _error(err)
        except BaseException:
            counters.end()
            raise

    def _events(self, route: str, events) -> Response:
        self.counters.answered(route, 200)
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def _choices(self, request, route, rid, gens, opts, chat, session) -> Response:
        """Several choices, log probabilities or echo (launcher/openai_api/answers.py)."""
        counters, token_text = self.counters, self.token_text
        its = [self.backend.generate(g, session).__aiter__() for g in gens]
        first, refused = await self._start(its, route)
        if refused is not None:
            return refused
        if opts.stream:
            events = answers.events(rid, gens, its, first, opts, chat, token_text, _sse)
            return self._events(route, self._choice_events(events))
        try:
            got = await _until_disconnect(request, answers.answers(its, first))
            out, counts = await _in_thread(answers.body, rid, gens, got, opts, chat, token_text)
        except BackendError as e:
            err = tr.engine_error(e.message, e.code)
            counters.answered(route, err.status)
            return _error(err)
        except tr.ApiError as e:
            counters.answered(route, e.status)
            return _error(e)
        finally:
            counters.end()
        counters.answered(route, 200)
        counters.tokens(counts["prompt_tokens"], counts["completion_tokens"])
        return JSONResponse(out)

    async def _choice_events(self, events):
        try:
            async for event in events:
                if isinstance(event, dict):  # the usage, last
                    self.counters.tokens(event["prompt_tokens"], event["completion_tokens"])
                    break
                yield event
            yield _DONE  # after the usage, or after an error event
        except BackendError as e:  # mid-stream: the status is sent already; the error goes as an event
            yield _sse(tr.engine_error(e.message, e.code).body())
            yield _DONE
        finally:
            self.counters.end()
            await events.aclose()

    def _count(self, input_tokens, output_tokens) -> dict:
        self.counters.tokens(input_tokens or 0, output_tokens or 0)
        return tr.usage(input_tokens, output_tokens)

    async def _stream(self, it, first, rid: str, opts: tr.Options, chat: bool):
        created_at = int(time.time())
        chunk = tr.chat_chunk if chat else tr.completion_chunk
        wu = opts.include_usage
        utf8 = Utf8Pieces()
        if chat:
            text_event = TextChunks(lambda t: chunk(rid, created_at, opts.model, {"content": t}, None, wu))
        else:
            text_event = TextChunks(lambda t: chunk(rid, created_at, opts.model, t, None, wu))
        try:
            if chat:
                yield _sse(chunk(rid, created_at, opts.model, {"role": "assistant", "content": ""}, None, wu))
            item = first
            while True:
                if isinstance(item, Final):
                    rest = utf8.flush()
                    reason = tr.finish_reason(item.finish_reason)
                    delta = ({"content": rest} if rest else {}) if chat else rest
                    yield _sse(chunk(rid, created_at, opts.model, delta, reason, wu))
                    counts = self._count(item.input_tokens, item.output_tokens)
                    if wu:
                        yield _sse(tr.usage_chunk(rid, created_at, opts.model, chat, counts))
                    yield _DONE
                    return
                text = utf8.feed(item)
                if text:
                    yield text_event(text)
                item = await it.__anext__()
        except BackendError as e:  # mid-stream: the status is sent already; the error goes as an event
            yield _sse(tr.engine_error(e.message, e.code).body())
            yield _DONE
        finally:
            self.counters.end()
            await it.aclose()  # cancels the gRPC call when the client went away


async def _until_disconnect(request: Request, work):
    """Await `work`, cancelling it (and so its gRPC call) when the HTTP client disconnects first."""
    task = asyncio.ensure_future(work)

    async def watch():
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                task.cancel()
                return

    watcher = asyncio.ensure_future(watch())
    try:
        return await task
    finally:
        watcher.cancel()


async def _in_thread(fn, *args):
    """Chat templates are Jinja rendering: off the event loop for long conversations."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
