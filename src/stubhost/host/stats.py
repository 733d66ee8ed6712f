"""Per-model inference statistics, in the shape of Triton's statistics extension.

Durations are split the way Triton reports them, from four instants on the shared
CLOCK_MONOTONIC: the parent received the call (``begin``), the request was queued to the stub
(``sent``), the stub's ``execute`` started and ended (``exec_start``/``exec_end``, written by the
stub), and the parent had the outputs (``done``). The stub's instants are untrusted, so they
are clamped into [sent, done].

- queue: sent -> exec_start (waiting for the stub, plus reading the request)
- compute_input: begin -> sent (checking inputs and copying them into the pool)
- compute_infer: exec_start -> exec_end (the model's ``execute``)
- compute_output: exec_end -> done (writing and reading the outputs)

Every failure counts in ``fail`` (Triton's statistics extension has no finer split, and counts
cancelled requests there too); each also carries one of Triton's failure reasons, which only the
metrics endpoint shows (``nv_inference_request_failure{reason=...}``):

- REJECTED: the scheduler refused it (its queue was full, or its queue timeout ran out)
- CANCELED: its caller gave up on it (a cancelled call, or the caller's own timeout)
- BACKEND: the model or its stub failed it (an error response, a crash, a bad answer)
- OTHER: anything else (its inputs were refused, the model was unloading)

With ``observe_latencies`` (``--metrics-config summary_latencies=true``) each version also feeds
Triton's latency summaries, in whole µs, as Triton's InferenceStatsAggregator does: a success
observes its request, queue and three compute durations; a cache hit its queue and lookup time; a
cache miss its lookup and insertion time; a failure nothing. They are observed when the requests
are folded (at the request's own end instant), so requests pay nothing more for them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import numpy as np

REJECTED, CANCELED, BACKEND, OTHER = "REJECTED", "CANCELED", "BACKEND", "OTHER"
FAILURE_REASONS = (REJECTED, CANCELED, BACKEND, OTHER)  # Triton's set, in the order it declares them

_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
              "cache_miss")
# The durations every successful request adds to, in the order of `_VersionStats.successes`.
_SUCCESS_DURATIONS = ("success", "queue", "compute_input", "compute_infer", "compute_output")
_BATCH_DURATIONS = ("compute_input", "compute_infer", "compute_output")
_HIT, _MISS = -2, -3  # the batch-size slot of a pending cache hit or miss (-1: a failure)
# The latency summaries a version keeps, in Triton's order of summary families.
LATENCY_KINDS = ("request", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")


class LatencySummary(Protocol):
    """One latency summary of one model version (the metrics endpoint provides them)."""

    def observe_many(self, values: Sequence[float] | np.ndarray, at_ns: Sequence[int] | np.ndarray) -> None:
        """Observations (µs), each made at its CLOCK_MONOTONIC instant."""

    def snapshot(self, now_ns: int) -> Any:
        """What a scrape at `now_ns` shows."""


@dataclass
class _Observed:
    """A fold's observations for one version's summaries: rows of ns instants and durations."""

    successes: list[tuple[int, int, int, int, int, int]] = field(default_factory=list)  # done, the 5 durations
    hits: list[tuple[int, int, int]] = field(default_factory=list)  # done, queue, lookup
    misses: list[tuple[int, int]] = field(default_factory=list)  # at, lookup + insertion


def _observed(observed: dict[int, _Observed], version: int) -> _Observed:
    """The version's rows in a fold's observations."""
    rows = observed.get(version)
    if rows is None:
        rows = observed[version] = _Observed()
    return rows


@dataclass
class _VersionStats:
    # Successful requests: their count, then the ns of each of _SUCCESS_DURATIONS. One flat list
    # rather than a [count, ns] pair per duration: folding a request is then six additions.
    successes: list[int] = field(default_factory=lambda: [0] * (1 + len(_SUCCESS_DURATIONS)))
    # The other durations (fail, cache_hit, cache_miss): [count, ns] each.
    durations: dict[str, list[int]] = field(
        default_factory=lambda: {k: [0, 0] for k in _DURATIONS if k not in _SUCCESS_DURATIONS})
    # Executions by the batch size they ran: their count, then the ns of each of _BATCH_DURATIONS.
    batches: dict[int, list[int]] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0))
    inference_count: int = 0
    execution_count: int = 0
    last_done: int = 0  # CLOCK_MONOTONIC ns of the last request (0: none yet)


class ModelStatistics:
    """Counts and durations of one model's requests, by version; thread-safe.

    The request path only appends the request's instants to a deque (thread-safe, no lock, a
    fraction of a microsecond); they are folded into the totals when someone reads them, or
    every ``FOLD_EVERY`` requests so that memory stays bounded.
    """

    FOLD_EVERY = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._versions: dict[int, _VersionStats] = {}
        self._pending: deque[tuple[int, ...]] = deque()
        self._new_summary: Callable[[], LatencySummary] | None = None  # None: no latency summaries
        self._summaries: dict[int, dict[str, LatencySummary]] = {}

    def _version(self, version: int) -> _VersionStats:
        stats = self._versions.get(version)
        if stats is None:
            stats = self._versions[version] = _VersionStats()
        return stats

    def record_success(self, version: int, batch_size: int, begin: int, sent: int, exec_start: int,
                       exec_end: int, done: int, execution: int | None = None) -> None:
        """One successful request of `batch_size`. `execution` is the batch size of the
        execution it counts (0: its batch's execution is counted by another request; None: it
        ran alone)."""
        self._pending.append((version, batch_size, begin, sent, exec_start, exec_end, done,
                              batch_size if execution is None else execution))
        if len(self._pending) >= self.FOLD_EVERY:
            self._fold()

    def record_failure(self, version: int, begin: int, done: int, reason: str = OTHER) -> None:
        """One failed request; `reason` is one of ``FAILURE_REASONS``."""
        self._pending.append((version, -1, begin, done, reason))
        if len(self._pending) >= self.FOLD_EVERY:
            self._fold()

    def record_cache_hit(self, version: int, begin: int, queue_start: int, lookup_start: int, lookup_end: int,
                         done: int) -> None:
        """A request answered from the response cache, counted as Triton's UpdateSuccessCacheHit
        counts it: a success (count and time), queue (`queue_start` to `lookup_start`), and
        cache_hit (the lookup); no inference, execution, or compute time or count (``snapshot``
        reports the compute counts less the hits, as Triton does), and last_inference stays as
        it is."""
        self._pending.append((version, _HIT, begin, queue_start, lookup_start, lookup_end, done))
        if len(self._pending) >= self.FOLD_EVERY:
            self._fold()

    def record_cache_miss(self, version: int, duration: int) -> None:
        """A successful request the cache did not have (its success is recorded apart):
        cache_miss counts it with `duration` (lookup and insertion, ns), which is added to its
        success time too, as Triton's UpdateSuccessCacheMiss does."""
        # (its instant only matters to the summaries, so the clock is read only for them)
        self._pending.append((version, _MISS, duration) if self._new_summary is None
                             else (version, _MISS, duration, time.monotonic_ns()))
        if len(self._pending) >= self.FOLD_EVERY:
            self._fold()

    def _fold_cache(self, record: tuple[int, ...], observed: dict[int, _Observed] | None) -> None:
        """Adds a cache hit or miss into the totals (the caller holds the lock)."""
        stats = self._version(record[0])
        if record[1] == _MISS:
            duration = max(record[2], 0)
            stats.successes[1] += duration
            entry = stats.durations["cache_miss"]
            entry[0] += 1
            entry[1] += duration
            if observed is not None:
                at = record[3] if len(record) > 3 else time.monotonic_ns()
                _observed(observed, record[0]).misses.append((at, duration))
            return
        _, _, begin, queue_start, lookup_start, lookup_end, done = record
        stats.successes[0] += 1
        stats.successes[1] += max(done - begin, 0)
        stats.successes[2] += max(lookup_start - queue_start, 0)
        entry = stats.durations["cache_hit"]
        entry[0] += 1
        entry[1] += max(lookup_end - lookup_start, 0)
        if observed is not None:
            _observed(observed, record[0]).hits.append(
                (done, max(lookup_start - queue_start, 0), max(lookup_end - lookup_start, 0)))

    def _fold(self) -> None:
        """Adds the pending requests into the totals (and the latency summaries, if kept)."""
        with self._lock:
            observed: dict[int, _Observed] | None = {} if self._new_summary is not None else None
            # (without summaries, each request is folded exactly as before: no extra argument)
            fold_success = self._fold_success if observed is None else partial(self._fold_success, observed=observed)
            pending = self._pending
            while pending:
                try:
                    record = pending.popleft()
                except IndexError:
                    break
                if record[1] <= _HIT:
                    self._fold_cache(record, observed)
                    continue
                if record[1] < 0:
                    version, _, begin, done, reason = record
                    stats = self._version(version)
                    entry = stats.durations["fail"]
                    entry[0] += 1
                    entry[1] += max(done - begin, 0)
                    stats.failures[reason if reason in stats.failures else OTHER] += 1
                    stats.last_done = max(stats.last_done, done)
                    continue
                fold_success(*record)
            if observed:
                self._observe(observed)

    def _fold_success(self, version: int, batch_size: int, begin: int, sent: int, exec_start: int, exec_end: int,
                      done: int, execution: int, observed: dict[int, _Observed] | None = None) -> None:
        """Adds one successful request into the totals (the caller holds the lock)."""
        # The stub's instants are untrusted: clamped into the request's own interval
        # (min(max(...)) written out, as this runs once per request).
        if exec_start < sent:
            exec_start = sent
        if exec_start > done:
            exec_start = done
        if exec_end < exec_start:
            exec_end = exec_start
        if exec_end > done:
            exec_end = done
        c_input, c_infer, c_output = sent - begin, exec_end - exec_start, done - exec_end
        stats = self._version(version)
        totals = stats.successes  # in the order of _SUCCESS_DURATIONS
        totals[0] += 1
        totals[1] += done - begin
        totals[2] += exec_start - sent
        totals[3] += c_input
        totals[4] += c_infer
        totals[5] += c_output
        stats.inference_count += batch_size
        if done > stats.last_done:
            stats.last_done = done
        if observed is not None:
            _observed(observed, version).successes.append((done, done - begin, exec_start - sent, c_input, c_infer,
                                                           c_output))
        if not execution:
            return
        # batch_stats count executions, keyed by the batch size they ran
        batch = stats.batches.get(execution)
        if batch is None:
            batch = stats.batches[execution] = [0] * (1 + len(_BATCH_DURATIONS))
        batch[0] += 1
        batch[1] += c_input
        batch[2] += c_infer
        batch[3] += c_output
        stats.execution_count += 1

    def observe_latencies(self, new_summary: Callable[[], LatencySummary]) -> None:
        """Keeps Triton's latency summaries from now on, per version: one of each of
        ``LATENCY_KINDS``, made by `new_summary`. Requests recorded but not folded yet count."""
        with self._lock:
            self._new_summary = new_summary

    def _kinds(self, version: int) -> dict[str, LatencySummary]:
        """The version's summaries, made on first use (the caller holds the lock)."""
        kinds = self._summaries.get(version)
        if kinds is None:
            assert self._new_summary is not None
            kinds = self._summaries[version] = {kind: self._new_summary() for kind in LATENCY_KINDS}
        return kinds

    def _observe(self, observed: dict[int, _Observed]) -> None:
        """Hands a fold's observations to the summaries, in whole µs (the caller holds the lock)."""
        for version, rows in observed.items():
            kinds = self._kinds(version)
            queue: list[tuple[np.ndarray, np.ndarray]] = []
            if rows.successes:
                table = np.array(rows.successes, dtype=np.int64)
                at, micros = table[:, 0], np.maximum(table[:, 1:], 0) // 1000
                queue.append((micros[:, 1], at))
                for column, kind in ((0, "request"), (2, "compute_input"), (3, "compute_infer"),
                                     (4, "compute_output")):
                    kinds[kind].observe_many(micros[:, column], at)
            if rows.hits:
                table = np.array(rows.hits, dtype=np.int64)
                queue.append((table[:, 1] // 1000, table[:, 0]))
                kinds["cache_hit"].observe_many(table[:, 2] // 1000, table[:, 0])
            if queue:
                kinds["queue"].observe_many(np.concatenate([v for v, _ in queue]), np.concatenate([t for _, t in queue]))
            if rows.misses:
                table = np.array(rows.misses, dtype=np.int64)
                kinds["cache_miss"].observe_many(table[:, 1] // 1000, table[:, 0])

    def latency_summaries(self, version: int, now_ns: int) -> dict[str, Any]:
        """The version's latency summaries as a scrape at `now_ns` shows them, by kind (``{}``
        unless ``observe_latencies`` was called)."""
        if self._new_summary is None:
            return {}
        self._fold()
        with self._lock:
            return {kind: summary.snapshot(now_ns) for kind, summary in self._kinds(version).items()}

    def failures(self, version: int) -> dict[str, int]:
        """The version's failures by reason (every reason of ``FAILURE_REASONS``, 0 if none)."""
        self._fold()
        with self._lock:
            stats = self._versions.get(version)
            return dict(stats.failures) if stats is not None else dict.fromkeys(FAILURE_REASONS, 0)

    def snapshot(self, name: str, versions: list[int]) -> list[dict[str, Any]]:
        """Triton's ``model_stats`` entries for the given versions (zeros for unused ones)."""
        out = []
        # Wall-clock milliseconds of the last request, from its monotonic instant (reading the
        # wall clock on every request would cost more than all the additions together).
        now_mono, now_ms = time.monotonic_ns(), time.time_ns() // 1_000_000
        self._fold()
        with self._lock:
            for version in versions:
                stats = self._versions.get(version) or _VersionStats()
                out.append({
                    "name": name,
                    "version": str(version),
                    "last_inference": now_ms - (now_mono - stats.last_done) // 1_000_000 if stats.last_done else 0,
                    "inference_count": stats.inference_count,
                    "execution_count": stats.execution_count,
                    "inference_stats": _inference_stats(stats),
                    "response_stats": {},
                    "batch_stats": [{"batch_size": size, **_figures(_BATCH_DURATIONS, b)}
                                    for size, b in sorted(stats.batches.items())],
                    "memory_usage": [],
                })
        return out


def _figures(keys: tuple[str, ...], totals: list[int]) -> dict[str, dict[str, int]]:
    """``{key: {"count", "ns"}}`` from a count and the ns of each key (all share the count)."""
    return {key: {"count": totals[0], "ns": ns} for key, ns in zip(keys, totals[1:])}


def _inference_stats(stats: _VersionStats) -> dict[str, dict[str, int]]:
    """A version's ``inference_stats``, in Triton's order of durations."""
    figures = _figures(_SUCCESS_DURATIONS, stats.successes)
    figures.update({k: {"count": c, "ns": ns} for k, (c, ns) in stats.durations.items()})
    # A cache hit computes nothing: Triton reports the compute counts as the successes less the hits.
    hits = figures["cache_hit"]["count"]
    for key in _BATCH_DURATIONS:
        figures[key]["count"] -= hits
    return {key: figures[key] for key in _DURATIONS}
