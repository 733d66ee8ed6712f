"""The streaming quantiles behind the latency summaries (stubhost/server/quantiles.py), checked
against numpy: every answer lies within its target's rank error, the sliding window keeps what
prometheus-cpp's age buckets keep, and count and sum count everything."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stubhost.server.metrics_config import DEFAULT_QUANTILES
from stubhost.server.quantiles import TargetedQuantiles, WindowedSummary

SECOND = 1_000_000_000

# Latencies in whole µs (what the summaries see), with many repeats, or arbitrary floats.
values_st = st.one_of(
    st.lists(st.integers(0, 2000).map(float), min_size=1, max_size=3000),
    st.lists(st.floats(-1e9, 1e9, allow_nan=False, allow_infinity=False), min_size=1, max_size=3000),
)
targets_st = st.lists(st.tuples(st.floats(0.01, 0.99), st.sampled_from([0.001, 0.005, 0.01, 0.05, 0.1])),
                      min_size=1, max_size=5)


def rank_range(data: np.ndarray, value: float) -> tuple[int, int]:
    """The 1-based ranks `value` holds in `data` (a range, for repeated values)."""
    ordered = np.sort(data)
    return int(np.searchsorted(ordered, value, "left")) + 1, int(np.searchsorted(ordered, value, "right"))


def assert_within(data: np.ndarray, phi: float, eps: float, answer: float) -> None:
    """`answer` is a value of `data` whose rank is within eps * n (at least 1: ranks are whole) of
    phi * n; equivalently, it lies between numpy's (phi - eps) and (phi + eps) quantiles."""
    n = data.size
    low, high = rank_range(data, answer)
    assert low <= high, f"{answer} is not one of the values"
    allowed = max(eps * n, 1.0)
    target = phi * n
    assert low - allowed <= target + 1e-9 and target - 1e-9 <= high + allowed, (phi, eps, n, low, high)
    # The same as numpy sees it (inverted_cdf: the smallest value whose share reaches p).
    lower = np.quantile(data, max(phi - eps - 1.0 / n, 0.0), method="inverted_cdf")
    upper = np.quantile(data, min(phi + eps + 1.0 / n, 1.0), method="inverted_cdf")
    assert lower <= answer <= upper, (phi, eps, lower, answer, upper)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=values_st, targets=targets_st, cuts=st.lists(st.integers(1, 3000), max_size=8))
def test_every_target_is_answered_within_its_error(values: list[float], targets: list[tuple[float, float]],
                                                   cuts: list[int]) -> None:
    sketch = TargetedQuantiles(targets)
    data = np.array(values)
    start = 0
    for cut in sorted(set(c for c in cuts if c < data.size)) + [data.size]:  # batches of any sizes
        sketch.insert_many(data[start:cut])
        start = cut
    assert sketch.count == data.size
    for phi, eps in targets:
        assert_within(data, phi, eps, sketch.query(phi))
    assert sketch.query(0.0) == data.min() and sketch.query(1.0) == data.max()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(5000, 60000))
def test_triton_default_quantiles_on_long_streams(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    data = np.floor(rng.lognormal(6, 1.2, n))  # latencies in µs: a long right tail
    sketch = TargetedQuantiles(DEFAULT_QUANTILES)
    for start in range(0, n, 4096):
        sketch.insert_many(data[start:start + 4096])
    for phi, eps in DEFAULT_QUANTILES:
        assert_within(data, phi, eps, sketch.query(phi))
    assert len(sketch) < 2000  # a sketch, not a copy of the stream


def test_the_sketch_stays_small_however_long_the_stream() -> None:
    sketch = TargetedQuantiles(DEFAULT_QUANTILES)
    rng = np.random.default_rng(7)
    sizes = []
    for _ in range(50):
        sketch.insert_many(rng.exponential(500.0, 4096))
        sizes.append(len(sketch))
    assert sketch.count == 50 * 4096
    assert max(sizes[10:]) < 1000 and max(sizes[10:]) < 2 * min(sizes[10:])


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(0, 50).map(float), min_size=1, max_size=400))
def test_an_error_of_zero_keeps_every_value(values: list[float]) -> None:
    sketch = TargetedQuantiles([(0.5, 0.0), (0.9, 0.0)])
    sketch.insert_many(np.array(values))
    data = np.array(values)
    for phi in (0.5, 0.9):
        assert_within(data, phi, 0.0, sketch.query(phi))


def test_targets_tritonserver_would_take_without_complaint() -> None:
    # tritonserver reads any pair: phi 0 and 1 are the smallest and largest value, a negative or
    # NaN error means exact, and nothing answers NaN but an empty sketch or a NaN phi.
    sketch = TargetedQuantiles([(0.0, 0.1), (1.0, 0.1), (0.5, -1.0), (0.5, math.nan), (1.5, 0.1)])
    assert math.isnan(sketch.query(0.5))
    sketch.insert_many(np.arange(100, dtype=float))
    assert (sketch.query(0.0), sketch.query(1.0), sketch.query(1.5)) == (0.0, 99.0, 99.0)
    assert sketch.query(0.5) in (49.0, 50.0)
    assert math.isnan(sketch.query(math.nan))


# ---- the sliding window ---------------------------------------------------------------------------
class ReferenceWindow:
    """prometheus-cpp's TimeWindowQuantiles with exact buckets, moved step by step as it does."""

    def __init__(self, start: int, max_age: int = 60 * SECOND, buckets: int = 5) -> None:
        self.buckets: list[list[float]] = [[] for _ in range(buckets)]
        self.current, self.last, self.interval = 0, start, max_age // buckets

    def rotate(self, now: int) -> list[float]:
        while now - self.last > self.interval:
            self.buckets[self.current] = []
            self.current = (self.current + 1) % len(self.buckets)
            self.last += self.interval
        return self.buckets[self.current]

    def insert(self, value: float, now: int) -> None:
        self.rotate(now)
        for bucket in self.buckets:
            bucket.append(value)


events_st = st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 300 * SECOND // 10**6)), min_size=1,
                     max_size=400)


@settings(max_examples=80, deadline=None)
@given(events=events_st, checks=st.lists(st.integers(0, 400 * SECOND // 10**6), min_size=1, max_size=6),
       chunk=st.integers(1, 50))
def test_the_window_holds_what_prometheus_cpp_age_buckets_hold(events: list[tuple[int, int]], checks: list[int],
                                                              chunk: int) -> None:
    """Observations handed over in chunks (as folds do), answers compared with exact buckets."""
    ordered = sorted((ms * 10**6, float(v)) for v, ms in events)
    summary = WindowedSummary([(0.5, 0.05), (0.9, 0.01)], start_ns=0)
    reference = ReferenceWindow(0)
    check_at = sorted(ms * 10**6 for ms in checks)
    i = 0
    for now in check_at:
        due = [(t, v) for t, v in ordered[i:] if t <= now]
        for k in range(0, len(due), chunk):
            part = due[k:k + chunk][::-1]  # within a chunk, in any order
            summary.observe_many([v for _, v in part], [t for t, _ in part])
        for t, v in due:
            reference.insert(v, t)
        i += len(due)
        snap = summary.snapshot(now)
        window = np.array(reference.rotate(now))
        assert snap.count == i and snap.sum == sum(v for _, v in ordered[:i])
        for (phi, eps), (asked, answer) in zip([(0.5, 0.05), (0.9, 0.01)], snap.quantiles):
            assert asked == phi
            if window.size == 0:
                assert math.isnan(answer)
            else:
                assert_within(window, phi, eps, answer)


def test_an_observation_leaves_the_window_after_48_to_60_seconds() -> None:
    summary = WindowedSummary(DEFAULT_QUANTILES, start_ns=0)
    summary.observe(250.0, 1 * SECOND)
    assert summary.snapshot(59 * SECOND).quantiles[0] == (0.5, 250.0)
    gone = summary.snapshot(61 * SECOND)
    assert math.isnan(gone.quantiles[0][1]) and (gone.count, gone.sum) == (1, 250.0)


def test_a_late_observation_lands_only_in_buckets_emptied_before_it() -> None:
    summary = WindowedSummary([(0.5, 0.0)], start_ns=0)
    summary.observe(1.0, 30 * SECOND)
    summary.snapshot(50 * SECOND)  # rotations at 12, 24, 36 and 48 s have happened
    summary.observe(7.0, 11 * SECOND)  # made before the first rotation, handed over now
    # The bucket answered from until 60 s was never emptied: it has both.
    assert summary.snapshot(55 * SECOND).quantiles[0][1] in (1.0, 7.0)
    # From 60 s on, the bucket emptied at 12 s answers: it holds the first value only.
    assert summary.snapshot(61 * SECOND).quantiles[0][1] == 1.0


def test_a_long_idle_time_empties_every_bucket_without_stepping_through_it() -> None:
    summary = WindowedSummary([(0.5, 0.01)], start_ns=0)
    summary.observe(3.0, SECOND)
    snap = summary.snapshot(10**6 * SECOND)  # eleven days later
    assert math.isnan(snap.quantiles[0][1]) and snap.count == 1
    summary.observe(5.0, 10**6 * SECOND + 1)
    assert summary.snapshot(10**6 * SECOND + 2).quantiles[0][1] == 5.0


def test_a_summary_needs_a_window() -> None:
    with pytest.raises(ValueError):
        WindowedSummary(DEFAULT_QUANTILES, age_buckets=0)
