"""The gRPC front end of `stubhost serve`: what only gRPC has.

Bidirectional streaming (``start_stream`` / ``async_stream_infer``: answers matched by id, an
erroring request reports an error and the stream goes on), typed ``contents`` sent with the
protobuf stub tritonclient ships, channel compression and client deadlines.
"""

from __future__ import annotations

import json
import queue
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor, triton_to_np_dtype

from tests.server.frontend_support import (
    Conn,
    build_repository,
    error_of,
    expect_status,
)
from tests.server.serve_process import ServeProcess

MODELS = ("add_sub", "all_types", "echo", "raiser", "slow")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = build_repository(tmp_path_factory.mktemp("grpc") / "models", *MODELS)
    with ServeProcess(repo) as srv:
        yield srv


@pytest.fixture(scope="module")
def conn(server: ServeProcess):
    c = Conn.open("grpc", server)
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(server: ServeProcess):
    channel = grpc.insecure_channel(server.grpc_url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def add_sub_inputs(conn: Conn, a: np.ndarray, b: np.ndarray) -> list:
    return [conn.input("INPUT0", a), conn.input("INPUT1", b)]


class Collector:
    """A stream callback that keeps every (result, error) it is given."""

    def __init__(self) -> None:
        self.items: queue.Queue = queue.Queue()

    def __call__(self, result, error) -> None:
        self.items.put((result, error))

    def take(self, n: int, timeout: float = 30.0) -> list:
        return [self.items.get(timeout=timeout) for _ in range(n)]


@pytest.fixture
def stream(conn: Conn):
    collector = Collector()
    conn.client.start_stream(callback=collector)
    yield collector
    conn.client.stop_stream()


# ---- streaming ---------------------------------------------------------------------------------
def test_stream_answers_matched_by_id(conn: Conn, stream: Collector):
    sent = {}
    for i in range(12):
        a = np.full(4, float(i), dtype=np.float32)
        b = np.arange(4, dtype=np.float32)
        sent[f"req-{i}"] = (a, b)
        conn.client.async_stream_infer("add_sub", add_sub_inputs(conn, a, b), request_id=f"req-{i}")
    got = stream.take(len(sent))
    assert all(error is None for _, error in got), [str(e) for _, e in got if e]
    by_id = {result.get_response().id: result for result, _ in got}
    assert set(by_id) == set(sent)
    for request_id, (a, b) in sent.items():
        np.testing.assert_array_equal(by_id[request_id].as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(by_id[request_id].as_numpy("OUTPUT1"), a - b)


def test_stream_error_reports_and_goes_on(conn: Conn, stream: Collector):
    ones = np.ones(4, dtype=np.float32)
    conn.client.async_stream_infer("add_sub", add_sub_inputs(conn, ones, ones), request_id="good-1")
    conn.client.async_stream_infer("raiser", [conn.input("INPUT0", ones)], request_id="bad-raise")
    conn.client.async_stream_infer("add_sub", add_sub_inputs(conn, ones[:3], ones[:3]), request_id="bad-shape")
    conn.client.async_stream_infer("no_such_model", [conn.input("INPUT0", ones)], request_id="bad-model")
    conn.client.async_stream_infer("add_sub", add_sub_inputs(conn, ones, ones * 2), request_id="good-2")
    got = stream.take(5)
    results = {r.get_response().id: r for r, e in got if e is None}
    errors = sorted(e.message() for r, e in got if e is not None)
    assert set(results) == {"good-1", "good-2"}
    assert len(errors) == 3
    assert any("Failed to process the request(s) for model" in m for m in errors), errors
    assert any("unexpected shape for input 'INPUT0'" in m for m in errors), errors
    assert any("no_such_model" in m for m in errors), errors
    # the stream is still usable after its errors
    conn.client.async_stream_infer("add_sub", add_sub_inputs(conn, ones, ones), request_id="after")
    [(result, error)] = stream.take(1)
    assert error is None and result.get_response().id == "after"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), ones * 2)


def test_stream_error_carries_request_id(stub):
    """On the wire, a failed stream request answers error_message plus an infer_response holding
    the request's id (what lets clients other than tritonclient match it)."""
    request = service_pb2.ModelInferRequest(model_name="raiser", id="which-one")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[2])
    tensor.contents.fp32_contents.extend([1.0, 2.0])
    [response] = list(stub.ModelStreamInfer(iter([request]), timeout=30))
    assert "Failed to process the request(s) for model" in response.error_message
    assert response.infer_response.id == "which-one"


def test_stream_parameters_and_sequence(conn: Conn, stream: Collector):
    x = conn.input("INPUT0", np.ones(2, dtype=np.float32))
    conn.client.async_stream_infer("echo", [x], request_id="s1", sequence_id=99, sequence_start=True,
                                   parameters={"tag": "streamed"})
    conn.client.async_stream_infer("echo", [x], request_id="s2", sequence_id=99, sequence_end=True)
    got = {r.get_response().id: r for r, e in stream.take(2) if e is None}
    first, last = (json.loads(got[i].as_numpy("META")[0]) for i in ("s1", "s2"))
    assert (first["correlation_id"], first["flags"], first["parameters"].get("tag")) == (99, 1, "streamed")
    assert (last["correlation_id"], last["flags"]) == (99, 2)
    params = got["s1"].get_response().parameters
    assert params["echo"].string_param == "streamed" and params["answer"].int64_param == 42


def test_stream_answers_in_completion_order(conn: Conn, stream: Collector):
    """Requests of one stream run concurrently: a quick request sent after a slow one on another
    model is answered first."""
    ones = np.ones(4, dtype=np.float32)
    conn.client.async_stream_infer("slow", [conn.input("INPUT0", ones)], request_id="slow",
                                   parameters={"sleep": 0.5})
    time.sleep(0.05)
    conn.client.async_stream_infer("add_sub", add_sub_inputs(conn, ones, ones), request_id="quick")
    order = [r.get_response().id for r, e in stream.take(2)]
    assert order == ["quick", "slow"]


def test_several_streams_at_once(server: ServeProcess):
    clients = [grpcclient.InferenceServerClient(server.grpc_url) for _ in range(3)]
    collectors = [Collector() for _ in clients]
    try:
        for client, collector in zip(clients, collectors):
            client.start_stream(callback=collector)
        for n, client in enumerate(clients):
            for i in range(5):
                x = np.full(4, float(n * 10 + i), dtype=np.float32)
                inputs = [grpcclient.InferInput("INPUT0", [4], "FP32").set_data_from_numpy(x),
                          grpcclient.InferInput("INPUT1", [4], "FP32").set_data_from_numpy(x)]
                client.async_stream_infer("add_sub", inputs, request_id=f"{n}-{i}")
        for n, collector in enumerate(collectors):
            got = collector.take(5)
            ids = sorted(r.get_response().id for r, e in got if e is None)
            assert ids == sorted(f"{n}-{i}" for i in range(5))
            for r, _ in got:
                i = int(r.get_response().id.split("-")[1])
                np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), np.full(4, 2.0 * (n * 10 + i)))
    finally:
        for client in clients:
            client.stop_stream()
            client.close()


# ---- typed contents through the protobuf stub -------------------------------------------------------
TYPED = {
    "BOOL": ("bool_contents", [True, False, True]),
    "INT8": ("int_contents", [-128, 0, 127]),
    "INT16": ("int_contents", [-32768, 1, 32767]),
    "INT32": ("int_contents", [-2**31, 2, 2**31 - 1]),
    "INT64": ("int64_contents", [-2**63, 3, 2**63 - 1]),
    "UINT8": ("uint_contents", [0, 1, 255]),
    "UINT16": ("uint_contents", [0, 2, 65535]),
    "UINT32": ("uint_contents", [0, 3, 2**32 - 1]),
    "UINT64": ("uint64_contents", [0, 4, 2**64 - 1]),
    "FP32": ("fp32_contents", [-1.5, 0.0, 3.25]),
    "FP64": ("fp64_contents", [-1e300, 0.0, 2.5]),
    "BYTES": ("bytes_contents", [b"", b"\xff\x00 raw", "\u2603".encode()]),
}


@pytest.mark.parametrize("datatype", list(TYPED))
def test_typed_contents(stub, datatype: str):
    field, values = TYPED[datatype]
    request = service_pb2.ModelInferRequest(model_name="all_types", id=f"typed-{datatype}")
    tensor = request.inputs.add(name=f"IN_{datatype}", datatype=datatype, shape=[1, 3])
    getattr(tensor.contents, field).extend(values)
    response = stub.ModelInfer(request, timeout=30)
    assert response.id == f"typed-{datatype}"
    [out] = response.outputs
    assert (out.name, out.datatype, list(out.shape)) == (f"OUT_{datatype}", datatype, [1, 3])
    raw = response.raw_output_contents[0]
    if datatype == "BYTES":
        assert list(deserialize_bytes_tensor(raw)) == values
    else:
        np.testing.assert_array_equal(np.frombuffer(raw, dtype=triton_to_np_dtype(datatype)),
                                      np.array(values, dtype=triton_to_np_dtype(datatype)))


def test_typed_contents_wrong_count(stub):
    request = service_pb2.ModelInferRequest(model_name="all_types")
    tensor = request.inputs.add(name="IN_FP32", datatype="FP32", shape=[2, 2])
    tensor.contents.fp32_contents.extend([1.0, 2.0, 3.0])
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "IN_FP32" in info.value.details()


def test_raw_and_typed_contents_mixed(stub):
    request = service_pb2.ModelInferRequest(model_name="add_sub")
    a = request.inputs.add(name="INPUT0", datatype="FP32", shape=[4])
    request.inputs.add(name="INPUT1", datatype="FP32", shape=[4])
    a.contents.fp32_contents.extend([1, 2, 3, 4])
    request.raw_input_contents.append(np.ones(4, np.float32).tobytes())
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_raw_contents_count_mismatch(stub):
    request = service_pb2.ModelInferRequest(model_name="add_sub")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[4])
    request.inputs.add(name="INPUT1", datatype="FP32", shape=[4])
    request.raw_input_contents.append(np.ones(4, np.float32).tobytes())
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_raw_contents_wrong_size(stub):
    request = service_pb2.ModelInferRequest(model_name="add_sub")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[4])
    request.inputs.add(name="INPUT1", datatype="FP32", shape=[4])
    request.raw_input_contents.extend([np.ones(4, np.float32).tobytes(), b"\0" * 12])
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "INPUT1" in info.value.details()


# ---- channel options ------------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_channel_compression(conn: Conn, algorithm: str):
    a = np.arange(4, dtype=np.float32)
    result = conn.client.infer("add_sub", add_sub_inputs(conn, a, a), compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def test_client_deadline(conn: Conn):
    """A client that gives up (deadline) leaves the server fine: the request finishes on the
    server and the next one is answered."""
    x = conn.input("INPUT0", np.ones(2, dtype=np.float32))
    error = error_of(conn.client.infer, "slow", [x], parameters={"sleep": 0.5}, client_timeout=0.1)
    expect_status(conn, error, 0, "DEADLINE_EXCEEDED")
    a = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(conn.client.infer("add_sub", add_sub_inputs(conn, a, a)).as_numpy("OUTPUT0"), a + a)


def test_stream_cancelled_by_client(server: ServeProcess, conn: Conn):
    """A client that drops its stream with a slow request in flight leaves the server serving."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    collector = Collector()
    client.start_stream(callback=collector)
    x = grpcclient.InferInput("INPUT0", [2], "FP32").set_data_from_numpy(np.ones(2, np.float32))
    client.async_stream_infer("slow", [x], parameters={"sleep": 0.5})
    time.sleep(0.1)
    client.stop_stream(cancel_requests=True)
    client.close()
    a = np.arange(4, dtype=np.float32)
    result = conn.client.infer("add_sub", add_sub_inputs(conn, a, a))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    assert conn.client.is_server_ready()
