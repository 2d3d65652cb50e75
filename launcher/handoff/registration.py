"""What a replica job of a service (serve.router=host|job) tells the router: `register` once its rank 0 serves,
`deregister` when it drains. The router's side is launcher/service/api.py; both speak JSON over HTTP, the service's
token as `Authorization: Bearer` (a job that does not present it, or that the router did not submit, is refused)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict


class Refused(RuntimeError):
    """The router answered, and said no (its reason is the message)."""


def read_token(token_file: str) -> str:
    return Path(token_file).read_text().strip()


def call(url: str, token: str, path: str, body: Dict, timeout_s: float = 5.0) -> Dict:
    """POST `body` to the router's `path`; its JSON answer. Raises Refused on a 4xx answer, OSError where the router
    cannot be reached."""
    req = urllib.request.Request(
        url.rstrip("/") + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        try:
            why = json.loads(e.read() or b"{}").get("error", "")
        except ValueError:
            why = ""
        if 400 <= e.code < 500:
            raise Refused(f"the router at {url} refused {path} ({e.code}): {why or e.reason}") from None
        raise OSError(f"the router at {url} answered {path} with {e.code}: {why or e.reason}") from None


def register(url: str, token_file: str, body: Dict, tries: int = 5, say=lambda m: None) -> Dict:
    """Register with the router (retried a few times where it cannot be reached: it may be restarting its API);
    Refused is raised at once."""
    token = read_token(token_file)
    for attempt in range(tries):
        try:
            return call(url, token, "/register", body)
        except Refused:
            raise
        except OSError as e:
            if attempt == tries - 1:
                raise
            say(f"registering with the router at {url}: {e}; trying again")
            time.sleep(1.0 + attempt)
    raise AssertionError("unreachable")
