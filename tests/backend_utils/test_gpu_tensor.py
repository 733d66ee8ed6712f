"""pb_utils.Tensor over GPU memory, driven with DLPack capsules that claim CUDA memory (never
dereferenced), so the wrapping logic is tested without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from stubhost import _core
from stubhost.backend_utils import TritonModelException
from stubhost.backend_utils.tensor import Tensor
from stubhost.gpu import cuda
from stubhost.stub import codec
from stubhost.stub.gpu_io import force_cpu_only_inputs

FAKE_DEVICE_ADDRESS = 0x7F00_0000_0000


class DeviceOwner:
    """Stands in for a cupy/torch tensor that owns the device memory."""


def cuda_capsule(shape=(2, 3), dtype=_core.DataType.FP32, device_id=1):
    return _core.to_dlpack(DeviceOwner(), FAKE_DEVICE_ADDRESS, dtype, list(shape), device_type=2,
                           device_id=device_id)


def test_from_dlpack_of_cuda_memory_is_a_gpu_tensor():
    t = Tensor.from_dlpack("OUTPUT0", cuda_capsule())
    assert not t.is_cpu()
    assert t.name() == "OUTPUT0" and t.shape() == [2, 3]
    assert t.triton_dtype() == int(_core.DataType.FP32)
    assert t.__dlpack_device__() == (2, 1)


def test_a_gpu_tensor_refuses_numpy_with_tritons_words():
    t = Tensor.from_dlpack("X", cuda_capsule())
    with pytest.raises(TritonModelException, match="Tensor is stored in GPU and cannot be converted to NumPy."):
        t.as_numpy()


def test_to_dlpack_of_a_gpu_tensor_hands_on_the_same_device_memory():
    t = Tensor.from_dlpack("X", cuda_capsule(device_id=3))
    again = Tensor.from_dlpack("Y", t.to_dlpack())
    assert not again.is_cpu() and again.__dlpack_device__() == (2, 3)
    assert again._array.ptr == FAKE_DEVICE_ADDRESS and again.shape() == [2, 3]
    via_protocol = Tensor.from_dlpack("Z", t)  # an object with __dlpack__, like torch.from_dlpack(t)
    assert via_protocol._array.ptr == FAKE_DEVICE_ADDRESS


def test_cpu_tensors_are_unchanged():
    t = Tensor("X", np.arange(6, dtype=np.int32).reshape(2, 3))
    assert t.is_cpu() and t.__dlpack_device__() == (1, 0)
    assert Tensor.from_dlpack("Y", t).as_numpy().tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize("value, expected", [(None, True), ("yes", True), ("no", False), ("NO", False),
                                             (" Yes ", True)])
def test_force_cpu_only_input_tensors_reads_yes_or_no(value, expected):
    config = {"parameters": {}} if value is None else {
        "parameters": {"FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": value}}}
    assert force_cpu_only_inputs(config) is expected


def test_force_cpu_only_input_tensors_refuses_other_values():
    with pytest.raises(TritonModelException, match="must be 'yes' or 'no', got 'maybe'"):
        force_cpu_only_inputs({"parameters": {"FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": "maybe"}}})


def test_a_request_naming_an_unmapped_cuda_region_is_refused(pool):
    record = _core.write_record(pool, int(_core.RecordKind.REQUEST), 0, (0, 0, 0), ("id", "{}", "", ""),
                                [("INPUT0", (4,), int(_core.DataType.FP32), 7, 0, 16, 0)])
    try:
        with pytest.raises(_core.FormatError, match="input 'INPUT0' lies in memory this stub has not mapped"):
            codec.read_requests(pool, record, "m", 1)
    finally:
        pool.free(record)


class FailingCopies:
    """A CUDA runtime whose copies fail, as a copy from a bad device address does."""

    def copy(self, dst: int, src: int, nbytes: int, device_id: int) -> None:
        raise cuda.CudaError("cudaMemcpy failed: an illegal memory access was encountered (700)")


def test_a_gpu_output_that_cannot_be_copied_fails_only_its_response(pool, monkeypatch):
    monkeypatch.setattr(cuda, "runtime", FailingCopies)
    request = codec.read_requests(pool, _write_request(pool), "m", 1)[0]
    from stubhost.backend_utils.response import InferenceResponse

    response = InferenceResponse([Tensor.from_dlpack("OUTPUT0", cuda_capsule())])
    handle = codec.write_response(pool, request, response, 0)
    try:
        _, status, _, _, strings, tensors = _core.read_record(pool, handle)
        assert status == 1 + 1 and tensors == []  # INTERNAL, no outputs
        assert strings[0].startswith("failed to send the response of request 'id'")
        assert "illegal memory access" in strings[0]
    finally:
        pool.free(handle)


def _write_request(pool):
    return _core.write_record(pool, int(_core.RecordKind.REQUEST), 0, (0, 0, 0), ("id", "{}", "", ""), [])
