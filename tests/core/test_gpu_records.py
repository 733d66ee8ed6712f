"""GPU tensors in inference records (csrc/ipc/infer_record.h): header-only, never their data.

Two kinds: a tensor in a client's CUDA region (flag kTensorInRegion, region id and offset) and
one exported from the writer's own device allocation (CUDA IPC handle, offset, buffer id). The
reader is the other process, which may be hostile, so every GPU field is checked on decode.
No GPU is needed: the device memory these headers name is never touched.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stubhost import _core
from stubhost._core import DataType, MemoryType, RecordKind

U64 = 1 << 64
RECORD_HEAD = struct.Struct("<IIIIIIQQ3Q")  # magic, kind, status, strings, tensors, reserved, total, next, ints
ITEMSIZE = {
    DataType.BOOL: 1, DataType.UINT8: 1, DataType.UINT16: 2, DataType.UINT32: 4, DataType.UINT64: 8,
    DataType.INT8: 1, DataType.INT16: 2, DataType.INT32: 4, DataType.INT64: 8,
    DataType.FP16: 2, DataType.FP32: 4, DataType.FP64: 8, DataType.BF16: 2,
}
NUMERIC = list(ITEMSIZE)
HANDLE = bytes(range(1, 65))  # a stand-in cudaIpcMemHandle_t: any 64 bytes that are not all zero

# Offsets inside a tensor header (tensor_header.h, TensorHeaderShm).
DTYPE, MEM, DEVICE, FLAGS, BYTE_SIZE, DATA_HANDLE, DATA_OFFSET, IPC = 4, 5, 8, 20, 24, 32, 40, 48
SHM = settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def in_region(name: str, shape: tuple[int, ...], dtype: DataType, region: int, offset: int,
              device: int) -> tuple[Any, ...]:
    return (name, shape, int(dtype), region, offset, math.prod(shape) * ITEMSIZE[dtype], device)


def exported(name: str, shape: tuple[int, ...], dtype: DataType, handle: Any, offset: int, device: int,
             buffer_id: int) -> tuple[Any, ...]:
    return (name, shape, int(dtype), handle, offset, math.prod(shape) * ITEMSIZE[dtype], device, buffer_id)


def header_at(record_strings: list[str], index: int, tensors: list[tuple[Any, ...]]) -> int:
    """Byte offset of tensor `index` inside a record, from the documented layout (protocol.md)."""
    at = -(-(64 + sum(4 + len(s.encode()) for s in record_strings)) // 64) * 64
    for entry in tensors[:index]:
        name, shape = entry[0].encode(), np.shape(entry[1]) if len(entry) <= 3 else entry[1]
        header = _core.tensor_header_bytes(len(name), len(shape))
        data = np.asarray(entry[1]).nbytes if len(entry) <= 3 else 0
        at += -(-(header + data) // 64) * 64
    return at


def patch(pool: _core.Pool, handle: int, at: int, fmt: str, value: Any) -> None:
    view = pool.view(handle, pool.allocation_size(handle))
    struct.pack_into(fmt, view, at, value)
    del view


# ---- round trips --------------------------------------------------------------------------------
def test_both_gpu_forms_round_trip_beside_cpu_and_system_region_tensors(pool: _core.Pool) -> None:
    cpu = np.arange(6, dtype=np.int32).reshape(2, 3)
    tensors = [
        ("CPU", cpu),
        in_region("IN_REGION", (4, 2), DataType.FP32, 11, 4096, 1),
        ("SYS", (3,), int(DataType.INT64), 5, 64, 24),
        exported("EXPORTED", (5,), DataType.FP16, HANDLE, 512, 3, 0xDEADBEEF_00000001),
        ("WORDS", np.array([b"a", b"bc"], dtype=object)),
    ]
    h = _core.write_record(pool, int(RecordKind.RESPONSE), 0, (1, 2, 3), ["", "{}"], tensors)
    try:
        kind, _, ints, _, strings, got = _core.read_record(pool, h)
        assert (kind, ints, strings) == (2, (1, 2, 3), ["", "{}"])
        assert [(n, DataType(d)) for n, d, _ in got] == [
            ("CPU", DataType.INT32), ("IN_REGION", DataType.FP32), ("SYS", DataType.INT64),
            ("EXPORTED", DataType.FP16), ("WORDS", DataType.BYTES)]
        np.testing.assert_array_equal(got[0][2], cpu)
        assert got[1][2] == ("cuda_region", 11, 4096, 32, (4, 2), 1)
        assert got[2][2] == (5, 64, 24, (3,))  # the system-region description is unchanged
        assert got[3][2] == ("cuda_ipc", HANDLE, 512, 10, (5,), 3, 0xDEADBEEF_00000001)
        assert list(got[4][2]) == [b"a", b"bc"]
    finally:
        pool.free(h)


def test_gpu_tensors_are_described_even_when_regions_are_given(pool: _core.Pool) -> None:
    region = bytearray(np.arange(3, dtype=np.int64).tobytes())
    tensors = [in_region("G", (2,), DataType.INT8, 1, 0, 0), ("SYS", (3,), int(DataType.INT64), 1, 0, 24),
               exported("E", (), DataType.FP64, HANDLE, 0, 0, 0)]
    h = _core.write_record(pool, int(RecordKind.REQUEST), tensors=tensors)
    try:
        *_, got = _core.read_record(pool, h, regions={1: region})
        assert got[0][2] == ("cuda_region", 1, 0, 2, (2,), 0)
        np.testing.assert_array_equal(got[1][2], [0, 1, 2])  # same region id, but a system tensor: a view
        assert got[2][2] == ("cuda_ipc", HANDLE, 0, 8, (), 0, 0)
    finally:
        pool.free(h)


def test_gpu_tensors_take_no_data_room_and_set_their_header_fields(pool: _core.Pool) -> None:
    shape = (1 << 20,)
    tensors = [in_region("R", shape, DataType.FP32, 7, 0, 2), exported("X", shape, DataType.FP32, HANDLE, 64, 1, 9)]
    h = _core.write_record(pool, int(RecordKind.REQUEST), tensors=tensors)
    try:
        view = pool.view(h, pool.allocation_size(h))
        total = RECORD_HEAD.unpack_from(view, 0)[6]
        header = _core.tensor_header_bytes(1, 1)
        assert total == 64 + 2 * header, "a GPU tensor's record entry is its header only"
        r, x = 64, 64 + header
        assert struct.unpack_from("<BBxxiII", view, r + DTYPE) == (int(DataType.FP32), int(MemoryType.GPU), 2, 1, 1)
        assert struct.unpack_from("<I", view, r + FLAGS)[0] == 1
        assert struct.unpack_from("<QQQ", view, r + BYTE_SIZE) == (4 << 20, 7, 0)
        assert struct.unpack_from("64s", view, r + IPC)[0] == bytes(64)
        assert struct.unpack_from("<B", view, x + MEM)[0] == int(MemoryType.GPU)
        assert struct.unpack_from("<i", view, x + DEVICE)[0] == 1
        assert struct.unpack_from("<I", view, x + FLAGS)[0] == 0
        assert struct.unpack_from("<QQQ", view, x + BYTE_SIZE) == (4 << 20, 9, 64)
        assert struct.unpack_from("64s", view, x + IPC)[0] == HANDLE
        del view
    finally:
        pool.free(h)


def test_existing_cpu_and_system_region_headers_keep_zero_flags(pool: _core.Pool) -> None:
    tensors = [("C", np.zeros(2, np.uint8)), ("S", (2,), int(DataType.UINT8), 3, 0, 2)]
    h = _core.write_record(pool, int(RecordKind.REQUEST), tensors=tensors)
    try:
        for i in range(2):
            view = pool.view(h, pool.allocation_size(h))
            assert struct.unpack_from("<I", view, header_at([], i, tensors) + FLAGS)[0] == 0
            del view
    finally:
        pool.free(h)


names = st.text(max_size=40)
shapes = st.lists(st.integers(0, 1 << 12), max_size=5).map(tuple)
devices = st.integers(0, 4095)
u64 = st.integers(0, U64 - 1)
handles = st.binary(min_size=64, max_size=64).filter(any)


@st.composite
def gpu_tensor(draw: st.DrawFn) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """A GPU tensor entry for write_record and the description read_record must give back."""
    name, shape, dtype, device = draw(names), draw(shapes), draw(st.sampled_from(NUMERIC)), draw(devices)
    size = math.prod(shape) * ITEMSIZE[dtype]
    offset = draw(st.one_of(st.integers(0, 1 << 20), st.integers(0, U64 - 1 - size), st.just(U64 - 1 - size)))
    if draw(st.booleans()):
        region = draw(u64)
        return (in_region(name, shape, dtype, region, offset, device),
                (name, int(dtype), ("cuda_region", region, offset, size, shape, device)))
    handle, buffer_id = draw(handles), draw(u64)
    return (exported(name, shape, dtype, handle, offset, device, buffer_id),
            (name, int(dtype), ("cuda_ipc", handle, offset, size, shape, device, buffer_id)))


@SHM
@given(entries=st.lists(gpu_tensor(), max_size=5), cpu_first=st.booleans(), region=u64)
def test_any_gpu_tensors_read_back_exactly(pool: _core.Pool, entries: list[tuple[Any, Any]], cpu_first: bool,
                                           region: int) -> None:
    cpu = ("cpu", np.arange(5, dtype=np.float64))
    system = ("sys", (2, 2), int(DataType.INT16), region, 8, 8)
    tensors = [e for e, _ in entries]
    tensors = [cpu, *tensors, system] if cpu_first else [system, *tensors, cpu]
    h = _core.write_record(pool, int(RecordKind.REQUEST), 0, (), ["id"], tensors)
    try:
        *_, got = _core.read_record(pool, h)
        body = got[1:-1]
        assert body == [expected for _, expected in entries]
        cpu_got = got[0] if cpu_first else got[-1]
        np.testing.assert_array_equal(cpu_got[2], cpu[1])
        assert (got[-1] if cpu_first else got[0])[2] == (region, 8, 8, (2, 2))
    finally:
        pool.free(h)
    assert pool.allocations == 0


# ---- what the writer refuses --------------------------------------------------------------------
@pytest.mark.parametrize("entry, error, match", [
    (in_region("G", (2,), DataType.FP32, 1, 0, 4096), _core.FormatError, "GPU tensor 'G' names device 4096"),
    (in_region("G", (2,), DataType.FP32, 1, 0, -1), _core.FormatError, "names device -1"),
    (in_region("G", (2,), DataType.FP32, 1, 0, 1 << 40), _core.FormatError, "names device"),
    (in_region("G", (2,), DataType.FP32, 1, U64 - 4, 0), _core.FormatError, "ends past 2\\^64"),
    (exported("E", (2,), DataType.FP32, bytes(64), 0, 0, 1), _core.FormatError, "all-zero CUDA IPC handle"),
    (exported("E", (2,), DataType.FP32, HANDLE[:63], 0, 0, 1), ValueError, "64 bytes, not 63"),
    (exported("E", (2,), DataType.FP32, HANDLE + b"x", 0, 0, 1), ValueError, "64 bytes, not 65"),
    (exported("E", (2,), DataType.FP32, HANDLE, U64 - 1, 0, 1), _core.FormatError, "ends past"),
    (("B", (2,), int(DataType.BYTES), 1, 0, 8, 0), _core.FormatError, "BYTES tensor 'B' cannot be a GPU tensor"),
    (("B", (2,), int(DataType.BYTES), HANDLE, 0, 8, 0, 1), _core.FormatError, "cannot be a GPU tensor"),
    (("G", (2,), int(DataType.FP32), 1, 0, 7, 0), _core.FormatError, "cannot have 7 bytes"),
])
def test_writer_refuses_impossible_gpu_tensors_and_leaves_nothing(pool: _core.Pool, entry: tuple[Any, ...],
                                                                  error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        _core.write_record(pool, int(RecordKind.REQUEST), tensors=[("ok", np.zeros(2)), entry])
    assert pool.allocations == 0


def test_ipc_handle_may_be_any_bytes_like_object(pool: _core.Pool) -> None:
    for handle in (bytearray(HANDLE), memoryview(HANDLE)):
        h = _core.write_record(pool, 3, tensors=[exported("E", (1,), DataType.INT8, handle, 0, 0, 2)])
        assert _core.read_record(pool, h)[5][0][2][1] == HANDLE
        pool.free(h)
    with pytest.raises(TypeError):
        _core.write_record(pool, 3, tensors=[exported("E", (1,), DataType.INT8, "x" * 64, 0, 0, 2)])
    assert pool.allocations == 0


# ---- hostile headers ----------------------------------------------------------------------------
GPU_RECORD = [("C", np.arange(4, dtype=np.float32)),
              in_region("R", (4,), DataType.FP32, 7, 0, 0),
              exported("X", (4,), DataType.FP32, HANDLE, 0, 1, 42),
              ("S", (4,), int(DataType.FP32), 7, 0, 16)]
C, R, X, S = range(4)


@pytest.mark.parametrize("tensor, at, fmt, value, match", [
    (R, FLAGS, "<I", 2, "'R' has unknown header flags 0x2"),
    (X, FLAGS, "<I", 0x80000001, "unknown header flags 0x80000001"),
    (R, DEVICE, "<i", 5000, "'R' names device 5000"),
    (X, DEVICE, "<i", -1, "'X' names device -1"),
    (X, DEVICE, "<i", 4096, "names device 4096"),
    (R, DATA_OFFSET, "<Q", U64 - 8, "'R' at offset .* ends past 2\\^64"),
    (X, DATA_OFFSET, "<Q", U64 - 15, "ends past 2\\^64"),
    (X, IPC, "64s", bytes(64), "exported GPU tensor 'X' has an all-zero CUDA IPC handle"),
    (X, FLAGS, "<I", 1, "'X' lies in a CUDA region but carries an IPC handle"),
    (R, IPC + 63, "<B", 1, "'R' lies in a CUDA region but carries an IPC handle"),
    (R, FLAGS, "<I", 0, "all-zero CUDA IPC handle"),  # flag cleared: now an export without a handle
    (C, FLAGS, "<I", 1, "'C' has header flags 0x1 but is not a GPU tensor"),
    (S, FLAGS, "<I", 1, "'S' has header flags 0x1 but is not a GPU tensor"),
    (R, DTYPE, "<B", int(DataType.BYTES), "BYTES tensor 'R' cannot be a GPU tensor"),
    (X, DTYPE, "<B", int(DataType.BYTES), "BYTES tensor 'X' cannot be a GPU tensor"),
    (C, MEM, "<B", int(MemoryType.GPU), "all-zero CUDA IPC handle"),  # inline data posing as GPU
    (X, MEM, "<B", int(MemoryType.CPU), "'X' does not hold its data inline"),
])
def test_hostile_gpu_header_is_a_format_error(pool: _core.Pool, tensor: int, at: int, fmt: str, value: Any,
                                              match: str) -> None:
    h = _core.write_record(pool, int(RecordKind.REQUEST), tensors=GPU_RECORD)
    try:
        _core.read_record(pool, h)  # intact, it reads
        patch(pool, h, header_at([], tensor, GPU_RECORD) + at, fmt, value)
        with pytest.raises(_core.FormatError, match=match):
            _core.read_record(pool, h)
        with pytest.raises(_core.FormatError, match=match):
            _core.read_record(pool, h, lease=True, regions={7: bytearray(64)})
    finally:
        pool.free(h)
    pool.check()


def expected_outcome(mem: int, flags: int, device: int, offset: int, size: int, ipc: bytes) -> str:
    """What the reader must make of a GPU entry whose placement fields were overwritten."""
    if mem > 3 or flags & ~1:
        return "reject"
    if mem != int(MemoryType.GPU):
        return "system" if mem == int(MemoryType.SYSTEM_SHM) and flags == 0 else "reject"
    if not 0 <= device < 4096 or offset + size >= U64:
        return "reject"
    no_handle = ipc == bytes(64)
    if flags == 1:  # in a client's CUDA region: must carry no IPC handle
        return "region" if no_handle else "reject"
    return "reject" if no_handle else "export"


@SHM
@given(which=st.sampled_from([R, X]), data=st.data())
def test_overwritten_gpu_fields_are_read_consistently_or_refused(pool: _core.Pool, which: int,
                                                                 data: st.DataObject) -> None:
    h = _core.write_record(pool, int(RecordKind.REQUEST), tensors=GPU_RECORD)
    base = header_at([], which, GPU_RECORD)
    view = pool.view(h, pool.allocation_size(h))
    try:
        mem = data.draw(st.one_of(st.just(int(MemoryType.GPU)), st.integers(0, 255)), label="memory_type")
        flags = data.draw(st.one_of(st.sampled_from([0, 1, 2, 3]), st.integers(0, (1 << 32) - 1)), label="flags")
        device = data.draw(st.one_of(st.integers(-2, 4097), st.integers(-(1 << 31), (1 << 31) - 1)), label="device")
        offset = data.draw(st.one_of(st.integers(0, 1 << 20), st.integers(U64 - 64, U64 - 1), u64), label="offset")
        ipc = data.draw(st.one_of(st.just(bytes(64)), st.just(HANDLE),
                                  st.binary(min_size=64, max_size=64)), label="ipc")
        struct.pack_into("<B", view, base + MEM, mem)
        struct.pack_into("<i", view, base + DEVICE, device)
        struct.pack_into("<I", view, base + FLAGS, flags)
        struct.pack_into("<Q", view, base + DATA_OFFSET, offset)
        struct.pack_into("64s", view, base + IPC, ipc)
        outcome = expected_outcome(mem, flags, device, offset, 16, ipc)
        if outcome == "reject":
            with pytest.raises(_core.FormatError):
                _core.read_record(pool, h)
            return
        *_, got = _core.read_record(pool, h)
        name, dtype, described = got[which]
        assert (name, dtype) == (GPU_RECORD[which][0], int(DataType.FP32))
        data_handle = 7 if which == R else 42
        if outcome == "system":
            assert described == (data_handle, offset, 16, (4,))
        elif outcome == "region":
            assert described == ("cuda_region", data_handle, offset, 16, (4,), device)
        else:
            assert described == ("cuda_ipc", ipc, offset, 16, (4,), device, data_handle)
    finally:
        del view
        pool.free(h)


@SHM
@given(data=st.data())
def test_random_damage_to_a_gpu_record_never_crashes(pool: _core.Pool, data: st.DataObject) -> None:
    h = _core.write_record(pool, int(RecordKind.REQUEST), 0, (), ["a", "{}"], GPU_RECORD)
    size = pool.allocation_size(h)
    view = pool.view(h, size)
    raw = np.frombuffer(view, dtype=np.uint8)
    try:
        for _ in range(data.draw(st.integers(1, 8))):
            raw[data.draw(st.integers(0, size - 1))] = data.draw(st.integers(0, 255))
        try:
            _core.read_record(pool, h)
        except (_core.CoreError, ValueError):
            pass  # a clear refusal is the only other acceptable outcome
    finally:
        del raw, view
        pool.free(h)
    pool.check()
