"""A fuzz pass over the HTTP API: whatever a client sends, the answer is a 2xx/4xx with a JSON
error body (never a 5xx, never a dropped connection), and the server keeps serving."""

from __future__ import annotations

import http.client
import json
import string

import numpy as np
import pytest
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.host.repo_factory import EXAMPLES
from tests.server.serve_process import ServeProcess

DATATYPES = ["BOOL", "UINT8", "INT8", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16", "", "fp32", "X"]
NAMES = ["INPUT0", "INPUT1", "OUTPUT0", "", "x" * 300, "\u00e9", "../../etc"]
MODELS = ["add_sub", "identity", "string_upper", "nope", "", "..", "%00"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=6),
                                                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=30)
shapes = st.one_of(st.lists(st.integers(-3, 8), max_size=4), st.lists(st.integers(-2**64, 2**64), max_size=3),
                   json_values)
parameters = st.one_of(st.dictionaries(st.sampled_from(["binary_data_size", "shared_memory_region",
                                                        "shared_memory_byte_size", "shared_memory_offset",
                                                        "binary_data", "classification", "sequence_id",
                                                        "timeout", "priority"]),
                                       scalars, max_size=3), json_values)
tensors = st.fixed_dictionaries({}, optional={
    "name": st.one_of(st.sampled_from(NAMES), scalars),
    "datatype": st.one_of(st.sampled_from(DATATYPES), scalars),
    "shape": shapes,
    "data": json_values,
    "parameters": parameters,
})
bodies = st.fixed_dictionaries({}, optional={
    "id": st.one_of(st.text(max_size=10), scalars),
    "inputs": st.one_of(st.lists(tensors, max_size=4), json_values),
    "outputs": st.one_of(st.lists(tensors, max_size=3), json_values),
    "parameters": parameters,
})


@pytest.fixture(scope="module")
def server():
    with ServeProcess(EXAMPLES) as srv:
        yield srv


def _send(server: ServeProcess, method: str, path: str, body: bytes = b"",
          headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    host, port = server.http_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def _check(status: int, payload: bytes) -> None:
    assert status < 500, (status, payload[:500])
    if status >= 400 and payload:
        error = json.loads(payload)
        assert isinstance(error, dict) and isinstance(error.get("error"), str), payload[:500]


def _still_serving(server: ServeProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    x = httpclient.InferInput("INPUT0", [3], "FP32")
    x.set_data_from_numpy(np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(client.infer("identity", [x]).as_numpy("OUTPUT0"), np.arange(3, dtype=np.float32))
    client.close()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=st.sampled_from(MODELS), body=bodies)
def test_json_infer_bodies_never_get_a_5xx(server, model, body):
    status, payload = _send(server, "POST", f"/v2/models/{model}/infer", json.dumps(body).encode(),
                            {"Content-Type": "application/json"})
    _check(status, payload)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(header=st.binary(max_size=200), tail=st.binary(max_size=64),
       length=st.one_of(st.none(), st.integers(-5, 400).map(str),
                        st.text(alphabet=string.ascii_letters + string.digits + string.punctuation, max_size=6)))
def test_raw_and_binary_bodies_never_get_a_5xx(server, header, tail, length):
    headers = {} if length is None else {"Inference-Header-Content-Length": length}
    status, payload = _send(server, "POST", "/v2/models/add_sub/infer", header + tail, headers)
    _check(status, payload)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
       segments=st.lists(st.sampled_from(["v2", "models", "add_sub", "versions", "1", "0", "-1", "x", "infer",
                                          "ready", "config", "stats", "repository", "index", "load", "unload",
                                          "systemsharedmemory", "cudasharedmemory", "region", "r", "register",
                                          "unregister", "status", "health", "live", ""]), max_size=7),
       body=json_values)
def test_any_path_and_method_never_get_a_5xx(server, method, segments, body):
    status, payload = _send(server, method, "/" + "/".join(segments), json.dumps(body).encode())
    _check(status, payload)


def test_the_server_still_serves_after_the_fuzzing(server):
    _still_serving(server)
