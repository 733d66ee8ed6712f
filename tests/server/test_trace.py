"""Triton's trace extension ("triton" mode) through `stubhost serve`, driven as a user drives
tritonserver: tritonclient's get_trace_settings / update_trace_settings over HTTP and gRPC,
--trace-config flags, inferences, then the trace file read back.

Expected answers and texts follow Triton (server docs/protocol/extension_trace.md,
docs/user_guide/trace.md, src/tracer.cc, src/http_server.cc, src/grpc/grpc_server.cc,
qa/L0_trace/test.sh and trace_endpoint_test.py).
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.host.repo_factory import config_pbtxt, copy_examples, io, wait_until, write_model
from tests.server.frontend_support import PROTOCOLS, Conn, error_of, expect_status, proto_json
from tests.server.serve_process import ServeProcess
from stubhost.host.trace import TIMESTAMPS, tensor_data
from stubhost.server.trace_config import TraceFlagError, parse_trace_config
from stubhost.server.trace_file import TraceFile
from stubhost.server.trace_settings import TraceManager

# Triton's order of a request's timestamps (each front end adds its own around the core's).
CORE = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
        "COMPUTE_END", "REQUEST_END"]
HTTP_ORDER = ["HTTP_RECV_START", "HTTP_RECV_END", *CORE, "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC_ORDER = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *CORE, "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START",
              "GRPC_SEND_END"]
FIELDS = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode")
CLEAR_ALL = {"trace_level": None, "trace_rate": None, "trace_count": None, "log_frequency": None}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # add_sub (plain), add_sub_twice (an ensemble of two add_sub steps), repeat (decoupled)
    return copy_examples(tmp_path_factory.mktemp("trace") / "models", "add_sub", "add_sub_twice", "repeat")


# ---- helpers -----------------------------------------------------------------------------------------
def settings_of(conn: Conn, answer: Any) -> dict[str, Any]:
    """A trace-settings answer as HTTP's JSON has it (gRPC's SettingValue lists unwrapped)."""
    if conn.protocol == "http":
        return answer
    values = {name: entry.get("value", []) for name, entry in proto_json(answer)["settings"].items()}
    return {name: value if name == "trace_level" else value[0] for name, value in values.items()}


def settings(trace_file: str, level: list[str], rate: str = "1", count: str = "-1",
             log_frequency: str = "0") -> dict[str, Any]:
    return {"trace_level": level, "trace_rate": rate, "trace_count": count, "log_frequency": log_frequency,
            "trace_file": trace_file, "trace_mode": "triton"}


def add_sub(conn: Conn, request_id: str = "") -> None:
    a = np.arange(4, dtype=np.float32)
    result = conn.client.infer("add_sub", [conn.input("INPUT0", a), conn.input("INPUT1", a)], request_id=request_id)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def read_traces(*paths: Path) -> dict[int, dict[str, Any]]:
    """The traces of trace files by id: the model entry (None if there is none), the
    timestamps (name -> list of ns) and the tensor entries. Each file must be a JSON array."""
    traces: dict[int, dict[str, Any]] = {}
    for path in paths:
        objects = json.loads(path.read_text())
        assert isinstance(objects, list), path
        for obj in objects:
            trace = traces.setdefault(obj["id"], {"model": None, "timestamps": {}, "tensors": []})
            if "model_name" in obj:
                assert trace["model"] is None, f"two model entries for trace {obj['id']}"
                trace["model"] = obj
            elif "timestamps" in obj:
                for stamp in obj["timestamps"]:
                    assert isinstance(stamp["ns"], int) and stamp["ns"] > 0
                    trace["timestamps"].setdefault(stamp["name"], []).append(stamp["ns"])
            else:
                assert set(obj) == {"id", "activity", "tensor"}, obj
                trace["tensors"].append(obj)
    return traces


def by_request(traces: dict[int, dict[str, Any]], request_id: str) -> list[dict[str, Any]]:
    return [t for t in traces.values() if t["model"] is not None and t["model"].get("request_id") == request_id]


def assert_in_order(trace: dict[str, Any], order: list[str]) -> None:
    """Every named timestamp is there, once, and they do not go back in time in `order`."""
    stamps = trace["timestamps"]
    assert set(stamps) == set(order), sorted(stamps)
    assert all(len(stamps[name]) == 1 for name in order), stamps
    values = [stamps[name][0] for name in order]
    assert values == sorted(values), list(zip(order, values))


# ---- the settings API (one traced server) ------------------------------------------------------------
@pytest.fixture(scope="module")
def traced(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServeProcess, str]]:
    trace_file = str(tmp_path_factory.mktemp("traced") / "global_unittest.log")
    with ServeProcess(repo, "--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS",
                      "--trace-config", "rate=1") as srv:
        yield srv, trace_file


@pytest.fixture(params=PROTOCOLS)
def tconn(request: pytest.FixtureRequest, traced: tuple[ServeProcess, str]) -> Iterator[Conn]:
    """A client of the traced server; the settings go back to the start-up ones afterwards, as
    Triton's trace_endpoint_test tearDown puts them back (its restore is itself under test)."""
    conn = Conn.open(request.param, traced[0])
    yield conn
    conn.client.update_trace_settings(model_name="add_sub", settings=CLEAR_ALL)
    conn.client.update_trace_settings(settings=CLEAR_ALL)
    conn.close()


def test_get_settings_global_and_model(tconn: Conn, traced: tuple[ServeProcess, str]) -> None:
    initial = settings(traced[1], ["TIMESTAMPS"])
    assert settings_of(tconn, tconn.client.get_trace_settings()) == initial
    assert settings_of(tconn, tconn.client.get_trace_settings(model_name="add_sub")) == initial
    answer = tconn.client.get_trace_settings()
    if tconn.protocol == "http":  # strings, and a list of strings for the level
        assert all(isinstance(answer[f], str) for f in FIELDS if f != "trace_level")
        assert list(answer) == list(FIELDS)
    else:
        assert isinstance(answer, grpcclient.service_pb2.TraceSettingResponse)
        assert set(answer.settings) == set(FIELDS)


def test_update_model_then_global(tconn: Conn, traced: tuple[ServeProcess, str]) -> None:
    """A model's own fields stay; the others follow the global setting, also after it changes."""
    client, file = tconn.client, traced[1]
    first = client.update_trace_settings(model_name="add_sub", settings={"trace_rate": "12", "log_frequency": "34"})
    assert settings_of(tconn, first) == settings(file, ["TIMESTAMPS"], rate="12", log_frequency="34")
    answer = client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_count": "78"})
    assert settings_of(tconn, answer) == settings(file, ["TIMESTAMPS", "TENSORS"], count="78")
    model = settings_of(tconn, client.get_trace_settings(model_name="add_sub"))
    assert model == settings(file, ["TIMESTAMPS", "TENSORS"], rate="12", count="78", log_frequency="34")
    # a model without a setting of its own answers the global one
    assert settings_of(tconn, client.get_trace_settings(model_name="repeat")) == settings_of(tconn, answer)


def test_clear_settings(tconn: Conn, traced: tuple[ServeProcess, str]) -> None:
    """Triton's trace_endpoint_test clear case: a cleared global field goes back to the start-up
    value, a cleared model field to the global one."""
    client, file = tconn.client, traced[1]
    client.update_trace_settings(model_name="add_sub", settings={"trace_rate": "12", "log_frequency": "34"})
    client.update_trace_settings(settings={"trace_rate": "56", "trace_count": "78", "trace_level": ["OFF"]})
    expected_global = settings(file, ["OFF"])
    cleared = client.update_trace_settings(settings={"trace_rate": None, "trace_count": None})
    assert settings_of(tconn, cleared) == expected_global
    assert settings_of(tconn, client.get_trace_settings(model_name="add_sub")) == settings(
        file, ["OFF"], rate="12", log_frequency="34")
    answer = client.update_trace_settings(model_name="add_sub", settings={"trace_rate": None, "trace_level": None})
    assert settings_of(tconn, answer) == settings(file, ["OFF"], log_frequency="34")
    assert settings_of(tconn, client.get_trace_settings()) == expected_global
    # clearing the model's last field removes its setting: it follows the global one again
    client.update_trace_settings(model_name="add_sub", settings={"log_frequency": None})
    client.update_trace_settings(settings={"trace_rate": "9"})
    assert settings_of(tconn, client.get_trace_settings(model_name="add_sub"))["trace_rate"] == "9"


@pytest.mark.parametrize("update, http_status, grpc_code, message", [
    ({"trace_rate": "abc"}, 400, "INVALID_ARGUMENT", "Unable to parse 'trace_rate', got: abc"),
    ({"log_frequency": "x1"}, 400, "INVALID_ARGUMENT", "Unable to parse 'log_frequency', got: x1"),
    ({"trace_rate": "10000000000"}, 400, "INVALID_ARGUMENT",
     "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 10000000000"),
    ({"trace_count": "10000000000"}, 400, "INVALID_ARGUMENT",
     "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: 10000000000"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, 400, "INVALID_ARGUMENT", "Expect only one trace level 'OFF' is specified"),
    ({"trace_rate": "0"}, 400, "INVALID_ARGUMENT",
     "Attempting to set invalid trace setting :sample rate must be non-zero"),
    ({"trace_file": "elsewhere.log"}, 501, "UNIMPLEMENTED",
     "trace file location can not be updated through network protocol"),
])
def test_invalid_settings_get_tritons_errors(tconn: Conn, traced: tuple[ServeProcess, str], update: dict[str, Any],
                                             http_status: int, grpc_code: str, message: str) -> None:
    for model in ("", "add_sub"):
        error = error_of(tconn.client.update_trace_settings, model_name=model, settings=update)
        expect_status(tconn, error, http_status, grpc_code)
        assert error.message() == message
    # nothing changed
    assert settings_of(tconn, tconn.client.get_trace_settings()) == settings(traced[1], ["TIMESTAMPS"])


def test_count_below_minus_one_is_refused(tconn: Conn) -> None:
    error = error_of(tconn.client.update_trace_settings, settings={"trace_count": "-5"})
    expect_status(tconn, error, 400, "INVALID_ARGUMENT")
    # Triton's HTTP handler words it without the space its gRPC handler has
    space = " " if tconn.protocol == "grpc" else ""
    assert error.message() == f"Unable to parse 'trace_count'. Expecting value >= -1, got:{space}-5"


def test_unknown_level_names_are_ignored_as_in_triton(tconn: Conn, traced: tuple[ServeProcess, str]) -> None:
    answer = tconn.client.update_trace_settings(settings={"trace_level": ["LOUD"]})
    assert settings_of(tconn, answer) == settings(traced[1], ["TIMESTAMPS"])
    answer = tconn.client.update_trace_settings(settings={"trace_level": ["LOUD", "TENSORS"]})
    assert settings_of(tconn, answer)["trace_level"] == ["TENSORS"]


def test_rate_zero_is_allowed_with_tracing_off(tconn: Conn, traced: tuple[ServeProcess, str]) -> None:
    answer = tconn.client.update_trace_settings(settings={"trace_level": ["OFF"], "trace_rate": "0"})
    assert settings_of(tconn, answer) == settings(traced[1], ["OFF"], rate="0")


def test_unknown_model(tconn: Conn) -> None:
    for call, kwargs in ((tconn.client.get_trace_settings, {}),
                         (tconn.client.update_trace_settings, {"settings": {"log_frequency": "1"}})):
        error = error_of(call, model_name="does-not-exist", **kwargs)
        expect_status(tconn, error, 400, "INVALID_ARGUMENT")
        assert error.message() == "Request for unknown model : does-not-exist"


def test_http_json_types_as_triton_reads_them(traced: tuple[ServeProcess, str]) -> None:
    """Numbers must be JSON strings and the level a list: Triton's JSON reader refuses others."""
    client = httpclient.InferenceServerClient(traced[0].http_url)
    try:
        error = error_of(client.update_trace_settings, settings={"trace_rate": 5})
        assert error.status() == "500" and error.message() == "attempt to access JSON non-string as string"
        error = error_of(client.update_trace_settings, settings={"trace_level": "TIMESTAMPS"})
        assert error.status() == "500" and error.message() == "attempt to access JSON non-array as array"
    finally:
        client.close()


def test_grpc_one_value_per_number(traced: tuple[ServeProcess, str]) -> None:
    client = grpcclient.InferenceServerClient(traced[0].grpc_url)
    try:
        error = error_of(client.update_trace_settings, settings={"trace_rate": ["1", "2"]})
        assert error.status() == "StatusCode.INVALID_ARGUMENT"
        assert error.message() == "expect only 1 value for 'trace_rate'"
    finally:
        client.close()


def test_trace_is_listed_in_the_server_metadata(tconn: Conn) -> None:
    meta = tconn.client.get_server_metadata()
    extensions = meta["extensions"] if tconn.protocol == "http" else list(meta.extensions)
    assert "trace" in extensions


# ---- what is written -------------------------------------------------------------------------------
def test_trace_file_of_every_kind_of_request(repo: Path, tmp_path: Path) -> None:
    """The deprecated flags set the same settings as --trace-config (with a warning each); with
    log frequency 0 the traces are written when the server stops: HTTP and gRPC requests, an
    ensemble (its steps are child traces) and a decoupled model's stream."""
    trace_file = tmp_path / "trace.json"
    with ServeProcess(repo, "--trace-file", str(trace_file), "--trace-level", "TIMESTAMPS", "--trace-rate", "1") as srv:
        for flag in ("--trace-file", "--trace-level", "--trace-rate"):
            assert f"'{flag}' has been deprecated" in srv.log
        http, rpc = Conn.open("http", srv), Conn.open("grpc", srv)
        try:
            assert http.client.get_trace_settings() == settings(str(trace_file), ["TIMESTAMPS"])
            add_sub(http, "h1")
            add_sub(rpc, "g1")
            a, b = np.arange(4, dtype=np.float32), np.ones(4, dtype=np.float32)
            http.client.infer("add_sub_twice", [http.input("A", a), http.input("B", b)], request_id="e1")
            answers: queue.Queue[Any] = queue.Queue()
            rpc.client.start_stream(callback=lambda result, error: answers.put((result, error)))
            inputs = [grpcclient.InferInput("IN", [3], "INT32").set_data_from_numpy(np.array([7, 8, 9], np.int32))]
            rpc.client.async_stream_infer("repeat", inputs, request_id="s1")
            got = [answers.get(timeout=30) for _ in range(3)]
            assert all(error is None for _, error in got)
            rpc.client.stop_stream()
        finally:
            http.close()
            rpc.close()
        assert not trace_file.exists()  # log frequency 0: written when the server stops
        assert "Traceback" not in srv.log
    traces = read_traces(trace_file)
    ids = sorted(traces)
    assert ids == list(range(ids[0], ids[0] + len(ids)))  # one id each, from one sequence

    [h1] = by_request(traces, "h1")
    assert h1["model"] == {"id": h1["model"]["id"], "model_name": "add_sub", "model_version": 1, "request_id": "h1"}
    assert_in_order(h1, HTTP_ORDER)
    [g1] = by_request(traces, "g1")
    assert_in_order(g1, GRPC_ORDER)

    ensemble = [t for t in by_request(traces, "e1") if t["model"]["model_name"] == "add_sub_twice"]
    steps = [t for t in by_request(traces, "e1") if t["model"]["model_name"] == "add_sub"]
    assert len(ensemble) == 1 and len(steps) == 2
    parent = ensemble[0]
    assert "parent_id" not in parent["model"]
    assert_in_order(parent, ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "REQUEST_END",
                             "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"])
    for step in steps:
        assert step["model"]["parent_id"] == parent["model"]["id"]
        assert_in_order(step, CORE)
        assert parent["timestamps"]["REQUEST_START"][0] <= step["timestamps"]["REQUEST_START"][0]
        assert step["timestamps"]["REQUEST_END"][0] <= parent["timestamps"]["REQUEST_END"][0]

    [s1] = by_request(traces, "s1")
    assert s1["model"]["model_name"] == "repeat"
    stamps = s1["timestamps"]
    assert [stamps[name][0] for name in CORE] == sorted(stamps[name][0] for name in CORE)
    assert len(stamps["GRPC_SEND_START"]) == len(stamps["GRPC_SEND_END"]) == 3  # one per response
    assert len(stamps["INFER_RESPONSE_COMPLETE"]) == 3
    assert stamps["GRPC_WAITREAD_END"][0] <= stamps["REQUEST_START"][0] <= min(stamps["GRPC_SEND_START"])
    assert all(start <= end for start, end in zip(stamps["GRPC_SEND_START"], stamps["GRPC_SEND_END"]))


# A BLS model: per request, add_sub with the request's trace (sync, then async), add_sub without
# it, and the decoupled repeat with it; each call's request id names how it was made.
BLS_PY = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return asyncio.run(self.run(requests))

    async def run(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, name) for name in ("INPUT0", "INPUT1")]
            rid = request.request_id()

            def call(model, how, tensors, **kw):
                return pb_utils.InferenceRequest(model_name=model, inputs=tensors, requested_output_names=[],
                                                request_id=f"{rid}-{how}", **kw)

            traced = call("add_sub", "sync", inputs, trace=request.trace()).exec()
            assert not traced.has_error(), traced.error().message()
            await call("add_sub", "async", inputs, trace=request.trace()).async_exec()
            call("add_sub", "untraced", inputs).exec()
            stream = [pb_utils.Tensor("IN", np.array([1, 2], np.int32))]
            for _ in call("repeat", "stream", stream, trace=request.trace()).exec(decoupled=True):
                pass
            out = pb_utils.get_output_tensor_by_name(traced, "OUTPUT0")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out.as_numpy())]))
        return responses
"""


def test_bls_requests_made_with_the_requests_trace_are_its_children(repo: Path, tmp_path: Path) -> None:
    """As in Triton, a BLS request made with ``trace=request.trace()`` of a traced request is
    traced as its child (its own id, ``parent_id`` the request's): sync, async and decoupled
    calls alike; a BLS request made without it is not traced."""
    models = Path(shutil.copytree(repo, tmp_path / "models"))
    write_model(models, "bls", BLS_PY, config_pbtxt(
        "bls", [io("INPUT0", "TYPE_FP32", [4]), io("INPUT1", "TYPE_FP32", [4])], [io("OUTPUT0", "TYPE_FP32", [4])]))
    trace_file = tmp_path / "trace.json"
    with ServeProcess(models, "--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS",
                      "--trace-config", "rate=1") as srv:
        for protocol, rid in (("http", "b1"), ("grpc", "b2")):
            conn = Conn.open(protocol, srv)
            try:
                a = np.arange(4, dtype=np.float32)
                result = conn.client.infer("bls", [conn.input("INPUT0", a), conn.input("INPUT1", a)], request_id=rid)
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
            finally:
                conn.close()
        assert "Traceback" not in srv.log
    traces = read_traces(trace_file)
    for rid, order in (("b1", HTTP_ORDER), ("b2", GRPC_ORDER)):
        [parent] = by_request(traces, rid)
        assert parent["model"]["model_name"] == "bls" and "parent_id" not in parent["model"]
        assert_in_order(parent, order)
        assert by_request(traces, f"{rid}-untraced") == []
        for how, model in (("sync", "add_sub"), ("async", "add_sub"), ("stream", "repeat")):
            [child] = by_request(traces, f"{rid}-{how}")
            assert child["model"] == {"id": child["model"]["id"], "model_name": model, "model_version": 1,
                                      "request_id": f"{rid}-{how}", "parent_id": parent["model"]["id"]}
            for name in ("REQUEST_START", "QUEUE_START", "COMPUTE_START", "REQUEST_END"):
                assert name in child["timestamps"], (how, sorted(child["timestamps"]))
            assert parent["timestamps"]["COMPUTE_INPUT_END"][0] <= child["timestamps"]["REQUEST_START"][0]
            assert child["timestamps"]["REQUEST_END"][0] <= parent["timestamps"]["COMPUTE_OUTPUT_START"][0]


def test_rate_count_log_frequency_and_tensors(repo: Path, tmp_path: Path) -> None:
    """Every 3rd request is traced, 2 traces then none (the count shown goes down to 0); with a
    log frequency of 1 each trace is its own file <trace_file>.<n> at once."""
    trace_file = tmp_path / "trace.json"
    args = ("--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS",
            "--trace-config", "rate=3", "--trace-config", "count=2", "--trace-config", "triton,log-frequency=1")
    with ServeProcess(repo, *args) as srv:
        conn = Conn.open("http", srv)
        try:
            for i in range(1, 10):
                add_sub(conn, f"r{i}")
            indexed = [Path(f"{trace_file}.{n}") for n in range(3)]
            assert wait_until(lambda: indexed[1].exists(), 10)
            assert conn.client.get_trace_settings()["trace_count"] == "0"
            assert not indexed[2].exists() and not trace_file.exists()
            assert [t["model"]["request_id"] for t in read_traces(indexed[0]).values()] == ["r3"]
            assert [t["model"]["request_id"] for t in read_traces(indexed[1]).values()] == ["r6"]

            # TENSORS only, for add_sub alone: the tensors and no timestamps (nor model entry)
            conn.client.update_trace_settings(model_name="add_sub", settings={
                "trace_level": ["TENSORS"], "trace_rate": "1", "trace_count": "-1"})
            add_sub(conn, "t1")
            assert wait_until(lambda: indexed[2].exists(), 10)
            [tensors_only] = read_traces(indexed[2]).values()
            assert tensors_only["model"] is None and tensors_only["timestamps"] == {}
            by_name = {(e["activity"], e["tensor"]["name"]): e["tensor"] for e in tensors_only["tensors"]}
            assert by_name[("TENSOR_QUEUE_INPUT", "INPUT0")] == {"name": "INPUT0", "data": "0,1,2,3", "shape": "4",
                                                                 "dtype": "FP32"}
            assert by_name[("TENSOR_BACKEND_OUTPUT", "OUTPUT0")]["data"] == "0,2,4,6"
            assert by_name[("TENSOR_BACKEND_OUTPUT", "OUTPUT1")]["data"] == "0,0,0,0"
            assert set(by_name) == {("TENSOR_QUEUE_INPUT", "INPUT0"), ("TENSOR_QUEUE_INPUT", "INPUT1"),
                                    ("TENSOR_BACKEND_OUTPUT", "OUTPUT0"), ("TENSOR_BACKEND_OUTPUT", "OUTPUT1")}
            assert "Traceback" not in srv.log
        finally:
            conn.close()


def test_tracing_off_by_default_and_restricted(repo: Path) -> None:
    """With no trace flag (Triton's defaults) nothing is traced, and turning tracing on without a
    trace file is refused with Triton's words; the trace settings are in the `trace` restricted
    group on both protocols."""
    args = ("--http-restricted-api", "trace:admin-key=s3cret", "--grpc-restricted-protocol", "trace:admin-key=s3cret")
    with ServeProcess(repo, *args) as srv:
        http, rpc = Conn.open("http", srv), Conn.open("grpc", srv)
        try:
            error = error_of(http.client.get_trace_settings)
            assert error.status() == "403" and error.message() == "This API is restricted, expecting header 'admin-key'"
            error = error_of(http.client.update_trace_settings, model_name="add_sub", settings={"trace_rate": "5"})
            assert error.status() == "403"
            error = error_of(rpc.client.get_trace_settings)
            assert error.status() == "StatusCode.UNAVAILABLE"
            assert error.message() == "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'"
            key, rpc_key = {"admin-key": "s3cret"}, {"triton-grpc-protocol-admin-key": "s3cret"}
            defaults = {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0",
                        "trace_file": "", "trace_mode": "triton"}
            assert http.client.get_trace_settings(headers=key) == defaults
            assert settings_of(rpc, rpc.client.get_trace_settings(headers=rpc_key)) == defaults
            add_sub(http, "untraced")  # inference is not in the group
            error = error_of(http.client.update_trace_settings, settings={"trace_level": ["TIMESTAMPS"]}, headers=key)
            assert error.status() == "400"
            assert error.message() == "Attempting to set invalid trace setting :trace file name is not given"
            answer = rpc.client.update_trace_settings(settings={"trace_rate": "5"}, headers=rpc_key)
            assert settings_of(rpc, answer) == {**defaults, "trace_rate": "5"}
        finally:
            http.close()
            rpc.close()


# ---- start-up flags ----------------------------------------------------------------------------------
def run_serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stubhost", "serve", *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("flag, message", [
    ("mode=jaeger", 'invalid value for trace mode option: jaeger. Available options are "triton" and "opentelemetry"'),
    ("rate=abc", 'Bad option: "--trace-config rate". Invalid option value. Got abc'),
    ("level=LOUD", 'Bad option: "--trace-config level". invalid value for trace level option: LOUD'),
])
def test_bad_trace_flags_stop_start_up(repo: Path, flag: str, message: str) -> None:
    done = run_serve("--model-repository", str(repo), "--trace-config", flag)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Started" not in done.stderr


def test_trace_config_syntax() -> None:
    config = parse_trace_config(["triton,file=/tmp/t.json", "triton,log-frequency=50", "rate=100",
                                 "level=TIMESTAMPS", "level=TENSORS", "count=100", "mode=triton"])
    assert (config.file, config.log_frequency, config.rate, config.count, config.level) == (
        "/tmp/t.json", 50, 100, 100, 0x4 | 0x8)
    assert config.report == []
    # OFF anywhere turns tracing off; --trace-config wins over a deprecated flag
    assert parse_trace_config(["level=TIMESTAMPS", "level=OFF"]).level == 0
    config = parse_trace_config(["rate=7"], trace_rate="3", trace_file="a", trace_count="2", trace_log_frequency="5")
    assert (config.rate, config.file, config.count, config.log_frequency) == (7, "a", 2, 5)
    assert len(config.report) == 4
    # another mode's settings are accepted with a warning, as Triton ignores them in triton mode
    assert "no effect" in parse_trace_config(["opentelemetry,url=localhost:4318"]).report[0]
    for bad in (",file=x", "triton,file", "file=", "jaeger,file=x"):
        with pytest.raises(TraceFlagError):
            parse_trace_config([bad])


# ---- pieces ------------------------------------------------------------------------------------------
def test_trace_file_is_a_json_array_after_every_write(tmp_path: Path) -> None:
    file = TraceFile(str(tmp_path / "t.json"))
    file.save([b'{"id":1}'], indexed=False)
    assert json.loads((tmp_path / "t.json").read_text()) == [{"id": 1}]
    file.save([b'{"id":2}', b'{"id":2,"x":1}'], indexed=False)
    assert json.loads((tmp_path / "t.json").read_text()) == [{"id": 1}, {"id": 2}, {"id": 2, "x": 1}]
    file.save([b'{"id":3}'], indexed=True)
    file.save([b'{"id":4}'], indexed=True)
    assert json.loads((tmp_path / "t.json.0").read_text()) == [{"id": 3}]
    assert json.loads((tmp_path / "t.json.1").read_text()) == [{"id": 4}]


def test_tensor_data_as_triton_prints_it() -> None:
    assert tensor_data(np.array([0.1, 1e-7, 2.5, 123456789.0], np.float32)) == "0.1,1e-07,2.5,1.23457e+08"
    assert tensor_data(np.array([[True, False]])) == "1,0"
    assert tensor_data(np.array([-3, 4], np.int64)) == "-3,4"
    assert tensor_data(np.array([b"ab", b"c"], dtype=object)) == '"ab","c"'
    assert tensor_data(np.array([1.0], np.float16)) == ""  # FP16 is left empty, as Triton does


def _trace_one(manager: TraceManager, model: str) -> bool:
    trace = manager.sample(model)
    if trace is None:
        return False
    trace.timestamp("REQUEST_START")
    trace.release()
    return True


def test_used_up_count_at_rate_one_writes_an_indexed_file(tmp_path: Path) -> None:
    """qa/L0_trace: with rate 1, the traces are written to <trace_file>.0 once the count is used
    up, before the server stops."""
    manager = TraceManager(TIMESTAMPS, 1, 3, 0, str(tmp_path / "t.json"))
    assert [_trace_one(manager, "m") for _ in range(5)] == [True, True, True, False, False]
    assert manager.settings()["trace_count"] == "0"
    assert len(read_traces(tmp_path / "t.json.0")) == 3
    manager.close()
    assert not (tmp_path / "t.json").exists()


def test_an_update_writes_what_the_replaced_setting_gathered(tmp_path: Path) -> None:
    """With log frequency 0, a setting's traces go to <trace_file> when an update replaces it
    (and at the stop); the file is one JSON array throughout."""
    trace_file = tmp_path / "t.json"
    manager = TraceManager(TIMESTAMPS, 1, -1, 0, str(trace_file))
    assert _trace_one(manager, "m") and _trace_one(manager, "m")
    assert not trace_file.exists()
    manager.update("", {"rate": 2})
    assert len(read_traces(trace_file)) == 2
    assert [_trace_one(manager, "m") for _ in range(4)] == [False, True, False, True]
    manager.close()
    assert len(read_traces(trace_file)) == 4


def test_generate_requests_are_traced(repo: Path, tmp_path: Path) -> None:
    """The generate extension's requests are sampled and traced as /infer's are, with the same
    timestamps, in both of its forms."""
    import urllib.request
    trace_file = tmp_path / "trace.json"
    body = json.dumps({"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]}).encode()
    with ServeProcess(repo, "--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS",
                      "--trace-config", "rate=1") as srv:
        for endpoint in ("generate", "generate_stream"):
            url = f"http://{srv.http_url}/v2/models/add_sub/{endpoint}"
            with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST"), timeout=30) as reply:
                assert b"OUTPUT0" in reply.read()
    traces = [t for t in read_traces(trace_file).values() if t["model"] is not None]
    assert len(traces) == 2 and {t["model"]["model_name"] for t in traces} == {"add_sub"}
    for trace in traces:
        assert_in_order(trace, HTTP_ORDER)
