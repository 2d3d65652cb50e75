"""The router's control API (launcher/service/api.py) over real HTTP, as replica jobs and llmlaunch-scale call it
(launcher/handoff/registration.py), and how the router reads its front end's /metrics (launcher/service/scrape.py)."""

from __future__ import annotations

import asyncio
import threading
import urllib.request

import pytest

from launcher.handoff.registration import Refused, call
from launcher.ports import free_port
from launcher.service.api import serve_control
from launcher.service.scrape import parse

TOKEN = "s3cret-token"


@pytest.fixture
def control():
    """The control API on a free port, its /register handler recording what it was given."""
    seen: list = []
    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop = asyncio.Event()

    async def register(body):
        seen.append(body)
        if body.get("job_id") != "42":
            return 403, {"error": f"job {body.get('job_id')} is not a replica job this service submitted"}
        return 200, {"slot": 3}

    async def main():
        server = await serve_control("127.0.0.1", port, TOKEN, {"/register": register}, {"/metrics": lambda: "x 1\n"})
        started.set()
        await stop.wait()
        server.close()
        await server.wait_closed()

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    started.wait(10)
    yield f"http://127.0.0.1:{port}", seen
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)
    loop.close()


def test_the_token_is_required_and_the_handler_decides(control):
    url, seen = control
    with pytest.raises(Refused, match="401.*not this service's token"):
        call(url, "wrong", "/register", {"job_id": "42"})
    assert seen == []  # refused before the handler saw it
    assert call(url, TOKEN, "/register", {"job_id": "42", "name": "r0"}) == {"slot": 3}
    with pytest.raises(Refused, match="403.*job 7 is not a replica job"):
        call(url, TOKEN, "/register", {"job_id": "7"})
    with pytest.raises(Refused, match="404"):
        call(url, TOKEN, "/nowhere", {})
    assert [b["job_id"] for b in seen] == ["42", "7"]


def test_metrics_are_open_to_get_and_a_bad_body_is_a_400(control):
    url, _ = control
    assert urllib.request.urlopen(f"{url}/metrics", timeout=5).read() == b"x 1\n"
    req = urllib.request.Request(
        f"{url}/register", b"[1, 2]", {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 400


def test_the_front_ends_metrics_are_read_by_name_and_replica():
    page = """# HELP llmlaunch_frontend_in_flight requests running on the replica
# TYPE llmlaunch_frontend_in_flight gauge
llmlaunch_frontend_in_flight{replica="0",addr="10.0.0.1:9001"} 3
llmlaunch_frontend_in_flight{replica="2",addr="10.0.0.2:9001"} 0
llmlaunch_frontend_members_version 7
"""
    seen = parse(page)
    assert seen[("llmlaunch_frontend_in_flight", "0")] == 3
    assert seen[("llmlaunch_frontend_in_flight", "2")] == 0
    assert seen[("llmlaunch_frontend_members_version", "")] == 7
