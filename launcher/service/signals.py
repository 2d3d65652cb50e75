"""How the router takes each serve.autoscale signal's value (launcher/scale_signals.py says what each means) from what
it reads each second (launcher/service/controller.py measure): the front end's own counters, its first-token
histogram, the serving replicas' tritonserver metrics. READERS holds one reader per signal."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable, Callable, Dict, List, Optional, Sequence, Tuple

from launcher.frontend import first_tokens
from launcher.python_backend.timings import ENGINE_KV_USAGE
from launcher.service import scrape


@dataclass(frozen=True)
class Reading:
    """What the router read this tick, for a signal to take its value from."""

    now: float
    in_flight: int  # requests in flight through the front end
    serving: int  # replicas serving
    metrics_urls: Sequence[str]  # the serving replicas' tritonserver metrics (where they gave one)
    first_tokens: Sequence[Tuple[float, List[float]]]  # (time, the front end's cumulative first-token buckets)
    window_s: float


async def _in_flight(r: Reading) -> Optional[float]:
    return float(r.in_flight)


async def _kv_cache(r: Reading) -> Optional[float]:
    pages = await asyncio.gather(*(scrape.fetch(u) for u in r.metrics_urls))
    return kv_load([scrape.parse(p) if p is not None else None for p in pages], r.serving)


async def _ttft_p90(r: Reading) -> Optional[float]:
    return ttft_p90_ms(r.first_tokens, r.now, r.window_s)


# each signal's value now from a Reading: the serving replicas' total for a shared load; None where it cannot be told
READERS: Dict[str, Callable[[Reading], Awaitable[Optional[float]]]] = {
    "in_flight": _in_flight,
    "kv_cache": _kv_cache,
    "ttft_p90": _ttft_p90,
}

KV_USAGE = ENGINE_KV_USAGE  # the gauge engines set (launcher/python_backend/timings.py ENGINE_GAUGES)


def kv_load(pages: Sequence[Optional[Dict[tuple, float]]], serving: int) -> Optional[float]:
    """The KV-cache load of the serving replicas, in replicas' worth (the sum of their shares in use), from their
    tritonserver metrics pages (parsed; None where one did not answer): the replicas read stand for those that were
    not; None where none was."""
    shares = [p[(KV_USAGE, "")] for p in pages if p is not None and (KV_USAGE, "") in p]
    if not shares:
        return None
    return sum(shares) / len(shares) * serving


def ttft_p90_ms(history: Sequence[Tuple[float, List[float]]], now: float, window_s: float) -> Optional[float]:
    """The p90, in ms, of the first tokens counted over the last `window_s`, from the front end's cumulative buckets
    read at each tick (`history`: (time, buckets), oldest first); 0 where the window counted none (an idle service
    is as fast as it gets); None until a whole window was read."""
    if not history or history[0][0] > now - window_s:
        return None
    start = next((b for t, b in reversed(history) if t <= now - window_s), history[0][1])
    q = first_tokens.quantile(0.9, history[-1][1], start)
    return 0.0 if q is None else 1000.0 * q
