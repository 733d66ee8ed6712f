"""The server's registry of models' custom metrics (``pb_utils.MetricFamily``), rendered as
Prometheus text beside the built-in counters.

Families are server-wide, as in Triton: every instance (and model) that declares a family of
the same name and kind shares it, and a metric with the same labels is one value. Updates come
as messages from the stubs, applied in the order each stub sent them.

Lifetime, as in Triton's Python backend: each ``MetricFamily`` object of a stub is a *handle*
here, under an id the stub chose, and each metric made through it holds its series through that
handle. A series lives while some handle holds it, a family while some handle of it lives; a
family without series is not exported (Triton's Prometheus registry skips empty families). A
handle goes when the stub deletes its object (``drop``) or when the stub is gone: every update
names its *owner* (the stub process), and what an owner that is ``dead`` held is released before
the next declaration or read, so unloading a model or losing a stub removes what only it held.

Nothing a stub sends is trusted: names, labels, kinds, buckets and values are checked, and a stub
can only reach families through its own handles.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

LabelKey = tuple[tuple[str, str], ...]

KINDS = ("counter", "gauge", "histogram")
# prometheus-cpp's words for a name taken by another kind, which Triton passes on to the model
KIND_CONFLICT = "Family name already exists with different type"
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_MAX_ID = 2**63 - 1


class MetricOwner(Protocol):
    """Who sends updates (a stub process): what it holds is released once it is ``dead``."""

    dead: bool


@dataclass
class _Series:
    value: float = 0.0
    bounds: list[float] = field(default_factory=list)  # histogram upper bounds (+Inf implied)
    counts: list[int] = field(default_factory=list)    # per bucket, not cumulative
    total: float = 0.0
    observations: int = 0
    holders: int = 0  # handles that made a metric with these labels


@dataclass
class _Family:
    description: str
    kind: str  # "counter", "gauge" or "histogram"
    series: dict[LabelKey, _Series] = field(default_factory=dict)
    handles: int = 0  # live MetricFamily objects of this name, in every stub


@dataclass
class _Handle:
    """One ``MetricFamily`` object of one stub."""

    family: str
    keys: set[LabelKey] = field(default_factory=set)  # the series its metrics hold


def escape_label(value: str) -> str:
    """A label value as the Prometheus text format writes it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """A HELP text as the Prometheus text format writes it (a newline would start a fake line)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


# ---- what a stub sends, checked ------------------------------------------------------------------
def _id(value: Any) -> int:
    if type(value) is not int or not 0 < value <= _MAX_ID:
        raise ValueError(f"invalid metric family id {value!r}")
    return value


def _text(update: dict[str, Any], key: str, pattern: re.Pattern[str] | None = None) -> str:
    value = update.get(key, "" if pattern is None else None)
    if not isinstance(value, str) or (pattern is not None and not pattern.fullmatch(value)):
        raise ValueError(f"invalid metric {key} {value!r}")
    return value


def _labels(update: dict[str, Any]) -> LabelKey:
    labels = update.get("labels", {})
    if not isinstance(labels, dict) or not all(isinstance(k, str) and _LABEL.fullmatch(k) and isinstance(v, str)
                                               for k, v in labels.items()):
        raise ValueError(f"invalid metric labels {labels!r}")
    return tuple(sorted(labels.items()))


def _real(value: Any) -> float:
    if type(value) not in (int, float):
        raise ValueError(f"invalid metric value {value!r}")
    return float(value)


def _buckets(update: dict[str, Any], kind: str) -> list[float]:
    raw = update.get("buckets", [])
    if not isinstance(raw, list):
        raise TypeError(f"invalid histogram buckets {raw!r}")
    bounds = [_real(b) for b in raw]
    if kind != "histogram" and bounds:
        raise ValueError(f"a {kind} has no buckets")
    if not all(math.isfinite(b) for b in bounds) or any(a >= b for a, b in itertools.pairwise(bounds)):
        raise ValueError(f"invalid histogram buckets {raw!r}")
    return bounds


def _update(kind: str, series: _Series, op: Any, update: dict[str, Any]) -> float | None:
    """Applies add, set, observe or value to one series, if its kind allows it."""
    if op == "value":
        if kind == "histogram":
            raise ValueError("Getting the value of a histogram metric is not supported")
        return series.value
    value = _real(update.get("value"))
    if op == "add" and kind != "histogram":
        if kind == "counter" and not value >= 0:
            raise ValueError("Counter metrics cannot be decremented")
        series.value += value
    elif op == "set" and kind == "gauge":
        series.value = value
    elif op == "observe" and kind == "histogram":
        series.counts[bisect.bisect_left(series.bounds, value)] += 1
        series.total += value
        series.observations += 1
    else:
        raise ValueError(f"metric operation {op!r} does not apply to a {kind}")
    return None


class CustomMetrics:
    """Every custom metric family of one server. Thread safe."""

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}
        self._owners: dict[MetricOwner, dict[int, _Handle]] = {}  # owner -> its handles by id
        self._lock = threading.Lock()

    def apply(self, owner: MetricOwner, update: Any) -> float | None:
        """Applies one message from `owner`'s stub (``op``: family, metric, add, set, observe,
        value, drop); returns the value for ``value`` (0.0 for ``family`` and ``metric``, which
        its stub waits for). Raises ValueError (TypeError for a malformed one), with the reason, for a message
        that cannot apply."""
        if not isinstance(update, dict):
            raise TypeError("malformed metric update")
        op = update.get("op")
        with self._lock:
            if owner.dead:  # a message still queued when its stub ended: nothing may outlive it
                raise ValueError("the instance is gone")
            if op == "family":
                self._purge()
                return self._declare(self._owners.setdefault(owner, {}), update)
            handles = self._owners.get(owner, {})
            family_id = _id(update.get("family"))
            handle = handles.get(family_id)
            if handle is None:
                raise ValueError(f"unknown metric family id {family_id}")
            if op == "drop":
                self._let_go(handles.pop(family_id))
                return None
            family = self._families[handle.family]
            key = _labels(update)
            if op == "metric":
                self._purge()  # a dead stub's series must not lend its value to a new metric
                self._hold(family, handle, key, _buckets(update, family.kind))
                return 0.0
            if key not in handle.keys:
                raise ValueError(f"unknown metric {dict(key)} of family '{handle.family}'")
            return _update(family.kind, family.series[key], op, update)

    def release(self, owner: MetricOwner) -> None:
        """Lets go of everything `owner` holds now (its stub ended)."""
        with self._lock:
            self._release(self._owners.pop(owner, {}))

    # ---- holding and letting go (lock held) ----------------------------------------------------
    def _declare(self, handles: dict[int, _Handle], update: dict[str, Any]) -> float:
        family_id = _id(update.get("id"))
        if family_id in handles:
            raise ValueError(f"metric family id {family_id} is in use")
        name, kind = _text(update, "name", _NAME), _text(update, "kind")
        description = _text(update, "description")
        if kind not in KINDS:
            raise ValueError(f"unknown metric kind {kind!r}")
        family = self._families.get(name)
        if family is None:  # the first declaration's description stays, as in Triton
            family = self._families[name] = _Family(description, kind)
        elif family.kind != kind:
            raise ValueError(KIND_CONFLICT)
        family.handles += 1
        handles[family_id] = _Handle(name)
        return 0.0

    def _hold(self, family: _Family, handle: _Handle, key: LabelKey, bounds: list[float]) -> None:
        if key in handle.keys:  # the same labels again through the same handle: the same metric
            return
        series = family.series.get(key)
        if series is None:  # the first metric's buckets stay, as in Triton
            series = family.series[key] = _Series(bounds=bounds, counts=[0] * (len(bounds) + 1))
        series.holders += 1
        handle.keys.add(key)

    def _let_go(self, handle: _Handle) -> None:
        family = self._families[handle.family]
        for key in handle.keys:
            series = family.series[key]
            series.holders -= 1
            if series.holders == 0:
                del family.series[key]
        family.handles -= 1
        if family.handles == 0:
            del self._families[handle.family]

    def _release(self, handles: dict[int, _Handle]) -> None:
        for handle in handles.values():
            self._let_go(handle)

    def _purge(self) -> None:
        """Releases what ended stubs held (``dead`` is never cleared)."""
        for owner in [owner for owner in self._owners if owner.dead]:
            self._release(self._owners.pop(owner))

    # ---- reading ---------------------------------------------------------------------------------
    def render(self) -> list[str]:
        """The Prometheus text lines of every family that has metrics."""
        lines: list[str] = []
        with self._lock:
            self._purge()
            for name, family in sorted(self._families.items()):
                if not family.series:  # Triton's registry exports no family without metrics
                    continue
                lines.append(f"# HELP {name} {escape_help(family.description)}")
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
