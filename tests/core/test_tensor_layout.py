"""Tensor header layout (csrc/tensor/tensor_header.h): encoding, validation and hostile input.

The header is read from shared memory a peer may have scribbled on, so every decoder must either
return a self-consistent description or raise, never read outside its buffer. The tests compare
the core against a small reference decoder written from the header's documented layout.
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
from stubhost._core import DataType, MemoryType

# ---- the documented layout ----------------------------------------------------------------------
# TensorHeaderShm: magic, dtype, memory_type, reserved0, device_id, ndim, name_length, flags,
# byte_size, data_handle, data_offset, cuda_ipc_handle[64], reserved[2]  (128 bytes)
HEADER = struct.Struct("<IBBHiIIIQQQ64s16s")
assert HEADER.size == 128
TENSOR_MAGIC = 0x534E5453  # "STNS"
MAX_DIMS = 64
MAX_NAME = 4096
U64 = 1 << 64

VALID_DTYPES = [d for d in DataType.__members__.values() if d != DataType.INVALID]
MEMORY_TYPES = list(MemoryType.__members__.values())
ITEMSIZE = {
    DataType.BOOL: 1, DataType.UINT8: 1, DataType.UINT16: 2, DataType.UINT32: 4, DataType.UINT64: 8,
    DataType.INT8: 1, DataType.INT16: 2, DataType.INT32: 4, DataType.INT64: 8,
    DataType.FP16: 2, DataType.FP32: 4, DataType.FP64: 8, DataType.BYTES: 0, DataType.BF16: 2,
}
# Byte ranges worth overwriting on purpose when mutating a header: (offset, width). The magic is
# left to random byte flips (overwriting it only ever yields "not a tensor"); 128 and 136 are the
# first two dims (or the name, for lower ranks).
FIELDS = [(4, 1), (5, 1), (8, 4), (12, 4), (16, 4), (24, 8), (32, 8), (40, 8), (128, 8), (136, 8)]


class Rejected(Exception):
    """The reference decoder refuses the bytes."""


def write_tensor(pool: _core.Pool, *args: Any, **kwargs: Any) -> tuple[int, int]:
    """_core.write_tensor, as (header handle, data handle)."""
    handle, written = _core.write_tensor(pool, *args, **kwargs)
    return handle, getattr(written, "data_handle", written)


def expected_header_bytes(name_len: int, ndim: int) -> int:
    return -(-(128 + 8 * ndim + name_len) // 64) * 64


def reference_decode(buf: bytes) -> dict[str, Any]:
    """Decodes a header the way tensor_header.h documents it; raises Rejected where it must fail."""
    if len(buf) < HEADER.size:
        raise Rejected("truncated")
    (magic, dtype, mem, _r0, device_id, ndim, name_len, _flags, byte_size, data_handle, data_offset,
     ipc, _reserved) = HEADER.unpack_from(buf)
    if magic != TENSOR_MAGIC:
        raise Rejected("magic")
    if ndim > MAX_DIMS or name_len > MAX_NAME:
        raise Rejected("rank or name length")
    need = 128 + 8 * ndim + name_len
    if need > len(buf):
        raise Rejected("runs past the buffer")
    shape = struct.unpack_from(f"<{ndim}q", buf, 128)
    raw_name = buf[128 + 8 * ndim:need]
    if dtype == 0 or dtype > 14:
        raise Rejected("dtype")
    if mem > max(m.value for m in MemoryType):
        raise Rejected("memory type")
    count = 1
    for d in shape:  # same order as the core: a partial product may overflow before a 0 dim
        if d < 0:
            raise Rejected("negative dim")
        count *= d
        if count >= U64:
            raise Rejected("count overflows")
    size = ITEMSIZE[DataType(dtype)]
    if size:
        if count * size >= U64 or count * size != byte_size:
            raise Rejected("byte size of a fixed dtype")
    elif count * 4 >= U64 or byte_size < count * 4:
        raise Rejected("byte size of BYTES")
    return dict(dtype=DataType(dtype), memory_type=MemoryType(mem), device_id=device_id, shape=shape,
                raw_name=raw_name, byte_size=byte_size, data_handle=data_handle, data_offset=data_offset,
                cuda_ipc_handle=ipc)


def assert_matches_reference(info: _core.TensorInfo, ref: dict[str, Any]) -> None:
    """The core's decoded description equals the reference, and its name is readable."""
    assert info.dtype == ref["dtype"]
    assert info.memory_type == ref["memory_type"]
    assert info.device_id == ref["device_id"]
    assert info.shape == ref["shape"]
    assert info.byte_size == ref["byte_size"]
    assert info.data_handle == ref["data_handle"]
    assert info.data_offset == ref["data_offset"]
    assert info.cuda_ipc_handle == ref["cuda_ipc_handle"]
    # A decoded header must be usable: its name has to come out as a str (an accepted header whose
    # name cannot be read is neither "decoded" nor "rejected").
    name = info.name
    assert isinstance(name, str)
    try:
        assert name == ref["raw_name"].decode("utf-8")
    except UnicodeDecodeError:
        pass  # the core may present undecodable names leniently, as long as it presents them


# ---- strategies ---------------------------------------------------------------------------------
names = st.one_of(st.text(max_size=24), st.text(min_size=300, max_size=1024))
shapes = st.lists(st.integers(0, 6), max_size=8)


@st.composite
def header_fields(draw: st.DrawFn) -> dict[str, Any]:
    dtype = draw(st.sampled_from(VALID_DTYPES))
    shape = draw(shapes)
    count = math.prod(shape)
    if dtype == DataType.BYTES:
        byte_size = 4 * count + draw(st.one_of(st.just(0), st.integers(0, 1 << 40)))
    else:
        byte_size = count * ITEMSIZE[dtype]
    return dict(
        name=draw(names),
        dtype=dtype,
        shape=shape,
        byte_size=byte_size,
        memory_type=draw(st.sampled_from(MEMORY_TYPES)),
        device_id=draw(st.integers(-(1 << 31), (1 << 31) - 1)),
        data_handle=draw(st.integers(0, U64 - 1)),
        data_offset=draw(st.integers(0, U64 - 1)),
        cuda_ipc_handle=draw(st.one_of(st.binary(min_size=64, max_size=64), st.binary(max_size=63))),
    )


@st.composite
def mutated_header(draw: st.DrawFn) -> bytes:
    """A valid encoding with a few bytes or whole fields overwritten, possibly truncated."""
    fields = draw(header_fields())
    buf = bytearray(_core.encode_tensor_header(**fields))
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            pos = draw(st.integers(0, len(buf) - 1))
            buf[pos] = draw(st.integers(0, 255))
        else:
            off, width = draw(st.sampled_from([f for f in FIELDS if f[0] + f[1] <= len(buf)]))
            value = draw(st.one_of(st.integers(0, 16), st.integers(0, (1 << (8 * width)) - 1),
                                   st.integers(-16, -1).map(lambda v: v % (1 << (8 * width)))))
            buf[off:off + width] = value.to_bytes(width, "little")
    if draw(st.booleans()):
        buf = buf[:draw(st.integers(0, len(buf)))]
    return bytes(buf)


# ---- round trip ---------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(fields=header_fields())
def test_encoded_header_round_trips_every_field(fields: dict[str, Any]) -> None:
    encoded = _core.encode_tensor_header(**fields)
    info = _core.decode_tensor_header(encoded)
    assert info.name == fields["name"]
    assert info.dtype == fields["dtype"]
    assert info.shape == tuple(fields["shape"])
    assert info.byte_size == fields["byte_size"]
    assert info.memory_type == fields["memory_type"]
    assert info.device_id == fields["device_id"]
    assert info.data_handle == fields["data_handle"]
    assert info.data_offset == fields["data_offset"]
    assert info.cuda_ipc_handle == fields["cuda_ipc_handle"].ljust(64, b"\0")


@settings(max_examples=150, deadline=None)
@given(fields=header_fields())
def test_encoded_header_has_the_documented_byte_layout(fields: dict[str, Any]) -> None:
    encoded = _core.encode_tensor_header(**fields)
    name = fields["name"].encode("utf-8")
    ndim = len(fields["shape"])
    assert len(encoded) == expected_header_bytes(len(name), ndim)
    assert len(encoded) == _core.tensor_header_bytes(len(name), ndim)
    assert len(encoded) % _core.ALIGNMENT == 0
    (magic, dtype, mem, r0, device_id, got_ndim, name_len, flags, byte_size, data_handle, data_offset,
     ipc, reserved) = HEADER.unpack_from(encoded)
    assert magic == TENSOR_MAGIC
    assert dtype == fields["dtype"].value
    assert mem == fields["memory_type"].value
    assert (r0, flags, reserved) == (0, 0, bytes(16))
    assert device_id == fields["device_id"]
    assert got_ndim == ndim
    assert name_len == len(name)
    assert (byte_size, data_handle, data_offset) == (fields["byte_size"], fields["data_handle"],
                                                     fields["data_offset"])
    assert ipc == fields["cuda_ipc_handle"].ljust(64, b"\0")
    assert struct.unpack_from(f"<{ndim}q", encoded, 128) == tuple(fields["shape"])
    end = 128 + 8 * ndim + len(name)
    assert encoded[128 + 8 * ndim:end] == name
    assert encoded[end:] == bytes(len(encoded) - end), "padding must be zeroed"


@settings(max_examples=40, deadline=None)
@given(fields=header_fields())
def test_header_truncated_at_every_length_decodes_only_when_complete(fields: dict[str, Any]) -> None:
    encoded = _core.encode_tensor_header(**fields)
    need = 128 + 8 * len(fields["shape"]) + len(fields["name"].encode("utf-8"))
    for k in range(len(encoded) + 1):
        if k < need:
            with pytest.raises(_core.FormatError):
                _core.decode_tensor_header(encoded[:k])
        else:  # the zero padding after the name is not needed
            info = _core.decode_tensor_header(encoded[:k])
            assert info.name == fields["name"] and info.shape == tuple(fields["shape"])


def test_decode_reads_from_any_contiguous_buffer_type() -> None:
    encoded = _core.encode_tensor_header("INPUT0", DataType.FP32, [2, 3], 24)
    for buf in (encoded, bytearray(encoded), memoryview(encoded), np.frombuffer(encoded, np.uint8),
                np.frombuffer(encoded, np.uint64).reshape(-1, 4)):
        info = _core.decode_tensor_header(buf)
        assert (info.name, info.shape, info.byte_size) == ("INPUT0", (2, 3), 24)
    with pytest.raises(ValueError, match="contiguous"):
        _core.decode_tensor_header(np.frombuffer(encoded + encoded, np.uint8)[::2])


# ---- validation of descriptions -----------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(dtype=st.sampled_from([d for d in VALID_DTYPES if d != DataType.BYTES]), shape=shapes, data=st.data())
def test_fixed_dtype_byte_size_must_equal_elements_times_itemsize(dtype: DataType, shape: list[int],
                                                                  data: st.DataObject) -> None:
    exact = math.prod(shape) * ITEMSIZE[dtype]
    assert _core.decode_tensor_header(_core.encode_tensor_header("t", dtype, shape, exact)).byte_size == exact
    wrong = data.draw(st.one_of(st.integers(0, 2 * exact + 16), st.integers(0, U64 - 1)).filter(
        lambda n: n != exact), label="wrong byte_size")
    with pytest.raises(_core.FormatError, match=f"cannot have {wrong} bytes"):
        _core.encode_tensor_header("t", dtype, shape, wrong)


@settings(max_examples=150, deadline=None)
@given(shape=shapes, data=st.data())
def test_bytes_dtype_needs_at_least_four_bytes_per_element(shape: list[int], data: st.DataObject) -> None:
    least = 4 * math.prod(shape)
    extra = data.draw(st.one_of(st.integers(0, 16), st.integers(0, U64 - 1 - least)), label="extra")
    info = _core.decode_tensor_header(_core.encode_tensor_header("b", DataType.BYTES, shape, least + extra))
    assert info.byte_size == least + extra
    if least:
        short = data.draw(st.integers(0, least - 1), label="short byte_size")
        with pytest.raises(_core.FormatError, match=f"BYTES tensor 'b' with {least // 4} elements"):
            _core.encode_tensor_header("b", DataType.BYTES, shape, short)


def test_byte_size_rules_also_guard_write_tensor(pool: _core.Pool) -> None:
    baseline = pool.used_bytes
    with pytest.raises(_core.FormatError):
        _core.write_tensor(pool, "t", DataType.FP32, [3], 11)
    with pytest.raises(_core.FormatError):
        _core.write_tensor(pool, "b", DataType.BYTES, [3], 11)
    assert pool.used_bytes == baseline, "a refused tensor must not leave an allocation behind"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(dtype=DataType.INVALID, shape=[1], byte_size=0), "invalid data type"),
        (dict(dtype=DataType.FP32, shape=[-1], byte_size=0), "negative dimension"),
        (dict(dtype=DataType.FP32, shape=[2, -3], byte_size=0), "negative dimension"),
        (dict(dtype=DataType.INT8, shape=[1 << 62, 1 << 62], byte_size=0), "overflows"),
        (dict(dtype=DataType.INT8, shape=[1 << 40, 1 << 40, 0], byte_size=0), "overflows"),
        (dict(dtype=DataType.INT64, shape=[1 << 61], byte_size=0), "cannot have"),
        (dict(dtype=DataType.BYTES, shape=[1 << 62], byte_size=U64 - 1), "BYTES"),
        (dict(dtype=DataType.UINT8, shape=[1] * 65, byte_size=1), "65 dimensions"),
        (dict(name="é" * 2049, dtype=DataType.UINT8, shape=[], byte_size=1), "name is too long"),
    ],
)
def test_impossible_descriptions_raise_format_error(kwargs: dict[str, Any], match: str) -> None:
    kwargs.setdefault("name", "t")
    with pytest.raises(_core.FormatError, match=match):
        _core.encode_tensor_header(**kwargs)


@settings(max_examples=100, deadline=None)
@given(name=names, dtype=st.sampled_from(VALID_DTYPES), shape=shapes.filter(lambda s: math.prod(s) > 0))
def test_refused_description_raises_format_error_whatever_its_name(name: str, dtype: DataType,
                                                                   shape: list[int]) -> None:
    # One byte short of what the dtype needs: always wrong (BYTES needs 4 per element).
    short = math.prod(shape) * (ITEMSIZE[dtype] or 4) - 1
    with pytest.raises(_core.FormatError):
        _core.encode_tensor_header(name, dtype, shape, short)


@pytest.mark.parametrize("cut", ["é", "€", "😀"])
@pytest.mark.parametrize("kwargs", [dict(dtype=DataType.FP32, shape=[1], byte_size=3),
                                    dict(dtype=DataType.BYTES, shape=[2], byte_size=7),
                                    dict(dtype=DataType.INVALID, shape=[1], byte_size=1)])
def test_error_message_quoting_a_long_unicode_name_is_still_a_format_error(kwargs: dict[str, Any],
                                                                         cut: str) -> None:
    """Regression: the message quotes the name's first 64 bytes; a character straddling byte 64
    must not turn the FormatError into a UnicodeDecodeError."""
    name = "a" * 63 + cut + "tail"
    with pytest.raises(_core.FormatError):
        _core.encode_tensor_header(name, **kwargs)


def test_limits_themselves_are_accepted() -> None:
    name = "é" * 2048  # exactly 4096 UTF-8 bytes
    info = _core.decode_tensor_header(_core.encode_tensor_header(name, DataType.UINT8, [1] * 64, 1))
    assert info.name == name and info.shape == (1,) * 64


def test_cuda_ipc_handle_longer_than_64_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match="64 bytes"):
        _core.encode_tensor_header("g", DataType.FP32, [1], 4, memory_type=MemoryType.GPU,
                                   cuda_ipc_handle=bytes(65))


# ---- hostile bytes ------------------------------------------------------------------------------
def name_is_utf8(ref: dict[str, Any]) -> bool:
    try:
        ref["raw_name"].decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def check_decode_against_reference(buf: bytes) -> None:
    try:
        ref = reference_decode(buf)
    except Rejected:
        with pytest.raises(_core.FormatError):
            _core.decode_tensor_header(buf)
        return
    try:
        info = _core.decode_tensor_header(buf)
    except _core.FormatError:
        # the only thing the reference leaves open: a name that is not UTF-8 may be refused
        assert not name_is_utf8(ref), "a consistent header was refused"
        return
    assert_matches_reference(info, ref)


@settings(max_examples=300, deadline=None)
@given(buf=st.one_of(
    st.binary(max_size=600),
    # garbage behind a valid magic gets past the first check
    st.binary(min_size=124, max_size=600).map(lambda b: struct.pack("<I", TENSOR_MAGIC) + b),
))
def test_garbage_header_bytes_never_crash_and_decode_only_when_consistent(buf: bytes) -> None:
    check_decode_against_reference(buf)


@settings(max_examples=400, deadline=None)
@given(buf=mutated_header())
def test_mutated_header_decodes_consistently_or_raises_format_error(buf: bytes) -> None:
    check_decode_against_reference(buf)


def test_header_with_undecodable_name_bytes_is_rejected_or_readable() -> None:
    """Regression: a flipped byte in the name must not yield a TensorInfo whose .name raises."""
    buf = bytearray(_core.encode_tensor_header("ab", DataType.FP32, [2, 3], 24))
    buf[128 + 8 * 2] = 0xFF  # first name byte: never valid UTF-8
    try:
        info = _core.decode_tensor_header(bytes(buf))
    except _core.FormatError:
        return
    assert isinstance(info.name, str)


# ---- hostile bytes in the pool ------------------------------------------------------------------
def read_tensor_expectation(pool: _core.Pool, handle: int) -> dict[str, Any] | None:
    """What read_tensor must do with the bytes at handle: a reference description, or None (raise)."""
    try:
        fixed = bytes(pool.view(handle, 128))
    except _core.InvalidHandleError:
        return None
    _m, _d, _mt, _r, _dev, ndim, name_len, *_rest = HEADER.unpack_from(fixed)
    if ndim > MAX_DIMS or name_len > MAX_NAME:
        return None
    try:
        ref = reference_decode(bytes(pool.view(handle, expected_header_bytes(name_len, ndim))))
    except (Rejected, _core.InvalidHandleError):
        return None
    if ref["memory_type"] == MemoryType.SYSTEM_SHM:
        return None  # data in a client region: read_tensor (a pool-only reader) refuses it
    if ref["memory_type"] != MemoryType.GPU:
        try:
            pool.view(ref["data_handle"], ref["byte_size"])
        except _core.InvalidHandleError:
            return None  # the data range must lie inside the pool
    return ref


def write_and_read_back(pool: _core.Pool, handle: int, garbage: bytes) -> None:
    np.frombuffer(pool.view(handle, len(garbage)), np.uint8)[:] = np.frombuffer(garbage, np.uint8)
    ref = read_tensor_expectation(pool, handle)
    if ref is None:
        with pytest.raises((_core.FormatError, _core.InvalidHandleError)):
            _core.read_tensor(pool, handle)
        return
    try:
        info = _core.read_tensor(pool, handle)
    except _core.FormatError:
        assert not name_is_utf8(ref), "a consistent tensor was refused"
        return
    assert_matches_reference(info, ref)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.one_of(
    st.binary(min_size=1, max_size=600),
    st.binary(min_size=124, max_size=600).map(lambda b: struct.pack("<I", TENSOR_MAGIC) + b),
    mutated_header().filter(bool),
))
def test_garbage_in_pool_memory_makes_read_tensor_raise_never_crash(pool: _core.Pool, garbage: bytes) -> None:
    baseline = pool.used_bytes
    handle = pool.allocate(len(garbage))
    try:
        write_and_read_back(pool, handle, garbage)
    finally:
        pool.free(handle)
    assert pool.used_bytes == baseline
    pool.check()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=header_fields(), mutations=st.lists(
    st.tuples(st.sampled_from(FIELDS + [(0, 4), (48, 8)]), st.integers(0, U64 - 1)),
    min_size=1, max_size=3))
def test_mutated_tensor_in_pool_is_read_consistently_or_refused(
        pool: _core.Pool, fields: dict[str, Any], mutations: list[tuple[tuple[int, int], int]]) -> None:
    # keep the data small: dims of at most 2, BYTES payloads of at most 4 KiB beyond the prefixes
    shape = [min(d, 2) for d in fields["shape"]]
    size = ITEMSIZE[fields["dtype"]]
    byte_size = math.prod(shape) * (size or 4) + (0 if size else fields["byte_size"] % 4096)
    fields = dict(fields, shape=shape, byte_size=byte_size, data_handle=0)
    handle, data_handle = write_tensor(pool, **fields)
    try:
        size = _core.tensor_header_bytes(len(fields["name"].encode()), len(fields["shape"]))
        buf = bytearray(pool.view(handle, size))
        for (off, width), value in mutations:
            if off + width <= size:
                buf[off:off + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
        write_and_read_back(pool, handle, bytes(buf))
    finally:
        pool.free(handle)
    pool.check()


def test_written_tensor_reads_back_with_inline_data_handle(pool: _core.Pool) -> None:
    handle, data_handle = write_tensor(pool, "INPUT0", DataType.INT16, [3, 5], 30)
    try:
        assert data_handle == handle + _core.tensor_header_bytes(len("INPUT0"), 2)
        info = _core.read_tensor(pool, handle)
        assert (info.name, info.dtype, info.shape, info.byte_size, info.data_handle) == (
            "INPUT0", DataType.INT16, (3, 5), 30, data_handle)
        assert pool.allocation_size(handle) >= (data_handle - handle) + 30
    finally:
        pool.free(handle)


SEGMENT0 = 1 << 20  # the pool fixture's first segment


@pytest.mark.parametrize("memory_type", [MemoryType.CPU, MemoryType.CPU_PINNED])
@pytest.mark.parametrize(
    "data_handle, dtype, shape, byte_size",
    [
        (_core.make_handle(0, 64), DataType.FP32, [4], 16),               # inside the pool header
        (_core.make_handle(0, SEGMENT0), DataType.FP32, [4], 16),         # just past the segment
        (_core.make_handle(0, SEGMENT0 - 8), DataType.FP32, [4], 16),     # straddles the end
        (_core.make_handle(0, (1 << 48) - 1), DataType.UINT8, [1], 1),    # largest offset
        (_core.make_handle(1, 4096), DataType.FP32, [4], 16),             # a segment the pool lacks
        (_core.make_handle(255, 0), DataType.FP32, [4], 16),
        ((1 << 64) - 1, DataType.FP32, [4], 16),                          # segment beyond the limit
        (_core.make_handle(0, 8192), DataType.BYTES, [1], 1 << 40),       # huge BYTES payload
        (_core.make_handle(0, 8192), DataType.BYTES, [1], U64 - 1),       # handle + size overflows
    ],
)
def test_header_whose_data_lies_outside_the_pool_is_rejected_by_read_tensor(
        pool: _core.Pool, memory_type: MemoryType, data_handle: int, dtype: DataType, shape: list[int],
        byte_size: int) -> None:
    handle, got = write_tensor(pool, "x", dtype, shape, byte_size, memory_type=memory_type,
                                     data_handle=data_handle)
    try:
        assert got == data_handle
        with pytest.raises(_core.InvalidHandleError):
            _core.read_tensor(pool, handle)
    finally:
        pool.free(handle)


def test_forged_data_handle_poked_into_a_valid_header_is_rejected(pool: _core.Pool) -> None:
    handle, data_handle = write_tensor(pool, "x", DataType.FP64, [8], 64)
    try:
        assert _core.read_tensor(pool, handle).data_handle == data_handle
        field = np.frombuffer(pool.view(handle + 32, 8), np.uint64)
        for forged in (0, _core.make_handle(0, SEGMENT0 - 32), _core.make_handle(7, 4480)):
            field[0] = forged  # null; the segment's last 32 bytes (64 do not fit); a missing segment
            with pytest.raises(_core.InvalidHandleError):
                _core.read_tensor(pool, handle)
        field[0] = data_handle
        assert _core.read_tensor(pool, handle).data_handle == data_handle
    finally:
        pool.free(handle)


@pytest.mark.parametrize("handle", [0, _core.make_handle(0, 64), _core.make_handle(0, SEGMENT0 - 64),
                                    _core.make_handle(3, 4480), (1 << 64) - 1])
def test_read_tensor_on_a_handle_outside_the_pool_raises_invalid_handle(pool: _core.Pool, handle: int) -> None:
    with pytest.raises(_core.InvalidHandleError):
        _core.read_tensor(pool, handle)


def test_read_tensor_on_memory_that_is_not_a_tensor_raises_format_error(pool: _core.Pool) -> None:
    handle = pool.allocate(256)
    try:
        np.frombuffer(pool.view(handle, 256), np.uint8)[:] = 0
        with pytest.raises(_core.FormatError, match="does not hold a tensor header"):
            _core.read_tensor(pool, handle)
    finally:
        pool.free(handle)
