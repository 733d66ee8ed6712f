"""`stubhost serve` end to end with tritonclient over HTTP and gRPC on the example models."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.host.repo_factory import EXAMPLES
from tests.server.serve_process import ServeProcess


@pytest.fixture(scope="module")
def server():
    with ServeProcess(EXAMPLES) as srv:
        yield srv


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_add_sub_round_trip(server, protocol):
    mod = httpclient if protocol == "http" else grpcclient
    client = mod.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 0.5, dtype=np.float32)
    inputs = [mod.InferInput("INPUT0", [4], "FP32"), mod.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("add_sub")
    client.close()
