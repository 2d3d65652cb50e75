"""What the router shows of the service: service/status.json each second (llmlaunch-status reads it) and its
/metrics page on the control port."""

from __future__ import annotations

import collections
import time


def write_status(c) -> None:
    """The controller `c`'s view now, to service/status.json."""
    auto = c.auto
    c.sdir.write_json(
        c.sdir.status_file,
        {
            "time": time.time(),
            "target": c.target,
            "serving": sum(1 for j in c.jobs.values() if j.state == "serving"),
            "replacements": c.replacements,
            "endpoint": bool(c.serving_since),
            "stopping": c.stopping,
            "autoscale": {
                "min": auto.min_replicas,
                "max": auto.max_replicas,
                "signal": auto.signal,
                "up_at": c.rule.up_at,
                "down_at": c.rule.down_at,
                "window_s": auto.window_s,
                "value": c.signal_now,
            }
            if auto.max_replicas
            else None,
            "jobs": [j.view() for j in c.jobs.values()],
            "in_flight": c.in_flight,
        },
    )


def metrics_text(c) -> str:
    """The controller `c`'s Prometheus page: its target, its jobs by state, its decisions, the signal it scales by."""
    states = collections.Counter(j.state for j in c.jobs.values())
    lines = [
        "# HELP llmlaunch_service_target_replicas replica jobs the service wants",
        "# TYPE llmlaunch_service_target_replicas gauge",
        f"llmlaunch_service_target_replicas {c.target}",
        "# HELP llmlaunch_service_replica_jobs replica jobs by state",
        "# TYPE llmlaunch_service_replica_jobs gauge",
        *(
            f'llmlaunch_service_replica_jobs{{state="{s}"}} {states.get(s, 0)}'
            for s in ("pending", "starting", "serving", "draining", "ended")
        ),
        "# HELP llmlaunch_service_decisions_total the router's decisions by action (service/decisions.jsonl)",
        "# TYPE llmlaunch_service_decisions_total counter",
        *(f'llmlaunch_service_decisions_total{{action="{a}"}} {n}' for a, n in sorted(c.counts.items())),
        "# HELP llmlaunch_service_replacements_total failed replica jobs replaced",
        "# TYPE llmlaunch_service_replacements_total counter",
        f"llmlaunch_service_replacements_total {c.replacements}",
    ]
    if c.auto.max_replicas and c.signal_now is not None:
        lines += [
            "# HELP llmlaunch_service_signal what serve.autoscale scales by, as the router last measured it: for "
            "in_flight and kv_cache per serving replica, for ttft_p90 in ms over the window",
            "# TYPE llmlaunch_service_signal gauge",
            f'llmlaunch_service_signal{{signal="{c.auto.signal}"}} {c.signal_now:g}',
        ]
    return "\n".join(lines) + "\n"
