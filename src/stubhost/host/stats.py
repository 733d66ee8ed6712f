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
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

REJECTED, CANCELED, BACKEND, OTHER = "REJECTED", "CANCELED", "BACKEND", "OTHER"
FAILURE_REASONS = (REJECTED, CANCELED, BACKEND, OTHER)  # Triton's set, in the order it declares them

_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
              "cache_miss")


@dataclass
class _VersionStats:
    durations: dict[str, list[int]] = field(default_factory=lambda: {k: [0, 0] for k in _DURATIONS})
    batches: dict[int, dict[str, list[int]]] = field(default_factory=dict)
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

    def _fold(self) -> None:
        """Adds the pending requests into the totals."""
        with self._lock:
            pending = self._pending
            while pending:
                try:
                    record = pending.popleft()
                except IndexError:
                    break
                if record[1] < 0:
                    version, _, begin, done, reason = record
                    stats = self._version(version)
                    entry = stats.durations["fail"]
                    entry[0] += 1
                    entry[1] += max(done - begin, 0)
                    stats.failures[reason if reason in stats.failures else OTHER] += 1
                    stats.last_done = max(stats.last_done, done)
                    continue
                version, batch_size, begin, sent, exec_start, exec_end, done, execution = record
                # The stub's instants are untrusted: clamped into the request's own interval.
                exec_start = min(max(exec_start, sent), done)
                exec_end = min(max(exec_end, exec_start), done)
                c_input, c_infer, c_output = sent - begin, exec_end - exec_start, done - exec_end
                stats = self._version(version)
                d = stats.durations
                for key, ns in (("success", done - begin), ("queue", exec_start - sent), ("compute_input", c_input),
                                ("compute_infer", c_infer), ("compute_output", c_output)):
                    entry = d[key]
                    entry[0] += 1
                    entry[1] += ns
                stats.inference_count += batch_size
                stats.last_done = max(stats.last_done, done)
                if not execution:
                    continue
                # batch_stats count executions, keyed by the batch size they ran
                batch = stats.batches.get(execution)
                if batch is None:
                    batch = stats.batches[execution] = {k: [0, 0] for k in
                                                        ("compute_input", "compute_infer", "compute_output")}
                for key, ns in (("compute_input", c_input), ("compute_infer", c_infer),
                                ("compute_output", c_output)):
                    entry = batch[key]
                    entry[0] += 1
                    entry[1] += ns
                stats.execution_count += 1

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
                    "inference_stats": {k: {"count": c, "ns": ns} for k, (c, ns) in stats.durations.items()},
                    "response_stats": {},
                    "batch_stats": [{"batch_size": size, **{k: {"count": c, "ns": ns} for k, (c, ns) in b.items()}}
                                    for size, b in sorted(stats.batches.items())],
                    "memory_usage": [],
                })
        return out
