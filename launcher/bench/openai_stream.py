"""llmlaunch-bench's OpenAI backends: requests over HTTP to /v1/completions or /v1/chat/completions of any
OpenAI-compatible server (llmlaunch's launcher/openai_api, vLLM's, SGLang's), with the interface of
launcher.client.stream.TritonStream (submit, wait, cancel, close, on_done), so the load generator
(launcher/bench/runner.py) and the metrics are the same whichever protocol carries the requests.

Requests run as tasks of one asyncio loop on a thread of its own, with one aiohttp session (aiohttp is what vLLM's
and SGLang's benchmark clients use).  Per streamed chunk: take the time, parse the SSE event's JSON, keep the text
as a Triton BYTES payload in the StreamRecord (so StreamRecord.text and the metrics read it as they read gRPC's).
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from launcher.client.connection import ClientError
from launcher.client.response import StreamRecord
from launcher.contract import SESSION_HEADER


@dataclass
class OpenAIRequest:
    """One request as the OpenAI backends send it."""

    id: str  # the StreamRecord's request id
    path: str  # /v1/completions or /v1/chat/completions
    body: bytes  # the JSON body
    headers: Optional[dict] = None  # more request headers (X-Session-ID)


def base_url(url: str) -> str:
    """'http://HOST:PORT[/v1]' or 'HOST:PORT' -> 'http://HOST:PORT' (the /v1 routes are appended per request)."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def auth_headers() -> dict:
    """The server's key, where it requires one (serve.api_key_file): OPENAI_API_KEY, as the openai SDK reads it."""
    key = os.environ.get("OPENAI_API_KEY", "")
    return {"Authorization": f"Bearer {key}"} if key else {}


def served_model(url: str, timeout: float = 10.0) -> str:
    """The first model GET /v1/models lists."""
    import urllib.request

    try:
        with urllib.request.urlopen(
            urllib.request.Request(base_url(url) + "/v1/models", headers=auth_headers()), timeout=timeout
        ) as r:
            data = json.loads(r.read())["data"]
    except Exception as e:
        raise ClientError(f"cannot list models at {base_url(url)}/v1/models: {e}") from None
    if not data:
        raise ClientError(f"{base_url(url)}/v1/models lists no model")
    return data[0]["id"]


def request_builder(chat: bool) -> Callable:
    """build(model, gen, request_id, parameters) -> OpenAIRequest: launcher.client.request.build_request's
    counterpart (Triton request parameters have no OpenAI form and are not sent; a session goes as X-Session-ID)."""
    from launcher.openai_api.translate import request_body

    path = "/v1/chat/completions" if chat else "/v1/completions"

    def build(model: str, gen, request_id: str, parameters: Optional[dict] = None) -> OpenAIRequest:
        body = json.dumps(request_body(gen, model, chat)).encode()
        return OpenAIRequest(request_id, path, body, {SESSION_HEADER: gen.session} if gen.session else None)

    return build


def _payload(text: str) -> bytes:
    b = text.encode("utf-8")
    return struct.pack("<I", len(b)) + b


class OpenAIStream:
    """Many concurrent OpenAI requests to one server, as TritonStream carries many gRPC requests."""

    def __init__(self, url: str, on_done: Optional[Callable] = None, connect_timeout: float = 30.0):
        self.url = base_url(url)
        self._headers = {"Content-Type": "application/json", **auth_headers()}
        self._on_done = on_done
        self._cond = threading.Condition()
        self._dead = ""
        self._tasks: set = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="openai-stream", daemon=True)
        self._thread.start()
        self._session = asyncio.run_coroutine_threadsafe(self._open(), self._loop).result(connect_timeout)

    async def _open(self):
        import aiohttp

        # no connection cap: the load generator decides the concurrency; no total timeout: long generations
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None, sock_connect=30)
        )

    def submit(self, request: OpenAIRequest, record: Optional[StreamRecord] = None) -> StreamRecord:
        if self._dead:
            raise ClientError(self._dead)
        rec = record if record is not None else StreamRecord(request.id)
        rec.request_id = request.id
        rec.queued = rec.sent = time.perf_counter()
        self._loop.call_soon_threadsafe(self._start, request, rec)
        return rec

    def _start(self, request: OpenAIRequest, rec: StreamRecord) -> None:
        task = self._loop.create_task(self._run(request, rec))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, request: OpenAIRequest, rec: StreamRecord) -> None:
        perf, loads = time.perf_counter, json.loads
        try:
            rec.sent = perf()
            headers = {**self._headers, **request.headers} if request.headers else self._headers
            async with self._session.post(self.url + request.path, data=request.body, headers=headers) as resp:
                if resp.status != 200:
                    text = await resp.text()
                    try:
                        text = loads(text)["error"]["message"]
                    except Exception:
                        pass
                    rec.times.append(perf())
                    rec.chunks.append(b"")
                    rec.error = f"HTTP {resp.status}: {text}"
                    return
                if not resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                    doc = await resp.json()
                    rec.times.append(perf())
                    choice = doc["choices"][0]
                    text = choice.get("text")
                    if text is None:
                        text = (choice.get("message") or {}).get("content") or ""
                    rec.chunks.append(_payload(text))
                    rec.finish_reason = choice.get("finish_reason") or ""
                    self._usage(rec, doc.get("usage"))
                    return
                async for line in resp.content:
                    if not line.startswith(b"data:"):
                        continue
                    t = perf()
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    doc = loads(data)
                    if "error" in doc:
                        rec.error = (
                            doc["error"].get("message", str(doc["error"]))
                            if isinstance(doc["error"], dict)
                            else str(doc["error"])
                        )
                        break
                    if doc.get("usage"):
                        self._usage(rec, doc["usage"])
                    for choice in doc.get("choices") or ():
                        text = choice.get("text")
                        if text is None:
                            text = (choice.get("delta") or {}).get("content") or ""
                        reason = choice.get("finish_reason")
                        if text or reason:
                            rec.times.append(t)
                            rec.chunks.append(_payload(text) if text else b"")
                        if reason:
                            rec.finish_reason = reason
        except asyncio.CancelledError:
            rec.error = rec.error or self._dead or "cancelled"
        except Exception as e:  # connection refused or reset, a malformed event
            rec.error = rec.error or f"{e.__class__.__name__}: {e}"
        finally:
            rec.done = True
            if self._on_done is not None:
                self._on_done(rec)
            with self._cond:
                self._cond.notify_all()

    @staticmethod
    def _usage(rec: StreamRecord, usage) -> None:
        if usage:
            rec.input_tokens = usage.get("prompt_tokens")
            rec.output_tokens = usage.get("completion_tokens")

    def wait(self, record: StreamRecord, timeout: Optional[float] = None) -> StreamRecord:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not record.done:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"request {record.request_id} did not finish within {timeout} s")
                self._cond.wait(left if left is not None else 1.0)
        return record

    def cancel(self, reason: str) -> None:
        """Give up on every running request: each ends with `reason` as its error."""
        self._dead = reason

        def cancel_all():
            for task in list(self._tasks):
                task.cancel()

        self._loop.call_soon_threadsafe(cancel_all)

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def close(self, cancel: bool = False, timeout: Optional[float] = None) -> None:
        if cancel:
            self.cancel("the client closed")

        async def finish():
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=timeout)
            await self._session.close()

        try:
            asyncio.run_coroutine_threadsafe(finish(), self._loop).result()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(cancel=exc_type is not None)
