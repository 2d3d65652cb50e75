"""What a service may scale by (serve.autoscale.signal): each signal's meaning and the bounds it takes where none are
given. A signal is either a load the serving replicas share (in_flight, kv_cache: its bounds are per replica, and the
load divided by up_at is the replicas it needs) or a latency of the service as a whole (ttft_p90: one replica more or
fewer at a time). launcher/validate.py checks a launch's bounds against these; the router reads each signal's value
as launcher/service/signals.py says and applies the bounds by launcher/service/policy.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Signal:
    name: str
    shared: bool  # a load the serving replicas share (per-replica bounds), or a latency of the whole service
    unit: str  # what its bounds are, for errors, decisions and docs
    up_at: Optional[float]  # serve.autoscale.up_at where it is 0; None: the user must give one
    down_share: float  # serve.autoscale.down_at where it is 0: this share of up_at
    most: Optional[float] = None  # the largest bound that means anything (a share of the KV cache: 1)
    engine_fact: str = ""  # the launcher.engines Engine fact an engine needs to report it ("" any engine)


SIGNALS: Dict[str, Signal] = {
    s.name: s
    for s in (
        Signal(
            "in_flight",
            True,
            "requests running or queued per serving replica, as the front end counts them",
            8.0,
            0.5,
        ),
        Signal(
            "kv_cache",
            True,
            "the share of a replica's KV cache its running requests hold (0..1), as its engine reports it",
            0.8,
            0.5,
            most=1.0,
            engine_fact="kv_usage",
        ),
        Signal(
            "ttft_p90",
            False,
            "milliseconds: the p90 of the times to first token the front end measured over the last window_s",
            None,
            0.5,
        ),
    )
}


def bounds(signal: str, up_at: float, down_at: float) -> Tuple[Optional[float], float]:
    """(up_at, down_at) as the service applies them: 0 takes the signal's own (up_at None: it has none)."""
    s = SIGNALS[signal]
    up = up_at or s.up_at
    down = down_at or (up * s.down_share if up is not None else 0.0)
    return up, down
