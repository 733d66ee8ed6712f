"""The data of one KServe v2 HTTP tensor: the wire datatypes, binary data as zero-copy views of
the request body, and JSON ``data`` as arrays, checked as Triton's HTTP server checks them
(``src/http_server.cc``), with its wording."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from stubhost import _core
from stubhost.host.errors import InferenceError
from stubhost.tensor import storage_dtype

MAX_DIMS = 32
"""Largest shape rank, and deepest ``data`` nesting, a request may use (numpy 1.x's own limit)."""

# Triton's JSON accessor messages (triton/common/triton_json.h), so errors read like Triton's.
NOT_ARRAY = "attempt to access JSON non-array as array"
NOT_OBJECT = "attempt to access JSON non-object as object"
NOT_STRING = "attempt to access JSON non-string as string"
NOT_BOOL = "attempt to access JSON non-boolean as boolean"
NOT_INT = "attempt to access JSON non-signed-integer as signed-integer"
NOT_UINT = "attempt to access JSON non-unsigned-integer as unsigned-integer"
NOT_NUMBER = "attempt to access JSON non-number as double"


def _wire_dtypes() -> dict[str, tuple[np.dtype, int]]:
    """KServe datatype name -> (little-endian numpy dtype, bytes per element; 0 for BYTES).

    Derived from the existing tables (``_core``'s names and sizes, ``stubhost.tensor``'s numpy
    dtypes) rather than written out again. BF16 has no numpy dtype: it travels as uint16 bits.
    """
    table: dict[str, tuple[np.dtype, int]] = {}
    for key, member in _core.DataType.__members__.items():
        if key == "INVALID":
            continue
        dtype = storage_dtype(member)
        table[_core.dtype_name(member)] = (dtype.newbyteorder("<"), _core.dtype_size(member))
    return table


WIRE_DTYPES = _wire_dtypes()

# Integer datatypes' bounds, looked up once (np.iinfo costs most of a microsecond per call).
_INT_RANGES = {dtype: (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
               for dtype, _ in WIRE_DTYPES.values() if dtype.kind in "iu"}
# The largest finite value of each narrower float datatype, which JSON numbers are cast to.
_FLOAT_MAX = {dtype: float(np.finfo(dtype).max) for dtype, _ in WIRE_DTYPES.values()
              if dtype.kind == "f" and dtype.itemsize < 8}
_SMALL_DATA = 64
"""Up to this many JSON numbers, the codec checks with min() and max() that none overflows its
float type, which costs less than the 2 µs of ``np.errstate``; beyond, ``np.errstate`` does."""


def invalid(message: str) -> InferenceError:
    """The error of a malformed request."""
    return InferenceError("INVALID_ARG", message)


def binary_tensor(
    body: memoryview,
    offset: int,
    size: int,
    name: str,
    dtype: np.dtype,
    itemsize: int,
    shape: list[int] | tuple[int, ...],
    count: int,
    model_name: str,
) -> np.ndarray:
    """An input's binary data, the ``size`` bytes at ``offset`` in ``body``: a zero-copy view,
    or for BYTES an object array of bytes."""
    if itemsize == 0:
        return _decode_bytes(body[offset : offset + size], name, count, model_name).reshape(shape)
    expected = count * itemsize
    if size != expected:
        raise invalid(
            f"input byte size mismatch for input '{name}' for model '{model_name}'. "
            f"Expected {expected}, got {size}"
        )
    # One call makes the view with its shape (frombuffer, then reshape, costs three times more).
    return np.ndarray(shape, dtype, body, offset)


def _decode_bytes(chunk: memoryview, name: str, count: int, model_name: str) -> np.ndarray:
    """Parses Triton's BYTES layout (4-byte little-endian length, then the bytes, per element),
    which must hold exactly ``count`` elements and nothing after them."""
    try:
        return _core.decode_bytes(chunk, count)
    except _core.FormatError:
        pass
    # The error path walks the buffer in Python to say what is wrong, as Triton's core does.
    where = f"for inference input '{name}' for model '{model_name}'"
    end, offset, found = chunk.nbytes, 0, 0
    while offset < end and found <= count:
        if end - offset < 4:
            raise invalid(
                f"incomplete string length indicator {where}, expecting 4 bytes but only "
                f"{end - offset} bytes available"
            )
        (length,) = struct.unpack_from("<I", chunk, offset)
        offset += 4 + length
        if offset > end:
            break
        found += 1
    if found > count:
        raise invalid(f"unexpected number of string elements {found} {where}, expecting {count}")
    raise invalid(f"expected {count} string elements {where}, got {found}")


def _flatten(items: list[Any], depth: int = 1) -> list[Any]:
    """Row-major flattening of nested ``data`` lists; rows of scalars are copied at C speed."""
    if list not in set(map(type, items)):
        return items
    if depth >= MAX_DIMS:
        raise invalid(f"Unable to parse 'data': nested deeper than {MAX_DIMS} levels")
    flat: list[Any] = []
    for item in items:
        if type(item) is list:
            flat.extend(_flatten(item, depth + 1))
        else:
            flat.append(item)
    return flat


def json_tensor(
    data: Any, name: str, datatype: str, dtype: np.dtype, shape: list[int], count: int
) -> np.ndarray:
    """An input's JSON ``data`` (flat or nested, row-major) as an array of ``shape``."""
    if datatype == "BF16":
        raise invalid(
            "receiving BF16 data via JSON is not supported. Please use the binary data format "
            f"for input {name}"
        )
    if type(data) is not list:
        raise invalid(f"Unable to parse 'data': {NOT_ARRAY}")
    kinds = set(map(type, data))
    flat = data
    if list in kinds:  # nested
        flat = _flatten(data)
        kinds = set(map(type, flat))
    if len(flat) != count:
        raise invalid("Unable to parse 'data': Shape does not match true shape of 'data' field")
    kind = dtype.kind
    if kind == "b":
        if kinds - {bool}:
            raise invalid(f"Unable to parse 'data': {NOT_BOOL}")
        array = np.array(flat, dtype=dtype)
    elif kind in "iu":
        if kinds - {int}:
            raise invalid(f"Unable to parse 'data': {NOT_INT if kind == 'i' else NOT_UINT}")
        if flat:
            lowest, highest = _INT_RANGES[dtype]
            low, high = min(flat), max(flat)
            if kind == "u" and low < 0:
                raise invalid(f"Unable to parse 'data': {NOT_UINT}")
            if low < lowest or high > highest:
                bad = low if low < lowest else high
                raise invalid(f"Unable to parse 'data': {bad} is out of range for {datatype}")
        array = np.array(flat, dtype=dtype)
    elif kind == "f":
        if kinds - {int, float}:
            raise invalid(f"Unable to parse 'data': {NOT_NUMBER}")
        try:
            wide = np.array(flat, dtype=np.float64)
        except OverflowError:  # a huge integer: only the standard-library parser yields one
            raise invalid(f"Unable to parse 'data': {NOT_NUMBER}") from None
        if _fits(flat, dtype):
            array = wide.astype(dtype, copy=False)
        else:
            with np.errstate(over="ignore"):  # like Triton's double -> float cast: inf, no error
                array = wide.astype(dtype, copy=False)
    else:  # BYTES: strings, sent on as their UTF-8 bytes
        if kinds - {str}:
            raise invalid(f"Unable to parse 'data': {NOT_STRING}")
        try:
            encoded = [s.encode() for s in flat]
        except UnicodeEncodeError as e:  # a lone surrogate escape ("\ud800")
            raise invalid(f"Unable to parse 'data': {e}") from None
        array = np.empty(count, dtype=object)
        array[:] = encoded
    return array.reshape(shape)


def _fits(flat: list[Any], dtype: np.dtype) -> bool:
    """True when casting these JSON numbers to the float ``dtype`` surely cannot overflow
    (float64, or a short list whose values all lie within the type's range)."""
    largest = _FLOAT_MAX.get(dtype)
    if largest is None:
        return True
    return 0 < len(flat) <= _SMALL_DATA and -largest <= min(flat) and max(flat) <= largest
