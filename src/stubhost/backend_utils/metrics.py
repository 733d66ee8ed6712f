"""``pb_utils.MetricFamily`` and ``pb_utils.Metric``: custom metrics a model exports.

A model declares a family (name, description, kind) and, in it, metrics by labels; the server
exports them on its metrics endpoint beside Triton's ``nv_inference_*`` counters. Updates
(``increment``, ``set``, ``observe``) are one-way messages to the server, so they cost no round
trip; ``value()`` asks the server, which holds the one value all instances share. Declaring a
family is a round trip too, so that a name taken by another kind raises here, as in Triton.

Lifetime follows Triton's Python backend: the server holds a family for as long as the
``MetricFamily`` object lives, and each metric made through it until that family object goes
(deleting a ``Metric`` object alone removes nothing: Triton's family keeps its metrics). The
message that lets go is one-way. A ``Metric`` does not keep its family alive; used after its
family was deleted, it raises Triton's error. Everything a stub holds is released when it ends.

Rules follow Triton's Python backend: a counter only grows, a histogram only
observes and needs its buckets, names are Prometheus metric names.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
import sys
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from stubhost.backend_utils.errors import TritonModelException

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

# Triton's words (python_backend's Metric::CheckIfCleared), after "Failed to <action> metric value: ".
FAMILY_DELETED = ("Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
                  "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have been "
                  "deleted.")
OUTSIDE_STUB = "metrics are only available inside a model instance"

_family_ids = itertools.count(1)  # names each MetricFamily object to the server; never reused in a stub


class MetricSink(Protocol):
    """What the stub provides to reach the server's metrics."""

    def metric(self, payload: dict[str, Any]) -> None:
        """Sends one update (nobody waits for it)."""

    def metric_value(self, payload: dict[str, Any]) -> float:
        """A round trip: the server's answer (a value), or TritonModelException with its reason."""


class _Unattached:
    def metric(self, payload: dict[str, Any]) -> None:
        raise TritonModelException(OUTSIDE_STUB)

    def metric_value(self, payload: dict[str, Any]) -> float:
        raise TritonModelException(OUTSIDE_STUB)


_sink: MetricSink = _Unattached()
_instance = ""  # the instance's name, which Triton's texts for a refused operation carry


def set_sink(sink: MetricSink, instance_name: str = "") -> None:
    """Installs the stub's sink (and the name of its instance)."""
    global _sink, _instance
    _sink, _instance = sink, instance_name


def _refusal(failure: str, reason: str) -> TritonModelException:
    """Triton's words for an operation its server refused: ``<failure>: Failed to process the
    request for model '<instance>', message: <reason>``."""
    return TritonModelException(f"{failure}: Failed to process the request for model '{_instance}', message: "
                                f"{reason}")


_KIND_NAMES = {0: "TRITONSERVER_METRIC_KIND_COUNTER", 1: "TRITONSERVER_METRIC_KIND_GAUGE",
               2: "TRITONSERVER_METRIC_KIND_HISTOGRAM"}


def _unsupported(action: str, kind: int, operation: str) -> TritonModelException:
    """Triton's refusal of an operation a kind of metric does not have."""
    return _refusal(f"Failed to {action} metric value", f"{_KIND_NAMES[kind]} does not support {operation}")


def _ask(payload: dict[str, Any], failure: str) -> float:
    """A round trip to the server; its refusal raises Triton's words (``_refusal``)."""
    sink = _sink
    if isinstance(sink, _Unattached):
        return sink.metric_value(payload)  # raises OUTSIDE_STUB as it is
    try:
        return sink.metric_value(payload)
    except TritonModelException as e:
        raise _refusal(failure, str(e)) from None


class MetricFamily:
    """A named family of metrics of one kind (COUNTER, GAUGE or HISTOGRAM)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2
    _KINDS = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}

    def __init__(self, name: str, description: str, kind: int) -> None:
        self._id = 0  # set once the server holds the family: a refused one lets nothing go in __del__
        if not isinstance(name, str) or not _NAME.match(name):
            raise TritonModelException(f"invalid metric family name '{name}'")
        if kind not in self._KINDS:
            raise TritonModelException("Unknown metric family kind: expected COUNTER, GAUGE or HISTOGRAM")
        self._name = name
        self._description = str(description)
        self._kind = kind
        family_id = next(_family_ids)
        _ask({"op": "family", "id": family_id, "name": name, "description": self._description,
              "kind": self._KINDS[kind]}, "Error when creating MetricFamily")
        self._id = family_id

    def Metric(self, labels: Mapping[str, str] | None = None,  # noqa: N802  (Triton's name)
               buckets: Sequence[float] | None = None) -> Metric:
        """The metric of this family with these labels (made on first use; shared by instances)."""
        return Metric(self, dict(labels or {}), buckets)

    def __del__(self) -> None:
        # Triton's ~MetricFamily: the family, and the metrics made through it, leave the server.
        # One-way; at interpreter exit there is no point (the server releases a stub that ends).
        family_id = getattr(self, "_id", 0)
        if not family_id or sys.is_finalizing():
            return
        with contextlib.suppress(Exception):  # a destructor must not raise; the stub's end releases it anyway
            _sink.metric({"op": "drop", "family": family_id})


class Metric:
    """One labelled metric of a family."""

    def __init__(self, family: MetricFamily, labels: dict[str, str], buckets: Sequence[float] | None) -> None:
        for key, value in labels.items():
            if not isinstance(key, str) or not _LABEL.match(key) or not isinstance(value, str):
                raise TritonModelException(f"invalid metric label {key!r}: {value!r}")
        if family._kind == MetricFamily.HISTOGRAM:
            if buckets is None:  # an empty list is accepted, as Triton accepts it (only +Inf)
                raise TritonModelException("Failed to create metric. Missing required buckets.")
            bounds = [float(b) for b in buckets]
            if not all(math.isfinite(b) for b in bounds):
                raise TritonModelException("histogram buckets must be finite")
            if bounds != sorted(set(bounds)):
                raise _refusal("Error when creating Metric", "Bucket Boundaries must be strictly sorted")
        elif buckets is not None:
            raise TritonModelException("Unexpected buckets found for non-histogram metrics.")
        else:
            bounds = []
        self._family = weakref.ref(family)  # as in Triton, a Metric does not keep its family alive
        self._kind = family._kind
        self._key = {"family": family._id, "labels": labels}
        # A round trip, as in Triton: once made, the metric is on the metrics endpoint (a model that
        # makes its metrics in initialize has them there by the time the instance is ready).
        _ask({"op": "metric", **self._key, "buckets": bounds}, "Error when creating Metric")

    def _check_family(self, action: str) -> None:
        """Triton's error for a metric whose family was deleted (checked before anything else)."""
        if self._family() is None:
            raise TritonModelException(f"Failed to {action} metric value: {FAMILY_DELETED}")

    def increment(self, value: float) -> None:
        """Adds `value` (a counter only grows)."""
        self._check_family("increment")
        if self._kind == MetricFamily.HISTOGRAM:
            raise _unsupported("increment", self._kind, "Increment")
        if self._kind == MetricFamily.COUNTER and value < 0:
            raise _refusal("Failed to increment metric value", "TRITONSERVER_METRIC_KIND_COUNTER can only be "
                                                               "incremented monotonically by non-negative values.")
        _sink.metric({"op": "add", **self._key, "value": float(value)})

    def set(self, value: float) -> None:
        """Sets a gauge."""
        self._check_family("set")
        if self._kind != MetricFamily.GAUGE:
            raise _unsupported("set", self._kind, "Set")
        _sink.metric({"op": "set", **self._key, "value": float(value)})

    def observe(self, value: float) -> None:
        """Records one observation in a histogram."""
        self._check_family("observe")
        if self._kind != MetricFamily.HISTOGRAM:
            raise _unsupported("observe", self._kind, "Observe")
        _sink.metric({"op": "observe", **self._key, "value": float(value)})

    def value(self) -> float:
        """The metric's current value (shared by every instance of every model)."""
        self._check_family("get")
        if self._kind == MetricFamily.HISTOGRAM:
            raise _unsupported("get", self._kind, "Value")
        return _ask({"op": "value", **self._key}, "Failed to get metric value")
