"""Inputs in a client's system region reach the model without a copy; outputs bound for a
region are written there by the stub (checked from inside the model, through /proc/self/maps)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from tests.host.repo_factory import config_pbtxt, io, write_model
from tests.server.serve_process import ServeProcess

# The model answers, for its input, the file backing the memory the array views, and writes an
# output of the same values; it also reports whether the input array is writable.
WHERE_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


def backing_file(address):
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return fields[5] if len(fields) > 5 else ""
    return "?"


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            where = backing_file(x.__array_interface__["data"][0])
            flags = np.array([x.flags.writeable], dtype=np.bool_)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x * 2),
                pb_utils.Tensor("WHERE", np.array([where.encode()], dtype=object)),
                pb_utils.Tensor("WRITABLE", flags)]))
        return responses
"""

N = 1 << 16  # 256 KiB of FP32: large enough that no small-tensor path could be involved


def _sent_no_data(result, protocol: str, name: str) -> bool:
    if protocol == "http":
        out = result.get_output(name)
        return "data" not in out and "binary_data_size" not in out.get("parameters", {})
    response = result.get_response()
    index = [o.name for o in response.outputs].index(name)
    return index >= len(response.raw_output_contents) or not response.raw_output_contents[index]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("zc") / "models"
    write_model(repo, "where", WHERE_MODEL, config_pbtxt(
        "where", [io("INPUT0", "TYPE_FP32", [-1])],
        [io("OUTPUT0", "TYPE_FP32", [-1]), io("WHERE", "TYPE_STRING", [1]), io("WRITABLE", "TYPE_BOOL", [1])]))
    with ServeProcess(repo) as srv:
        yield srv


@pytest.fixture
def regions():
    """An input and an output region named after this test process (destroyed afterwards)."""
    made = []

    def make(tag: str, size: int):
        key = f"/zc_{os.getpid()}_{tag}"
        handle = shm.create_shared_memory_region(f"{tag}", key, size)
        made.append(handle)
        return key, handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_input_in_a_client_region_is_read_in_place_and_output_written_there(server, regions, protocol):
    mod = httpclient if protocol == "http" else grpcclient
    client = mod.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    values = np.arange(N, dtype=np.float32)
    in_key, in_handle = regions(f"in_{protocol}", 4096 + values.nbytes)
    out_key, out_handle = regions(f"out_{protocol}", values.nbytes)
    shm.set_shared_memory_region(in_handle, [values], offset=4096)
    client.register_system_shared_memory(f"in_{protocol}", in_key, 4096 + values.nbytes)
    client.register_system_shared_memory(f"out_{protocol}", out_key, values.nbytes)
    try:
        x = mod.InferInput("INPUT0", [N], "FP32")
        x.set_shared_memory(f"in_{protocol}", values.nbytes, offset=4096)
        out = mod.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(f"out_{protocol}", values.nbytes)
        result = client.infer("where", [x], outputs=[out, mod.InferRequestedOutput("WHERE"),
                                                     mod.InferRequestedOutput("WRITABLE")])
        # The model's input array lies in a mapping of the client's own object, not of a pool.
        assert result.as_numpy("WHERE")[0].decode() == f"/dev/shm{in_key}"
        assert not result.as_numpy("WRITABLE")[0], "a model must not be able to write into a client's input"
        assert _sent_no_data(result, protocol, "OUTPUT0")  # its data went to the region, not the response
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [N]), values * 2)
    finally:
        client.unregister_system_shared_memory()
        client.close()


def test_output_region_too_small_fails_that_request_only(server, regions):
    client = httpclient.InferenceServerClient(server.http_url)
    in_key, in_handle = regions("in_small", 64)
    out_key, _ = regions("out_small", 8)
    shm.set_shared_memory_region(in_handle, [np.ones(4, np.float32)])
    client.register_system_shared_memory("in_small", in_key, 64)
    client.register_system_shared_memory("out_small", out_key, 8)
    try:
        x = httpclient.InferInput("INPUT0", [4], "FP32")
        x.set_shared_memory("in_small", 16)
        out = httpclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory("out_small", 8)
        with pytest.raises(Exception, match="should be at least 16 bytes to hold the results"):
            client.infer("where", [x], outputs=[out])
        result = client.infer("where", [x])  # the instance keeps serving
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full(4, 2, np.float32))
    finally:
        client.unregister_system_shared_memory()
        client.close()
