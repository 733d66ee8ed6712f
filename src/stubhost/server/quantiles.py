"""Streaming quantiles for Prometheus summaries, as Triton's summaries (prometheus-cpp's) give them.

``TargetedQuantiles`` is a CKMS sketch (Cormode, Korn, Muthukrishnan and Srivastava, "Effective
Computation of Biased Quantiles over Data Streams", ICDE 2005) for *targeted* quantiles: each
target ``(phi, eps)`` asks for the phi-quantile with a rank error of at most ``eps * n``, which is
what a Prometheus summary's ``<quantile>:<error>`` means. It keeps tuples ``(value, g, delta)``
sorted by value: ``rmin(i)`` (the sum of ``g`` up to ``i``) and ``rmax(i) = rmin(i) + delta`` bound
the true rank of ``value[i]``. Invariant, for every tuple ``i >= 1``:

    rmax(i) - rmin(i - 1)  <=  max(1, min over r in [rmin(i - 1), rmax(i)] of h(r, n))
    h(r, n) = min over targets of eps * max(r / phi, (n - r) / (1 - phi))

so for any target rank ``t = phi * n`` the first tuple with ``rmin >= t`` has ``|rank - t| <=
h(t, n) <= eps * n``: every answer is within its target's error (the tests check this against
numpy). ``h`` only grows as values arrive, so the invariant survives insertions; compression merges
a tuple into its right neighbour only where the merged span keeps it. The smallest and largest
values are kept exactly. Work is done in numpy batches, so a value costs well under a microsecond.

``WindowedSummary`` is a Prometheus summary: count and sum of every observation, and the quantiles
over a sliding window of ``max_age`` made of ``age_buckets`` sketches, as prometheus-cpp's Summary
keeps them (Triton uses its defaults: 60 s and 5 buckets). Every observation goes into every
bucket; every ``max_age / age_buckets`` the oldest bucket is emptied and becomes the one answered
from, so answers cover between the last 48 and 60 s. Observations carry their own instant
(``CLOCK_MONOTONIC`` ns), so they may be handed over late and still land in the buckets they would
have been in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_AGE_NS = 60 * 1_000_000_000  # prometheus-cpp's Summary defaults, which Triton keeps
AGE_BUCKETS = 5
_FLUSH_AT = 4096  # observations buffered before they are merged into the buckets


class TargetedQuantiles:
    """A CKMS sketch answering the phi of each ``(phi, eps)`` target within ``eps * n`` ranks.

    A target whose phi is not strictly between 0 and 1 constrains nothing (0 and 1 are answered
    exactly anyway); an eps that is 0, negative or NaN means exact: nothing is merged there.
    """

    def __init__(self, targets: Sequence[tuple[float, float]]) -> None:
        usable = [(phi, eps if eps > 0 else 0.0) for phi, eps in targets if 0.0 < phi < 1.0]
        self._phi = np.array([p for p, _ in usable], dtype=np.float64).reshape(-1, 1)
        self._eps = np.array([e for _, e in usable], dtype=np.float64).reshape(-1, 1)
        self.count = 0
        self._values = np.empty(0, dtype=np.float64)
        self._g = np.empty(0, dtype=np.int64)
        self._delta = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        """How many tuples the sketch keeps."""
        return int(self._values.size)

    def reset(self) -> None:
        """Forgets every value."""
        self.count = 0
        self._values = np.empty(0, dtype=np.float64)
        self._g = np.empty(0, dtype=np.int64)
        self._delta = np.empty(0, dtype=np.int64)

    def _min_tolerance(self, lo: np.ndarray, hi: np.ndarray, n: int) -> np.ndarray:
        """The least h(r, n) over each rank interval [lo, hi] (inf without targets)."""
        if self._phi.size == 0:
            return np.full(lo.shape, np.inf)
        # Each target's h is convex with its minimum at phi * n: the interval's least value is
        # at phi * n clipped into the interval.
        r = np.clip(self._phi * n, lo, hi)
        h = self._eps * np.maximum(r / self._phi, (n - r) / (1.0 - self._phi))
        return np.maximum(h.min(axis=0), 1.0)

    def insert_many(self, values: np.ndarray) -> None:
        """Adds the values (finite floats)."""
        values = np.asarray(values, dtype=np.float64)
        if values.size > _FLUSH_AT:  # in parts, so that each is chunked by what came before it
            for start in range(0, values.size, _FLUSH_AT):
                self.insert_many(values[start:start + _FLUSH_AT])
            return
        batch = np.sort(values)
        if batch.size == 0:
            return
        size, n = self._values.size, self.count
        self.count += int(batch.size)
        if size == 0:
            self._values = batch
            self._g = np.ones(batch.size, dtype=np.int64)
            self._delta = np.zeros(batch.size, dtype=np.int64)
            self._compress()
            return
        g, delta = self._g, self._delta
        pos = np.searchsorted(self._values, batch, side="right")  # the gap each value falls in
        succ = np.minimum(pos, size - 1)
        inside = pos < size
        # A value between two tuples is as uncertain as its successor b (GK's rule); above the
        # largest it is exact. Values of one gap go in as chunks of up to `cap` (the largest value
        # of each, counting them all), as many as b's old span leaves room for under the
        # tolerance: h only grows with n, so that room is still there after the insertion.
        rmin = np.cumsum(g)
        lo = np.concatenate(([0], rmin[:-1])).astype(np.float64)
        room = self._min_tolerance(lo, (rmin + delta).astype(np.float64), n)
        top = self._min_tolerance(np.array([float(n)]), np.array([float(n)]), n)[0]
        cap = np.maximum(np.floor(np.where(inside, room[succ] - g[succ] - delta[succ] + 1, top)), 1).astype(np.int64)
        gap_delta = np.where(inside, g[succ] + delta[succ] - 1, 0)
        within = np.arange(batch.size) - np.searchsorted(pos, pos, side="left")
        # below the smallest value, the first new one stays alone: the new, exact, smallest
        chunk = np.where(pos == 0, np.where(within == 0, 0, 1 + (within - 1) // cap), within // cap)
        last = np.ones(batch.size, dtype=bool)
        last[:-1] = (pos[1:] != pos[:-1]) | (chunk[1:] != chunk[:-1])
        ends = np.flatnonzero(last)
        counts = np.diff(np.concatenate(([-1], ends)))
        at = pos[ends]
        self._values = np.insert(self._values, at, batch[ends])
        self._g = np.insert(g, at, counts)
        self._delta = np.insert(delta, at, gap_delta[ends])
        self._compress()

    def _compress(self) -> None:
        """Merges tuples into their right neighbours wherever the invariant allows it.

        Each pass merges an independent set of tuples (no two neighbours), which makes every
        merge valid on its own; passes repeat until none is possible.
        """
        n = self.count
        while self._values.size > 2:
            g, delta = self._g, self._delta
            rmin = np.cumsum(g)
            lo = np.concatenate(([0], rmin[:-2]))  # rmin(i - 1) for i = 0 .. size - 2
            span = g[:-1] + g[1:] + delta[1:]      # rmax(i + 1) - rmin(i - 1), were i merged
            ok = span <= self._min_tolerance(lo.astype(np.float64), (lo + span).astype(np.float64), n)
            ok[0] = False  # the smallest value stays exact
            if not ok.any():
                return
            index = np.arange(ok.size)
            starts = ok & ~np.concatenate(([False], ok[:-1]))
            run_start = np.maximum.accumulate(np.where(starts, index, 0))
            chosen = np.flatnonzero(ok & ((index - run_start) % 2 == 0))
            g = g.copy()
            g[chosen + 1] += g[chosen]
            keep = np.ones(g.size, dtype=bool)
            keep[chosen] = False
            self._values, self._g, self._delta = self._values[keep], g[keep], delta[keep]

    def query(self, phi: float) -> float:
        """The phi-quantile (NaN with no values, or for a NaN phi)."""
        if self._values.size == 0 or math.isnan(phi):
            return math.nan
        if phi <= 0.0:
            return float(self._values[0])
        if phi >= 1.0:
            return float(self._values[-1])
        rmin = np.cumsum(self._g)
        rmax = rmin + self._delta
        t = phi * self.count
        # The tuple whose rank bounds stray least from t; the first with rmin >= t is within
        # h(t) of it, so this one is too.
        err = np.maximum(t - rmin, rmax - t)
        return float(self._values[int(np.argmin(err))])


@dataclass(frozen=True)
class SummarySnapshot:
    """A summary as a scrape shows it: count and sum of every observation, and each quantile."""

    count: int
    sum: float
    quantiles: tuple[tuple[float, float], ...]  # (phi, value), in the order they were asked for


class WindowedSummary:
    """A Prometheus summary with prometheus-cpp's sliding window (see the module's docstring).

    ``targets`` are ``(phi, eps)`` pairs, reported in their order. Not thread-safe: the caller
    serializes observations and snapshots.
    """

    def __init__(self, targets: Sequence[tuple[float, float]], *, max_age_ns: int = MAX_AGE_NS,
                 age_buckets: int = AGE_BUCKETS, start_ns: int = 0) -> None:
        if age_buckets < 1 or max_age_ns < age_buckets:
            raise ValueError("a summary needs at least one age bucket and a positive max age")
        self.targets = tuple((float(phi), float(eps)) for phi, eps in targets)
        self.count = 0
        self.sum = 0.0
        self._buckets = [TargetedQuantiles(self.targets) for _ in range(age_buckets)]
        # When each bucket was last emptied: it holds the observations made after that.
        self._reset_at = [-math.inf] * age_buckets
        self._current = 0
        self._interval = max_age_ns // age_buckets
        self._last_rotation = start_ns
        self._pending_values: list[np.ndarray] = []
        self._pending_at: list[np.ndarray] = []
        self._pending = 0

    def observe(self, value: float, at_ns: int) -> None:
        """One observation made at ``at_ns``."""
        self.observe_many([value], [at_ns])

    def observe_many(self, values: Sequence[float] | np.ndarray, at_ns: Sequence[int] | np.ndarray) -> None:
        """Observations, each made at its ``at_ns`` (in any order)."""
        v = np.asarray(values, dtype=np.float64)
        t = np.asarray(at_ns, dtype=np.int64)
        if v.size == 0:
            return
        self.count += int(v.size)
        self.sum += float(v.sum())
        order = np.argsort(t, kind="stable")
        v, t = v[order], t[order]
        while v.size:
            # prometheus-cpp rotates when an observation comes more than one interval after the
            # last rotation, before adding it: what precedes the boundary is added first.
            cut = int(np.searchsorted(t, self._last_rotation + self._interval, side="right"))
            self._buffer(v[:cut], t[:cut])
            if cut == v.size:
                break
            self._rotate(int(t[cut]))
            v, t = v[cut:], t[cut:]

    def _buffer(self, values: np.ndarray, at: np.ndarray) -> None:
        if values.size == 0:
            return
        self._pending_values.append(values)
        self._pending_at.append(at)
        self._pending += int(values.size)
        if self._pending >= _FLUSH_AT:
            self._flush()

    def _flush(self) -> None:
        """Merges the buffered observations into every bucket emptied before they were made."""
        if not self._pending:
            return
        values, at = np.concatenate(self._pending_values), np.concatenate(self._pending_at)
        self._pending_values, self._pending_at, self._pending = [], [], 0
        for bucket, reset_at in zip(self._buckets, self._reset_at):
            bucket.insert_many(values if reset_at == -math.inf else values[at > reset_at])

    def _rotate(self, now_ns: int) -> None:
        """Empties the buckets whose turn came by ``now_ns``, as prometheus-cpp's rotate() does."""
        elapsed = now_ns - self._last_rotation
        if elapsed <= self._interval:
            return
        self._flush()  # what was buffered precedes these rotations
        steps = -(-elapsed // self._interval) - 1  # rotations while more than one interval is left
        k = len(self._buckets)
        for step in range(max(1, steps - k + 1), steps + 1):  # only the last k rotations matter
            bucket = (self._current + step - 1) % k
            self._buckets[bucket].reset()
            self._reset_at[bucket] = self._last_rotation + step * self._interval
        self._current = (self._current + steps) % k
        self._last_rotation += steps * self._interval

    def snapshot(self, now_ns: int) -> SummarySnapshot:
        """Count, sum and the quantiles of the current bucket, at ``now_ns``."""
        self._flush()
        self._rotate(now_ns)
        bucket = self._buckets[self._current]
        return SummarySnapshot(self.count, self.sum, tuple((phi, bucket.query(phi)) for phi, _ in self.targets))
