"""DLPack export (``_core.to_dlpack``) and import (``_core.from_dlpack``) of CPU memory, no copies."""

from __future__ import annotations

import ctypes
import gc
import sys
import weakref
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from stubhost import _core
from stubhost._core import DataType
from stubhost.tensor import SharedTensor

NUMERIC = {
    np.dtype(np.bool_): DataType.BOOL,
    np.dtype(np.uint8): DataType.UINT8, np.dtype(np.uint16): DataType.UINT16,
    np.dtype(np.uint32): DataType.UINT32, np.dtype(np.uint64): DataType.UINT64,
    np.dtype(np.int8): DataType.INT8, np.dtype(np.int16): DataType.INT16,
    np.dtype(np.int32): DataType.INT32, np.dtype(np.int64): DataType.INT64,
    np.dtype(np.float16): DataType.FP16, np.dtype(np.float32): DataType.FP32,
    np.dtype(np.float64): DataType.FP64,
}

_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def capsule_named(capsule: Any, name: bytes) -> bool:
    return bool(_is_valid(capsule, name))


def address(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0]


class Holder:
    """An owner object whose lifetime the tests watch (weakref-able, refcount-observable)."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr


class Exporter:
    """Something numpy.from_dlpack accepts, backed by a capsule from _core.to_dlpack."""

    def __init__(self, capsule: Any) -> None:
        self.capsule = capsule

    def __dlpack__(self, **_: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def arrays(dtype: np.dtype) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(dtype, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal shape and bit-identical elements (NaN payloads and -0.0 included)."""
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


# ---- import from numpy --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", list(NUMERIC), ids=str)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_numpy_array_imports_without_copy(dtype: np.dtype, data: st.DataObject) -> None:
    arr = data.draw(arrays(dtype), label="array")
    got_dtype, view = _core.from_dlpack(arr)
    assert got_dtype == NUMERIC[dtype]
    assert view.dtype == dtype and same_bits(view, arr)
    if arr.size:
        assert address(view) == address(arr)
        assert np.shares_memory(view, arr)


@pytest.mark.parametrize("dtype", list(NUMERIC), ids=str)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_exported_capsule_round_trips_without_copy(dtype: np.dtype, data: st.DataObject) -> None:
    arr = np.ascontiguousarray(data.draw(arrays(dtype), label="array"))
    capsule = _core.to_dlpack(arr, arr.ctypes.data, NUMERIC[dtype], list(arr.shape))
    assert capsule_named(capsule, b"dltensor")
    got_dtype, view = _core.from_dlpack(capsule)
    assert capsule_named(capsule, b"used_dltensor"), "a consumer must rename the capsule it took"
    assert got_dtype == NUMERIC[dtype]
    assert view.flags.c_contiguous and same_bits(view, arr)
    assert address(view) == arr.ctypes.data
    if arr.size:
        assert np.shares_memory(view, arr)


@pytest.mark.parametrize("dtype", list(NUMERIC), ids=str)
def test_numpy_consumes_an_exported_capsule_without_copy(dtype: np.dtype) -> None:
    arr = (np.arange(24) % 2 if dtype == np.bool_ else np.arange(24)).astype(dtype).reshape(2, 3, 4)
    out = np.from_dlpack(Exporter(_core.to_dlpack(arr, arr.ctypes.data, NUMERIC[dtype], [2, 3, 4])))
    assert out.dtype == dtype and out.shape == (2, 3, 4)
    assert same_bits(out, arr) and np.shares_memory(out, arr)


def test_imported_view_writes_through_to_the_source() -> None:
    arr = np.zeros((3, 4), np.float32)
    _, view = _core.from_dlpack(arr)
    view[1, 2] = 42.0
    assert arr[1, 2] == 42.0
    arr[0, 0] = -1.0
    assert view[0, 0] == -1.0


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a[:, ::2],
        lambda a: a[::2, 1:],
        lambda a: a.T,
        lambda a: a[::-1, ::3],
        lambda a: np.asfortranarray(a)[1:4, 2:],
        lambda a: a[:, 1:2],
    ],
    ids=["every-other-column", "row-step", "transpose", "negative-stride", "fortran", "column"],
)
def test_strided_numpy_input_imports_as_a_strided_view(make: Any) -> None:
    base = np.arange(48, dtype=np.int32).reshape(6, 8)
    src = make(base)
    owner = base if np.shares_memory(src, base) else src
    dtype, view = _core.from_dlpack(src)
    assert dtype == DataType.INT32
    np.testing.assert_array_equal(view, src)
    assert view.strides == src.strides
    assert address(view) == address(src)
    view[...] = -7  # writes land in the source's elements, and only there
    assert (src == -7).all()
    assert (owner == -7).sum() == src.size


def test_unsupported_numpy_dtypes_are_refused() -> None:
    with pytest.raises(ValueError, match="no Triton equivalent"):
        _core.from_dlpack(np.zeros(3, np.complex64))


def test_object_without_dlpack_is_refused() -> None:
    with pytest.raises(TypeError, match="__dlpack__"):
        _core.from_dlpack([1, 2, 3])


# ---- BF16 and BYTES -----------------------------------------------------------------------------
def test_bf16_comes_back_as_bf16_viewed_as_uint16_words() -> None:
    words = np.array([[0x3F80, 0x4000, 0xC040], [0x7F80, 0xFF80, 0x0000]], np.uint16)  # 1, 2, -3, inf, -inf, 0
    capsule = _core.to_dlpack(words, words.ctypes.data, DataType.BF16, [2, 3])
    dtype, view = _core.from_dlpack(capsule)
    assert dtype == DataType.BF16
    assert view.dtype == np.uint16 and view.shape == (2, 3)
    np.testing.assert_array_equal(view, words)
    assert address(view) == words.ctypes.data


def test_bf16_shared_tensor_exports_its_pool_words(pool: _core.Pool) -> None:
    t = SharedTensor.empty(pool, "BF", DataType.BF16, [4])
    try:
        raw = np.frombuffer(t.data_view(), np.uint16)
        raw[:] = [0x3F80, 0x4000, 0x4040, 0x4080]
        dtype, view = _core.from_dlpack(t)
        assert dtype == DataType.BF16
        np.testing.assert_array_equal(view, raw)
        assert np.shares_memory(view, raw)
        del view
    finally:
        t.free()


@pytest.mark.parametrize("dtype", [DataType.BYTES, DataType.INVALID])
def test_bytes_and_invalid_cannot_be_exported(dtype: DataType) -> None:
    holder = Holder(np.zeros(4, np.uint8))
    before = sys.getrefcount(holder)
    with pytest.raises(ValueError, match=f"DLPack cannot carry {dtype.name}"):
        _core.to_dlpack(holder, holder.arr.ctypes.data, dtype, [4])
    assert sys.getrefcount(holder) == before, "a refused export must not keep the owner"


def test_bytes_shared_tensor_refuses_dlpack(pool: _core.Pool) -> None:
    t = SharedTensor.from_numpy(pool, "B", np.array([b"a", b"bc"], dtype=object))
    try:
        with pytest.raises(ValueError, match="BYTES"):
            t.__dlpack__()
        with pytest.raises(ValueError, match="BYTES"):
            np.from_dlpack(t)
    finally:
        t.free()


def test_negative_dimension_is_refused() -> None:
    arr = np.zeros(4, np.int32)
    with pytest.raises(_core.FormatError, match="negative"):
        _core.to_dlpack(arr, arr.ctypes.data, DataType.INT32, [2, -2])


# ---- capsule life cycle -------------------------------------------------------------------------
def test_consumed_capsule_cannot_be_consumed_twice() -> None:
    arr = np.arange(6, dtype=np.int64)
    capsule = _core.to_dlpack(arr, arr.ctypes.data, DataType.INT64, [6])
    _, first = _core.from_dlpack(capsule)
    with pytest.raises(ValueError, match="already consumed"):
        _core.from_dlpack(capsule)
    np.testing.assert_array_equal(first, arr)  # the first import is unaffected
    numpy_capsule = arr.__dlpack__()
    _core.from_dlpack(numpy_capsule)
    with pytest.raises(ValueError, match="already consumed"):
        _core.from_dlpack(numpy_capsule)


def test_exported_capsule_keeps_its_owner_alive_until_dropped() -> None:
    holder = Holder(np.arange(8, dtype=np.float64))
    ref = weakref.ref(holder)
    baseline = sys.getrefcount(holder)
    capsule = _core.to_dlpack(holder, holder.arr.ctypes.data, DataType.FP64, [8])
    assert sys.getrefcount(holder) == baseline + 1
    del holder
    gc.collect()
    assert ref() is not None, "an unconsumed capsule must keep the memory's owner alive"
    del capsule
    gc.collect()
    assert ref() is None, "dropping an unconsumed capsule must release the owner"


def test_consumer_view_keeps_the_owner_alive_and_releases_it_exactly_once() -> None:
    holder = Holder(np.arange(8, dtype=np.float32))
    ref = weakref.ref(holder)
    baseline = sys.getrefcount(holder)
    capsule = _core.to_dlpack(holder, holder.arr.ctypes.data, DataType.FP32, [8])
    _, view = _core.from_dlpack(capsule)
    del capsule  # the consumer owns the tensor now
    gc.collect()
    assert sys.getrefcount(holder) == baseline + 1
    other = view[2:5]  # a derived view also keeps it
    del view
    gc.collect()
    assert sys.getrefcount(holder) == baseline + 1
    np.testing.assert_array_equal(other, [2, 3, 4])
    del other
    gc.collect()
    assert sys.getrefcount(holder) == baseline, "the owner must be released exactly once"
    del holder
    gc.collect()
    assert ref() is None


def test_numpy_consumer_keeps_the_owner_alive() -> None:
    holder = Holder(np.arange(5, dtype=np.int16))
    ref = weakref.ref(holder)
    out = np.from_dlpack(Exporter(_core.to_dlpack(holder, holder.arr.ctypes.data, DataType.INT16, [5])))
    del holder
    gc.collect()
    assert ref() is not None
    np.testing.assert_array_equal(out, np.arange(5))
    del out
    gc.collect()
    assert ref() is None


def test_refused_import_of_a_device_capsule_still_releases_the_owner() -> None:
    holder = Holder(np.zeros(4, np.float32))
    ref = weakref.ref(holder)
    capsule = _core.to_dlpack(holder, holder.arr.ctypes.data, DataType.FP32, [4], device_type=4, device_id=0)
    with pytest.raises(ValueError, match="device type 4"):
        _core.from_dlpack(capsule)
    del holder, capsule
    gc.collect()
    assert ref() is None


# ---- SharedTensor -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", list(NUMERIC), ids=str)
def test_numpy_from_dlpack_of_shared_tensor_is_a_view_of_the_pool(pool: _core.Pool, dtype: np.dtype) -> None:
    src = (np.arange(12) % 2 if dtype == np.bool_ else np.arange(12)).astype(dtype).reshape(3, 4)
    t = SharedTensor.from_numpy(pool, "T", src)
    try:
        out = np.from_dlpack(t)
        assert out.dtype == dtype and out.shape == (3, 4)
        np.testing.assert_array_equal(out, src)
        pool_view = t.as_numpy()
        assert np.shares_memory(out, pool_view)
        assert address(out) == t.data_view().address
        pool_view[0, 0] = src[0, 1]  # the export sees later writes to the pool
        assert out[0, 0] == src[0, 1]
        del out, pool_view
    finally:
        t.free()


def test_shared_tensor_dlpack_outlives_the_tensor_object_and_pool_close() -> None:
    pool = _core.Pool.create(initial_size=1 << 20, growth_size=1 << 20, max_size=8 << 20)
    try:
        t = SharedTensor.from_numpy(pool, "T", np.arange(16, dtype=np.int32))
        out = np.from_dlpack(t)  # numpy marks legacy-capsule imports read-only
        _, writable = _core.from_dlpack(t)
        del t
        gc.collect()
    finally:
        pool.close()  # unlinks the names; the mapping stays while the exports hold it
    np.testing.assert_array_equal(out, np.arange(16))
    writable += 1  # both still see the same pool memory
    np.testing.assert_array_equal(out, np.arange(1, 17))


def test_shared_tensor_refuses_a_copying_export(pool: _core.Pool) -> None:
    t = SharedTensor.from_numpy(pool, "T", np.arange(3, dtype=np.int8))
    try:
        with pytest.raises(BufferError):
            t.__dlpack__(copy=True)
        assert t.__dlpack_device__() == (1, 0)
    finally:
        t.free()
