"""The service's rules (launcher/service/policy.py): when a replica job's successor is due, and what the load asks
of the replica count."""

from __future__ import annotations

from launcher.service.policy import Scaling, expected, handover_at, scale

RULE = Scaling(min_replicas=1, max_replicas=4, up_at=8, down_at=2, window_s=20, up_cooldown_s=30, down_cooldown_s=60)
NEVER = float("-inf")


def steady(load: float, serving: int, until: float = 100.0, every: float = 1.0, since: float = 0.0):
    out, t = [], since
    while t <= until:
        out.append((t, load, serving))
        t += every
    return out


def test_the_successor_is_due_its_queue_wait_and_load_time_plus_the_margin_before_the_job_must_drain():
    assert handover_at(end_time=1000, queue_wait_s=5, ready_s=40, margin_s=60) == 895
    assert handover_at(end_time=1000, queue_wait_s=5, ready_s=40, margin_s=60, drain_s=40) == 855


def test_the_expected_time_is_the_slowest_of_the_last_three_and_the_default_before_any():
    assert expected([], 120) == 120
    assert expected([90, 10, 20, 30], 120) == 30
    assert expected([10, 50, 20], 120) == 50


def test_a_load_above_the_bound_for_the_whole_window_scales_to_load_over_up_at():
    d = scale(RULE, target=1, samples=steady(30, 1), now=100, last_up=NEVER, last_down=NEVER)
    assert d is not None and d.target == 4  # ceil(30 / 8)
    assert "above up_at=8" in d.reason


def test_one_dip_below_the_bound_in_the_window_holds_the_target():
    samples = steady(30, 1)
    samples[-5] = (samples[-5][0], 4, 1)
    assert scale(RULE, 1, samples, now=100, last_up=NEVER, last_down=NEVER) is None


def test_a_window_not_yet_measured_decides_nothing():
    assert scale(RULE, 1, steady(30, 1, since=90), now=100, last_up=NEVER, last_down=NEVER) is None


def test_scaling_up_stops_at_max_and_waits_out_its_cool_down():
    assert scale(RULE, 4, steady(100, 4), now=100, last_up=NEVER, last_down=NEVER) is None
    assert scale(RULE, 2, steady(40, 2), now=100, last_up=80, last_down=NEVER) is None
    d = scale(RULE, 2, steady(40, 2), now=100, last_up=60, last_down=NEVER)
    assert d is not None and d.target == 4


def test_one_more_at_least_when_the_load_divided_asks_for_no_more_than_there_are():
    d = scale(RULE, 3, steady(27, 3), now=100, last_up=NEVER, last_down=NEVER)  # 9 a replica; ceil(27/8) = 4
    assert d.target == 4
    d = scale(RULE, 2, steady(17, 2), now=100, last_up=NEVER, last_down=NEVER)  # 8.5 a replica; ceil(17/8) = 3
    assert d.target == 3


def test_a_low_load_with_one_replica_fewer_gives_one_back_down_to_min():
    d = scale(RULE, 3, steady(2, 3), now=100, last_up=NEVER, last_down=NEVER)  # 1 a replica with 2
    assert d is not None and d.target == 2 and "below down_at=2" in d.reason
    assert scale(RULE, 1, steady(0, 1), now=100, last_up=NEVER, last_down=NEVER) is None


def test_scaling_down_waits_when_one_fewer_would_cross_the_bound_and_after_either_change():
    assert scale(RULE, 3, steady(5, 3), now=100, last_up=NEVER, last_down=NEVER) is None  # 2.5 a replica with 2
    assert scale(RULE, 3, steady(2, 3), now=100, last_up=NEVER, last_down=50) is None  # down cool-down: 60 s
    assert scale(RULE, 3, steady(2, 3), now=100, last_up=80, last_down=NEVER) is None  # up cool-down: 30 s


LATENCY = Scaling(1, 4, up_at=500, down_at=200, window_s=20, up_cooldown_s=30, down_cooldown_s=60, signal="ttft_p90",
                  shared=False)  # fmt: skip


def test_a_latency_above_its_target_adds_one_replica_at_a_time_and_below_down_at_gives_one_back():
    d = scale(LATENCY, 1, steady(900, 1), now=100, last_up=NEVER, last_down=NEVER)
    assert d is not None and d.target == 2 and "ttft_p90 900" in d.reason and "above up_at=500" in d.reason
    d = scale(LATENCY, 3, steady(150, 3), now=100, last_up=NEVER, last_down=NEVER)
    assert d is not None and d.target == 2 and "below down_at=200" in d.reason
    assert scale(LATENCY, 2, steady(300, 2), now=100, last_up=NEVER, last_down=NEVER) is None  # between the bounds


def test_a_latency_is_judged_by_its_latest_window_once_a_whole_window_was_read():
    samples = steady(100, 2, until=99) + [(100.0, 700.0, 2)]  # the p90 over the last window: already a whole window
    assert scale(LATENCY, 2, samples, now=100, last_up=NEVER, last_down=NEVER).target == 3
    assert scale(LATENCY, 2, steady(900, 2, since=90), now=100, last_up=NEVER, last_down=NEVER) is None
    assert scale(LATENCY, 4, steady(900, 4), now=100, last_up=NEVER, last_down=NEVER) is None  # at max
    assert scale(LATENCY, 2, steady(900, 2), now=100, last_up=80, last_down=NEVER) is None  # its cool-down
