"""The service's decisions as pure functions of what it measured: when a replica job's successor is due, and how many
replica jobs the load asks for (serve.autoscale). The controller (launcher/service/controller.py) gathers the facts
and acts; nothing here reads a clock or a file, so each rule is tested on its own (tests/unit/test_service_policy.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

# A replica job's deferred drain (launcher/rank/join.py) starts this long before it must end: its ranks' own exit and
# the batch script's teardown after the drain
DRAIN_SLACK_S = 10.0


def handover_at(end_time: float, queue_wait_s: float, ready_s: float, margin_s: float, drain_s: float = 0) -> float:
    """When a replica job ending at `end_time` (Slurm's EndTime) needs its successor submitted: early enough that the
    successor, queued for `queue_wait_s` and loading for `ready_s` as the service's replica jobs did, serves
    `margin_s` before the job must start draining to end by its limit (`drain_s` before it: serve.drain_timeout_s and
    the ranks' exit; launcher/rank/join.py defers Slurm's time-limit signal until then)."""
    return end_time - (drain_s + queue_wait_s + ready_s + margin_s)


def expected(samples: Sequence[float], default: float) -> float:
    """What the next job will likely take, from what the last ones took (`samples`, newest last): the largest of the
    last three, so one fast start does not make the next handover late; `default` before any was measured."""
    return max(samples[-3:]) if samples else default


@dataclass(frozen=True)
class Scaling:
    """serve.autoscale as the policy reads it (launcher/schema.py AutoscaleConfig has each field's meaning)."""

    min_replicas: int
    max_replicas: int
    up_at: float
    down_at: float
    window_s: float
    up_cooldown_s: float
    down_cooldown_s: float
    signal: str = "in_flight"  # its name, in the reasons given
    shared: bool = True  # a load the replicas share (launcher/service/signals.py), or a latency of the whole service


@dataclass(frozen=True)
class Decision:
    """A change of the target: the replica jobs wanted, and why (logged, shown by llmlaunch-status and /metrics)."""

    target: int
    reason: str


def scale(
    rule: Scaling,
    target: int,
    samples: Sequence[Tuple[float, float, int]],
    now: float,
    last_up: float,
    last_down: float,
) -> Optional[Decision]:
    """The new target, or None to keep `target`.  samples: (time, the signal's value, replicas serving), oldest
    first, covering at least the window; last_up / last_down: when the target last rose / fell.  Each change waits
    out its cool-down; a scale-down also waits out the scale-up's.
    A shared load (in_flight, kv_cache: the value is the serving replicas' total): up when the load per serving
    replica stayed above up_at for the whole window -> as many replicas as the window's mean load divided by up_at
    asks for (one more at least), up to max_replicas; down when it stayed below down_at for the whole window, counted
    as if one replica fewer served it -> one fewer, down to min_replicas (one at a time: the one given back is
    drained first).
    A latency (ttft_p90: the value is already taken over the window): one more when it is above up_at, one fewer
    when it is below down_at."""
    if not samples or samples[0][0] > now - rule.window_s:
        return None  # not a whole window measured yet
    window = [s for s in samples if s[0] >= now - rule.window_s] or [samples[-1]]
    can_up = target < rule.max_replicas and now - last_up >= rule.up_cooldown_s
    can_down = (
        target > rule.min_replicas and now - last_down >= rule.down_cooldown_s and now - last_up >= rule.up_cooldown_s
    )
    if not rule.shared:
        value = window[-1][1]
        if can_up and value > rule.up_at:
            return Decision(
                target + 1, f"{rule.signal} {value:.0f} over the last {rule.window_s:g}s is above up_at={rule.up_at:g}"
            )
        if can_down and value < rule.down_at:
            return Decision(
                target - 1,
                f"{rule.signal} {value:.0f} over the last {rule.window_s:g}s is below down_at={rule.down_at:g}",
            )
        return None
    per_replica = [load / max(serving, 1) for _, load, serving in window]
    if can_up and min(per_replica) > rule.up_at:
        mean_load = sum(load for _, load, _ in window) / len(window)
        want = min(rule.max_replicas, max(target + 1, math.ceil(mean_load / rule.up_at)))
        return Decision(
            want,
            f"{rule.signal} per replica stayed above up_at={rule.up_at:g} for {rule.window_s:g}s "
            f"(min {min(per_replica):.2f}, mean load {mean_load:.2f} over {window[-1][2]} serving)",
        )
    if can_down and all(load / max(serving - 1, 1) < rule.down_at for _, load, serving in window):
        peak = max(load for _, load, _ in window)
        return Decision(
            target - 1,
            f"{rule.signal} per replica would stay below down_at={rule.down_at:g} with one replica fewer for "
            f"{rule.window_s:g}s (peak load {peak:.2f})",
        )
    return None
