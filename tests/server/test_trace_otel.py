"""Triton's "opentelemetry" trace mode through `stubhost serve`: tritonclient requests over HTTP and
gRPC, with and without a client's W3C ``traceparent``, and the spans read back by an OTLP/HTTP
collector run by the test (the protobuf ExportTraceServiceRequest the SDK's exporter posts).

What is checked follows Triton's qa/L0_trace/opentelemetry_unittest.py: the spans of a plain
model (InferRequest -> model -> compute), an ensemble (InferRequest -> ensemble -> step ->
compute), a BLS model's children, their events and attributes, the resource, the propagated
parent, the context a model reads with ``request.trace().get_context()``, and that a request
carrying a context is traced whatever the rate.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stubhost.server.trace_config import parse_trace_config, TraceFlagError
from tests.host.repo_factory import config_pbtxt, io, wait_until, write_model
from tests.server.frontend_support import Conn
from tests.server.serve_process import ServeProcess
from tests.server.test_trace import BLS_PY

pytest.importorskip("opentelemetry.sdk.trace", reason="the opentelemetry packages come with stubhost[test]")
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: E402

TRACE_ID = "0af7651916cd43dd8448eb211c12666c"  # the client's span (Triton's test uses the same)
SPAN_ID = "b7ad6b7169242424"
TRACEPARENT = f"00-{TRACE_ID}-{SPAN_ID}-01"
MODEL_EVENTS = {"REQUEST_START", "QUEUE_START", "REQUEST_END"}
COMPUTE_EVENTS = {"COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"}
HTTP_EVENTS = {"HTTP_RECV_START", "HTTP_RECV_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"}
GRPC_EVENTS = {"GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START",
               "GRPC_SEND_END"}

CONTEXT_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "CONTEXT", np.array([str(r.trace().get_context())], dtype=object))]) for r in requests]
"""


class Collector:
    """An OTLP/HTTP trace receiver on loopback: keeps every span it is sent, with its resource."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                collector.receive(self.path, body)
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def receive(self, path: str, body: bytes) -> None:
        assert path == "/v1/traces", path
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    with self._lock:
                        self.spans.append({
                            "name": span.name, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(), "kind": span.kind, "scope": scope_spans.scope.name,
                            "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "events": [e.name for e in span.events], "resource": resource})

    def trace_of(self, model_span: str, request_id: str, count: int, timeout: float = 20) -> list[dict[str, Any]]:
        """The `count` spans of the trace whose `model_span` span has `request_id`."""
        def found() -> list[dict[str, Any]]:
            with self._lock:
                spans = list(self.spans)
            owners = [s for s in spans if s["name"] == model_span and s["attributes"].get("triton.request_id")
                      == request_id]
            if not owners:
                return []
            # The request's InferRequest span and everything under it (requests that continue the
            # same client span share its trace id).
            top = next((s for s in spans if s["span_id"] == owners[0]["parent"]), None)
            if top is None:
                return []
            trace, frontier = [top], {top["span_id"]}
            while frontier:
                below = [s for s in spans if s["parent"] in frontier]
                trace.extend(below)
                frontier = {s["span_id"] for s in below}
            return trace if len(trace) >= count else []
        assert wait_until(found, timeout), f"no trace of {count} spans for {model_span} {request_id}: {self.spans}"
        return found()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _value(value: Any) -> Any:
    return getattr(value, value.WhichOneof("value"))


def by_name(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name]


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, collector: Collector) -> Iterator[ServeProcess]:
    repo = tmp_path_factory.mktemp("otel") / "models"
    shutil.copytree(Path(__file__).parents[2] / "examples" / "models", repo,
                    ignore=shutil.ignore_patterns("__pycache__"))
    write_model(repo, "bls", BLS_PY, config_pbtxt(
        "bls", [io("INPUT0", "TYPE_FP32", [4]), io("INPUT1", "TYPE_FP32", [4])], [io("OUTPUT0", "TYPE_FP32", [4])]))
    write_model(repo, "context", CONTEXT_PY, config_pbtxt("context", [io("X", "TYPE_FP32", [1])],
                                                          [io("CONTEXT", "TYPE_STRING", [1])]))
    with ServeProcess(repo, "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
                      "--trace-config", "rate=1", "--trace-config", f"opentelemetry,url={collector.url}",
                      "--trace-config", "opentelemetry,resource=service.name=test_triton",
                      "--trace-config", "opentelemetry,resource=test.key=test.value",
                      "--trace-config", "opentelemetry,bsp_schedule_delay=0") as srv:
        yield srv


def add_sub(conn: Conn, request_id: str, model: str = "add_sub", headers: dict[str, str] | None = None) -> None:
    a = np.arange(4, dtype=np.float32)
    names = ("A", "B") if model == "add_sub_twice" else ("INPUT0", "INPUT1")
    result = conn.client.infer(model, [conn.input(n, a) for n in names], request_id=request_id, headers=headers)
    assert result.get_response() is not None


def check_plain(spans: list[dict[str, Any]], model: str, front_events: set[str], request_id: str) -> None:
    """InferRequest -> model -> compute, with Triton's events and attributes."""
    assert sorted(s["name"] for s in spans) == sorted(["InferRequest", model, "compute"]), spans
    [root], [span], [compute] = by_name(spans, "InferRequest"), by_name(spans, model), by_name(spans, "compute")
    assert span["parent"] == root["span_id"] and compute["parent"] == span["span_id"]
    assert set(root["events"]) == front_events, root["events"]
    assert set(span["events"]) == MODEL_EVENTS and set(compute["events"]) == COMPUTE_EVENTS
    assert span["attributes"]["triton.model_name"] == model
    assert span["attributes"]["triton.model_version"] == 1
    assert span["attributes"]["triton.trace_parent_id"] == 0
    assert span["attributes"]["triton.request_id"] == request_id
    assert span["attributes"]["triton.trace_id"] > 0
    assert root["start"] <= span["start"] <= compute["start"] <= compute["end"] <= span["end"] <= root["end"]
    assert all(s["kind"] == 2 and s["scope"] == "triton-server" for s in spans)  # SPAN_KIND_SERVER
    assert root["resource"]["service.name"] == "test_triton"
    assert root["resource"]["test.key"] == "test.value"
    assert abs(root["start"] / 1e9 - time.time()) < 120, "span times are wall-clock times"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_plain_model_gives_three_spans(server: ServeProcess, collector: Collector, protocol: str) -> None:
    conn = Conn.open(protocol, server)
    try:
        add_sub(conn, f"plain-{protocol}")
    finally:
        conn.close()
    spans = collector.trace_of("add_sub", f"plain-{protocol}", 3)
    check_plain(spans, "add_sub", HTTP_EVENTS if protocol == "http" else GRPC_EVENTS, f"plain-{protocol}")
    assert by_name(spans, "InferRequest")[0]["parent"] == ""


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_clients_traceparent_makes_the_request_its_child(server: ServeProcess, collector: Collector,
                                                            protocol: str) -> None:
    conn = Conn.open(protocol, server)
    try:
        add_sub(conn, f"propagated-{protocol}", headers={"traceparent": TRACEPARENT})
    finally:
        conn.close()
    spans = collector.trace_of("add_sub", f"propagated-{protocol}", 3)
    check_plain(spans, "add_sub", HTTP_EVENTS if protocol == "http" else GRPC_EVENTS, f"propagated-{protocol}")
    assert {s["trace_id"] for s in spans} == {TRACE_ID}
    assert by_name(spans, "InferRequest")[0]["parent"] == SPAN_ID


def test_an_ensemble_gives_a_span_per_step(server: ServeProcess, collector: Collector) -> None:
    """InferRequest -> add_sub_twice -> add_sub (x2) -> compute: the ensemble has no compute span."""
    conn = Conn.open("http", server)
    try:
        add_sub(conn, "ensemble", model="add_sub_twice")
    finally:
        conn.close()
    spans = collector.trace_of("add_sub_twice", "ensemble", 6)
    [root], [ensemble] = by_name(spans, "InferRequest"), by_name(spans, "add_sub_twice")
    steps, computes = by_name(spans, "add_sub"), by_name(spans, "compute")
    assert len(steps) == 2 and len(computes) == 2 and len(spans) == 6
    assert ensemble["parent"] == root["span_id"]
    assert all(step["parent"] == ensemble["span_id"] for step in steps)
    assert {c["parent"] for c in computes} == {step["span_id"] for step in steps}
    assert all(step["attributes"]["triton.trace_parent_id"] == ensemble["attributes"]["triton.trace_id"]
               for step in steps)


def test_bls_calls_made_with_the_requests_trace_are_children_of_its_span(server: ServeProcess,
                                                                          collector: Collector) -> None:
    conn = Conn.open("grpc", server)
    try:
        a = np.arange(4, dtype=np.float32)
        conn.client.infer("bls", [conn.input("INPUT0", a), conn.input("INPUT1", a)], request_id="b")
    finally:
        conn.close()
    # InferRequest, bls + compute, add_sub (sync, async) + computes, repeat + compute
    spans = collector.trace_of("bls", "b", 9)
    [bls] = by_name(spans, "bls")
    children = [s for s in spans if s["parent"] == bls["span_id"] and s["name"] != "compute"]
    assert sorted(c["attributes"]["triton.request_id"] for c in children) == ["b-async", "b-stream", "b-sync"]
    assert all(c["attributes"]["triton.trace_parent_id"] == bls["attributes"]["triton.trace_id"] for c in children)
    assert not [s for s in collector.spans if s["attributes"].get("triton.request_id") == "b-untraced"]


def test_a_model_reads_its_requests_context(server: ServeProcess, collector: Collector) -> None:
    conn = Conn.open("http", server)
    try:
        result = conn.client.infer("context", [conn.input("X", np.ones(1, np.float32))], request_id="ctx",
                                   headers={"traceparent": TRACEPARENT})
    finally:
        conn.close()
    context = json.loads(result.as_numpy("CONTEXT")[0])
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-01", context["traceparent"])
    [span] = by_name(collector.trace_of("context", "ctx", 3), "context")
    assert context["traceparent"] == f"00-{TRACE_ID}-{span['span_id']}-01"


def test_rate_zero_traces_only_requests_with_a_context(tmp_path: Path, collector: Collector) -> None:
    repo = tmp_path / "models"
    shutil.copytree(Path(__file__).parents[2] / "examples" / "models" / "add_sub", repo / "add_sub")
    with ServeProcess(repo, "--trace-config", "mode=opentelemetry", "--trace-config", "level=TIMESTAMPS",
                      "--trace-config", "rate=0", "--trace-config", f"opentelemetry,url={collector.url}",
                      "--trace-config", "opentelemetry,bsp_schedule_delay=0") as srv:
        conn = Conn.open("http", srv)
        try:
            add_sub(conn, "rate0-plain")
            add_sub(conn, "rate0-context", headers={"traceparent": TRACEPARENT})
            settings = conn.client.get_trace_settings()
        finally:
            conn.close()
        collector.trace_of("add_sub", "rate0-context", 3)
    assert not [s for s in collector.spans if s["attributes"].get("triton.request_id") == "rate0-plain"]
    assert settings["trace_mode"] == "opentelemetry" and settings["trace_rate"] == "0"
    assert settings["url"] == collector.url and settings["bsp_max_queue_size"] == "2048"
    assert "trace_file" not in settings and "log_frequency" not in settings


def test_the_modes_settings_are_read_and_checked() -> None:
    config = parse_trace_config(["mode=opentelemetry", "opentelemetry,url=http://c:4318/v1/traces",
                                 "opentelemetry,resource=a=b=c", "opentelemetry,bsp_max_queue_size=7",
                                 "triton,file=/tmp/x.json", "level=TENSORS"],
                                environment={"OTEL_BSP_SCHEDULE_DELAY": "9"})
    otel = config.opentelemetry
    assert otel is not None and config.file == ""
    assert (otel.url, otel.resource, otel.bsp_max_queue_size, otel.bsp_schedule_delay) == (
        "http://c:4318/v1/traces", {"a": "b=c"}, 7, 9)
    assert "Tensor level tracing is not supported by the mode: opentelemetry" in config.report
    assert any("triton,file" in line and "no effect" in line for line in config.report)
    with pytest.raises(TraceFlagError, match='Bad option: "--trace-config opentelemetry,bsp_schedule_delay"'):
        parse_trace_config(["mode=opentelemetry", "opentelemetry,bsp_schedule_delay=-1"])
    with pytest.raises(TraceFlagError, match='Bad option: "OTEL_BSP_MAX_QUEUE_SIZE"'):
        parse_trace_config(["mode=opentelemetry"], environment={"OTEL_BSP_MAX_QUEUE_SIZE": "lots"})
    deprecated = parse_trace_config(["mode=opentelemetry"], trace_file="/tmp/t.json")
    assert deprecated.file == "" and deprecated.report == [
        "Warning: '--trace-file' is deprecated and will be ignored with opentelemetry tracing mode. "]
