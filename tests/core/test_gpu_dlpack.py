"""DLPack import of CUDA tensors (``_core.from_dlpack`` -> ``GpuView``) and ``_core.gpu_view``.

No GPU is needed: a GpuView only describes device memory, so the capsules here carry fake device
addresses that nothing ever dereferences. What is checked is the description, the re-export, and
that whoever owns the memory is released exactly once.
"""

from __future__ import annotations

import ctypes
import gc
import math
import sys
import weakref
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stubhost import _core
from stubhost._core import DataType

KDLCPU, KDLCUDA, KDLCUDA_MANAGED = 1, 2, 13
ITEMSIZE = {
    DataType.BOOL: 1, DataType.UINT8: 1, DataType.UINT16: 2, DataType.UINT32: 4, DataType.UINT64: 8,
    DataType.INT8: 1, DataType.INT16: 2, DataType.INT32: 4, DataType.INT64: 8,
    DataType.FP16: 2, DataType.FP32: 4, DataType.FP64: 8, DataType.BF16: 2,
}
NOT_CONTIGUOUS = ("DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in C-Order "
                  "are supported.")
FAKE = 0x7F00_0000_1000  # a device address: never dereferenced


class Owner:
    """Owns the (pretend) device memory; weakref-able so the tests can watch its lifetime."""


# ---- a DLPack producer written with ctypes, for capsules to_dlpack cannot make (strides) -------
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]
assert ctypes.sizeof(DLManagedTensor) == 64

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
CAPSULE_NAME = b"dltensor"  # PyCapsule keeps the pointer, so the bytes must outlive every capsule


class ForeignTensor:
    """A float32 CUDA tensor with explicit strides, whose deleter counts its calls. Keep the object
    alive until the deleter has run: it owns the structures the capsule points at."""

    def __init__(self, shape: list[int], strides: list[int] | None, byte_offset: int = 0,
                 device_type: int = KDLCUDA, device_id: int = 0) -> None:
        self.deleted = 0
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.strides = (ctypes.c_int64 * len(strides))(*strides) if strides is not None else None
        self.deleter = DELETER(self._delete)
        t = self.managed = DLManagedTensor()
        t.dl_tensor.data = FAKE
        t.dl_tensor.device = DLDevice(device_type, device_id)
        t.dl_tensor.ndim = len(shape)
        t.dl_tensor.dtype = DLDataType(2, 32, 1)  # kDLFloat, 32 bits
        t.dl_tensor.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        if self.strides is not None:
            t.dl_tensor.strides = ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64))
        t.dl_tensor.byte_offset = byte_offset
        t.deleter = self.deleter

    def _delete(self, _: Any) -> None:
        self.deleted += 1

    def capsule(self) -> Any:
        return _capsule_new(ctypes.addressof(self.managed), CAPSULE_NAME, None)


def cuda_capsule(owner: Any, dtype: DataType = DataType.FP32, shape: tuple[int, ...] = (2, 3),
                 device_id: int = 1, address: int = FAKE) -> Any:
    return _core.to_dlpack(owner, address, dtype, list(shape), device_type=KDLCUDA, device_id=device_id)


def assert_view(view: Any, ptr: int, dtype: DataType, shape: tuple[int, ...], device_id: int) -> None:
    assert isinstance(view, _core.GpuView)
    assert (view.ptr, view.dtype, view.shape, view.device_id) == (ptr, dtype, shape, device_id)
    assert view.byte_size == math.prod(shape) * ITEMSIZE[dtype]
    assert view.__dlpack_device__() == (KDLCUDA, device_id)


# ---- import -------------------------------------------------------------------------------------
@settings(max_examples=80, deadline=None)
@given(dtype=st.sampled_from(list(ITEMSIZE)), shape=st.lists(st.integers(0, 50), max_size=4).map(tuple),
       device_id=st.integers(0, 4095), address=st.integers(1, (1 << 56) - 1))
def test_cuda_capsule_imports_as_a_gpu_view(dtype: DataType, shape: tuple[int, ...], device_id: int,
                                            address: int) -> None:
    got_dtype, view = _core.from_dlpack(cuda_capsule(Owner(), dtype, shape, device_id, address))
    assert got_dtype == dtype and isinstance(got_dtype, DataType)
    assert_view(view, address, dtype, shape, device_id)


def test_object_with_dlpack_is_imported_like_its_capsule() -> None:
    class Producer:
        def __dlpack__(self, **_: Any) -> Any:
            return cuda_capsule(self, DataType.INT64, (4,), 2)

    dtype, view = _core.from_dlpack(Producer())
    assert dtype == DataType.INT64
    assert_view(view, FAKE, DataType.INT64, (4,), 2)


def test_byte_offset_is_part_of_the_pointer() -> None:
    foreign = ForeignTensor([2, 2], None, byte_offset=48)
    _, view = _core.from_dlpack(foreign.capsule())
    assert_view(view, FAKE + 48, DataType.FP32, (2, 2), 0)
    del view
    gc.collect()
    assert foreign.deleted == 1


def test_cpu_import_is_unchanged() -> None:
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    dtype, view = _core.from_dlpack(_core.to_dlpack(arr, arr.ctypes.data, DataType.FP32, [2, 3]))
    assert dtype == DataType.FP32 and isinstance(view, np.ndarray)
    np.testing.assert_array_equal(view, arr)


@pytest.mark.parametrize("device_type", [4, KDLCUDA_MANAGED, 14])
def test_other_devices_are_still_refused_and_release_the_owner(device_type: int) -> None:
    owner = Owner()
    ref = weakref.ref(owner)
    capsule = _core.to_dlpack(owner, FAKE, DataType.FP32, [4], device_type=device_type, device_id=0)
    with pytest.raises(ValueError, match=f"device type {device_type}"):
        _core.from_dlpack(capsule)
    del owner, capsule
    gc.collect()
    assert ref() is None


# ---- contiguity ---------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, strides", [
    ([2, 3], [1, 2]),         # column-major
    ([2, 3], [6, 2]),         # every other element
    ([4], [2]),
    ([3, 1, 2], [2, 2, 2]),   # the size-1 dim may stride anyhow, the others may not
    ([2, 3], [-3, 1]),
    ([2, 3], [3, 0]),         # a broadcast dim
])
def test_non_contiguous_cuda_tensor_is_refused_with_tritons_words(shape: list[int], strides: list[int]) -> None:
    foreign = ForeignTensor(shape, strides)
    with pytest.raises(ValueError) as info:
        _core.from_dlpack(foreign.capsule())
    assert str(info.value) == NOT_CONTIGUOUS
    gc.collect()
    assert foreign.deleted == 1, "a refused tensor is still deleted, once"


@pytest.mark.parametrize("shape, strides", [
    ([2, 3], [3, 1]),
    ([2, 1, 3], [3, 999, 1]),   # dims of size 1 may have any stride
    ([1, 4], [-7, 1]),
    ([], []),
    ([2, 0, 3], [5, 7, 11]),    # no elements: nothing is ever stepped over
])
def test_compact_strides_are_accepted(shape: list[int], strides: list[int]) -> None:
    foreign = ForeignTensor(shape, strides, device_id=3)
    _, view = _core.from_dlpack(foreign.capsule())
    assert_view(view, FAKE, DataType.FP32, tuple(shape), 3)
    assert foreign.deleted == 0, "the view owns the tensor while it lives"
    del view
    gc.collect()
    assert foreign.deleted == 1


# ---- lifetime -----------------------------------------------------------------------------------
def test_view_releases_the_owner_exactly_once() -> None:
    owner = Owner()
    ref = weakref.ref(owner)
    baseline = sys.getrefcount(owner)
    capsule = cuda_capsule(owner)
    _, view = _core.from_dlpack(capsule)
    del capsule  # consumed: the view owns the tensor now
    gc.collect()
    assert sys.getrefcount(owner) == baseline + 1
    del view
    gc.collect()
    assert sys.getrefcount(owner) == baseline, "the owner must be released exactly once"
    del owner
    gc.collect()
    assert ref() is None


def test_foreign_deleter_runs_once_when_the_view_goes() -> None:
    foreign = ForeignTensor([4, 4], [4, 1])
    capsule = foreign.capsule()
    _, view = _core.from_dlpack(capsule)
    with pytest.raises(ValueError, match="already consumed"):
        _core.from_dlpack(capsule)
    del capsule
    gc.collect()
    assert foreign.deleted == 0
    del view
    gc.collect()
    assert foreign.deleted == 1


def test_reexported_capsule_round_trips_and_keeps_the_chain_alive() -> None:
    owner = Owner()
    ref = weakref.ref(owner)
    _, first = _core.from_dlpack(cuda_capsule(owner, DataType.BF16, (3, 5), 7))
    capsule = first.__dlpack__()
    dtype, second = _core.from_dlpack(capsule)
    assert dtype == DataType.BF16
    assert_view(second, FAKE, DataType.BF16, (3, 5), 7)
    _, third = _core.from_dlpack(second)  # through __dlpack__ of the object itself
    assert_view(third, FAKE, DataType.BF16, (3, 5), 7)
    first_ref = weakref.ref(first) if hasattr(first, "__weakref__") else None
    del owner, first, capsule, second
    gc.collect()
    assert ref() is not None, "the last view keeps every view before it, and the owner, alive"
    if first_ref is not None:
        assert first_ref() is not None
    del third
    gc.collect()
    assert ref() is None


def test_unconsumed_reexport_keeps_the_view_alive_until_dropped() -> None:
    owner = Owner()
    ref = weakref.ref(owner)
    _, view = _core.from_dlpack(cuda_capsule(owner))
    capsule = view.__dlpack__(stream=None)
    del owner, view
    gc.collect()
    assert ref() is not None
    del capsule
    gc.collect()
    assert ref() is None


def test_dlpack_keywords() -> None:
    _, view = _core.from_dlpack(cuda_capsule(Owner(), device_id=2))
    for kwargs in ({"stream": 1}, {"stream": None, "max_version": (1, 0)}, {"dl_device": (KDLCUDA, 2)},
                   {"copy": False}, {"dl_device": None, "copy": None}):
        assert_view(_core.from_dlpack(view.__dlpack__(**kwargs))[1], FAKE, DataType.FP32, (2, 3), 2)
    with pytest.raises(BufferError):
        view.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        view.__dlpack__(dl_device=(KDLCUDA, 0))
    with pytest.raises(BufferError):
        view.__dlpack__(dl_device=(KDLCPU, 0))


def test_gpu_view_properties_are_read_only() -> None:
    _, view = _core.from_dlpack(cuda_capsule(Owner()))
    for name in ("ptr", "shape", "dtype", "device_id", "byte_size"):
        with pytest.raises(AttributeError):
            setattr(view, name, 0)
    assert "GpuView" in repr(view)


# ---- gpu_view -----------------------------------------------------------------------------------
def test_gpu_view_describes_memory_and_keeps_its_owner_alive() -> None:
    owner = Owner()
    ref = weakref.ref(owner)
    view = _core.gpu_view(owner, FAKE + 256, DataType.INT16, [4, 4], 5)
    assert_view(view, FAKE + 256, DataType.INT16, (4, 4), 5)
    del owner
    gc.collect()
    assert ref() is not None, "the view keeps its owner alive"
    _, imported = _core.from_dlpack(view)
    del view
    gc.collect()
    assert ref() is not None, "an import of the view keeps the view, and so the owner"
    assert_view(imported, FAKE + 256, DataType.INT16, (4, 4), 5)
    del imported
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("dtype, shape, device_id, error", [
    (DataType.BYTES, [2], 0, ValueError),
    (DataType.INVALID, [2], 0, ValueError),
    (DataType.FP32, [2], -1, ValueError),
    (DataType.FP32, [2], 4096, ValueError),
    (DataType.FP32, [-2], 0, _core.FormatError),
    (DataType.FP64, [1 << 62, 4], 0, _core.FormatError),
])
def test_gpu_view_refuses_impossible_descriptions(dtype: DataType, shape: list[int], device_id: int,
                                                  error: type) -> None:
    owner = Owner()
    ref = weakref.ref(owner)
    with pytest.raises(error):
        _core.gpu_view(owner, FAKE, dtype, shape, device_id)
    del owner
    gc.collect()
    assert ref() is None, "a refused view must not keep its owner"
