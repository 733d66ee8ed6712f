"""CUDA shared-memory regions through tritonclient: registered from a client's device buffer,
read as inputs and written as outputs. Runs where a CUDA GPU exists (marked ``gpu``)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient

from stubhost.gpu import cuda
from tests.host.repo_factory import EXAMPLES
from tests.server.serve_process import ServeProcess


@pytest.mark.gpu
def test_identity_through_cuda_shared_memory_regions():
    cudashm = pytest.importorskip("tritonclient.utils.cuda_shared_memory",
                                  reason="tritonclient's CUDA shared memory needs cuda-python")
    values = np.arange(1024, dtype=np.float32)
    with ServeProcess(EXAMPLES) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        region_in = cudashm.create_shared_memory_region("cuda_in", values.nbytes, 0)
        region_out = cudashm.create_shared_memory_region("cuda_out", values.nbytes, 0)
        try:
            cudashm.set_shared_memory_region(region_in, [values])
            client.register_cuda_shared_memory("cuda_in", cudashm.get_raw_handle(region_in), 0, values.nbytes)
            client.register_cuda_shared_memory("cuda_out", cudashm.get_raw_handle(region_out), 0, values.nbytes)
            assert {r["name"] for r in client.get_cuda_shared_memory_status()} == {"cuda_in", "cuda_out"}
            x = httpclient.InferInput("INPUT0", [values.size], "FP32")
            x.set_shared_memory("cuda_in", values.nbytes)
            out = httpclient.InferRequestedOutput("OUTPUT0")
            out.set_shared_memory("cuda_out", values.nbytes)
            client.infer("identity", [x], outputs=[out])
            got = cudashm.get_contents_as_numpy(region_out, np.float32, [values.size])
            np.testing.assert_array_equal(got, values)
            with pytest.raises(Exception, match="lies outside|Invalid offset"):
                y = httpclient.InferInput("INPUT0", [values.size], "FP32")
                y.set_shared_memory("cuda_in", values.nbytes, offset=8)
                client.infer("identity", [y])
        finally:
            client.unregister_cuda_shared_memory()
            cudashm.destroy_shared_memory_region(region_in)
            cudashm.destroy_shared_memory_region(region_out)
            client.close()


def test_without_a_gpu_the_reason_is_known_and_no_opener_is_offered():
    reason = cuda.unavailable_reason()
    if reason is None:
        assert cuda.cuda_opener() is cuda.IpcMemory
    else:
        assert isinstance(reason, str) and reason
        assert cuda.cuda_opener() is None


def test_ipc_memory_refuses_a_malformed_handle_before_touching_cuda():
    with pytest.raises(ValueError, match="64 bytes"):
        cuda.IpcMemory(b"short", 0, 16)
