"""The HTTP/REST front end of `stubhost serve`: what only HTTP has.

Compression (tritonclient's request/response_compression_algorithm, and on the wire), the binary
tensor data extension details, and raw malformed requests sent with http.client: every error
answers ``{"error": "..."}`` with Triton's status, and the server keeps serving afterwards.
"""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import time
import zlib
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.server.frontend_support import Conn, build_repository, error_of, sample
from tests.server.serve_process import ServeProcess

MODELS = ("add_sub", "all_types", "string_upper", "slow")
INFER = "/v2/models/add_sub/infer"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = build_repository(tmp_path_factory.mktemp("http") / "models", *MODELS)
    with ServeProcess(repo) as srv:
        yield srv


@pytest.fixture(scope="module")
def conn(server: ServeProcess):
    c = Conn.open("http", server)
    yield c
    c.close()


class Raw:
    """A keep-alive connection for hand-made requests."""

    def __init__(self, server: ServeProcess) -> None:
        host, port = server.http_url.rsplit(":", 1)
        self.http = http.client.HTTPConnection(host, int(port), timeout=30)

    def send(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
             **kw: Any) -> tuple[int, dict[str, str], bytes]:
        self.http.request(method, path, body=body, headers=headers or {}, **kw)
        response = self.http.getresponse()
        data = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data

    def close(self) -> None:
        self.http.close()


@pytest.fixture
def raw(server: ServeProcess):
    r = Raw(server)
    yield r
    r.close()


def add_sub_json(a: list[float] | None = None, **extra: Any) -> dict[str, Any]:
    a = a if a is not None else [1.0, 2.0, 3.0, 4.0]
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": a},
                       {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": a}], **extra}


def binary_body(inputs: list, outputs: list | None = None, **kw: Any) -> tuple[bytes, int | None]:
    return httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs, **kw)


def f32(name: str, values: np.ndarray) -> Any:
    return httpclient.InferInput(name, list(values.shape), "FP32").set_data_from_numpy(values)


def assert_serving(raw: Raw) -> None:
    """The same connection still answers health and a good inference."""
    status, _, _ = raw.send("GET", "/v2/health/ready")
    assert status == 200
    status, _, body = raw.send("POST", INFER, json.dumps(add_sub_json()).encode(),
                               {"Content-Type": "application/json"})
    assert status == 200, body
    outputs = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
    assert outputs["OUTPUT0"] == [2.0, 4.0, 6.0, 8.0]


def assert_error_body(headers: dict[str, str], body: bytes) -> str:
    """Triton's error body: a JSON object with one string member "error"."""
    assert headers.get("content-type", "").startswith("application/json"), headers
    doc = json.loads(body)
    assert list(doc) == ["error"] and isinstance(doc["error"], str) and doc["error"], doc
    return doc["error"]


# ---- compression -----------------------------------------------------------------------------------
@pytest.mark.parametrize("request_algorithm", [None, "gzip", "deflate"])
@pytest.mark.parametrize("response_algorithm", [None, "gzip", "deflate"])
def test_compression(conn: Conn, request_algorithm, response_algorithm):
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 3.0, dtype=np.float32)
    for binary in (True, False):
        result = conn.client.infer("add_sub", [conn.input("INPUT0", a, binary=binary),
                                               conn.input("INPUT1", b, binary=binary)],
                                   outputs=[conn.output("OUTPUT0", binary=binary), conn.output("OUTPUT1")],
                                   request_compression_algorithm=request_algorithm,
                                   response_compression_algorithm=response_algorithm)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("encoding, decompress", [("gzip", gzip.decompress), ("deflate", zlib.decompress)])
def test_response_compressed_on_the_wire(raw: Raw, encoding, decompress):
    body, json_size = binary_body([f32("INPUT0", np.ones(4, np.float32)), f32("INPUT1", np.ones(4, np.float32))])
    status, headers, data = raw.send("POST", INFER, body, {"Inference-Header-Content-Length": str(json_size),
                                                           "Accept-Encoding": encoding})
    assert status == 200
    assert headers.get("content-encoding") == encoding
    plain = decompress(data)
    header_length = int(headers["inference-header-content-length"])
    doc = json.loads(plain[:header_length])
    assert [o["name"] for o in doc["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    np.testing.assert_array_equal(np.frombuffer(plain[header_length:header_length + 16], np.float32), [2] * 4)


@pytest.mark.parametrize("encoding, compress", [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_request_compressed_on_the_wire(raw: Raw, encoding, compress):
    body, json_size = binary_body([f32("INPUT0", np.ones(4, np.float32)), f32("INPUT1", np.ones(4, np.float32))])
    status, _, data = raw.send("POST", INFER, compress(body), {"Inference-Header-Content-Length": str(json_size),
                                                               "Content-Encoding": encoding})
    assert status == 200, data


def test_corrupt_compressed_body(raw: Raw):
    status, headers, body = raw.send("POST", INFER, b"\x1f\x8b not really gzip", {"Content-Encoding": "gzip"})
    assert status == 400
    assert assert_error_body(headers, body)
    assert_serving(raw)


# ---- binary tensor data extension --------------------------------------------------------------------
def test_json_request_json_response(raw: Raw):
    status, headers, body = raw.send("POST", INFER, json.dumps(add_sub_json(id="j1")).encode())
    assert status == 200
    assert "inference-header-content-length" not in headers
    doc = json.loads(body)
    assert doc["id"] == "j1" and doc["model_name"] == "add_sub" and doc["model_version"] == "1"
    assert {o["name"]: o["data"] for o in doc["outputs"]} == {"OUTPUT0": [2, 4, 6, 8], "OUTPUT1": [0, 0, 0, 0]}


def test_binary_data_output_parameter(raw: Raw):
    request = add_sub_json(parameters={"binary_data_output": True})
    status, headers, body = raw.send("POST", INFER, json.dumps(request).encode())
    assert status == 200
    length = int(headers["inference-header-content-length"])
    doc = json.loads(body[:length])
    sizes = [o["parameters"]["binary_data_size"] for o in doc["outputs"]]
    assert sizes == [16, 16] and len(body) == length + 32
    np.testing.assert_array_equal(np.frombuffer(body[length:length + 16], np.float32), [2, 4, 6, 8])


def test_per_output_binary_choice(raw: Raw):
    request = add_sub_json(outputs=[{"name": "OUTPUT0", "parameters": {"binary_data": True}},
                                    {"name": "OUTPUT1", "parameters": {"binary_data": False}}])
    status, headers, body = raw.send("POST", INFER, json.dumps(request).encode())
    assert status == 200
    length = int(headers["inference-header-content-length"])
    out0, out1 = json.loads(body[:length])["outputs"]
    assert out0["parameters"]["binary_data_size"] == 16 and "data" not in out0
    assert out1["data"] == [0, 0, 0, 0]


def test_nested_json_data(conn: Conn, raw: Raw):
    request = {"inputs": [{"name": "IN_INT32", "datatype": "INT32", "shape": [2, 3],
                           "data": [[1, 2, 3], [4, 5, 6]]}]}
    status, _, body = raw.send("POST", "/v2/models/all_types/infer", json.dumps(request).encode())
    assert status == 200, body
    [out] = json.loads(body)["outputs"]
    assert out["shape"] == [2, 3] and out["data"] == [1, 2, 3, 4, 5, 6]


def test_large_binary_tensor(conn: Conn):
    array = np.random.default_rng(0).random((1024, 1024), dtype=np.float32)  # 4 MiB each way
    result = conn.client.infer("all_types", [conn.input("IN_FP32", array)])
    np.testing.assert_array_equal(result.as_numpy("OUT_FP32"), array)


def test_chunked_request_body(raw: Raw):
    body, json_size = binary_body([f32("INPUT0", np.ones(4, np.float32)), f32("INPUT1", np.ones(4, np.float32))])
    chunks = iter([body[:7], body[7:json_size], body[json_size:]])
    status, _, data = raw.send("POST", INFER, chunks, {"Inference-Header-Content-Length": str(json_size)},
                               encode_chunked=True)
    assert status == 200, data


def test_non_utf8_bytes_cannot_be_json(conn: Conn):
    """BYTES that are not UTF-8 cannot be written as a JSON string: the output must be asked for as
    binary; as JSON the request fails with a clear error (never invalid JSON), binary works."""
    array = sample("BYTES")
    x = conn.input("IN_BYTES", array)
    error = error_of(conn.client.infer, "all_types", [x], outputs=[conn.output("OUT_BYTES", binary=False)])
    assert "OUT_BYTES" in error.message()
    assert error.status() == "400"
    result = conn.client.infer("all_types", [x], outputs=[conn.output("OUT_BYTES")])
    assert list(result.as_numpy("OUT_BYTES").ravel()) == list(array.ravel())


# ---- malformed requests ------------------------------------------------------------------------
def _binary_add_sub() -> tuple[bytes, int]:
    body, json_size = binary_body([f32("INPUT0", np.ones(4, np.float32)), f32("INPUT1", np.ones(4, np.float32))])
    assert json_size is not None
    return body, json_size


def _header_json(doc: dict[str, Any], binary: bytes) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(doc).encode()
    return header + binary, {"Inference-Header-Content-Length": str(len(header))}


def _binary_size_mismatch(short: bool) -> tuple[bytes, dict[str, str]]:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}},
                      {"name": "INPUT1", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}}]}
    return _header_json(doc, b"\0" * (24 if short else 40))


def _binary_wrong_size_for_shape() -> tuple[bytes, dict[str, str]]:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 8}},
                      {"name": "INPUT1", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}}]}
    return _header_json(doc, b"\0" * 24)


MALFORMED = {
    "bad json": (b'{"inputs": [', {}, "failed to parse"),
    "json not an object": (b"[1, 2, 3]", {}, ""),
    "no inputs": (b"{}", {}, "inputs"),
    "inputs not a list": (b'{"inputs": 5}', {}, "inputs"),
    "data count mismatch": (json.dumps(add_sub_json([1.0, 2.0, 3.0])).encode(), {}, ""),
    "data of wrong type": (json.dumps(add_sub_json(["a", "b", "c", "d"])).encode(), {}, ""),
    "unknown datatype": (json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP33", "shape": [1],
                                                 "data": [1]}]}).encode(), {}, "datatype"),
    "negative shape": (json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-4],
                                               "data": [1, 2, 3, 4]}]}).encode(), {}, "shape"),
    "header length not a number": (_binary_add_sub()[0], {"Inference-Header-Content-Length": "abc"},
                                   "Inference-Header-Content-Length"),
    "header length past the body": (_binary_add_sub()[0], {"Inference-Header-Content-Length": "100000"}, ""),
    "negative header length": (_binary_add_sub()[0], {"Inference-Header-Content-Length": "-5"}, ""),
    "header length cuts the JSON": (_binary_add_sub()[0], {"Inference-Header-Content-Length": "10"},
                                    "failed to parse"),
    "binary data missing": (json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4],
                                                    "parameters": {"binary_data_size": 16}}]}).encode(), {}, ""),
    "binary data short": (*_binary_size_mismatch(True), "unexpected size for input"),
    "binary data too long": (*_binary_size_mismatch(False), "unexpected additional input data"),
    "binary size wrong for the shape": (*_binary_wrong_size_for_shape(), "byte size mismatch"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_infer_request(raw: Raw, case: str):
    body, headers, fragment = MALFORMED[case]
    status, out_headers, data = raw.send("POST", INFER, body, headers)
    assert status == 400, (status, data)
    message = assert_error_body(out_headers, data)
    assert fragment in message
    assert_serving(raw)


@pytest.mark.parametrize("method, path, status", [
    ("GET", "/v2/nothing_here", 404),
    ("GET", "/not_v2", 404),
    ("GET", "/v2/models/add_sub/bogus", 404),
    ("GET", "/v2/models/add_sub/versions/1/bogus", 404),
    ("POST", "/v2/repository/bogus", 404),
    ("GET", "/v2/systemsharedmemory/bogus", 404),
    ("GET", INFER, 405),
    ("PUT", INFER, 405),
    ("POST", "/v2/health/live", 405),
    ("POST", "/v2/health/ready", 405),
    ("DELETE", "/v2", 405),
    ("POST", "/v2/models/add_sub", 405),
    ("POST", "/v2/models/add_sub/config", 405),
    ("POST", "/v2/models/stats", 405),
    ("GET", "/v2/repository/index", 405),
    ("GET", "/v2/systemsharedmemory/region/x/register", 405),
])
def test_unknown_path_and_wrong_method(raw: Raw, method: str, path: str, status: int):
    got, headers, body = raw.send(method, path, b"{}" if method in ("POST", "PUT") else None)
    assert got == status, (got, body)
    assert_error_body(headers, body)
    assert_serving(raw)


@pytest.mark.parametrize("method, path, body, status, fragment", [
    ("GET", "/v2/models/no_such_model", None, 404, "no_such_model"),
    ("GET", "/v2/models/no_such_model/config", None, 404, "no_such_model"),
    ("GET", "/v2/models/no_such_model/stats", None, 400, "requested model 'no_such_model' is not available"),
    ("POST", "/v2/models/no_such_model/infer", json.dumps(add_sub_json()).encode(), 404, "no_such_model"),
    ("GET", "/v2/systemsharedmemory/region/no_such_region/status", None, 404, "no_such_region"),
    ("POST", "/v2/systemsharedmemory/region/r/register", b"{not json", 400, ""),
    ("POST", "/v2/systemsharedmemory/region/r/register", b'{"offset": 0, "byte_size": 8}', 400, "key"),
    ("POST", "/v2/repository/index", b"{not json", 400, ""),
])
def test_error_bodies(raw: Raw, method: str, path: str, body: bytes | None, status: int, fragment: str):
    got, headers, data = raw.send(method, path, body)
    assert got == status, (got, data)
    assert fragment in assert_error_body(headers, data)
    assert_serving(raw)


def test_model_ready_and_health_bodies(raw: Raw):
    assert raw.send("GET", "/v2/health/live")[0] == 200
    assert raw.send("GET", "/v2/models/add_sub/ready")[0] == 200
    assert raw.send("GET", "/v2/models/add_sub/versions/1/ready")[0] == 200
    assert raw.send("GET", "/v2/models/add_sub/versions/7/ready")[0] != 200
    assert raw.send("GET", "/v2/models/no_such_model/ready")[0] != 200


def test_many_errors_then_good_requests_on_one_connection(raw: Raw):
    for _ in range(20):
        status, _, _ = raw.send("POST", INFER, b"garbage")
        assert status == 400
    for _ in range(5):
        assert_serving(raw)


def test_tritonclient_sees_error_messages(conn: Conn):
    """tritonclient reads the message out of {"error": ...}; a body of any other shape would turn
    into 'an exception occurred in the client while decoding the response'."""
    error = error_of(conn.client.get_model_metadata, "no_such_model")
    assert "decoding the response" not in error.message() and "no_such_model" in error.message()
    error = error_of(conn.client.infer, "add_sub", [conn.input("INPUT0", np.ones(3, np.float32))])
    assert "decoding the response" not in error.message()


def test_client_disconnects_mid_request(server: ServeProcess, raw: Raw, tmp_path):
    """A client that hangs up while its request runs, or before its body is complete, costs the
    server nothing."""
    host, port = server.http_url.rsplit(":", 1)
    started = tmp_path / "started"
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}],
                       "parameters": {"sleep": 0.3, "touch": str(started)}}).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
                     + body)
        deadline = time.monotonic() + 30
        while not started.exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"inp")
    time.sleep(0.5)  # the slow request has finished into a closed connection
    assert_serving(raw)
    status, _, data = raw.send("POST", "/v2/models/slow/infer", json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}).encode())
    assert status == 200, data


def test_ready_filter_in_repository_index(raw: Raw):
    status, _, body = raw.send("POST", "/v2/repository/index", json.dumps({"ready": True}).encode())
    assert status == 200
    assert {e["name"] for e in json.loads(body)} == set(MODELS)
