"""The server's registry of models' custom metrics (``pb_utils.MetricFamily``), rendered as
Prometheus text beside the built-in counters.

Families are server-wide, as in Triton: every instance (and model) that declares a family of
the same name and kind shares it, and a metric with the same labels is one value. Updates come
as one-way messages from the stubs, applied in the order each stub sent them.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("stubhost")

LabelKey = tuple[tuple[str, str], ...]


@dataclass
class _Series:
    value: float = 0.0
    bounds: list[float] = field(default_factory=list)  # histogram upper bounds (+Inf implied)
    counts: list[int] = field(default_factory=list)    # per bucket, not cumulative
    total: float = 0.0
    observations: int = 0


@dataclass
class _Family:
    description: str
    kind: str  # "counter", "gauge" or "histogram"
    series: dict[LabelKey, _Series] = field(default_factory=dict)


def escape_label(value: str) -> str:
    """A label value as the Prometheus text format writes it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


class CustomMetrics:
    """Every custom metric family of one server."""

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}
        self._lock = threading.Lock()

    def apply(self, update: dict[str, Any]) -> float | None:
        """Applies one update from a stub (``op``: family, metric, add, set, observe, value);
        returns the value for ``value``. Raises ValueError for an update that cannot apply."""
        op = update.get("op")
        with self._lock:
            if op == "family":
                name, kind = str(update["name"]), str(update["kind"])
                family = self._families.get(name)
                if family is None:
                    self._families[name] = _Family(str(update.get("description", "")), kind)
                elif family.kind != kind:
                    raise ValueError(f"metric family '{name}' exists already as a {family.kind}, not a {kind}")
                return None
            family = self._families.get(str(update.get("family")))
            if family is None:
                raise ValueError(f"unknown metric family '{update.get('family')}'")
            key: LabelKey = tuple(sorted((str(k), str(v)) for k, v in dict(update.get("labels", {})).items()))
            series = family.series.get(key)
            if op == "metric":
                if series is None:
                    bounds = [float(b) for b in update.get("buckets", [])]
                    family.series[key] = _Series(bounds=bounds, counts=[0] * (len(bounds) + 1))
                return None
            if series is None:
                raise ValueError(f"unknown metric {dict(key)} of family '{update.get('family')}'")
            value = float(update.get("value", 0.0))
            if op == "add":
                series.value += value
            elif op == "set":
                series.value = value
            elif op == "observe":
                series.counts[bisect.bisect_left(series.bounds, value)] += 1
                series.total += value
                series.observations += 1
            elif op == "value":
                return series.value
            else:
                raise ValueError(f"unknown metric operation {op!r}")
        return None

    def render(self) -> list[str]:
        """The Prometheus text lines of every family."""
        lines: list[str] = []
        with self._lock:
            for name, family in sorted(self._families.items()):
                lines.append(f"# HELP {name} {family.description}")
                lines.append(f"# TYPE {name} {family.kind}")
                for key, series in family.series.items():
                    labels = ",".join(f'{k}="{escape_label(v)}"' for k, v in key)
                    if family.kind != "histogram":
                        lines.append(f"{name}{{{labels}}} {_number(series.value)}" if labels
                                     else f"{name} {_number(series.value)}")
                        continue
                    sep = "," if labels else ""
                    running = 0
                    for bound, count in zip([*series.bounds, math.inf], series.counts):
                        running += count
                        lines.append(f'{name}_bucket{{{labels}{sep}le="{_number(bound)}"}} {running}')
                    suffix = f"{{{labels}}}" if labels else ""
                    lines.append(f"{name}_sum{suffix} {_number(series.total)}")
                    lines.append(f"{name}_count{suffix} {series.observations}")
        return lines
