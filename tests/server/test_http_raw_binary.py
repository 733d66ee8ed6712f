"""Triton's raw binary request on the HTTP front end: ``Inference-Header-Content-Length: 0`` and a
body that is only the data of the model's one input (no JSON).

As Triton (``src/http_server.cc`` EVBufferToRawInput, core ``InferenceRequest::Normalize``): the
input's name, datatype and shape come from the model configuration (a batch dimension of 1 when
``max_batch_size`` > 0, one variable-sized dim from the byte size), a BYTES input must have shape
[1] and gets the whole body as its one element, and every output comes back as binary data.
tritonclient cannot send such requests, so these go out through http.client, as curl users send them.
"""

from __future__ import annotations

import gzip
import http.client
import json
import struct
from typing import Any

import numpy as np
import pytest

from stubhost.host.errors import InferenceError
from stubhost.server.http_codec import decode_raw_request
from tests.host.repo_factory import config_pbtxt, io, write_model
from tests.server.frontend_support import BATCHED_PY, build_repository
from tests.server.serve_process import ServeProcess

RAW = {"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"}
NO_ID = "[request id: <id_unknown>] "

# OUTPUT0 = INPUT0 and LENGTH = each element's length: the model sees one element, the whole body.
BYTES_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            lengths = np.array([len(e) for e in x.reshape(-1)], dtype=np.int32).reshape(x.shape)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("LENGTH", lengths)]))
        return responses
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    # identity: FP32 [-1]; batched: FP32 [2], max_batch_size 8; add_sub: two inputs;
    # string_upper: BYTES [-1].
    repo = build_repository(tmp_path_factory.mktemp("raw") / "models", "identity", "batched", "add_sub",
                            "string_upper")
    # BATCHED_PY answers OUTPUT0 = INPUT0 whatever the shape.
    write_model(repo, "fixed", BATCHED_PY, config_pbtxt("fixed", [io("INPUT0", "TYPE_FP32", [2, 3])],
                                                        [io("OUTPUT0", "TYPE_FP32", [2, 3])]))
    write_model(repo, "matrix", BATCHED_PY, config_pbtxt("matrix", [io("INPUT0", "TYPE_FP32", [-1, -1])],
                                                         [io("OUTPUT0", "TYPE_FP32", [-1, -1])]))
    write_model(repo, "one_string", BYTES_PY, config_pbtxt(
        "one_string", [io("INPUT0", "TYPE_STRING", [1])],
        [io("OUTPUT0", "TYPE_STRING", [1]), io("LENGTH", "TYPE_INT32", [1])]))
    with ServeProcess(repo) as srv:
        yield srv


def post(server: ServeProcess, model: str, body: bytes, headers: dict[str, str] | None = None,
         path: str | None = None) -> tuple[int, dict[str, str], bytes]:
    host, port = server.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", path or f"/v2/models/{model}/infer", body=body, headers=RAW if headers is None else headers)
        reply = conn.getresponse()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
    finally:
        conn.close()


def split(headers: dict[str, str], body: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A binary response: its JSON header, and each output's bytes by name. When every output is
    empty no binary data follows, and (as in Triton) the response is plain JSON."""
    if "inference-header-content-length" in headers:
        assert headers["content-type"] == "application/octet-stream", headers
        length = int(headers["inference-header-content-length"])
    else:
        assert headers["content-type"] == "application/json", headers
        length = len(body)
    doc = json.loads(body[:length])
    data, offset = {}, length
    for out in doc["outputs"]:
        size = out["parameters"]["binary_data_size"]
        assert "data" not in out
        data[out["name"]] = body[offset:offset + size]
        offset += size
    assert offset == len(body)
    return doc, data


def error(status: int, headers: dict[str, str], body: bytes) -> str:
    assert status == 400, (status, body)
    assert headers["content-type"].startswith("application/json"), headers
    doc = json.loads(body)
    assert list(doc) == ["error"], doc
    return doc["error"]


# ---- requests Triton accepts ---------------------------------------------------------------------
def test_fixed_dims(server: ServeProcess, quiet_log):
    x = np.arange(6, dtype=np.float32)
    status, headers, body = post(server, "fixed", x.tobytes())
    assert status == 200, body
    doc, data = split(headers, body)
    assert doc == {"model_name": "fixed", "model_version": "1", "outputs": [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}}]}
    assert data["OUTPUT0"] == x.tobytes()


def test_variable_dim_takes_the_element_count(server: ServeProcess, quiet_log):
    x = np.arange(5, dtype=np.float32) * 1.5
    for path in ("/v2/models/identity/infer", "/v2/models/identity/versions/1/infer"):
        status, headers, body = post(server, "identity", x.tobytes(), path=path)
        assert status == 200, body
        doc, data = split(headers, body)
        assert doc["outputs"][0]["shape"] == [5]
        np.testing.assert_array_equal(np.frombuffer(data["OUTPUT0"], np.float32), x)


def test_batching_model_gets_a_batch_of_one(server: ServeProcess, quiet_log):
    x = np.array([3.0, 4.0], dtype=np.float32)
    status, headers, body = post(server, "batched", x.tobytes())
    assert status == 200, body
    doc, data = split(headers, body)
    assert doc["outputs"][0]["shape"] == [1, 2]
    assert data["OUTPUT0"] == x.tobytes()


def test_bytes_input_is_the_whole_body_as_one_element(server: ServeProcess, quiet_log):
    payload = b"427 \x00\xff raw, no length prefix"
    status, headers, body = post(server, "one_string", payload)
    assert status == 200, body
    doc, data = split(headers, body)
    assert [(o["name"], o["datatype"], o["shape"]) for o in doc["outputs"]] == [
        ("OUTPUT0", "BYTES", [1]), ("LENGTH", "INT32", [1])]
    # A BYTES output in binary: the 4-byte length, then the bytes (as in Triton's test_byte).
    assert data["OUTPUT0"] == struct.pack("<I", len(payload)) + payload
    assert np.frombuffer(data["LENGTH"], np.int32).tolist() == [len(payload)]


def test_empty_body(server: ServeProcess, quiet_log):
    """An empty body is a zero-size tensor (Triton appends no data): fine for a variable dim,
    one empty element for BYTES [1]."""
    status, headers, body = post(server, "identity", b"")
    assert status == 200, body
    doc, data = split(headers, body)
    assert doc["outputs"][0]["shape"] == [0] and data["OUTPUT0"] == b""
    status, headers, body = post(server, "one_string", b"")
    assert status == 200, body
    assert split(headers, body)[1]["OUTPUT0"] == b"\0\0\0\0"


def test_no_header_and_an_empty_body_is_raw_too(server: ServeProcess, quiet_log):
    """Triton takes a missing header as the body's length: an empty body is then a raw request."""
    status, headers, body = post(server, "identity", b"", headers={})
    assert status == 200, body
    assert split(headers, body)[0]["outputs"][0]["shape"] == [0]
    message = error(*post(server, "add_sub", b"", headers={}))
    assert message.startswith(f"{NO_ID}Raw request must only have 1 input")


def test_compressed_raw_body(server: ServeProcess, quiet_log):
    x = np.arange(6, dtype=np.float32)
    status, headers, body = post(server, "fixed", gzip.compress(x.tobytes()), {**RAW, "Content-Encoding": "gzip"})
    assert status == 200, body
    assert split(headers, body)[1]["OUTPUT0"] == x.tobytes()


# ---- requests Triton refuses, with its words -------------------------------------------------------
@pytest.mark.parametrize("model, body, message", [
    ("add_sub", np.arange(8, dtype=np.float32).tobytes(),
     (f"{NO_ID}Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'add_sub' model "
      "configuration")),
    ("matrix", np.ones(4, np.float32).tobytes(),
     (f"{NO_ID}The shape of the raw input 'INPUT0' can not be deduced because there are more than one "
      "variable-sized dimension")),
    ("string_upper", b"abc", f"{NO_ID}For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"),
    # A byte size that is not a whole number of elements: the variable dim is rounded down, and the
    # size then fails the byte-size check every binary input gets.
    ("identity", b"\0" * 6, "input byte size mismatch for input 'INPUT0' for model 'identity'. Expected 4, got 6"),
    ("batched", b"\0" * 12, "input byte size mismatch for input 'INPUT0' for model 'batched'. Expected 8, got 12"),
    ("fixed", b"\0" * 10, "input byte size mismatch for input 'INPUT0' for model 'fixed'. Expected 24, got 10"),
    ("fixed", b"", "input byte size mismatch for input 'INPUT0' for model 'fixed'. Expected 24, got 0"),
])
def test_refused(server: ServeProcess, model: str, body: bytes, message: str):
    assert error(*post(server, model, body)) == message


def test_unknown_model(server: ServeProcess):
    status, _, body = post(server, "no_such_model", b"\0" * 4)
    assert status == 404 and "no_such_model" in json.loads(body)["error"]


@pytest.mark.parametrize("value", ["abc", "0x0", ""])
def test_a_malformed_header_is_not_raw(server: ServeProcess, value: str):
    """Only a header that reads 0 asks for a raw request; a malformed one stays an error (an empty
    one counts as missing, so the body must be JSON)."""
    message = error(*post(server, "identity", b"\0" * 4, {"Inference-Header-Content-Length": value}))
    if value:
        assert message == f"invalid Inference-Header-Content-Length '{value}'"
    else:
        assert message.startswith("failed to parse the request JSON buffer")


def test_the_server_keeps_serving(server: ServeProcess, quiet_log):
    for _ in range(3):
        assert post(server, "add_sub", b"\0" * 32)[0] == 400
    assert post(server, "fixed", b"\0" * 24)[0] == 200


# ---- the codec alone -------------------------------------------------------------------------------
def test_codec_fixed_size_input_is_a_view_of_the_body():
    body = np.arange(6, dtype=np.float32).tobytes()
    config = {"max_batch_size": 4, "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [3, -1]}]}
    request = decode_raw_request("m", "", body, config)
    [tensor] = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("X", "FP32", [1, 3, 2])
    assert np.shares_memory(tensor.data, np.frombuffer(body, np.uint8))
    assert (request.id, request.parameters, request.outputs) == ("", {}, [])


def test_codec_holds_raw_inputs_to_the_tensor_limit():
    config = {"input": [{"name": "X", "data_type": "TYPE_STRING", "dims": [1]}]}
    with pytest.raises(InferenceError, match=r"^input 'X' with shape \[1\] and datatype BYTES is too large"):
        decode_raw_request("m", "", b"x" * 13, config, max_tensor_bytes=16)
    assert decode_raw_request("m", "", b"x" * 12, config, max_tensor_bytes=16).inputs[0].data.tolist() == [b"x" * 12]
