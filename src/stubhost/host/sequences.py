"""Sequence routing: every request of a sequence (one correlation id) goes to the same instance.

``SequenceRouter`` serves a sequence model with ``max_batch_size: 0``: one request per Execute,
straight to its instance. A request with the START flag opens a sequence on the instance with the
fewest open sequences; the sequence's later requests go to that instance, in order (its stub's
queue is FIFO); the END flag closes it. A sequence idle for longer than
``max_sequence_idle_microseconds`` is closed, so a later request without START fails, as in
Triton. The model reads START/END from ``request.flags()`` and the id from
``request.correlation_id()``, or from the control inputs its configuration asks for
(sequence_controls.py). A model that batches (``max_batch_size > 0``) has Triton's sequence
batcher instead, with its batch slots and backlog (sequence_batcher.py); both refuse requests with
the errors below.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from stubhost.config import ModelConfig
from stubhost.host.errors import InferenceError
from stubhost.host.instance import InstanceState, ModelInstance

FLAG_SEQUENCE_START = 1  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
FLAG_SEQUENCE_END = 2    # TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
DEFAULT_IDLE_US = 1_000_000


def no_correlation_id(model_name: str) -> InferenceError:
    """Triton's error for a sequence model's request without a correlation id."""
    return InferenceError("INVALID_ARG", f"inference request to model '{model_name}' must specify a non-zero or "
                                         "non-empty correlation ID")


def not_started(model_name: str, correlation_id: int | str) -> InferenceError:
    """Triton's error for a request that continues a sequence that is not open."""
    return InferenceError("INVALID_ARG", f"inference request for sequence {correlation_id} to model '{model_name}' "
                                         "must specify the START flag on the first request of the sequence")


class SequenceRouter:
    """Which instance each open sequence of one model runs on; thread-safe."""

    def __init__(self, model_name: str, config: ModelConfig) -> None:
        self.model_name = model_name
        idle_us = int(config.sequence_batching.max_sequence_idle_microseconds) or DEFAULT_IDLE_US
        self.idle_ns = idle_us * 1000
        # Iterative sequence batching: a request without a correlation id is a sequence of its
        # own (it lives in one stub, which reruns it while the model reschedules it).
        self.iterative = bool(config.sequence_batching.iterative_sequence)
        self._lock = threading.Lock()
        # (version, correlation id) -> [instance, last use in CLOCK_MONOTONIC ns]
        self._open: dict[tuple[int, int | str], list] = {}
        self._next_sweep = 0

    def route(self, version: int, group: Sequence[ModelInstance], correlation_id: int | str,
              flags: int) -> ModelInstance:
        """The instance that runs this request of its sequence. Raises INVALID_ARG, with
        Triton's texts, for a request without a correlation id, or one that continues a sequence
        that is not open."""
        if correlation_id == 0 or correlation_id == "":
            if self.iterative:
                with self._lock:
                    return self._least_used(version, group)
            raise no_correlation_id(self.model_name)
        now = time.monotonic_ns()
        key = (version, correlation_id)
        with self._lock:
            self._expire(now)
            entry = self._open.get(key)
            if entry is not None and now - entry[1] > self.idle_ns:
                entry = None  # idle for too long: closed
            if flags & FLAG_SEQUENCE_START:
                instance = self._least_used(version, group)
            elif entry is None:
                raise not_started(self.model_name, correlation_id)
            else:
                instance = entry[0]
            if flags & FLAG_SEQUENCE_END:
                self._open.pop(key, None)
            else:
                self._open[key] = [instance, now]
        return instance

    def open_sequences(self) -> int:
        """How many sequences are open."""
        now = time.monotonic_ns()
        with self._lock:
            return sum(1 for _, last in self._open.values() if now - last <= self.idle_ns)

    def _least_used(self, version: int, group: Sequence[ModelInstance]) -> ModelInstance:
        """The READY instance of the version with the fewest open sequences (lock held)."""
        counts = {id(i): 0 for i in group}
        for (v, _), (instance, _) in self._open.items():
            if v == version and id(instance) in counts:
                counts[id(instance)] += 1
        ready = [i for i in group if i.state is InstanceState.READY] or list(group)
        return min(ready, key=lambda i: (counts[id(i)], i.load_count()))

    def _expire(self, now: int) -> None:
        """Closes the sequences idle for too long (lock held); a sweep at most twice per idle
        period, so that routing stays cheap with many sequences open."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.idle_ns // 2
        stale = [key for key, (_, last) in self._open.items() if now - last > self.idle_ns]
        for key in stale:
            del self._open[key]
