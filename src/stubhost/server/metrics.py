"""The Prometheus metrics endpoint (``GET /metrics`` on ``--metrics-port``), with Triton's names.

Counters are read from the models' statistics at each scrape, so they cost nothing per request:
``nv_inference_request_success``, ``nv_inference_request_failure``, ``nv_inference_count``,
``nv_inference_exec_count`` and the cumulative ``nv_inference_*_duration_us`` (request, queue,
compute input, compute infer, compute output), labelled ``model`` and ``version`` as in Triton.
"""

from __future__ import annotations

from typing import Any

from stubhost.host.custom_metrics import escape_label
from stubhost.host.server import Server

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"

# (metric name, help, where in a model_stats entry: a count, or the ns of a duration in µs)
_COUNTS = (
    ("nv_inference_request_success", "Number of successful inference requests, all batch sizes",
     ("inference_stats", "success", "count")),
    ("nv_inference_request_failure", "Number of failed inference requests, all batch sizes",
     ("inference_stats", "fail", "count")),
    ("nv_inference_count", "Number of inferences performed (does not include cached requests)",
     ("inference_count",)),
    ("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)",
     ("execution_count",)),
)
_DURATIONS = (
    ("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds", "success"),
    ("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds", "queue"),
    ("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds",
     "compute_input"),
    ("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds",
     "compute_infer"),
    ("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds",
     "compute_output"),
)


def _dig(entry: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        entry = entry[key]
    return entry


def render_metrics(server: Server) -> bytes:
    """The Prometheus text exposition (format 0.0.4) of the models' counters.

    Written out here rather than through prometheus_client: that library names every counter
    sample ``<name>_total``, and Triton's dashboards and alerts expect ``nv_inference_count``
    itself to be a counter.
    """
    stats = [] if server.closed else server.statistics()["model_stats"]
    lines: list[str] = []
    series = [(name, text, path, 1) for name, text, path in _COUNTS]
    series += [(name, text, ("inference_stats", key, "ns"), 1000) for name, text, key in _DURATIONS]  # ns -> µs
    for name, text, path, scale in series:
        lines.append(f"# HELP {name} {text}")
        lines.append(f"# TYPE {name} counter")
        for entry in stats:
            value = _dig(entry, path)
            lines.append(f'{name}{{model="{escape_label(entry["name"])}",version="{escape_label(entry["version"])}"}} '
                         f"{value / scale if scale != 1 else value}")
    lines += server.custom_metrics.render()  # the models' own (pb_utils.MetricFamily)
    return ("\n".join(lines) + "\n").encode()


class MetricsApp:
    """A plain ASGI app serving ``GET /metrics`` in the Prometheus text format."""

    def __init__(self, server: Server) -> None:
        self.server = server

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["path"].rstrip("/") != "/metrics":
            status, body = 404, b"Not Found"
        elif scope["method"] != "GET":
            status, body = 405, b"Method Not Allowed"
        else:
            status, body = 200, render_metrics(self.server)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", CONTENT_TYPE), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
