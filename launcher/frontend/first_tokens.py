"""Time to first token as the front end sees it: from a streamed request's arrival to its first response passed back
to the client (both APIs: the OpenAI API reaches the replicas through the front end's gRPC port). Counted in a
Prometheus histogram, llmlaunch_frontend_first_token_seconds, whose buckets several front-end processes add up
(launcher/frontend/workers.py shares them as plain counters), and from which a service's router takes the p90 of the
last window (serve.autoscale.signal=ttft_p90: the bucket counts now less those a window ago, `quantile`)."""

from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Sequence

NAME = "llmlaunch_frontend_first_token_seconds"
# the buckets' upper bounds, seconds: fine where TTFT targets are set (tens of ms to a few seconds), +Inf beyond
BOUNDS = (
    0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0,
    7.5, 10.0, 15.0, 20.0, 30.0, 60.0,
)  # fmt: skip
# the counters a front end keeps of them (snapshot keys): a count per bucket (not cumulative), +Inf's, and the sum
KEYS = tuple(f"first_token_le_{i}" for i in range(len(BOUNDS) + 1)) + ("first_token_us_sum",)


class FirstTokens:
    """The histogram one front-end process keeps (its event loop only: no lock)."""

    def __init__(self):
        self.counts = [0] * (len(BOUNDS) + 1)
        self.us_sum = 0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BOUNDS, seconds)] += 1
        self.us_sum += int(seconds * 1e6)

    def snapshot(self) -> Dict[str, int]:
        return {**dict(zip(KEYS, self.counts)), KEYS[-1]: self.us_sum}


def lines(snap: dict) -> List[str]:
    """The histogram's Prometheus lines from a snapshot's KEYS (one process's, or several added up)."""
    out = [
        f"# HELP {NAME} seconds from a streamed request's arrival at the front end to its first response passed back",
        f"# TYPE {NAME} histogram",
    ]
    total = 0
    for i, bound in enumerate((*BOUNDS, None)):
        total += int(snap.get(KEYS[i], 0))
        out.append(f'{NAME}_bucket{{le="{"+Inf" if bound is None else f"{bound:g}"}"}} {total}')
    out += [f"{NAME}_sum {int(snap.get(KEYS[-1], 0)) / 1e6:.6f}", f"{NAME}_count {total}"]
    return out


def buckets(page: Dict[tuple, float]) -> Optional[List[float]]:
    """The cumulative bucket counts, in BOUNDS' order then +Inf, from a parsed /metrics page
    (launcher/service/scrape.py parse: (name, le) keys); None where the page has no histogram."""
    keys = [(f"{NAME}_bucket", f"{b:g}") for b in BOUNDS] + [(f"{NAME}_bucket", "+Inf")]
    if keys[-1] not in page:
        return None
    return [page.get(k, 0.0) for k in keys]


def quantile(q: float, now: Sequence[float], before: Sequence[float]) -> Optional[float]:
    """The q-quantile, in seconds, of the first tokens counted between two readings of the cumulative buckets
    (`before`, then `now`): linear within the bucket it falls in (so good to a bucket's width); the last finite bound
    where it falls beyond them; None where none was counted."""
    delta = [max(0.0, n - b) for n, b in zip(now, before)]  # cumulative still
    total = delta[-1]
    if total <= 0:
        return None
    rank = q * total
    i = bisect.bisect_left(delta, rank)
    if i >= len(BOUNDS):
        return BOUNDS[-1]
    lo_bound, lo_count = (BOUNDS[i - 1], delta[i - 1]) if i else (0.0, 0.0)
    in_bucket = delta[i] - lo_count
    share = (rank - lo_count) / in_bucket if in_bucket > 0 else 1.0
    return lo_bound + share * (BOUNDS[i] - lo_bound)
