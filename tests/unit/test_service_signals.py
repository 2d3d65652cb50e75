"""What a service scales by (launcher/service/signals.py) and the front end's first-token histogram it reads for
ttft_p90 (launcher/frontend/first_tokens.py): bounds, quantiles from bucket deltas, the KV-cache load of replicas."""

from __future__ import annotations

import asyncio

import pytest

from launcher.domains import SCALE_SIGNALS
from launcher.frontend import first_tokens
from launcher.frontend.first_tokens import BOUNDS, FirstTokens, buckets, lines, quantile
from launcher.scale_signals import SIGNALS, bounds
from launcher.service.scrape import parse
from launcher.service.signals import KV_USAGE, READERS, Reading, kv_load, ttft_p90_ms


def test_every_signal_the_schema_offers_has_an_entry_that_reads_it():
    assert set(SIGNALS) == set(SCALE_SIGNALS) == set(READERS)


def test_bounds_left_zero_take_the_signals_own_and_down_at_half_of_up_at():
    assert bounds("in_flight", 0, 0) == (8.0, 4.0)
    assert bounds("kv_cache", 0, 0) == (0.8, 0.4)
    assert bounds("ttft_p90", 0, 0) == (None, 0.0)  # no target of its own: validation asks for one
    assert bounds("ttft_p90", 500, 0) == (500, 250)
    assert bounds("in_flight", 16, 3) == (16, 3)


def histogram(seconds):
    h = FirstTokens()
    for s in seconds:
        h.observe(s)
    return h


def cumulative(h: FirstTokens):
    return buckets(parse("\n".join(lines(h.snapshot()))))


def test_the_histogram_reads_back_as_prometheus_buckets_and_its_quantile_falls_in_the_right_bucket():
    h = histogram([0.04] * 80 + [0.6] * 20)  # 80 in (0.03, 0.05], 20 in (0.5, 0.75]
    text = "\n".join(lines(h.snapshot()))
    assert f'{first_tokens.NAME}_bucket{{le="+Inf"}} 100' in text and f"{first_tokens.NAME}_count 100" in text
    assert f"{first_tokens.NAME}_sum 15.200000" in text  # 80 x 0.04 + 20 x 0.6
    now = cumulative(h)
    assert len(now) == len(BOUNDS) + 1 and now[-1] == 100
    zero = [0.0] * len(now)
    assert 0.5 < quantile(0.9, now, zero) <= 0.75  # the 90th of 100 is in the 0.6 s group
    assert 0.03 < quantile(0.5, now, zero) <= 0.05
    assert quantile(0.9, now, now) is None  # nothing counted between the two readings
    assert quantile(0.9, cumulative(histogram([100.0])), zero) == BOUNDS[-1]  # beyond the last bound


def test_ttft_p90_takes_the_first_tokens_of_the_last_window_only():
    none = [0.0] * (len(BOUNDS) + 1)
    slow = cumulative(histogram([2.0] * 50))  # 50 slow first tokens by t=10
    fast_after = cumulative(histogram([2.0] * 50 + [0.01] * 100))  # then 100 fast ones by t=50
    history = (
        [(t, none) for t in range(0, 10)]
        + [(t, slow) for t in range(10, 50)]
        + [(t, fast_after) for t in range(50, 61)]
    )
    p90 = ttft_p90_ms(history, now=60, window_s=20)
    assert p90 is not None and 5 < p90 <= 10  # only the fast ones came in the last 20 s
    assert ttft_p90_ms(history, now=60, window_s=55) > 1500  # a window reaching back over the slow ones
    assert ttft_p90_ms([(t, slow) for t in range(0, 61)], now=60, window_s=20) == 0.0  # none in the window: idle
    assert ttft_p90_ms(history[-5:], now=60, window_s=20) is None  # not a whole window read yet


def test_the_kv_cache_load_is_the_serving_replicas_shares_with_those_unread_counted_as_the_others():
    page = lambda share: parse(f'{KV_USAGE}{{model="m"}} {share}\n')  # noqa: E731
    assert kv_load([page(0.5), page(0.9)], serving=2) == pytest.approx(1.4)
    assert kv_load([page(0.5), None], serving=2) == pytest.approx(1.0)
    assert kv_load([None, parse("other 1\n")], serving=2) is None


def test_each_signal_reads_its_value_from_a_reading():
    h = cumulative(histogram([0.3] * 10))
    r = Reading(now=30, in_flight=12, serving=3, metrics_urls=[], first_tokens=[(0, [0.0] * len(h)), (30, h)],
                window_s=20)  # fmt: skip
    assert asyncio.run(READERS["in_flight"](r)) == 12.0
    assert asyncio.run(READERS["kv_cache"](r)) is None  # no replica to read
    assert 200 < asyncio.run(READERS["ttft_p90"](r)) <= 300
