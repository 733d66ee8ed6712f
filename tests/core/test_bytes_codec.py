"""Triton's BYTES layout (csrc/tensor/bytes_codec.h): per element a 4-byte little-endian length,
then the bytes, in C order. Checked against a hand-written reference built with ``struct``."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stubhost import _core


# ---- reference ----------------------------------------------------------------------------------
def as_element_bytes(item: Any) -> bytes:
    """What one element becomes: bytes as they are, str as UTF-8, anything else as str(x) in UTF-8."""
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    if isinstance(item, str):
        return item.encode("utf-8")
    return str(item).encode("utf-8")


def reference_encode(items: Iterable[Any]) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in map(as_element_bytes, items))


class Rejected(Exception):
    pass


def reference_parse(buf: bytes, count: int | None = None) -> list[bytes]:
    """Parses `count` elements (all of them if None); rejects truncation and leftovers."""
    out, off = [], 0
    while (off < len(buf)) if count is None else (len(out) < count):
        if len(buf) - off < 4:
            raise Rejected("no length prefix")
        (n,) = struct.unpack_from("<I", buf, off)
        off += 4
        if n > len(buf) - off:
            raise Rejected("element runs past the end")
        out.append(buf[off:off + n])
        off += n
    if off != len(buf):
        raise Rejected("trailing bytes")
    return out


# ---- strategies ---------------------------------------------------------------------------------
byte_strings = st.one_of(st.binary(max_size=48), st.just(b""), st.just(b"\0"), st.just(b"a\0b\0"))
elements = st.one_of(
    byte_strings,
    byte_strings.map(bytearray),
    st.text(max_size=24),                      # str: UTF-8
    st.integers(), st.floats(), st.booleans(), st.none(),  # anything else: str(x)
)


def decoded_list(arr: np.ndarray) -> list[bytes]:
    assert isinstance(arr, np.ndarray) and arr.dtype == object and arr.ndim == 1
    assert all(type(x) is bytes for x in arr), "decoded elements must be plain bytes"
    return list(arr)


# ---- encoding -----------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(items=st.lists(elements, max_size=20))
def test_encode_bytes_matches_hand_written_wire_layout(items: list[Any]) -> None:
    assert _core.encode_bytes(items) == reference_encode(items)


@settings(max_examples=200, deadline=None)
@given(items=st.lists(elements, max_size=20))
def test_encoded_bytes_round_trip_through_decode_and_count(items: list[Any]) -> None:
    encoded = _core.encode_bytes(items)
    assert _core.encoded_bytes_size(items) == len(encoded)
    assert _core.count_bytes_elements(encoded) == len(items)
    assert decoded_list(_core.decode_bytes(encoded, len(items))) == [as_element_bytes(x) for x in items]


@pytest.mark.parametrize(
    "items, expected",
    [
        ([], b""),
        ([b""], b"\0\0\0\0"),
        ([b"\0"], b"\1\0\0\0\0"),
        ([b"ab", b"", b"c\0d"], b"\2\0\0\0ab" + b"\0\0\0\0" + b"\3\0\0\0c\0d"),
        (["é"], b"\2\0\0\0\xc3\xa9"),
        ([7, None, 1.5, True], b"\1\0\0\x007" + b"\4\0\0\0None" + b"\3\0\0\x001.5" + b"\4\0\0\0True"),
        ([b"x" * 300], b"\x2c\x01\0\0" + b"x" * 300),  # length 300 = 0x012c, little-endian
    ],
)
def test_encode_bytes_known_layouts(items: list[Any], expected: bytes) -> None:
    assert _core.encode_bytes(items) == expected
    assert _core.encoded_bytes_size(items) == len(expected)


def test_encode_bytes_accepts_any_iterable_in_c_order() -> None:
    values = [b"a", b"bb", b"", b"d\0", b"eeeee", b"f"]
    expected = reference_encode(values)
    fortran = np.asfortranarray(np.array(values, dtype=object).reshape(2, 3))
    assert not fortran.flags.c_contiguous
    for source in (values, tuple(values), iter(values), (v for v in values),
                   np.array(values, dtype=object), fortran.ravel(order="C")):
        assert _core.encode_bytes(source) == expected
    # numpy str_ / bytes_ scalars are str / bytes
    assert _core.encode_bytes(np.array(["x", "héllo"])) == reference_encode(["x", "héllo"])
    assert _core.encode_bytes(np.array([b"x", b"yz"], dtype="S")) == reference_encode([b"x", b"yz"])
    # numpy scalars of other types go through str()
    assert _core.encode_bytes(np.array([1, 22], dtype=np.int32)) == reference_encode(["1", "22"])


def test_encode_bytes_of_a_str_that_is_not_utf8_encodable_raises_unicode_error() -> None:
    with pytest.raises(UnicodeEncodeError):
        _core.encode_bytes(["ok", "\ud800"])
    with pytest.raises(UnicodeEncodeError):
        _core.encoded_bytes_size(["\udfff"])


def test_encode_bytes_propagates_errors_from_the_iterable() -> None:
    def broken() -> Iterable[bytes]:
        yield b"a"
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        _core.encode_bytes(broken())
    with pytest.raises(TypeError):
        _core.encode_bytes(42)  # type: ignore[arg-type]


# ---- encode_bytes_into --------------------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(items=st.lists(elements, max_size=12), slack=st.integers(0, 64))
def test_encode_bytes_into_writes_the_layout_and_leaves_the_rest_alone(items: list[Any], slack: int) -> None:
    expected = reference_encode(items)
    target = bytearray(b"\xee" * (len(expected) + slack))
    assert _core.encode_bytes_into(target, items) == len(expected)
    assert bytes(target[:len(expected)]) == expected
    assert bytes(target[len(expected):]) == b"\xee" * slack


@settings(max_examples=100, deadline=None)
@given(items=st.lists(elements, min_size=1, max_size=12), data=st.data())
def test_encode_bytes_into_a_too_small_buffer_raises_format_error_and_writes_nothing(
        items: list[Any], data: st.DataObject) -> None:
    need = len(reference_encode(items))
    size = data.draw(st.integers(0, need - 1), label="buffer size")
    target = bytearray(b"\xee" * size)
    with pytest.raises(_core.FormatError, match=f"needs {need} bytes but the buffer has {size}"):
        _core.encode_bytes_into(target, items)
    assert target == bytearray(b"\xee" * size)


def test_encode_bytes_into_writes_into_numpy_and_pool_memory(pool: _core.Pool) -> None:
    items = [b"alpha", "beta", b"", b"\0\0"]
    expected = reference_encode(items)
    arr = np.zeros(len(expected) + 3, np.uint8)
    assert _core.encode_bytes_into(arr, items) == len(expected)
    assert arr[:len(expected)].tobytes() == expected and not arr[len(expected):].any()

    handle = pool.allocate(len(expected))
    try:
        view = pool.view(handle, len(expected))
        assert _core.encode_bytes_into(view, items) == len(expected)
        assert bytes(pool.view(handle, len(expected), readonly=True)) == expected
        assert decoded_list(_core.decode_bytes(view, len(items))) == [as_element_bytes(x) for x in items]
    finally:
        pool.free(handle)


def test_encode_bytes_into_a_read_only_buffer_is_refused(pool: _core.Pool) -> None:
    with pytest.raises(BufferError):
        _core.encode_bytes_into(b"\0" * 16, [b"a"])
    handle = pool.allocate(16)
    try:
        with pytest.raises(BufferError):
            _core.encode_bytes_into(pool.view(handle, 16, readonly=True), [b"a"])
    finally:
        pool.free(handle)


# ---- decoding hostile buffers -------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(items=st.lists(byte_strings, min_size=1, max_size=10))
def test_truncated_buffer_raises_format_error_at_every_length(items: list[bytes]) -> None:
    encoded = reference_encode(items)
    n = len(items)
    for k in range(len(encoded)):
        # either the parse runs out of bytes at some element, or the size check up front says so
        with pytest.raises(_core.FormatError,
                           match=rf"BYTES tensor (is truncated: element \d+ |of {k} bytes cannot hold {n} elements)"):
            _core.decode_bytes(encoded[:k], n)


@settings(max_examples=100, deadline=None)
@given(items=st.lists(byte_strings, max_size=10), extra=st.binary(min_size=1, max_size=16))
def test_trailing_bytes_after_the_last_element_raise_format_error(items: list[bytes], extra: bytes) -> None:
    with pytest.raises(_core.FormatError, match=f"BYTES tensor has {len(extra)} trailing bytes after "
                                                f"{len(items)} elements"):
        _core.decode_bytes(reference_encode(items) + extra, len(items))


@settings(max_examples=100, deadline=None)
@given(items=st.lists(byte_strings, min_size=1, max_size=10), data=st.data())
def test_wrong_element_count_raises_format_error(items: list[bytes], data: st.DataObject) -> None:
    encoded = reference_encode(items)
    fewer = data.draw(st.integers(0, len(items) - 1), label="fewer")
    with pytest.raises(_core.FormatError, match="trailing bytes"):
        _core.decode_bytes(encoded, fewer)
    more = data.draw(st.integers(len(items) + 1, len(items) + 1000), label="more")
    with pytest.raises(_core.FormatError, match=rf"(element {len(items)} of {more} has no length prefix"
                                                rf"|{len(encoded)} bytes cannot hold {more} elements)"):
        _core.decode_bytes(encoded, more)


def test_length_prefix_claiming_more_than_remains_names_both_sizes() -> None:
    buf = struct.pack("<I", 0xFFFFFFFF) + b"abc"
    with pytest.raises(_core.FormatError, match="element 0 claims 4294967295 bytes but only 3 remain"):
        _core.decode_bytes(buf, 1)
    with pytest.raises(_core.FormatError, match="runs past the end"):
        _core.count_bytes_elements(buf)
    with pytest.raises(_core.FormatError, match="ends inside a length prefix"):
        _core.count_bytes_elements(b"\1\0\0\0x\0\0")


def test_empty_buffer_holds_zero_elements() -> None:
    out = _core.decode_bytes(b"", 0)
    assert out.shape == (0,) and out.dtype == object
    assert _core.count_bytes_elements(b"") == 0
    with pytest.raises(_core.FormatError, match="trailing bytes"):
        _core.decode_bytes(b"\0\0\0\0", 0)


def test_decode_bytes_rejects_a_count_the_buffer_cannot_hold_before_allocating() -> None:
    """Regression: each element takes at least 4 bytes, so a count above len(buffer) // 4 can be
    refused up front; the count must not size an allocation first (a forged shape would make the
    decoder try to allocate terabytes, or fail with a numpy error instead of FormatError)."""
    with pytest.raises(_core.FormatError):
        _core.decode_bytes(b"\0\0\0\0", 1 << 61)


@settings(max_examples=300, deadline=None)
@given(buf=st.one_of(st.binary(max_size=64),
                     # plausible prefixes: small lengths make multi-element parses likely
                     st.lists(st.tuples(st.integers(0, 6), st.binary(max_size=6)), max_size=6).map(
                         lambda parts: b"".join(struct.pack("<I", n) + b for n, b in parts))),
       count=st.integers(0, 12))
def test_random_garbage_decodes_exactly_like_the_reference_parser(buf: bytes, count: int) -> None:
    try:
        expected = reference_parse(buf, count)
    except Rejected:
        with pytest.raises(_core.FormatError):
            _core.decode_bytes(buf, count)
    else:
        assert decoded_list(_core.decode_bytes(buf, count)) == expected
    try:
        expected_count = len(reference_parse(buf))
    except Rejected:
        with pytest.raises(_core.FormatError):
            _core.count_bytes_elements(buf)
    else:
        assert _core.count_bytes_elements(buf) == expected_count


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(buf=st.binary(min_size=1, max_size=256), count=st.integers(0, 80))
def test_garbage_in_pool_memory_decodes_like_the_reference_parser(pool: _core.Pool, buf: bytes,
                                                                  count: int) -> None:
    handle = pool.allocate(len(buf))
    try:
        view = pool.view(handle, len(buf))
        np.frombuffer(view, np.uint8)[:] = np.frombuffer(buf, np.uint8)
        try:
            expected = reference_parse(buf, count)
        except Rejected:
            with pytest.raises(_core.FormatError):
                _core.decode_bytes(view, count)
        else:
            assert decoded_list(_core.decode_bytes(view, count)) == expected
    finally:
        pool.free(handle)


def test_decode_accepts_contiguous_buffers_and_refuses_strided_ones() -> None:
    encoded = reference_encode([b"ab", b"cd"])  # 12 bytes
    for buf in (encoded, bytearray(encoded), memoryview(encoded), np.frombuffer(encoded, np.uint8),
                np.frombuffer(encoded, np.uint32).reshape(3, 1)):
        assert decoded_list(_core.decode_bytes(buf, 2)) == [b"ab", b"cd"]
        assert _core.count_bytes_elements(buf) == 2
    strided = np.frombuffer(encoded * 2, np.uint8)[::2]
    with pytest.raises(ValueError, match="contiguous"):
        _core.decode_bytes(strided, 2)
    with pytest.raises(ValueError, match="contiguous"):
        _core.count_bytes_elements(strided)


def test_decoded_elements_are_copies_not_views_of_the_buffer() -> None:
    buf = bytearray(reference_encode([b"abc"]))
    out = _core.decode_bytes(buf, 1)
    buf[4:7] = b"xyz"
    assert out[0] == b"abc"
