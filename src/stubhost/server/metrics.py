"""The Prometheus metrics endpoint (``GET /metrics`` on ``--metrics-port``), as Triton exports it.

Names, HELP texts, types and labels are Triton's, so that dashboards and alerts written for
Triton keep working; labels are written sorted by name, as Triton's text output has them. Per
model version (labels ``model``, ``version``), read from the models' statistics at each scrape,
so requests pay nothing for them:

- counters ``nv_inference_request_success``, ``nv_inference_request_failure`` (one series per
  ``reason``: REJECTED, CANCELED, BACKEND, OTHER, each there from load at 0), ``nv_inference_count``,
  ``nv_inference_exec_count``, and the cumulative µs of successful requests
  ``nv_inference_request_duration_us``, ``nv_inference_queue_duration_us``,
  ``nv_inference_compute_input_duration_us``, ``nv_inference_compute_infer_duration_us``,
  ``nv_inference_compute_output_duration_us``;
- the gauge ``nv_inference_pending_request_count`` (``LoadedModel.pending``);
- for models that use the response cache only, the counters ``nv_cache_num_hits_per_model``,
  ``nv_cache_hit_duration_per_model``, ``nv_cache_num_misses_per_model`` and
  ``nv_cache_miss_duration_per_model`` (µs).

Then, on Linux, the server-wide gauges ``nv_cpu_utilization``, ``nv_cpu_memory_total_bytes`` and
``nv_cpu_memory_used_bytes`` (read from /proc as Triton reads them; ``--allow-cpu-metrics false``
leaves them out), and the models' own metrics (``pb_utils.MetricFamily``).

The server's ``MetricsConfig`` (``--metrics-config``) changes two things, as in Triton 2.51:
``counter_latencies=false`` leaves out the five ``*_duration_us`` counters and the per-model cache
counters; ``summary_latencies=true`` adds, last (Triton's registry writes summaries after every
other kind), a summary per model version of each latency, with ``_count``, ``_sum`` and one series
per quantile (label ``quantile`` after the others, as prometheus-cpp writes it). For a version
that uses the response cache there is no request summary (Triton leaves it out then) and there
are cache hit and miss summaries instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stubhost.host.custom_metrics import escape_label
from stubhost.host.server import Server
from stubhost.host.stats import FAILURE_REASONS
from stubhost.server.metrics_config import MetricsConfig
from stubhost.server.quantiles import SummarySnapshot

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

Labels = tuple[tuple[str, str], ...]  # a sample's own labels, besides model and version


@dataclass(frozen=True)
class _VersionFigures:
    """What one model version's samples are read from."""

    model: str
    version: str
    entry: dict[str, Any]     # its statistics-extension entry (``model_stats``)
    failures: dict[str, int]  # failures by reason
    pending: int
    cached: bool = False      # the model uses the server's response cache


def _count(*path: str) -> Callable[[_VersionFigures], list[tuple[Labels, int]]]:
    def read(figures: _VersionFigures) -> list[tuple[Labels, int]]:
        value: Any = figures.entry
        for key in path:
            value = value[key]
        return [((), value)]
    return read


def _micros(key: str) -> Callable[[_VersionFigures], list[tuple[Labels, int]]]:
    """A duration of ``inference_stats``, in whole µs as Triton counts them."""
    return lambda figures: [((), figures.entry["inference_stats"][key]["ns"] // 1000)]


def _failures(figures: _VersionFigures) -> list[tuple[Labels, int]]:
    return [((("reason", reason),), figures.failures[reason]) for reason in FAILURE_REASONS]


def _pending(figures: _VersionFigures) -> list[tuple[Labels, int]]:
    return [((), figures.pending)]


# (name, HELP, TYPE, samples of one version), in the order Triton writes them
_MODEL_FAMILIES: tuple[tuple[str, str, str, Callable[[_VersionFigures], list[tuple[Labels, int]]]], ...] = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes", "counter",
     _count("inference_stats", "success", "count")),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", "counter", _failures),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)", "counter",
     _count("inference_count")),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     "counter", _count("execution_count")),
    ("nv_inference_request_duration_us",
     "Cumulative inference request duration in microseconds (includes cached requests)", "counter",
     _micros("success")),
    ("nv_inference_queue_duration_us",
     "Cumulative inference queuing duration in microseconds (includes cached requests)", "counter",
     _micros("queue")),
    ("nv_inference_compute_input_duration_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)", "counter",
     _micros("compute_input")),
    ("nv_inference_compute_infer_duration_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)", "counter",
     _micros("compute_infer")),
    ("nv_inference_compute_output_duration_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     "counter", _micros("compute_output")),
    ("nv_inference_pending_request_count", "Instantaneous number of pending requests awaiting execution per-model.",
     "gauge", _pending),
)
# The counters --metrics-config counter_latencies=false leaves out (with the cache families below).
_LATENCY_COUNTERS = frozenset({"nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                               "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                               "nv_inference_compute_output_duration_us"})
# Triton's per-model cache families (metrics.cc), written only for the versions of models that use
# the response cache (as Triton creates them only then), and left out while no model does.
_CACHE_FAMILIES: tuple[tuple[str, str, str, Callable[[_VersionFigures], list[tuple[Labels, int]]]], ...] = (
    ("nv_cache_num_hits_per_model", "Number of cache hits per model", "counter",
     _count("inference_stats", "cache_hit", "count")),
    ("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds", "counter",
     _micros("cache_hit")),
    ("nv_cache_num_misses_per_model", "Number of cache misses per model", "counter",
     _count("inference_stats", "cache_miss", "count")),
    ("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds",
     "counter", _micros("cache_miss")),
)


# Triton's latency summaries (metrics.cc), in its order: (name, HELP, kind of ModelStatistics'
# latency_summaries, which versions have one: None all, True those using the cache, False the others)
_SUMMARY_FAMILIES: tuple[tuple[str, str, str, bool | None], ...] = (
    ("nv_inference_request_summary_us",
     "Summary of inference request duration in microseconds (includes cached requests)", "request", False),
    ("nv_inference_queue_summary_us",
     "Summary of inference queuing duration in microseconds (includes cached requests)", "queue", None),
    ("nv_inference_compute_input_summary_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)", "compute_input", None),
    ("nv_inference_compute_infer_summary_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)", "compute_infer",
     None),
    ("nv_inference_compute_output_summary_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     "compute_output", None),
    ("nv_cache_hit_summary_per_model", "Summary of cache hit counts/durations per model, in microseconds.",
     "cache_hit", True),
    ("nv_cache_miss_summary_per_model", "Summary of cache miss counts/durations per model, in microseconds.",
     "cache_miss", True),
)


def _number(value: float) -> str:
    """A sample value as Triton writes it: integers without a fraction (NaN and infinities as
    prometheus-cpp writes them)."""
    value = float(value)
    if not math.isfinite(value):
        return "Nan" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    return str(int(value)) if value.is_integer() else repr(value)


def _quantile_label(phi: float) -> str:
    """A quantile label as prometheus-cpp writes it (%g with 16 significant digits)."""
    return _number(phi) if not math.isfinite(phi) else f"{phi:.16g}"


def _label_text(labels: Iterable[tuple[str, str]]) -> str:
    """``key="value",...``, sorted by key (Triton's label maps are ordered)."""
    return ",".join(f'{key}="{escape_label(val)}"' for key, val in sorted(labels))


def _sample(name: str, labels: Iterable[tuple[str, str]], value: float) -> str:
    text = _label_text(labels)
    return f"{name}{{{text}}} {_number(value)}" if text else f"{name} {_number(value)}"


def _figures(server: Server) -> list[_VersionFigures]:
    """Every loaded model version's figures, by model name then version."""
    out = []
    for model in server.loaded():
        for entry in model.statistics():
            version = int(entry["version"])
            out.append(_VersionFigures(model.name, entry["version"], entry, model.stats.failures(version),
                                       model.pending(version), getattr(model, "cache_use", None) is not None))
    return out


def _model_lines(figures: list[_VersionFigures], config: MetricsConfig) -> list[str]:
    """The per-model-version families (their HELP and TYPE lines even with no model loaded)."""
    lines: list[str] = []
    for name, text, kind, samples in _MODEL_FAMILIES:
        if name in _LATENCY_COUNTERS and not config.counter_latencies:
            continue
        lines.append(f"# HELP {name} {text}")
        lines.append(f"# TYPE {name} {kind}")
        for f in figures:
            for labels, value in samples(f):
                lines.append(_sample(name, (("model", f.model), ("version", f.version), *labels), value))
    # (Triton makes its cache counters with the latency counters, so they go with them)
    cached = [f for f in figures if f.cached] if config.counter_latencies else []
    for name, text, kind, samples in _CACHE_FAMILIES if cached else ():
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        lines += [_sample(name, (("model", f.model), ("version", f.version), *labels), value)
                  for f in cached for labels, value in samples(f)]
    return lines


class CpuMetrics:
    """Triton's CPU gauges, read from /proc as Triton reads them; only where /proc/stat exists
    (Linux). One caller at a time.

    Utilization is the busy share of the CPU time of all cores (busy: user, nice, system, irq,
    softirq, steal; idle: idle, iowait) over a window of at least ``WINDOW_S``, as Triton's
    per-interval poll gives it: a scrape within a window sees the last window's figure. Used
    memory is MemTotal - MemAvailable.
    """

    WINDOW_S = 1.0

    def __init__(self, proc: str | Path = "/proc") -> None:
        self._proc = Path(proc)
        self._base = self._cpu_times()
        self._base_at = time.monotonic()
        self._last: float | None = None  # the last complete window's utilization

    def available(self) -> bool:
        """True where the gauges can be read."""
        return self._base is not None

    def _cpu_times(self) -> tuple[int, int] | None:
        """(busy, idle) jiffies of all cores since boot (None: /proc/stat unreadable)."""
        try:
            with open(self._proc / "stat") as f:
                fields = f.readline().split()
        except OSError:
            return None
        if len(fields) < 9 or fields[0] != "cpu":
            return None
        user, nice, system, idle, iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
        return user + nice + system + irq + softirq + steal, idle + iowait

    def utilization(self) -> float:
        """Utilization in [0.0, 1.0] (0.0 when it cannot be read)."""
        now = self._cpu_times()
        if now is None or self._base is None:
            return 0.0
        # (clamped at 0: the kernel's counters may step back, and Triton ignores that too)
        busy, idle = max(now[0] - self._base[0], 0), max(now[1] - self._base[1], 0)
        if busy + idle == 0:  # no tick since the window began
            return self._last or 0.0
        current = busy / (busy + idle)
        if time.monotonic() - self._base_at >= self.WINDOW_S:
            self._last = current
            self._base, self._base_at = now, time.monotonic()
        return current if self._last is None else self._last

    def memory(self) -> tuple[int, int]:
        """(total, used) bytes of RAM ((0, 0) when /proc/meminfo cannot be read)."""
        values: dict[str, int] = {}
        try:
            with open(self._proc / "meminfo") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 2 and parts[0] in ("MemTotal:", "MemAvailable:"):
                        values[parts[0]] = int(parts[1]) * 1024  # kB
        except (OSError, ValueError):
            return 0, 0
        total, available = values.get("MemTotal:"), values.get("MemAvailable:")
        if total is None or available is None or available > total:
            return 0, 0
        return total, total - available

    def render(self) -> list[str]:
        """The three gauges' lines (none where /proc/stat is missing)."""
        if not self.available():
            return []
        total, used = self.memory()
        lines = []
        for name, text, value in (("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", self.utilization()),
                                  ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", total),
                                  ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", used)):
            lines += [f"# HELP {name} {text}", f"# TYPE {name} gauge", _sample(name, (), value)]
        return lines


def _summary_lines(server: Server, figures: list[_VersionFigures]) -> list[str]:
    """The latency summaries of every version that keeps them (families without one left out,
    as prometheus-cpp leaves out a family without metrics)."""
    models = {model.name: model for model in server.loaded()}
    now = time.monotonic_ns()
    kept: list[tuple[_VersionFigures, dict[str, Any]]] = []
    for f in figures:
        model = models.get(f.model)
        snapshots = model.stats.latency_summaries(int(f.version), now) if model is not None else {}
        if snapshots:
            kept.append((f, snapshots))
    lines: list[str] = []
    for name, text, kind, cached in _SUMMARY_FAMILIES:
        series = [(f, snapshots[kind]) for f, snapshots in kept if cached is None or f.cached == cached]
        if not series:
            continue
        lines += [f"# HELP {name} {text}", f"# TYPE {name} summary"]
        for f, snap in series:
            assert isinstance(snap, SummarySnapshot)
            labels = (("model", f.model), ("version", f.version))
            lines.append(_sample(f"{name}_count", labels, snap.count))
            lines.append(_sample(f"{name}_sum", labels, snap.sum))
            own = _label_text(labels)  # then the quantile, last, as prometheus-cpp adds it
            lines += [f'{name}{{{own},quantile="{_quantile_label(phi)}"}} {_number(value)}'
                      for phi, value in snap.quantiles]
    return lines


def render_metrics(server: Server, cpu: CpuMetrics | None = None) -> bytes:
    """The Prometheus text exposition (format 0.0.4) of the server's metrics, as the server's
    ``metrics_config`` (None: Triton's defaults) asks.

    Written out here rather than through prometheus_client: that library names every counter
    sample ``<name>_total``, and Triton's dashboards and alerts expect ``nv_inference_count``
    itself to be a counter.
    """
    config = getattr(server, "metrics_config", None) or MetricsConfig()
    figures = [] if server.closed else _figures(server)
    lines = _model_lines(figures, config)
    if cpu is not None:
        lines += cpu.render()
    lines += server.custom_metrics.render()  # the models' own (pb_utils.MetricFamily)
    if config.summary_latencies and figures:
        lines += _summary_lines(server, figures)
    return ("\n".join(lines) + "\n").encode()


class MetricsApp:
    """A plain ASGI app serving ``GET /metrics`` in the Prometheus text format; ``cpu_metrics``
    (``--allow-cpu-metrics``) False leaves the CPU gauges out."""

    def __init__(self, server: Server, *, cpu_metrics: bool = True) -> None:
        self.server = server
        self.cpu = CpuMetrics() if cpu_metrics else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"].rstrip("/") != "/metrics":
            status, body = 404, b"Not Found"
        elif scope["method"] != "GET":
            status, body = 405, b"Method Not Allowed"
        else:
            status, body = 200, render_metrics(self.server, self.cpu)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", CONTENT_TYPE), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
