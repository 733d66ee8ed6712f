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
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
              "cache_miss")


@dataclass
class _VersionStats:
    durations: dict[str, list[int]] = field(default_factory=lambda: {k: [0, 0] for k in _DURATIONS})
    batches: dict[int, dict[str, list[int]]] = field(default_factory=dict)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0


class ModelStatistics:
    """Counts and durations of one model's requests, by version; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._versions: dict[int, _VersionStats] = {}

    def _version(self, version: int) -> _VersionStats:
        stats = self._versions.get(version)
        if stats is None:
            stats = self._versions[version] = _VersionStats()
        return stats

    def record_success(self, version: int, batch_size: int, begin: int, sent: int, exec_start: int,
                       exec_end: int, done: int) -> None:
        """One successful request (one execution of `batch_size`)."""
        exec_start = min(max(exec_start, sent), done)
        exec_end = min(max(exec_end, exec_start), done)
        parts = (("success", done - begin), ("queue", exec_start - sent), ("compute_input", sent - begin),
                 ("compute_infer", exec_end - exec_start), ("compute_output", done - exec_end))
        with self._lock:
            stats = self._version(version)
            for key, ns in parts:
                entry = stats.durations[key]
                entry[0] += 1
                entry[1] += ns
            batch = stats.batches.get(batch_size)
            if batch is None:
                batch = stats.batches[batch_size] = {k: [0, 0] for k in
                                                     ("compute_input", "compute_infer", "compute_output")}
            for key, ns in parts[2:]:
                batch[key][0] += 1
                batch[key][1] += ns
            stats.inference_count += batch_size
            stats.execution_count += 1
            stats.last_inference_ms = time.time_ns() // 1_000_000

    def record_failure(self, version: int, begin: int, done: int) -> None:
        """One failed request."""
        with self._lock:
            stats = self._version(version)
            entry = stats.durations["fail"]
            entry[0] += 1
            entry[1] += max(done - begin, 0)
            stats.last_inference_ms = time.time_ns() // 1_000_000

    def snapshot(self, name: str, versions: list[int]) -> list[dict[str, Any]]:
        """Triton's ``model_stats`` entries for the given versions (zeros for unused ones)."""
        out = []
        with self._lock:
            for version in versions:
                stats = self._versions.get(version) or _VersionStats()
                out.append({
                    "name": name,
                    "version": str(version),
                    "last_inference": stats.last_inference_ms,
                    "inference_count": stats.inference_count,
                    "execution_count": stats.execution_count,
                    "inference_stats": {k: {"count": c, "ns": ns} for k, (c, ns) in stats.durations.items()},
                    "response_stats": {},
                    "batch_stats": [{"batch_size": size, **{k: {"count": c, "ns": ns} for k, (c, ns) in b.items()}}
                                    for size, b in sorted(stats.batches.items())],
                    "memory_usage": [],
                })
        return out
