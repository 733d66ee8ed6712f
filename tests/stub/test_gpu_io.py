"""The stub's GPU side without a GPU: CUDA regions are opened through a recording runtime, so
mapping, bounds, lifetimes and the tensors models get are checked everywhere."""

from __future__ import annotations

import base64
import gc

import pytest

from stubhost import _core
from stubhost.gpu.ipc_cache import IpcHandleCache
from stubhost.stub import gpu_io
from stubhost.stub.gpu_io import StubGpu
from tests.gpu.test_ipc_cache import RecordingRuntime

HANDLE = bytes(range(64))
FP32 = int(_core.DataType.FP32)


@pytest.fixture
def runtime(monkeypatch) -> RecordingRuntime:
    rt = RecordingRuntime()
    cache = IpcHandleCache(rt)
    monkeypatch.setattr(gpu_io, "shared_cache", lambda: cache)
    return rt


def _payload(region_id: int = 7, size: int = 4096) -> dict:
    return {"id": region_id, "kind": "cuda", "raw_handle": base64.b64encode(HANDLE).decode(), "device_id": 0,
            "byte_size": size}


def _description(region_id: int = 7, offset: int = 64, nbytes: int = 64, shape=(16,)) -> tuple:
    return ("cuda_region", region_id, offset, nbytes, shape, 0)


def test_an_input_in_a_cuda_region_is_a_gpu_view_at_its_offset(runtime):
    gpu = StubGpu(force_cpu_inputs=False)
    gpu.map_region(_payload())
    name, dtype, view = gpu.input_tensor("INPUT0", FP32, _description())
    base = gpu.regions[7].ptr
    assert isinstance(view, _core.GpuView)
    assert (name, dtype, view.ptr, view.shape, view.byte_size) == ("INPUT0", FP32, base + 64, (16,), 64)


def test_two_regions_on_one_allocation_open_it_once(runtime):
    gpu = StubGpu(force_cpu_inputs=False)
    gpu.map_region(_payload(1))
    gpu.map_region(_payload(2))
    assert len(runtime.opened) == 1 and gpu.regions[1].ptr == gpu.regions[2].ptr


def test_an_input_past_the_end_of_its_region_is_refused(runtime):
    gpu = StubGpu(force_cpu_inputs=False)
    gpu.map_region(_payload(size=100))
    with pytest.raises(_core.FormatError, match="tensor 'INPUT0' runs past the end of its CUDA shared memory region"):
        gpu.input_tensor("INPUT0", FP32, _description(offset=64, nbytes=64))


def test_an_input_in_an_unmapped_region_is_refused(runtime):
    gpu = StubGpu()
    with pytest.raises(_core.FormatError, match="names CUDA region 9, which is not mapped"):
        gpu.input_tensor("INPUT0", FP32, _description(region_id=9))


def test_an_unmapped_region_stays_open_while_a_model_holds_a_view_of_it(runtime):
    gpu = StubGpu(force_cpu_inputs=False)
    gpu.map_region(_payload())
    _, _, view = gpu.input_tensor("INPUT0", FP32, _description())
    gpu.unmap_region(7)
    gc.collect()
    assert runtime.closed == []
    del view
    gc.collect()
    assert len(runtime.closed) == 1


def test_an_output_too_large_for_its_cuda_region_is_refused_before_any_copy(runtime):
    gpu = StubGpu()
    target = gpu.map_region(_payload(size=128))
    with pytest.raises(_core.FormatError, match="tensor 'OUTPUT0' runs past the end"):
        target.write(96, b"\0" * 64, 64, "OUTPUT0")
    assert len(target) == 128


def test_a_forged_gpu_buffer_input_is_refused(runtime):
    gpu = StubGpu()
    forged = ("cuda_ipc", HANDLE, 0, 64, (16,), 0, 5)
    with pytest.raises(_core.FormatError, match="inputs come from CUDA regions only"):
        gpu.input_tensor("INPUT0", FP32, forged)
