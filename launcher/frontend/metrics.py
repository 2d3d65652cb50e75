"""The front end's Prometheus counters: their text, and a minimal HTTP server for GET /metrics."""

from __future__ import annotations

import asyncio
import inspect
from typing import Sequence

from launcher.frontend import first_tokens

_METRICS = (
    # (key, name, type, help)
    ("up", "llmlaunch_frontend_replica_up", "gauge", "1 when the front end routes requests to the replica"),
    ("in_flight", "llmlaunch_frontend_in_flight", "gauge", "requests running on the replica"),
    ("requests", "llmlaunch_frontend_requests_total", "counter", "requests routed to the replica"),
    ("responses", "llmlaunch_frontend_responses_total", "counter", "responses passed back from the replica"),
    ("errors", "llmlaunch_frontend_errors_total", "counter", "requests on the replica that ended in an error"),
    ("failures", "llmlaunch_frontend_replica_failures_total", "counter", "times the replica was marked down"),
    (
        "recoveries",
        "llmlaunch_frontend_replica_recoveries_total",
        "counter",
        "times the replica was marked up again after it was down (its server restarted in place, or answered again)",
    ),
    (
        "retried",
        "llmlaunch_frontend_retried_total",
        "counter",
        "requests moved to another replica after this one failed before answering them",
    ),
    (
        "migrated",
        "llmlaunch_frontend_migrated_total",
        "counter",
        "requests moved to another replica mid-stream after this one failed while generating them (they go on after "
        "the tokens their clients had)",
    ),
    (
        "trips",
        "llmlaunch_frontend_circuit_breaker_trips_total",
        "counter",
        "times the replica was taken out of routing because its requests failed with server errors in a row "
        "(serve.breaker_errors)",
    ),
    (
        "prompt_blocks",
        "llmlaunch_frontend_prompt_blocks_total",
        "counter",
        "prompt blocks of the requests routed to the replica by prefix: 256 bytes of text (serve.routing=prefix), "
        "the engines' token blocks (serve.routing=kv)",
    ),
    (
        "predicted_blocks",
        "llmlaunch_frontend_predicted_cached_blocks_total",
        "counter",
        "of those, the leading blocks the front end had sent the replica before (prefix: its prefix cache may hold "
        "them), or its engine held as the request was routed (kv)",
    ),
)
# a front end following a members file (launcher/frontend/members.py) only: shown for its members, by slot
_DRAINING = (
    "draining",
    "llmlaunch_frontend_replica_draining",
    "gauge",
    "1 while the replica drains: no new request goes to it, those running there go on (its in_flight falls to 0)",
)
# what a snapshot (Frontend.snapshot) gives of each replica, and the shared memory of several workers keeps
REPLICA_KEYS = tuple(k for k, *_ in _METRICS) + (_DRAINING[0],)
MEMBERS_VERSION = "llmlaunch_frontend_members_version"


def metrics_text(snap: dict, addrs: Sequence[str], processes: int = 1) -> str:
    """The front end's own counters, for a fixed list of replicas (their addresses `addrs`, in its order)."""
    lines = []
    for key, name, kind, help_ in _METRICS:
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        for i, (addr, r) in enumerate(zip(addrs, snap["replicas"])):
            lines.append(f'{name}{{replica="{i}",addr="{addr}"}} {r[key]}')
    return "\n".join(lines + _totals(snap, processes)) + "\n"


def members_text(snap: dict, members: Sequence, processes: int = 1) -> str:
    """The front end's own counters where a members file names the replicas: a line per member (launcher/frontend/
    members.py's Member) and counter, labelled with its slot, name and address (a slot no member holds is left
    out), the draining gauge beside the others, and the version of the file applied (several workers: the lowest
    any of them applied, so a change is everywhere once it shows)."""
    rows = snap["replicas"]
    held = [m for m in members if 0 <= m.slot < len(rows)]
    lines = []
    for key, name, kind, help_ in (*_METRICS, _DRAINING):
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}"]
        for m in held:
            lines.append(
                f'{name}{{replica="{m.slot}",name="{_label(m.name)}",addr="{_label(m.addr)}"}} {rows[m.slot][key]}'
            )
    lines += [
        f"# HELP {MEMBERS_VERSION} the version of the members file the front end applied (the lowest of its workers)",
        f"# TYPE {MEMBERS_VERSION} gauge",
        f"{MEMBERS_VERSION} {snap['members_version']}",
    ]
    return "\n".join(lines + _totals(snap, processes)) + "\n"


def _label(value: str) -> str:
    """A Prometheus label value: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _totals(snap: dict, processes: int) -> list:
    """The lines of the front end as a whole."""
    return [
        "# HELP llmlaunch_frontend_streams_active client ModelStreamInfer streams open",
        "# TYPE llmlaunch_frontend_streams_active gauge",
        f"llmlaunch_frontend_streams_active {snap['streams_active']}",
        "# HELP llmlaunch_frontend_rejected_total requests refused because no replica was up",
        "# TYPE llmlaunch_frontend_rejected_total counter",
        f"llmlaunch_frontend_rejected_total {snap['rejected']}",
        "# HELP llmlaunch_frontend_processes front-end worker processes sharing the gRPC port",
        "# TYPE llmlaunch_frontend_processes gauge",
        f"llmlaunch_frontend_processes {processes}",
        *first_tokens.lines(snap),
    ]


ENGINE_PROMPT_TOKENS = "llmlaunch_frontend_replica_prompt_tokens_total"
# keys and values a decode replica moved from prefill replicas (disagg): its engine's llmlaunch_kv_transfer* counters
REPLICA_KV_TRANSFERS = (
    (
        "llmlaunch_frontend_replica_kv_transfers_total",
        "transfers from prefill replicas: done, and failed (computed here instead)",
        (("done", "kv_transfers"), ("failed", "kv_transfer_failures")),
    ),
    (
        "llmlaunch_frontend_replica_kv_transfer_bytes_total",
        "bytes of keys and values moved in",
        ((None, "kv_transfer_bytes"),),
    ),
    (
        "llmlaunch_frontend_replica_kv_transfer_seconds_total",
        "seconds the moves took, summed",
        ((None, "kv_transfer_s"),),
    ),
)


async def engine_lines(
    addrs: Sequence[str], urls: Sequence[str], timeout_s: float = 2.0, indexes: Sequence[int] = ()
) -> list:
    """The replicas' engines' prefix-cache counters (launcher/python_backend/timings.py: the prompt tokens admitted,
    and those served from the cache) and, where a replica moved keys and values from prefill replicas, its
    transfers, read from each replica leader's tritonserver metrics as this page is asked for, one line per replica
    and kind; a replica whose metrics cannot be read (or whose engine counts none) has
    none.  indexes: each replica's `replica` label (a members file's slots; by default their order)."""
    from launcher.python_backend.timings import fetch_metrics_text, read_engine_metrics

    async def read(url: str):
        if not url:
            return None
        try:
            return read_engine_metrics(await asyncio.to_thread(fetch_metrics_text, url, timeout_s))
        except Exception:  # noqa: BLE001 - a replica that is down or busy: its lines are left out this time
            return None

    counts = await asyncio.gather(*(read(u) for u in urls))
    lines = [
        f"# HELP {ENGINE_PROMPT_TOKENS} prompt tokens the replica's engine admitted, and of those served from its "
        "prefix cache, not prefilled (kind=cached), as its tritonserver's metrics report them",
        f"# TYPE {ENGINE_PROMPT_TOKENS} counter",
    ]
    replicas = [(i, addr, c) for i, addr, c in zip(indexes or range(len(addrs)), addrs, counts) if c is not None]
    for i, addr, c in replicas:
        if not c["prompt_tokens"]:
            continue
        for kind, key in (("admitted", "prompt_tokens"), ("cached", "cached_prompt_tokens")):
            lines.append(f'{ENGINE_PROMPT_TOKENS}{{replica="{i}",addr="{addr}",kind="{kind}"}} {int(c[key])}')
    moved = [(i, addr, c) for i, addr, c in replicas if c["kv_transfers"] or c["kv_transfer_failures"]]
    for name, doc, kinds in REPLICA_KV_TRANSFERS if moved else ():
        lines += [f"# HELP {name} {doc}, as the replica's tritonserver metrics report them", f"# TYPE {name} counter"]
        for (i, addr, c), (kind, key) in ((r, k) for r in moved for k in kinds):
            label = f',kind="{kind}"' if kind else ""
            lines.append(f'{name}{{replica="{i}",addr="{addr}"{label}}} {c[key]:g}')
    return lines


def with_engines(text, addrs: Sequence[str], urls: Sequence[str]):
    """The /metrics page: `text()` (the front end's own counters) and, where `urls` name the replicas' metrics,
    their engines' prompt tokens beside (`engine_lines`)."""

    async def page() -> str:
        own = text()
        if not any(urls):
            return own
        return own + "\n".join(await engine_lines(addrs, urls)) + "\n"

    return page


def with_member_engines(text, members):
    """with_engines for a members file's replicas: `members()` (the Members now) name their metrics URLs."""

    async def page() -> str:
        own = text()
        held = [m for m in members() if m.metrics_url]
        if not held:
            return own
        lines = await engine_lines(
            [m.addr for m in held], [m.metrics_url for m in held], indexes=[m.slot for m in held]
        )
        return own + "\n".join(lines) + "\n"

    return page


async def _serve_metrics(host: str, port: int, text, own=None):
    """A minimal HTTP/1.1 responder: GET /metrics (or /) -> the Prometheus text (`text()`, a string or an awaitable
    of one); GET /metrics/frontend -> `own()`, the front end's own counters without its replicas' engine lines (what a
    service's router reads each second: it asks no replica anything); anything else 404."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 10)
            while True:  # skip the headers
                h = await asyncio.wait_for(reader.readline(), 10)
                if h in (b"\r\n", b"\n", b""):
                    break
            parts = line.split()
            path = parts[1].split(b"?")[0] if len(parts) >= 2 else b""
            if parts[:1] in ([b"GET"], [b"HEAD"]) and path in (b"/metrics", b"/", b"/metrics/frontend"):
                page = own() if own is not None and path == b"/metrics/frontend" else text()
                status, body = "200 OK", (await page if inspect.isawaitable(page) else page).encode()
            else:
                status, body = "404 Not Found", b"try GET /metrics\n"
            head = f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            writer.write(head.encode() + (body if parts[:1] != [b"HEAD"] else b""))
            await writer.drain()
        except (asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port, reuse_address=True)
