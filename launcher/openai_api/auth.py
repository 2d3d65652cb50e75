"""The OpenAI API's key (`serve.api_key_file`): read from a file, never from a command line, and required as
`Authorization: Bearer <key>` on every route but /health (which rank 0 and load balancers poll).

On Slurm the API binds every interface of rank 0's node, so without a key anyone who reaches the cluster network can
use the model.  The key travels as a file path only: the config, the rendered job, the ranks' command lines and the
run record name the file, and only the API process reads what is in it.
"""

from __future__ import annotations

import hmac
import json
from pathlib import Path

OPEN_PATHS = ("/health",)  # answered without a key


def read_key(path: str) -> str:
    """The key in `path`: its first line, without surrounding whitespace.  Raises ValueError naming what is wrong."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the API key file {path}: {e.__class__.__name__}: {e}") from None
    key = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not key:
        raise ValueError(f"the API key file {path} is empty")
    return key


class BearerAuth:
    """ASGI middleware: a request to any path but OPEN_PATHS without `Authorization: Bearer <key>` gets OpenAI's
    401 error object.  The comparison takes the same time however much of the key matches."""

    def __init__(self, app, key: str):
        self.app = app
        self.expected = b"Bearer " + key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        if hmac.compare_digest(given, self.expected):
            return await self.app(scope, receive, send)
        why = "no API key was given" if not given else "the API key is not valid"
        body = json.dumps(
            {
                "error": {
                    "message": f"{why}: send the server's key as `Authorization: Bearer <key>` (serve.api_key_file "
                    "names the file that holds it; the openai SDK sends OPENAI_API_KEY)",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
