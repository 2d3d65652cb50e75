"""The router reads Prometheus pages for what it decides by: the front end's own (launcher/frontend/metrics.py: each
replica's requests in flight, the members version every front-end process applied, its first-token histogram) and,
for serve.autoscale.signal=kv_cache, each replica's tritonserver metrics (its engine's KV-cache use)."""

from __future__ import annotations

import asyncio
import re
from typing import Dict, Optional, Tuple

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)$")
_KEY_LABEL = re.compile(r'(?:replica|le)="([^"]*)"')


def parse(text: str) -> Dict[Tuple[str, str], float]:
    """(metric name, its replica label, or a histogram bucket's le, or "") -> value, for every sample line of a
    Prometheus text page."""
    out: Dict[Tuple[str, str], float] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m or line.startswith("#"):
            continue
        replica = _KEY_LABEL.search(m.group(2) or "")
        try:
            out[(m.group(1), replica.group(1) if replica else "")] = float(m.group(3))
        except ValueError:
            continue
    return out


async def fetch(url: str, timeout_s: float = 2.0) -> Optional[str]:
    """GET `url` (http://host:port/path) on a plain connection; its body, None where it does not answer in time."""
    host_port, _, path = url.removeprefix("http://").partition("/")
    host, _, port = host_port.rpartition(":")
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout_s)
        writer.write(f"GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), timeout_s)
        writer.close()
    except (OSError, asyncio.TimeoutError, ValueError):
        return None
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0]
    return body.decode(errors="replace") if status_line.split(b" ")[1:2] == [b"200"] else None
