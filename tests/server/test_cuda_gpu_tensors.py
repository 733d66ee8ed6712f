"""GPU tensors end to end: inputs in a client's CUDA region reach the model as GPU tensors with no
host round trip, outputs go back into a CUDA region device to device, nothing leaks, and a stub
killed while it holds opened handles leaves no device memory behind.

Needs a CUDA GPU (marked ``gpu``); the client side uses stubhost.gpu.cuda to allocate and export
its device buffers, so no cuda-python is needed."""

from __future__ import annotations

import base64
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from stubhost.gpu import cuda
from tests.host.repo_factory import config_pbtxt, io, write_model
from tests.server.serve_process import ServeProcess

pytestmark = pytest.mark.gpu

N = 1024

GPU_IDENTITY = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            y = pb_utils.Tensor.from_dlpack("OUTPUT0", x.to_dlpack())  # the same device memory
            responses.append(pb_utils.InferenceResponse([
                y,
                pb_utils.Tensor("ON_GPU", np.array([not x.is_cpu()], dtype=np.bool_)),
                pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
            ]))
        return responses
"""


def _config(name: str, force_cpu: str) -> str:
    return config_pbtxt(name, [io("INPUT0", "TYPE_FP32", [N])],
                        [io("OUTPUT0", "TYPE_FP32", [N]), io("ON_GPU", "TYPE_BOOL", [1]), io("PID", "TYPE_INT64", [1])],
                        extra=f'parameters {{ key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: {{ string_value: "{force_cpu}" }} }}')


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    write_model(tmp_path, "gpu_identity", GPU_IDENTITY, _config("gpu_identity", "no"))
    write_model(tmp_path, "cpu_identity", GPU_IDENTITY, _config("cpu_identity", "yes"))
    return tmp_path


class DeviceBuffer:
    """A client's device allocation, exported as a CUDA IPC handle."""

    def __init__(self, nbytes: int) -> None:
        self.rt = cuda.runtime()
        self.nbytes = nbytes
        self.ptr = self.rt.malloc(nbytes, 0)
        self.raw = self.rt.ipc_handle(self.ptr, 0)

    def fill(self, array: np.ndarray) -> None:
        self.rt.copy(self.ptr, array.ctypes.data, array.nbytes, 0)

    def read(self) -> np.ndarray:
        host = np.empty(self.nbytes, dtype=np.uint8)
        self.rt.copy(host.ctypes.data, self.ptr, self.nbytes, 0)
        return host

    def free(self) -> None:
        self.rt.free(self.ptr, 0)


@pytest.fixture
def server(repo: Path) -> Iterator[ServeProcess]:
    with ServeProcess(repo) as s:
        yield s


def _register(client: grpcclient.InferenceServerClient, name: str, buf: DeviceBuffer) -> None:
    client.register_cuda_shared_memory(name, base64.b64encode(buf.raw), 0, buf.nbytes)


def _infer(client, model: str, out_in_region: bool = True):
    x = grpcclient.InferInput("INPUT0", [N], "FP32")
    x.set_shared_memory("cuda_in", N * 4)
    outputs = [grpcclient.InferRequestedOutput("ON_GPU"), grpcclient.InferRequestedOutput("PID")]
    y = grpcclient.InferRequestedOutput("OUTPUT0")
    if out_in_region:
        y.set_shared_memory("cuda_out", N * 4)
    return client.infer(model, [x], outputs=[y, *outputs])


class Regions:
    """A client with two registered CUDA regions of N floats: "cuda_in" holding `values`, "cuda_out"."""

    def __init__(self, url: str, values: np.ndarray) -> None:
        self.values = values
        self.src, self.dst = DeviceBuffer(values.nbytes), DeviceBuffer(values.nbytes)
        self.client = grpcclient.InferenceServerClient(url)
        self.src.fill(values)
        _register(self.client, "cuda_in", self.src)
        _register(self.client, "cuda_out", self.dst)

    def output(self) -> np.ndarray:
        return self.dst.read().view(self.values.dtype)

    def close(self) -> None:
        try:
            self.client.unregister_cuda_shared_memory()
            self.client.close()
        finally:
            self.src.free()
            self.dst.free()


@pytest.fixture
def regions(server: ServeProcess) -> Iterator[Regions]:
    r = Regions(server.grpc_url, np.arange(N, dtype=np.float32))
    try:
        yield r
    finally:
        r.close()


def test_a_cuda_region_input_reaches_the_model_on_the_gpu_and_returns_device_to_device(regions):
    result = _infer(regions.client, "gpu_identity")
    assert bool(result.as_numpy("ON_GPU")[0]) is True
    assert result.as_numpy("OUTPUT0") is None  # it went into the region
    np.testing.assert_array_equal(regions.output(), regions.values)
    # The same GPU input returned through the pool: copied to the host once, by the stub.
    np.testing.assert_array_equal(_infer(regions.client, "gpu_identity", out_in_region=False).as_numpy("OUTPUT0"),
                                  regions.values)


def test_by_default_a_cuda_region_input_reaches_the_model_on_the_cpu(regions):
    result = _infer(regions.client, "cpu_identity")
    assert bool(result.as_numpy("ON_GPU")[0]) is False
    np.testing.assert_array_equal(regions.output(), regions.values)


def test_a_thousand_requests_leave_device_memory_flat(regions):
    rt = cuda.runtime()
    for _ in range(50):  # warm: stubs open the regions, allocators settle
        _infer(regions.client, "gpu_identity")
    before = rt.mem_get_info(0)[0]
    for _ in range(1000):
        _infer(regions.client, "gpu_identity")
    after = rt.mem_get_info(0)[0]
    assert before - after < (4 << 20), f"device memory fell by {before - after} bytes over 1000 requests"


def test_a_stub_killed_while_holding_opened_handles_leaves_nothing_behind(repo):
    rt = cuda.runtime()
    baseline = rt.mem_get_info(0)[0]
    with ServeProcess(repo) as server:
        regions = Regions(server.grpc_url, np.arange(N, dtype=np.float32))
        try:
            pid = int(_infer(regions.client, "gpu_identity").as_numpy("PID")[0])
            os.kill(pid, signal.SIGKILL)  # it holds both regions open
            deadline = time.monotonic() + 30
            while True:
                try:
                    if int(_infer(regions.client, "gpu_identity").as_numpy("PID")[0]) != pid:
                        break
                except Exception:
                    pass
                assert time.monotonic() < deadline, "the killed stub was not replaced"
                time.sleep(0.2)
            np.testing.assert_array_equal(regions.output(), regions.values)
        finally:
            regions.close()
    # Server and client buffers gone: every opening of the client's buffers was closed.
    leftover = baseline - rt.mem_get_info(0)[0]
    assert leftover < (8 << 20), f"{leftover} bytes of device memory were not given back"
