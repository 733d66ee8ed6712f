"""stubhost.tensor.SharedTensor: numpy in and out of the pool, zero-copy views, and a second process
that reads a tensor by handle and answers with its own."""

from __future__ import annotations

import math
import multiprocessing
import struct
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from stubhost import _core
from stubhost._core import DataType, MemoryType, MessageQueue
from stubhost.tensor import SharedTensor, numpy_to_triton_dtype, triton_to_numpy_dtype
from tests.core.procs import join_peer
from tests.core import workers_tensor

NUMERIC = {
    DataType.BOOL: np.dtype(np.bool_),
    DataType.UINT8: np.dtype(np.uint8), DataType.UINT16: np.dtype(np.uint16),
    DataType.UINT32: np.dtype(np.uint32), DataType.UINT64: np.dtype(np.uint64),
    DataType.INT8: np.dtype(np.int8), DataType.INT16: np.dtype(np.int16),
    DataType.INT32: np.dtype(np.int32), DataType.INT64: np.dtype(np.int64),
    DataType.FP16: np.dtype(np.float16), DataType.FP32: np.dtype(np.float32),
    DataType.FP64: np.dtype(np.float64),
}
def fixture_settings(max_examples: int) -> settings:
    """Hypothesis settings for tests that reuse the function-scoped pool across examples."""
    return settings(max_examples=max_examples, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def bytes_reference(values: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def usage(pool: _core.Pool) -> tuple[int, int]:
    return pool.used_bytes, pool.allocations


def object_array(values: list[Any], shape: tuple[int, ...]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr.reshape(shape)


# ---- numeric dtypes -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", list(NUMERIC), ids=lambda d: d.name)
@fixture_settings(20)
@given(data=st.data())
def test_from_numpy_round_trips_every_numeric_dtype(pool: _core.Pool, dtype: DataType,
                                                    data: st.DataObject) -> None:
    arr = data.draw(hnp.arrays(NUMERIC[dtype], hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)),
                    label="array")
    name = data.draw(st.text(max_size=16), label="name")
    baseline = usage(pool)
    t = SharedTensor.from_numpy(pool, name, arr)
    try:
        assert (t.name, t.dtype, t.shape, t.memory_type) == (name, dtype, arr.shape, MemoryType.CPU)
        assert t.byte_size == arr.size * NUMERIC[dtype].itemsize
        out = t.as_numpy()
        assert out.dtype == NUMERIC[dtype] and out.shape == arr.shape
        assert out.tobytes() == arr.tobytes(), "values must be bit-identical (NaN payloads, -0.0)"
        assert bytes(t.data_view()) == arr.tobytes()
        again = SharedTensor.read(pool, t.handle)
        assert (again.name, again.dtype, again.shape) == (name, dtype, arr.shape)
        assert again.as_numpy().tobytes() == arr.tobytes()
    finally:
        t.free()
    assert usage(pool) == baseline


@pytest.mark.parametrize(
    "make",
    [lambda a: a[::2], lambda a: a[:, ::-1], lambda a: a.T, lambda a: np.asfortranarray(a),
     lambda a: a[1:, 2:5], lambda a: np.broadcast_to(a[:1], a.shape)],
    ids=["row-step", "reversed", "transpose", "fortran", "slice", "broadcast"],
)
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16])
def test_non_contiguous_input_is_stored_in_c_order(pool: _core.Pool, make: Any, dtype: Any) -> None:
    src = make((np.arange(42).reshape(6, 7) % 5).astype(dtype))
    t = SharedTensor.from_numpy(pool, "NC", src)
    try:
        out = t.as_numpy()
        assert out.shape == src.shape and out.flags.c_contiguous
        np.testing.assert_array_equal(out, src)
        assert bytes(t.data_view()) == np.ascontiguousarray(src).tobytes()
        assert not np.shares_memory(out, src)
    finally:
        t.free()


@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (0, 2, 5), (1,), (1, 1, 1)])
@pytest.mark.parametrize("dtype", [DataType.FP64, DataType.BOOL, DataType.BYTES])
def test_zero_d_and_zero_size_shapes(pool: _core.Pool, shape: tuple[int, ...], dtype: DataType) -> None:
    n = math.prod(shape)
    if dtype == DataType.BYTES:
        src = object_array([b"x%d" % i for i in range(n)], shape)
    else:
        src = (np.arange(n) % 2 + (0.5 if dtype == DataType.FP64 else 0)).astype(NUMERIC[dtype]).reshape(shape)
    baseline = usage(pool)
    t = SharedTensor.from_numpy(pool, "Z", src)
    try:
        assert t.shape == shape and t.dtype == dtype
        out = t.as_numpy()
        assert out.shape == shape
        if dtype == DataType.BYTES:
            assert t.byte_size == sum(4 + len(v) for v in src.ravel())
            assert list(out.ravel()) == list(src.ravel())
        else:
            assert t.byte_size == n * NUMERIC[dtype].itemsize
            assert out.tobytes() == src.tobytes()
    finally:
        t.free()
    assert usage(pool) == baseline


def test_from_numpy_accepts_python_scalars_and_lists(pool: _core.Pool) -> None:
    for value, dtype in ((3.25, DataType.FP64), (7, DataType.INT64), (True, DataType.BOOL),
                         ([[1, 2], [3, 4]], DataType.INT64), (b"raw", DataType.BYTES), ("txt", DataType.BYTES)):
        t = SharedTensor.from_numpy(pool, "S", value)
        try:
            assert t.dtype == dtype and t.shape == np.asarray(value).shape
            expected = np.asarray(value)
            got = t.as_numpy()
            if dtype == DataType.BYTES:
                assert got.item() == (value if isinstance(value, bytes) else value.encode())
            else:
                np.testing.assert_array_equal(got, expected)
        finally:
            t.free()


@pytest.mark.parametrize("dtype", [">i4", ">f8", ">u2", ">f2"])
def test_from_numpy_of_non_native_byte_order_stores_the_values(pool: _core.Pool, dtype: str) -> None:
    """numpy_to_triton_dtype maps '>i4' to INT32, so from_numpy must store the values (swapped to
    the pool's little-endian layout), not fail, and must not leak the allocation either way."""
    src = np.array([1, 2, 300, 4], dtype=dtype)
    baseline = usage(pool)
    try:
        t = SharedTensor.from_numpy(pool, "BE", src)
    except TypeError as e:
        leaked = usage(pool) != baseline
        pytest.fail(f"from_numpy refused a {dtype} array ({e}); its allocation "
                    f"{'was leaked' if leaked else 'was released'}")
    try:
        assert t.dtype == numpy_to_triton_dtype(src.dtype)
        np.testing.assert_array_equal(t.as_numpy(), src)
        assert bytes(t.data_view()) == src.astype(src.dtype.newbyteorder("<")).tobytes()
    finally:
        t.free()
    assert usage(pool) == baseline


# ---- BYTES --------------------------------------------------------------------------------------
@fixture_settings(60)
@given(values=st.lists(st.binary(max_size=24), max_size=12), data=st.data())
def test_bytes_object_arrays_round_trip_with_the_triton_layout(pool: _core.Pool, values: list[bytes],
                                                                data: st.DataObject) -> None:
    shape = data.draw(st.sampled_from([(len(values),)] + ([(2, len(values) // 2)] if len(values) % 2 == 0 else [])),
                      label="shape")
    src = object_array(values, shape)
    baseline = usage(pool)
    t = SharedTensor.from_numpy(pool, "B", src)
    try:
        assert (t.dtype, t.shape) == (DataType.BYTES, shape)
        assert bytes(t.data_view()) == bytes_reference(values)
        assert t.byte_size == len(bytes_reference(values))
        out = t.as_numpy()
        assert out.dtype == object and out.shape == shape
        assert [type(v) for v in out.ravel()] == [bytes] * len(values)
        assert list(out.ravel()) == values
    finally:
        t.free()
    assert usage(pool) == baseline


@fixture_settings(60)
@given(values=st.lists(st.text(max_size=12), min_size=1, max_size=10))
def test_str_arrays_are_stored_as_utf8_bytes(pool: _core.Pool, values: list[str]) -> None:
    for src in (np.array(values, dtype=str), object_array(values, (len(values),))):
        t = SharedTensor.from_numpy(pool, "U", src)
        try:
            assert t.dtype == DataType.BYTES
            # numpy 'U' arrays drop trailing NULs, so compare with what the array holds
            expected = [str(v).encode("utf-8") for v in src]
            assert bytes(t.data_view()) == bytes_reference(expected)
            assert list(t.as_numpy()) == expected
        finally:
            t.free()


def test_fixed_width_bytes_arrays_are_bytes(pool: _core.Pool) -> None:
    src = np.array([[b"ab", b"\0c"], [b"", b"xyz"]], dtype="S3")
    t = SharedTensor.from_numpy(pool, "S", src)
    try:
        assert t.dtype == DataType.BYTES and t.shape == (2, 2)
        assert list(t.as_numpy().ravel()) == [bytes(v) for v in src.ravel()]
    finally:
        t.free()


def test_bytes_as_numpy_is_a_decoded_copy(pool: _core.Pool) -> None:
    t = SharedTensor.from_numpy(pool, "B", object_array([b"one", b"two"], (2,)))
    try:
        first = t.as_numpy()
        first[0] = b"changed"
        assert list(t.as_numpy()) == [b"one", b"two"]
    finally:
        t.free()


def test_empty_bytes_tensor_needs_its_serialized_size(pool: _core.Pool) -> None:
    baseline = usage(pool)
    with pytest.raises(ValueError, match="byte_size"):
        SharedTensor.empty(pool, "B", DataType.BYTES, [2])
    with pytest.raises(_core.FormatError):
        SharedTensor.empty(pool, "B", DataType.BYTES, [2], byte_size=7)
    assert usage(pool) == baseline


# ---- views --------------------------------------------------------------------------------------
def test_as_numpy_is_a_writable_view_of_the_pool(pool: _core.Pool) -> None:
    t = SharedTensor.from_numpy(pool, "V", np.zeros((4, 4), np.float32))
    try:
        a, b = t.as_numpy(), t.as_numpy()
        assert np.shares_memory(a, b)
        assert a.__array_interface__["data"][0] == t.data_view().address
        assert pool.handle_of(t.data_view().address) == t.info.data_handle
        a[2, 3] = 7.5
        assert b[2, 3] == 7.5
        assert SharedTensor.read(pool, t.handle).as_numpy()[2, 3] == 7.5
        assert np.frombuffer(pool.view(t.info.data_handle, 64), np.float32)[11] == 7.5
    finally:
        t.free()


def test_empty_tensor_is_filled_through_its_view(pool: _core.Pool) -> None:
    t = SharedTensor.empty(pool, "E", DataType.INT16, (3, 2))
    try:
        assert t.byte_size == 12
        t.as_numpy()[...] = [[1, 2], [3, 4], [5, 6]]
        assert bytes(t.data_view()) == np.array([1, 2, 3, 4, 5, 6], "<i2").tobytes()
    finally:
        t.free()


def test_gpu_tensor_has_no_numpy_view(pool: _core.Pool) -> None:
    handle, _ = _core.write_tensor(pool, "G", DataType.FP32, [4], 16, memory_type=MemoryType.GPU,
                                   cuda_ipc_handle=b"\1" * 64)
    try:
        t = SharedTensor.read(pool, handle)
        assert t.memory_type == MemoryType.GPU
        with pytest.raises(TypeError, match="GPU"):
            t.as_numpy()
    finally:
        pool.free(handle)


def test_free_returns_pool_usage_to_baseline(pool: _core.Pool) -> None:
    baseline = usage(pool)
    tensors = [SharedTensor.from_numpy(pool, f"T{i}", np.full((i + 1, 100), i, np.float64)) for i in range(10)]
    tensors.append(SharedTensor.from_numpy(pool, "B", object_array([b"a" * 1000] * 5, (5,))))
    assert pool.used_bytes > baseline[0] + sum(t.byte_size for t in tensors)
    assert pool.allocations == baseline[1] + len(tensors)
    for t in tensors[::2] + tensors[1::2]:
        t.free()
    assert usage(pool) == baseline
    pool.check()
    with pytest.raises(_core.InvalidHandleError):
        tensors[0].free()  # a second free of the same handle


def test_from_dlpack_copies_once_into_the_pool(pool: _core.Pool) -> None:
    src = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    t = SharedTensor.from_dlpack(pool, "D", src)
    try:
        assert (t.dtype, t.shape) == (DataType.FP32, (3, 2))
        np.testing.assert_array_equal(t.as_numpy(), src)
        assert not np.shares_memory(t.as_numpy(), src)
    finally:
        t.free()
    words = np.array([0x3F80, 0xC000], np.uint16)
    t = SharedTensor.from_dlpack(pool, "BF", _core.to_dlpack(words, words.ctypes.data, DataType.BF16, [2]))
    try:
        assert t.dtype == DataType.BF16 and bytes(t.data_view()) == words.tobytes()
        with pytest.raises(TypeError, match="BF16"):
            t.as_numpy()
    finally:
        t.free()


# ---- dtype mapping ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", list(NUMERIC), ids=lambda d: d.name)
def test_numeric_dtype_mapping_round_trips(dtype: DataType) -> None:
    np_dtype = triton_to_numpy_dtype(dtype)
    assert np_dtype == NUMERIC[dtype]
    assert numpy_to_triton_dtype(np_dtype) == dtype
    assert numpy_to_triton_dtype(np_dtype.newbyteorder(">")) == dtype
    assert np_dtype.itemsize == _core.dtype_size(dtype)


@pytest.mark.parametrize("np_dtype", ["S5", "U3", object, np.bytes_, np.str_])
def test_string_like_numpy_dtypes_map_to_bytes(np_dtype: Any) -> None:
    assert numpy_to_triton_dtype(np_dtype) == DataType.BYTES
    assert triton_to_numpy_dtype(DataType.BYTES) == np.dtype(object)


@pytest.mark.parametrize("dtype", [DataType.BF16, DataType.INVALID])
def test_triton_dtypes_without_numpy_equivalent_raise(dtype: DataType) -> None:
    with pytest.raises(TypeError, match=dtype.name):
        triton_to_numpy_dtype(dtype)


@pytest.mark.parametrize("np_dtype", [np.complex64, np.complex128, "datetime64[s]", "timedelta64[ms]",
                                      "V8", [("a", "<i4")], np.longdouble])
def test_numpy_dtypes_without_triton_equivalent_raise(pool: _core.Pool, np_dtype: Any) -> None:
    with pytest.raises(TypeError, match="no Triton equivalent"):
        numpy_to_triton_dtype(np_dtype)
    baseline = usage(pool)
    with pytest.raises(TypeError):
        SharedTensor.from_numpy(pool, "X", np.zeros(2, dtype=np_dtype))
    assert usage(pool) == baseline


# ---- a second process ---------------------------------------------------------------------------
def pop_from_peer(queue: MessageQueue, proc: multiprocessing.process.BaseProcess, timeout: float) -> int:
    """The handle the peer pushed; fails fast if the peer died first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        handle = queue.pop(timeout=0.1)
        if handle is not None:
            return handle
        if not proc.is_alive():
            handle = queue.pop(timeout=0)
            if handle is not None:
                return handle
            pytest.fail(f"peer exited with code {proc.exitcode} without answering")
    pytest.fail("peer did not answer in time")



def exchange_with_peer(pool: _core.Pool, spawn: Any, src: np.ndarray, out_repeat: int = 1) -> None:
    baseline = usage(pool)
    queue = MessageQueue.create(pool, 4)
    t = SharedTensor.from_numpy(pool, "INPUT0", src)
    parent_view = t.as_numpy()
    proc = spawn.Process(target=workers_tensor.answer_tensor,
                         args=(pool.name, t.handle, queue.handle, src, int(t.dtype), out_repeat))
    proc.start()
    try:
        handle = pop_from_peer(queue, proc, timeout=60)
    finally:
        join_peer(proc)
    out = SharedTensor.read(pool, handle)
    try:
        expected = workers_tensor.transform(src)
        if out_repeat > 1:
            expected = np.stack([expected] * out_repeat)
        assert (out.name, out.dtype, out.shape) == ("OUTPUT0", t.dtype, expected.shape)
        got = out.as_numpy()
        if src.dtype == object:
            assert list(got.ravel()) == list(expected.ravel())
        else:
            assert got.tobytes() == expected.tobytes()
            assert not parent_view.any(), "the peer's in-place write must show in the parent's view"
    finally:
        del parent_view
        out.free()
        t.free()
        pool.free(queue.handle)
    assert usage(pool) == baseline
    pool.check()


def test_second_process_reads_tensor_by_handle_and_answers_with_its_own(pool: _core.Pool, spawn: Any) -> None:
    exchange_with_peer(pool, spawn, np.arange(-6, 6, dtype=np.int32).reshape(3, 4))


def test_second_process_exchanges_bytes_tensors(pool: _core.Pool, spawn: Any) -> None:
    exchange_with_peer(pool, spawn, object_array([b"abc", b"", b"\0\xff", "héllo".encode()], (2, 2)))


def test_tensor_a_peer_writes_into_a_segment_it_grew_is_readable(pool: _core.Pool, spawn: Any) -> None:
    segments = pool.segment_count
    # 1.5 MiB of output does not fit the 1 MiB first segment: the peer must grow the pool
    exchange_with_peer(pool, spawn, np.linspace(-1, 1, 256).astype(np.float32), out_repeat=1536)
    assert pool.segment_count > segments


def test_from_dlpack_refuses_gpu_memory_with_a_clear_error(pool: _core.Pool) -> None:
    capsule = _core.to_dlpack(object(), 0x7F00_0000_0000, _core.DataType.FP32, [4], device_type=2, device_id=0)
    with pytest.raises(ValueError, match="tensor 'X' is in GPU memory; a pool holds CPU tensors only"):
        SharedTensor.from_dlpack(pool, "X", capsule)
