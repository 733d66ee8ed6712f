"""An ensemble of two Python models through `stubhost serve`, driven by tritonclient: the composed
result over HTTP and gRPC, inputs and outputs in system shared memory, a streaming ensemble over
gRPC's ModelStreamInfer, and an error in a step reaching the client."""

from __future__ import annotations

import queue
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

from tests.host.repo_factory import config_pbtxt, copy_examples, io, write_model
from tests.host.test_ensemble import double_model, ensemble_config, write_ensemble
from tests.server.frontend_support import PROTOCOLS, Conn, error_of
from tests.server.serve_process import ServeProcess

TO_FLOAT_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy().astype(np.float32) * 10)]) for r in requests]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = copy_examples(tmp_path_factory.mktemp("ensemble_fe") / "models", "add_sub", "add_sub_twice", "repeat")
    double_model(repo)
    write_ensemble(repo, "quadruple", ensemble_config("quadruple", [io("X", "TYPE_FP32", [-1])],
                                                      [io("Y", "TYPE_FP32", [-1])], [
        ("double", {"X": "X"}, {"Y": "TWICE"}), ("double", {"X": "TWICE"}, {"Y": "Y"})]))
    write_model(repo, "to_float", TO_FLOAT_PY, config_pbtxt("to_float", [io("X", "TYPE_INT32", [1])],
                                                            [io("Y", "TYPE_FP32", [1])]))
    write_ensemble(repo, "stream_tens", ensemble_config(
        "stream_tens", [io("IN", "TYPE_INT32", [-1])], [io("TENS", "TYPE_FP32", [1])], [
            ("repeat", {"IN": "IN"}, {"OUT": "VALUE"}), ("to_float", {"X": "VALUE"}, {"Y": "TENS"})],
        extra="model_transaction_policy { decoupled: true }\n"))
    with ServeProcess(repo) as srv:
        yield srv


@pytest.fixture(params=PROTOCOLS)
def conn(request: pytest.FixtureRequest, server: ServeProcess):
    c = Conn.open(request.param, server)
    yield c
    c.close()


def test_the_composed_result(conn: Conn) -> None:
    a, b = np.arange(4, dtype=np.float32), np.full(4, 0.5, np.float32)
    result = conn.client.infer("add_sub_twice", [conn.input("A", a), conn.input("B", b)])
    np.testing.assert_array_equal(result.as_numpy("TWICE_A"), 2 * a)
    np.testing.assert_array_equal(result.as_numpy("TWICE_B"), 2 * b)
    only = conn.client.infer("add_sub_twice", [conn.input("A", a), conn.input("B", b)],
                             outputs=[conn.output("TWICE_B")])
    assert only.as_numpy("TWICE_A") is None
    np.testing.assert_array_equal(only.as_numpy("TWICE_B"), 2 * b)


def test_metadata_and_readiness(conn: Conn) -> None:
    assert conn.client.is_model_ready("add_sub_twice")
    meta = conn.client.get_model_metadata("add_sub_twice")
    platform = meta["platform"] if conn.protocol == "http" else meta.platform
    assert platform == "ensemble"


def test_an_error_in_a_step_reaches_the_client(conn: Conn) -> None:
    error = error_of(conn.client.infer, "quadruple", [conn.input("X", np.full(2, -1, np.float32))])
    assert "negative input to double" in error.message()
    np.testing.assert_array_equal(conn.client.infer("quadruple", [conn.input("X", np.ones(2, np.float32))])
                                  .as_numpy("Y"), [4, 4])


def test_inputs_and_outputs_in_system_shared_memory(conn: Conn) -> None:
    """A and B are read from one region, TWICE_A is written into another by the last step."""
    a, b = np.arange(4, dtype=np.float32), np.full(4, 2, np.float32)
    tag = uuid.uuid4().hex[:8]
    names = (f"ens_in_{tag}", f"ens_out_{tag}")
    inputs = shm.create_shared_memory_region(names[0], f"/{names[0]}", 32)
    outputs = shm.create_shared_memory_region(names[1], f"/{names[1]}", 16)
    try:
        shm.set_shared_memory_region(inputs, [a, b])
        conn.client.register_system_shared_memory(names[0], f"/{names[0]}", 32)
        conn.client.register_system_shared_memory(names[1], f"/{names[1]}", 16)
        x = conn.mod.InferInput("A", [4], "FP32")
        x.set_shared_memory(names[0], 16)
        y = conn.mod.InferInput("B", [4], "FP32")
        y.set_shared_memory(names[0], 16, offset=16)
        out = conn.mod.InferRequestedOutput("TWICE_A")
        out.set_shared_memory(names[1], 16)
        result = conn.client.infer("add_sub_twice", [x, y], outputs=[out])
        entry = conn.response(result)["outputs"][0]
        assert entry["name"] == "TWICE_A" and "data" not in entry  # it went into the region
        np.testing.assert_array_equal(shm.get_contents_as_numpy(outputs, np.float32, [4]), 2 * a)
    finally:
        conn.client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(inputs)
        shm.destroy_shared_memory_region(outputs)


def test_a_streaming_ensemble_over_model_stream_infer(server: ServeProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        x = grpcclient.InferInput("IN", [3], "INT32")
        x.set_data_from_numpy(np.array([1, 2, 3], np.int32))
        client.async_stream_infer("stream_tens", [x], request_id="r1")
        got = []
        for _ in range(3):
            result, error = results.get(timeout=30)
            assert error is None, error
            got.append(float(result.as_numpy("TENS")[0]))
        assert got == [10.0, 20.0, 30.0]
    finally:
        client.stop_stream()
        client.close()


def test_a_streaming_ensemble_is_refused_on_plain_infer(conn: Conn) -> None:
    error = error_of(conn.client.infer, "stream_tens", [conn.input("IN", np.array([1], np.int32))])
    assert "decoupled" in error.message()


def test_unload_dependents_over_both_protocols(tmp_path_factory: pytest.TempPathFactory) -> None:
    repo = copy_examples(tmp_path_factory.mktemp("ensemble_unload") / "models", "add_sub", "add_sub_twice")
    with ServeProcess(repo, "--model-control-mode", "explicit", "--load-model", "add_sub_twice") as srv:
        for protocol in PROTOCOLS:
            conn = Conn.open(protocol, srv)
            try:
                assert conn.client.is_model_ready("add_sub")  # loaded along with the ensemble
                conn.client.unload_model("add_sub_twice", unload_dependents=True)
                assert not conn.client.is_model_ready("add_sub_twice")
                assert not conn.client.is_model_ready("add_sub")
                conn.client.load_model("add_sub_twice")
                assert conn.client.is_model_ready("add_sub")
            finally:
                conn.close()
