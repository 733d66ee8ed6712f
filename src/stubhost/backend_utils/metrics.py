"""``pb_utils.MetricFamily`` and ``pb_utils.Metric``: custom metrics a model exports.

A model declares a family (name, description, kind) and, in it, metrics by labels; the server
exports them on its metrics endpoint beside Triton's ``nv_inference_*`` counters. Updates
(``increment``, ``set``, ``observe``) are one-way messages to the server, so they cost no round
trip; ``value()`` asks the server, which holds the one value all instances share.

Rules follow Triton's Python backend: a counter only grows, a histogram only
observes and needs its buckets, names are Prometheus metric names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from stubhost.backend_utils.errors import TritonModelException

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class MetricSink(Protocol):
    """What the stub provides to reach the server's metrics."""

    def metric(self, payload: dict[str, Any]) -> None:
        """Sends one update (nobody waits for it)."""

    def metric_value(self, payload: dict[str, Any]) -> float:
        """Asks the server for a metric's value."""


class _Unattached:
    def metric(self, payload: dict[str, Any]) -> None:
        raise TritonModelException("metrics are only available inside a model instance")

    def metric_value(self, payload: dict[str, Any]) -> float:
        raise TritonModelException("metrics are only available inside a model instance")


_sink: MetricSink = _Unattached()


def set_sink(sink: MetricSink) -> None:
    """Installs the stub's sink."""
    global _sink
    _sink = sink


class MetricFamily:
    """A named family of metrics of one kind (COUNTER, GAUGE or HISTOGRAM)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2
    _KINDS = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}

    def __init__(self, name: str, description: str, kind: int) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise TritonModelException(f"invalid metric family name '{name}'")
        if kind not in self._KINDS:
            raise TritonModelException("Unknown metric family kind: expected COUNTER, GAUGE or HISTOGRAM")
        self._name = name
        self._description = str(description)
        self._kind = kind
        _sink.metric({"op": "family", "name": name, "description": self._description, "kind": self._KINDS[kind]})

    def Metric(self, labels: Mapping[str, str] | None = None,  # noqa: N802  (Triton's name)
               buckets: Sequence[float] | None = None) -> Metric:
        """The metric of this family with these labels (made on first use; shared by instances)."""
        return Metric(self, dict(labels or {}), buckets)


class Metric:
    """One labelled metric of a family."""

    def __init__(self, family: MetricFamily, labels: dict[str, str], buckets: Sequence[float] | None) -> None:
        for key, value in labels.items():
            if not isinstance(key, str) or not _LABEL.match(key) or not isinstance(value, str):
                raise TritonModelException(f"invalid metric label {key!r}: {value!r}")
        if family._kind == MetricFamily.HISTOGRAM:
            if not buckets:
                raise TritonModelException("Missing required buckets for histogram metrics.")
            bounds = [float(b) for b in buckets]
            if bounds != sorted(set(bounds)):
                raise TritonModelException("histogram buckets must be increasing")
        elif buckets is not None:
            raise TritonModelException("Unexpected buckets found for non-histogram metrics.")
        else:
            bounds = []
        self._family = family
        self._key = {"family": family._name, "labels": labels}
        _sink.metric({"op": "metric", **self._key, "buckets": bounds})

    def increment(self, value: float) -> None:
        """Adds `value` (a counter only grows)."""
        kind = self._family._kind
        if kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("Incrementing a histogram metric is not supported")
        if kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException("Counter metrics cannot be decremented")
        _sink.metric({"op": "add", **self._key, "value": float(value)})

    def set(self, value: float) -> None:
        """Sets a gauge."""
        if self._family._kind != MetricFamily.GAUGE:
            raise TritonModelException("Only gauge metrics can be set")
        _sink.metric({"op": "set", **self._key, "value": float(value)})

    def observe(self, value: float) -> None:
        """Records one observation in a histogram."""
        if self._family._kind != MetricFamily.HISTOGRAM:
            raise TritonModelException("Only histogram metrics can be observed")
        _sink.metric({"op": "observe", **self._key, "value": float(value)})

    def value(self) -> float:
        """The metric's current value (shared by every instance of every model)."""
        if self._family._kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("Getting the value of a histogram metric is not supported")
        return _sink.metric_value({"op": "value", **self._key})
