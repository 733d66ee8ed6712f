"""DeviceAllocation: device memory the stub makes is freed exactly once, by the last user."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from stubhost import _core
from stubhost.gpu import cuda
from stubhost.gpu.device_memory import DeviceAllocation, upload


class CountingRuntime:
    """Stands in for CUDA: fake addresses, every malloc/free/copy recorded."""

    def __init__(self, fail_copy: bool = False) -> None:
        self.mallocs: list[tuple[int, int]] = []
        self.frees: list[tuple[int, int]] = []
        self.copies: list[tuple[int, int, int]] = []
        self.fail_copy = fail_copy

    def malloc(self, nbytes: int, device_id: int) -> int:
        self.mallocs.append((nbytes, device_id))
        return 0x5000_0000 + 0x1000 * len(self.mallocs)

    def free(self, ptr: int, device_id: int) -> None:
        self.frees.append((ptr, device_id))

    def copy(self, dst: int, src: int, nbytes: int, device_id: int) -> None:
        if self.fail_copy:
            raise cuda.CudaError("cudaMemcpy failed: invalid argument (1)")
        self.copies.append((dst, src, nbytes))


def test_an_allocation_is_freed_once_when_its_last_view_dies():
    rt = CountingRuntime()
    owner = DeviceAllocation(4096, 1, rt)
    ptr = owner.ptr
    view = _core.gpu_view(owner, ptr, _core.DataType.FP32, [1024], 1)
    del owner
    gc.collect()
    assert rt.frees == []  # the view keeps it
    del view
    gc.collect()
    assert rt.frees == [(ptr, 1)]


def test_an_explicit_free_and_the_objects_death_free_once():
    rt = CountingRuntime()
    owner = DeviceAllocation(16, 0, rt)
    owner.free()
    owner.free()
    assert not owner.alive
    del owner
    gc.collect()
    assert len(rt.frees) == 1


def test_racing_frees_free_once():
    rt = CountingRuntime()
    owner = DeviceAllocation(16, 0, rt)
    barrier = threading.Barrier(8)

    def free() -> None:
        barrier.wait()
        owner.free()

    threads = [threading.Thread(target=free) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(rt.frees) == 1


def test_a_zero_byte_tensor_still_gets_an_address():
    rt = CountingRuntime()
    DeviceAllocation(0, 0, rt)
    assert rt.mallocs == [(1, 0)]


def test_upload_copies_once_and_a_failed_copy_frees_what_it_allocated():
    rt = CountingRuntime()
    data = np.arange(8, dtype=np.int64)
    owner, ptr = upload(data, 2, rt)
    assert rt.copies == [(ptr, rt.copies[0][1], 64)] and owner.nbytes == 64
    failing = CountingRuntime(fail_copy=True)
    with pytest.raises(cuda.CudaError):
        upload(data, 0, failing)
    assert len(failing.frees) == 1


@pytest.mark.gpu
def test_a_real_upload_round_trips():
    data = np.arange(1000, dtype=np.float32)
    owner, ptr = upload(data, 0)
    back = np.empty_like(data)
    cuda.runtime().copy(back.ctypes.data, ptr, data.nbytes, 0)
    np.testing.assert_array_equal(back, data)
    owner.free()
