"""One sampled request's trace, as Triton's "triton" trace mode records it
(server docs/user_guide/trace.md, "JSON Trace Output").

A front end samples a request (server/trace_settings.py) and hands its :class:`RequestTrace`
down with it. Each layer adds what it already knows: the front end its HTTP_* / GRPC_*
instants, the model the request's REQUEST_START .. REQUEST_END from the very instants its
statistics use (stats.py), the service the request's tensors (TENSORS level). An untraced
request carries None and pays one ``if trace is not None`` per layer.

Every instant is CLOCK_MONOTONIC nanoseconds (``time.monotonic_ns()``, the clock the stubs
stamp ``exec_start``/``exec_end`` with too), which is the clock behind Triton's
``std::chrono::steady_clock`` on Linux.

How stubhost's instants map onto Triton's timestamps:

- REQUEST_START: the model received the call (``begin``).
- QUEUE_START: the request started waiting: entering its model's queue (a model with a
  scheduler), else being handed to its instance's stub, whose requests wait in order.
- COMPUTE_START: a queued request's batch started being written to its instance; a direct
  request's wait ends when the model's ``execute`` starts, so it is that instant.
- COMPUTE_INPUT_END: the model's ``execute`` started (its inputs are read by then).
- COMPUTE_OUTPUT_START: ``execute`` returned (a decoupled model: its last response's).
- COMPUTE_END: the parent had read the outputs. REQUEST_END: the response was ready.

The stub's instants are untrusted, so they are clamped into the request's interval, and the
queue instants into [begin, execute start], which keeps the timestamps in Triton's order.

In the "opentelemetry" trace mode the same record becomes spans (server/trace_otel.py); a trace
then also carries its span ids (:class:`SpanIds`), so that a model can read its request's
context.
"""

from __future__ import annotations

import itertools
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

TIMESTAMPS = 0x4  # TRITONSERVER_TRACE_LEVEL_TIMESTAMPS
TENSORS = 0x8     # TRITONSERVER_TRACE_LEVEL_TENSORS
LEVELS = {"TIMESTAMPS": TIMESTAMPS, "TENSORS": TENSORS}

TENSOR_QUEUE_INPUT = "TENSOR_QUEUE_INPUT"
TENSOR_BACKEND_OUTPUT = "TENSOR_BACKEND_OUTPUT"

_ids = itertools.count(1)  # as Triton's trace ids: one sequence per server, from 1

Sink = Callable[["RequestTrace"], None]  # receives a finished trace (its root)


@dataclass(frozen=True)
class SpanIds:
    """A trace's OpenTelemetry identity (opentelemetry trace mode): the trace id its spans share,
    the id of its model span (what a model's ``request.trace().get_context()`` names), and, for
    a request's own trace, the id of its ``InferRequest`` span and the client's span it continues
    (``traceparent``), if any."""

    trace_id: int
    span_id: int
    root_span_id: int = 0
    remote_parent: tuple[int, int, int] | None = None  # (trace id, span id, trace flags) of the client's span

    def traceparent(self) -> str:
        """The W3C ``traceparent`` of the model span."""
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-01"

    def child(self) -> SpanIds:
        """The identity of a request this one starts: the same trace, a span of its own."""
        return SpanIds(self.trace_id, _span_id())


def new_span_ids(remote_parent: tuple[int, int, int] | None = None) -> SpanIds:
    """The identity of a request's own trace: the client's trace id when it sent one, else a new one."""
    trace_id = remote_parent[0] if remote_parent is not None else random.getrandbits(128) or 1
    return SpanIds(trace_id, _span_id(), _span_id(), remote_parent)


def _span_id() -> int:
    return random.getrandbits(64) or 1


def level_names(level: int) -> list[str]:
    """The names of a trace level, as the trace extension lists them (["OFF"] for none)."""
    names = [name for name, bit in LEVELS.items() if level & bit]
    return names or ["OFF"]


class RequestTrace:
    """The trace of one request (and of the requests it started: ensemble steps), written as
    one unit once its front end is done with it.

    ``hold``/``release`` count its users (the sampler holds it first): the last release hands
    the trace to the setting that sampled it, which writes its JSON objects (grouped by trace id
    as Triton groups them) or exports its spans.
    """

    __slots__ = ("id", "parent_id", "level", "model_name", "spans", "created", "_root", "_entries", "_children",
                 "_sink", "_refs", "_lock", "__weakref__")

    def __init__(self, level: int, sink: Sink | None, model_name: str = "",
                 parent: RequestTrace | None = None, spans: SpanIds | None = None) -> None:
        self.id = next(_ids)
        self.parent_id = parent.id if parent is not None else 0
        self.level = level
        self.model_name = model_name
        # OpenTelemetry mode only: the trace's span ids, and when it was taken (monotonic and
        # wall-clock ns: spans carry wall-clock times).
        self.spans = spans if parent is None or parent.spans is None else parent.spans.child()
        self.created = (time.monotonic_ns(), time.time_ns())
        self._root: RequestTrace = parent._root if parent is not None else self
        self._entries: list[dict[str, Any]] = []
        self._children: list[RequestTrace] = []
        self._sink = sink
        self._refs = 1
        self._lock = threading.Lock()

    # ---- recording -------------------------------------------------------------------------------
    def timestamp(self, name: str, ns: int | None = None) -> None:
        """Records one named instant (now, unless `ns` is given); only at TIMESTAMPS level."""
        if self.level & TIMESTAMPS:
            self._entries.append({"id": self.id, "timestamps": [{"name": name,
                                                                  "ns": time.monotonic_ns() if ns is None else ns}]})

    def started(self, model_name: str, version: int, request_id: str, begin: int) -> None:
        """The request reached its model: Triton writes the trace's model entry with its
        REQUEST_START."""
        if not self.level & TIMESTAMPS:
            return
        entry: dict[str, Any] = {"id": self.id, "model_name": model_name, "model_version": version}
        if request_id:
            entry["request_id"] = request_id
        if self.parent_id:
            entry["parent_id"] = self.parent_id
        self._entries.append(entry)
        self.timestamp("REQUEST_START", begin)

    def executed(self, model_name: str, version: int, request_id: str, begin: int, sent: int, exec_start: int,
                 exec_end: int, done: int, queued: tuple[int, int] | None = None) -> None:
        """The timestamps of a request that ran once (see the module docstring); `queued` is
        (enqueued, dispatched) for a request that went through its model's queue."""
        if not self.level & TIMESTAMPS:
            return
        # Clamped into [begin, done] rather than [sent, done] as stats.py does: `sent` is read
        # after the request was queued to the stub, which may have run it already.
        exec_start = min(max(exec_start, begin), done)
        exec_end = min(max(exec_end, exec_start), done)
        if queued is not None:
            queue_start = min(max(queued[0], begin), exec_start)
            compute_start = min(max(queued[1], queue_start), exec_start)
        else:
            queue_start = compute_start = None
        self.started(model_name, version, request_id, begin)
        self.timestamp("QUEUE_START", queue_start if queue_start is not None else min(max(sent, begin), exec_start))
        self.timestamp("COMPUTE_START", compute_start if compute_start is not None else exec_start)
        self.timestamp("COMPUTE_INPUT_END", exec_start)
        self.timestamp("COMPUTE_OUTPUT_START", exec_end)
        self.timestamp("COMPUTE_END", done)
        self.timestamp("REQUEST_END", max(time.monotonic_ns(), done))

    def tensor(self, activity: str, name: str, datatype: str, shape: Any, data: str) -> None:
        """One tensor of the request (TENSORS level): TENSOR_QUEUE_INPUT or
        TENSOR_BACKEND_OUTPUT, with its data as Triton prints it (``tensor_data``)."""
        if self.level & TENSORS:
            self._entries.append({"id": self.id, "activity": activity, "tensor": {
                "name": name, "data": data, "shape": ",".join(str(int(d)) for d in shape), "dtype": datatype}})

    def context(self) -> str:
        """What a model's ``request.trace().get_context()`` returns: the OpenTelemetry context of
        the request's model span as JSON, or "" outside OpenTelemetry mode."""
        return "" if self.spans is None else '{"traceparent":"%s"}' % self.spans.traceparent()

    def entries(self) -> list[dict[str, Any]]:
        """What was recorded for this request (not its children), in order."""
        return list(self._entries)

    def children(self) -> list[RequestTrace]:
        """The traces of the requests this one (a root) started, in the order they began."""
        return list(self._children)

    def child(self, model_name: str = "") -> RequestTrace:
        """The trace of a request this one starts (an ensemble step): its own id, this one's as
        its ``parent_id``, written together with its root."""
        trace = RequestTrace(self.level, None, model_name, parent=self)
        with self._root._lock:
            self._root._children.append(trace)
        return trace

    # ---- lifetime --------------------------------------------------------------------------------
    def hold(self) -> None:
        """One more user (a response in flight); each calls ``release`` once."""
        root = self._root
        with root._lock:
            root._refs += 1

    def release(self) -> None:
        """One user is done; the last one writes the trace."""
        root = self._root
        with root._lock:
            root._refs -= 1
            if root._refs:
                return
            sink, root._sink = root._sink, None
        if sink is not None:
            sink(root)

    def objects(self) -> list[bytes]:
        """The trace's JSON objects: this trace's, then each child's."""
        out = [orjson.dumps(entry) for entry in self._entries]
        for child in list(self._children):
            out.extend(child.objects())
        return out


# ---- TENSORS level: data as Triton prints it ---------------------------------------------------------
def tensor_data(array: np.ndarray) -> str:
    """A tensor's elements as Triton's trace writes them: comma-separated, floats as C++ streams
    print them (6 significant digits), BOOL as 1/0, BYTES as quoted strings, FP16/BF16 empty."""
    kind = array.dtype.kind
    if kind == "O" or kind == "S":
        return ",".join('"' + (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)) + '"'
                        for v in array.ravel().tolist())
    if kind == "b":
        return ",".join("1" if v else "0" for v in array.ravel().tolist())
    if kind == "f":
        if array.dtype.itemsize < 4:  # FP16 (and BF16) are left empty, as Triton does
            return ""
        return ",".join(_float(v) for v in array.ravel().tolist())
    if kind in "iu":
        return ",".join(map(str, array.ravel().tolist()))
    return ""


def _float(value: float) -> str:
    if math.isnan(value):
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    return "%g" % value
