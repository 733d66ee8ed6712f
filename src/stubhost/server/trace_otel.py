"""Triton's "opentelemetry" trace mode (``--trace-config mode=opentelemetry``): each sampled request
becomes spans sent to an OTLP/HTTP collector, as Triton's tracer builds them (server
src/tracer.cc, docs/user_guide/trace.md).

Per request, with the client's span as parent when the request carried a W3C ``traceparent``:

- ``InferRequest``: from the moment the request was sampled to the moment its trace ended;
  events: the front end's HTTP_* / GRPC_* instants and INFER_RESPONSE_COMPLETE.
- ``<model name>``, child of ``InferRequest``: REQUEST_START .. REQUEST_END, with events
  REQUEST_START, QUEUE_START, REQUEST_END and attributes ``triton.model_name``,
  ``triton.model_version``, ``triton.trace_id``, ``triton.trace_parent_id`` and
  ``triton.request_id`` (when the request has an id).
- ``compute``, child of the model span: COMPUTE_START .. COMPUTE_END, with the four COMPUTE_*
  events. A request that never ran (cancelled in its queue, an ensemble) has none.

The requests a request starts (ensemble steps, BLS calls made with its trace) get a model span
(and compute span) each, as children of the model span of the request that started them. Every
span is a SERVER span of the instrumentation scope ``triton-server``; the resource has
``service.name=triton-inference-server`` unless ``resource`` settings say otherwise.

Spans are made once the request's trace ends, from its recorded instants, and go through the
SDK's BatchSpanProcessor to its OTLP/HTTP (protobuf) exporter. The packages are optional:
``pip install 'stubhost[otel]'``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stubhost.host.trace import TIMESTAMPS, RequestTrace

DEFAULT_URL = "http://localhost:4318/v1/traces"
SCOPE = "triton-server"
ROOT_SPAN = "InferRequest"
COMPUTE_SPAN = "compute"
_COMPUTE_EVENTS = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")
SHUTDOWN_WAIT_S = 2.0
MISSING_PACKAGES = ("OpenTelemetry tracing needs the packages opentelemetry-sdk and "
                    "opentelemetry-exporter-otlp-proto-http: pip install 'stubhost[otel]'")


@dataclass
class OtelSettings:
    """The ``--trace-config opentelemetry,<setting>=<value>`` values, with Triton's defaults."""

    url: str = DEFAULT_URL
    resource: dict[str, str] = field(default_factory=dict)
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay: int = 5000  # ms
    bsp_max_export_batch_size: int = 512
    other: dict[str, str] = field(default_factory=dict)  # settings Triton keeps without using them

    def shown(self) -> dict[str, str]:
        """The settings as the trace extension answers them in this mode (strings)."""
        return {"url": self.url, "bsp_max_queue_size": str(self.bsp_max_queue_size),
                "bsp_schedule_delay": str(self.bsp_schedule_delay),
                "bsp_max_export_batch_size": str(self.bsp_max_export_batch_size), **self.other}


def available() -> bool:
    """Whether the OpenTelemetry packages this mode needs are installed."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter  # noqa: F401
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        return False
    return True


def remote_parent(traceparent: str | None, tracestate: str | None = None) -> tuple[int, int, int] | None:
    """The client's span a request continues, from its W3C ``traceparent`` (and ``tracestate``)
    header, read with OpenTelemetry's TraceContext propagator: (trace id, span id, trace flags),
    or None when there is no valid one."""
    if not traceparent:
        return None
    from opentelemetry import trace as api
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    context = api.get_current_span(TraceContextTextMapPropagator().extract(carrier)).get_span_context()
    if not context.is_valid:
        return None
    return context.trace_id, context.span_id, int(context.trace_flags)


class OtelExporter:
    """Turns finished request traces into spans and hands them to a BatchSpanProcessor."""

    def __init__(self, settings: OtelSettings) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.settings = settings
        # Resource.create also reads OTEL_RESOURCE_ATTRIBUTES; the settings win over it.
        self._resource = Resource.create({"service.name": "triton-inference-server", **settings.resource})
        self._scope = InstrumentationScope(SCOPE)
        # The SDK wants a positive delay; Triton's 0 means "as soon as possible".
        self._processor = BatchSpanProcessor(
            OTLPSpanExporter(endpoint=settings.url), max_queue_size=settings.bsp_max_queue_size,
            schedule_delay_millis=max(settings.bsp_schedule_delay, 1),
            max_export_batch_size=min(settings.bsp_max_export_batch_size, settings.bsp_max_queue_size))

    def export(self, root: RequestTrace) -> None:
        """Queues the spans of a finished trace (and of the requests it started) for export;
        a trace taken without the TIMESTAMPS level recorded nothing, and gives no span, as in
        Triton."""
        if not root.level & TIMESTAMPS:
            return
        for span in self.spans(root):
            self._processor.on_end(span)

    def shutdown(self) -> None:
        """Exports what is queued, then stops; waits SHUTDOWN_WAIT_S at most, so that a collector
        that cannot be reached (the exporter retries for seconds) does not hold up the server's
        stop: what is not sent by then is lost."""
        stopping = threading.Thread(target=self._processor.shutdown, name="stubhost-otel-shutdown", daemon=True)
        stopping.start()
        stopping.join(SHUTDOWN_WAIT_S)

    # ---- building spans --------------------------------------------------------------------------
    def spans(self, root: RequestTrace) -> list[Any]:
        """The ReadableSpans of a finished trace: InferRequest, then each request's model and
        compute spans."""
        from opentelemetry.trace import SpanContext, TraceFlags

        ids = root.spans
        if ids is None:
            return []
        offset = root.created[1] - root.created[0]  # monotonic -> wall-clock ns

        def context(span_id: int) -> SpanContext:
            return SpanContext(ids.trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))

        remote = None
        if ids.remote_parent is not None:
            trace_id, span_id, flags = ids.remote_parent
            remote = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))
        ended = time.monotonic_ns()
        traces = [root, *root.children()]
        span_of = {t.id: t.spans.span_id for t in traces if t.spans is not None}
        root_context = context(ids.root_span_id)
        root_events: list[tuple[str, int]] = []
        spans = []
        for trace in traces:
            model, stamps = _record(trace)
            if trace is root:
                root_events = [s for s in stamps if _is_front_end(s[0])]
            if model is None or trace.spans is None:
                continue
            parent = root_context if trace is root else context(span_of.get(trace.parent_id, ids.root_span_id))
            own = [s for s in stamps if not _is_front_end(s[0]) and s[0] not in _COMPUTE_EVENTS]
            compute = [s for s in stamps if s[0] in _COMPUTE_EVENTS]
            start = _first(own, "REQUEST_START", ended)
            attributes: dict[str, Any] = {"triton.model_name": str(model["model_name"]),
                                          "triton.model_version": int(model.get("model_version", 0)),
                                          "triton.trace_id": trace.id, "triton.trace_parent_id": trace.parent_id}
            if model.get("request_id"):
                attributes["triton.request_id"] = str(model["request_id"])
            model_context = context(trace.spans.span_id)
            spans.append(self._span(str(model["model_name"]), model_context, parent, attributes, own, start,
                                    _last(own, "REQUEST_END", max([start, *(ns for _, ns in stamps)])), offset))
            if any(name == "COMPUTE_START" for name, _ in compute):
                compute_start = _first(compute, "COMPUTE_START", start)
                spans.append(self._span(COMPUTE_SPAN, context(random.getrandbits(64) or 1), model_context, {},
                                        compute, compute_start,
                                        _last(compute, "COMPUTE_END", max(ns for _, ns in compute)), offset))
        spans.insert(0, self._span(ROOT_SPAN, root_context, remote, {}, root_events, root.created[0], ended, offset))
        return spans

    def _span(self, name: str, context: Any, parent: Any, attributes: Mapping[str, Any],
              events: list[tuple[str, int]], start: int, end: int, offset: int) -> Any:
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.trace import SpanKind

        return ReadableSpan(name, context=context, parent=parent, resource=self._resource, attributes=dict(attributes),
                            events=[Event(event, timestamp=ns + offset) for event, ns in events],
                            kind=SpanKind.SERVER, instrumentation_scope=self._scope, start_time=start + offset,
                            end_time=max(end, start) + offset)


def _record(trace: RequestTrace) -> tuple[dict[str, Any] | None, list[tuple[str, int]]]:
    """A trace's model entry (None if it never reached a model) and its named instants, in order."""
    model = None
    stamps: list[tuple[str, int]] = []
    for entry in trace.entries():
        if "model_name" in entry:
            model = entry
        stamps.extend((t["name"], int(t["ns"])) for t in entry.get("timestamps", ()))
    return model, stamps


def _is_front_end(name: str) -> bool:
    return name.startswith(("HTTP_", "GRPC_")) or name == "INFER_RESPONSE_COMPLETE"


def _first(stamps: list[tuple[str, int]], name: str, default: int) -> int:
    return next((ns for n, ns in stamps if n == name), default)


def _last(stamps: list[tuple[str, int]], name: str, default: int) -> int:
    return next((ns for n, ns in reversed(stamps) if n == name), default)
