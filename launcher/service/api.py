"""The router's control API: a small HTTP server on serve.control_port. Replica jobs POST /register and /deregister
(launcher/handoff/registration.py), llmlaunch-scale POSTs /scale, and GET /metrics and /status show the service.
Every POST must carry the service's token (`Authorization: Bearer`); the controller decides what each asks for."""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Awaitable, Callable, Dict, Tuple

Handler = Callable[[Dict], Awaitable[Tuple[int, Dict]]]
MAX_BODY = 64 << 10  # a registration is a few hundred bytes


async def serve_control(
    host: str, port: int, token: str, posts: Dict[str, Handler], gets: Dict[str, Callable[[], str]]
) -> asyncio.AbstractServer:
    """Serve `posts` (path -> handler of the JSON body, answering (status, JSON)) behind the token, and `gets` (path ->
    its text) to anyone who reaches the port (what /metrics shows is the service's state, no secret)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, kind, text = await asyncio.wait_for(_answer(reader, token, posts, gets), 10.0)
        except (asyncio.TimeoutError, ConnectionError, asyncio.IncompleteReadError, ValueError) as e:
            status, kind, text = 400, "application/json", json.dumps({"error": f"bad request: {e}"})
        body = text.encode()
        reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found"}.get(
            status, ""
        )
        try:
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port, reuse_address=True)


async def _answer(reader, token: str, posts, gets) -> Tuple[int, str, str]:
    request = (await reader.readline()).decode("latin-1").split()
    if len(request) < 2:
        raise ValueError("no request line")
    method, path = request[0], request[1].split("?")[0]
    headers = {}
    while True:
        line = (await reader.readline()).decode("latin-1").strip()
        if not line:
            break
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    if method == "GET" and path in gets:
        return 200, "text/plain; version=0.0.4", gets[path]()
    if method != "POST" or path not in posts:
        return (
            404,
            "application/json",
            json.dumps({"error": f"no {method} {path}: POST {sorted(posts)}, GET {sorted(gets)}"}),
        )
    size = int(headers.get("content-length", "0"))
    if size > MAX_BODY:
        return 400, "application/json", json.dumps({"error": f"body of {size} bytes; at most {MAX_BODY}"})
    raw = await reader.readexactly(size) if size else b"{}"
    given = headers.get("authorization", "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(given.encode(), token.encode()):
        return 401, "application/json", json.dumps({"error": "not this service's token"})
    body = json.loads(raw or b"{}")
    if not isinstance(body, dict):
        raise ValueError("the body is not a JSON object")
    status, answer = await posts[path](body)
    return status, "application/json", json.dumps(answer)
