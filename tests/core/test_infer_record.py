"""Inference records (csrc/ipc/infer_record.h): one allocation per request or response.

Records are read by the other process, which may be buggy or hostile, so reading must either
return exactly what was written or raise a core error, never read outside the record.
"""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stubhost import _core
from stubhost._core import DataType, RecordKind

RECORD_HEAD = struct.Struct("<IIIIIIQQ3Q")  # magic, kind, status, strings, tensors, started_ms, total, next, ints
assert RECORD_HEAD.size == 64
NUMERIC = [np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64,
           np.float16, np.float32, np.float64]


def test_round_trip_keeps_strings_ints_and_tensors(pool: _core.Pool) -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = np.array([b"", b"\xff\x00", "é"], dtype=object)
    h = _core.write_record(pool, int(RecordKind.REQUEST), 7, (1, 2**64 - 1, 3), ["id", "", "ü"],
                           [("A", a), ("S", s), ("B", np.array([True, False]))], next=0)
    kind, status, ints, nxt, strings, tensors = _core.read_record(pool, h)
    assert (kind, status, ints, nxt, strings) == (1, 7, (1, 2**64 - 1, 3), 0, ["id", "", "ü"])
    assert [(n, DataType(d)) for n, d, _ in tensors] == [("A", DataType.FP32), ("S", DataType.BYTES),
                                                         ("B", DataType.BOOL)]
    np.testing.assert_array_equal(tensors[0][2], a)
    assert list(tensors[1][2]) == [b"", b"\xff\x00", "é".encode()]
    pool.free(h)


def test_views_share_pool_memory_and_lease_frees_with_the_last_view(pool: _core.Pool) -> None:
    h = _core.write_record(pool, int(RecordKind.RESPONSE), tensors=[("X", np.ones(4, np.int64))])
    before = pool.allocations
    *_, tensors = _core.read_record(pool, h, lease=True)
    view = tensors[0][2]
    del tensors
    address = pool.handle_of(view.ctypes.data)
    assert address != 0, "the array must be a view into the pool"
    assert pool.allocations == before
    del view
    assert pool.allocations == before - 1


def test_non_contiguous_and_big_endian_arrays_are_written_in_c_order(pool: _core.Pool) -> None:
    base = np.arange(12, dtype=">i4").reshape(3, 4)
    h = _core.write_record(pool, 3, tensors=[("T", base.T)])
    *_, tensors = _core.read_record(pool, h)
    np.testing.assert_array_equal(tensors[0][2], base.T)
    assert tensors[0][2].flags.c_contiguous and tensors[0][2].dtype == np.dtype("<i4")
    pool.free(h)


def test_declared_dtype_must_match_the_element_size(pool: _core.Pool) -> None:
    with pytest.raises(TypeError, match="declared"):
        _core.write_record(pool, 3, tensors=[("T", np.zeros(2, np.float32), int(DataType.FP16))])
    with pytest.raises(TypeError, match="holds strings"):
        _core.write_record(pool, 3, tensors=[("T", np.array(["a"]), int(DataType.INT32))])
    assert pool.allocations == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(strings=st.lists(st.binary(max_size=40), max_size=5),
       shapes=st.lists(st.lists(st.integers(0, 4), max_size=3), max_size=4),
       dtypes=st.lists(st.sampled_from(NUMERIC), min_size=4, max_size=4),
       ints=st.tuples(*[st.integers(0, 2**64 - 1)] * 3))
def test_any_record_reads_back_exactly(pool: _core.Pool, strings: list[bytes], shapes: list[list[int]],
                                       dtypes: list[type], ints: tuple[int, int, int]) -> None:
    arrays = [np.arange(int(np.prod(s)), dtype=np.int64).astype(d).reshape(s) for s, d in zip(shapes, dtypes)]
    h = _core.write_record(pool, 2, 0, ints, strings, [(f"t{i}", a) for i, a in enumerate(arrays)])
    _, _, got_ints, _, got_strings, tensors = _core.read_record(pool, h)
    assert got_ints == ints
    assert got_strings == [s.decode("utf-8", "replace") for s in strings]
    for a, (_, _, b) in zip(arrays, tensors):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    pool.free(h)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_corrupted_records_raise_instead_of_reading_outside(pool: _core.Pool, data: st.DataObject) -> None:
    h = _core.write_record(pool, 1, 0, (1, 2, 3), ["req", "{}", ""],
                           [("INPUT0", np.arange(4, dtype=np.float32)),
                            ("S", np.array([b"ab", b"c"], dtype=object))])
    size = pool.allocation_size(h)
    view = pool.view(h, size)
    raw = np.frombuffer(view, dtype=np.uint8)
    for _ in range(data.draw(st.integers(1, 6))):
        at = data.draw(st.integers(0, size - 1))
        raw[at] = data.draw(st.integers(0, 255))
    try:
        _core.read_record(pool, h)
    except (_core.CoreError, ValueError):
        pass  # a clear refusal is the only other acceptable outcome
    del raw, view
    pool.free(h)


def test_total_bytes_beyond_the_segment_is_refused(pool: _core.Pool) -> None:
    h = _core.write_record(pool, 1, strings=["x"])
    view = pool.view(h, 64)
    head = list(RECORD_HEAD.unpack_from(view, 0))
    head[6] = 1 << 40
    RECORD_HEAD.pack_into(view, 0, *head)
    with pytest.raises(_core.InvalidHandleError):
        _core.read_record(pool, h)
    del view
    pool.free(h)


def test_tensor_data_must_stay_inline(pool: _core.Pool) -> None:
    h = _core.write_record(pool, 1, tensors=[("T", np.zeros(4, np.float32))])
    other = pool.allocate(64)
    view = pool.view(h, 64 + 128)
    # data_handle sits at offset 32 of the tensor header, which starts at 64 (no strings).
    struct.pack_into("<Q", view, 64 + 32, other)
    with pytest.raises(_core.FormatError, match="inline"):
        _core.read_record(pool, h)
    del view
    pool.free(other)
    pool.free(h)


def test_chains_link_and_free_together_even_when_cyclic(pool: _core.Pool) -> None:
    last = _core.write_record(pool, 2, strings=["b"])
    first = _core.write_record(pool, 2, strings=["a"], next=last)
    assert _core.read_record(pool, first)[3] == last
    assert _core.free_record_chain(pool, first) == 2
    assert pool.allocations == 0
    a = _core.write_record(pool, 2)
    b = _core.write_record(pool, 2, next=a)
    _core.set_record_next(pool, a, b)  # a hostile peer's cycle
    assert _core.free_record_chain(pool, b) == 2
    assert pool.allocations == 0


def test_a_request_record_tells_how_long_it_has_run_since_its_stamp(pool: _core.Pool) -> None:
    h = _core.write_record(pool, int(RecordKind.REQUEST), 0, (0, 0, 0), ["id", "{}", ""])
    assert _core.record_running_ms(pool, h) == -1  # written, not started
    _core.mark_record_started(pool, h)
    first = _core.record_running_ms(pool, h)
    assert 0 <= first < 1000
    time.sleep(0.05)
    assert 40 <= _core.record_running_ms(pool, h) - first < 5000
    assert _core.read_record(pool, h)[2] == (0, 0, 0)  # the stamp leaves the record's contents alone
    pool.free(h)


def test_the_run_stamp_is_refused_outside_request_records(pool: _core.Pool) -> None:
    response = _core.write_record(pool, int(RecordKind.RESPONSE))
    for call in (_core.mark_record_started, _core.record_running_ms):
        with pytest.raises(_core.FormatError):
            call(pool, response)
        with pytest.raises(_core.CoreError):
            call(pool, _core.make_handle(0, pool.capacity_bytes * 4))  # past the end of the segment
        with pytest.raises(_core.CoreError):
            call(pool, _core.make_handle(17, 64))  # no such segment
    pool.free(response)


# ---- tensors that live in a client region (zero-copy shared-memory inputs and outputs) ----------
def _region(values: np.ndarray, pad: int = 0) -> bytearray:
    """A stand-in for a client's mapped region: `pad` bytes, then the values."""
    return bytearray(pad) + bytearray(values.tobytes())


def test_external_tensor_takes_no_room_and_reads_as_a_view_of_its_region(pool: _core.Pool) -> None:
    values = np.arange(4, dtype=np.float32)
    region = _region(values, pad=8)
    inline = _core.write_record(pool, int(RecordKind.REQUEST), tensors=[("X", np.zeros(1 << 16, np.uint8))])
    external = _core.write_record(pool, int(RecordKind.REQUEST),
                                  tensors=[("X", (1 << 16,), int(DataType.UINT8), 5, 0, 1 << 16)])
    assert pool.allocation_size(external) < pool.allocation_size(inline) - (1 << 15)
    pool.free(inline)
    pool.free(external)
    h = _core.write_record(pool, int(RecordKind.REQUEST),
                           tensors=[("A", (2, 2), int(DataType.FP32), 9, 8, 16), ("B", np.ones(2, np.int8))])
    _, _, _, _, _, tensors = _core.read_record(pool, h, regions={9: region})
    a = tensors[0][2]
    np.testing.assert_array_equal(a, values.reshape(2, 2))
    region[8:12] = np.float32(42).tobytes()  # the view sees the region itself, not a copy
    assert a[0, 0] == 42
    np.testing.assert_array_equal(tensors[1][2], np.ones(2, np.int8))
    pool.free(h)


def test_external_tensor_without_regions_is_described(pool: _core.Pool) -> None:
    h = _core.write_record(pool, int(RecordKind.RESPONSE), tensors=[("O", (3,), int(DataType.INT32), 4, 64, 12)])
    _, _, _, _, _, tensors = _core.read_record(pool, h)
    assert tensors == [("O", int(DataType.INT32), (4, 64, 12, (3,)))]
    pool.free(h)


@pytest.mark.parametrize("region_id, offset, size, region_bytes, match", [
    (1, 0, 16, 8, "runs past the end"),             # region too small
    (1, 2**64 - 8, 16, 64, "runs past the end"),    # offset + size overflows
    (1, 65, 0, 64, "runs past the end"),            # offset beyond the region, even when empty
    (2, 0, 16, 64, "not mapped"),                   # unknown region
])
def test_external_tensor_is_bounds_checked_against_its_region(pool: _core.Pool, region_id: int, offset: int,
                                                              size: int, region_bytes: int, match: str) -> None:
    count = size // 4
    h = _core.write_record(pool, int(RecordKind.REQUEST),
                           tensors=[("A", (count,), int(DataType.FP32), region_id, offset, size)])
    with pytest.raises(_core.FormatError, match=match):
        _core.read_record(pool, h, regions={1: bytearray(region_bytes)})
    pool.free(h)


def test_external_bytes_tensor_is_decoded_and_its_count_checked(pool: _core.Pool) -> None:
    region = bytearray(_core.encode_bytes([b"ab", b"", b"xyz"]))
    good = _core.write_record(pool, int(RecordKind.REQUEST),
                              tensors=[("S", (3,), int(DataType.BYTES), 1, 0, len(region))])
    _, _, _, _, _, tensors = _core.read_record(pool, good, regions={1: region})
    assert list(tensors[0][2]) == [b"ab", b"", b"xyz"]
    bad = _core.write_record(pool, int(RecordKind.REQUEST),
                             tensors=[("S", (4,), int(DataType.BYTES), 1, 0, len(region))])
    with pytest.raises(_core.FormatError):
        _core.read_record(pool, bad, regions={1: region})
    pool.free(good)
    pool.free(bad)


def test_external_tensor_of_a_read_only_region_is_a_read_only_view(pool: _core.Pool) -> None:
    region = memoryview(bytearray(16)).toreadonly()
    h = _core.write_record(pool, int(RecordKind.REQUEST), tensors=[("A", (4,), int(DataType.FP32), 1, 0, 16)])
    _, _, _, _, _, tensors = _core.read_record(pool, h, regions={1: region})
    assert not tensors[0][2].flags.writeable
    pool.free(h)
