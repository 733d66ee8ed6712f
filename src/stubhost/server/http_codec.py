"""The HTTP/REST infer codec: KServe v2 JSON with Triton's binary tensor data extension.

``decode_infer_request`` turns an infer request body into an :class:`InferRequest` (responses
are encoded by :mod:`stubhost.server.http_response`). Neither knows about models or stubs. Malformed requests raise ``InferenceError("INVALID_ARG", ...)`` worded like
Triton's HTTP server (``src/http_server.cc``), so clients written against Triton see the same
messages. Everything read from the wire is bounded: shape rank, tensor size, ``data`` nesting.

Binary inputs are zero-copy views of the request body (read-only when the body is ``bytes``;
possibly unaligned).
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np
import orjson

from stubhost import _core
from stubhost.host.errors import InferenceError
from stubhost.server.types import (
    InferRequest,
    InputTensor,
    RequestedOutput,
    ShmRef,
)
from stubhost.tensor import storage_dtype

__all__ = [
    "DEFAULT_MAX_TENSOR_BYTES",
    "MAX_DIMS",
    "decode_infer_request",
]

DEFAULT_MAX_TENSOR_BYTES = 2**32
"""Largest tensor a request may describe, in bytes (BYTES counts 4 per element, its length prefix)."""

MAX_DIMS = 32
"""Largest shape rank, and deepest ``data`` nesting, a request may use (numpy 1.x's own limit)."""

_U64_MAX = 2**64 - 1
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1

# Triton's JSON accessor messages (triton/common/triton_json.h), so errors read like Triton's.
_NOT_ARRAY = "attempt to access JSON non-array as array"
_NOT_OBJECT = "attempt to access JSON non-object as object"
_NOT_STRING = "attempt to access JSON non-string as string"
_NOT_BOOL = "attempt to access JSON non-boolean as boolean"
_NOT_INT = "attempt to access JSON non-signed-integer as signed-integer"
_NOT_UINT = "attempt to access JSON non-unsigned-integer as unsigned-integer"
_NOT_NUMBER = "attempt to access JSON non-number as double"

_SHM_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
_INPUT_KEYS = frozenset(("binary_data_size", *_SHM_KEYS))
_OUTPUT_KEYS = frozenset(("binary_data", "classification", *_SHM_KEYS))


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


_DTYPES = _wire_dtypes()


def _invalid(message: str) -> InferenceError:
    return InferenceError("INVALID_ARG", message)


def _is_uint(value: Any) -> bool:
    """True for a JSON unsigned 64-bit integer (bool is an int in Python, but not in JSON)."""
    return type(value) is int and 0 <= value <= _U64_MAX


# --------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------


def decode_infer_request(
    model_name: str,
    model_version: str,
    body: bytes | bytearray | memoryview,
    header_length: int | None,
    *,
    max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
) -> InferRequest:
    """Decodes an infer request body.

    ``header_length`` is the ``Inference-Header-Content-Length`` header: the JSON is the first
    ``header_length`` bytes and binary tensor data follows; None means the whole body is JSON.
    No input may describe more than ``max_tensor_bytes`` bytes of data, whatever its source.
    Raises ``InferenceError("INVALID_ARG", ...)`` for anything malformed.
    """
    view = memoryview(body)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")  # orjson and slicing below want plain bytes
    total = view.nbytes
    if header_length is None:
        json_end = total
    else:
        if header_length < 0 or header_length > total:
            raise _invalid(
                f"inference header size should be in range (0, {total}), got: {header_length}"
            )
        if header_length == 0:
            # Triton reads a zero-length header as a raw binary request for a single-input
            # model; the codec cannot name that input without the model's metadata.
            raise _invalid(
                "raw binary requests ('Inference-Header-Content-Length' of 0) are not supported"
            )
        json_end = header_length
    doc = _parse_json(view[:json_end])
    if not isinstance(doc, dict):
        raise _invalid("Unable to parse 'inputs': attempt to access non-existing object member 'inputs'")

    request = InferRequest(model_name=model_name, model_version=model_version)
    if "id" in doc:
        if type(doc["id"]) is not str:
            raise _invalid(f"Unable to parse 'id': {_NOT_STRING}")
        request.id = doc["id"]
    if "parameters" in doc:
        request.parameters = _request_parameters(doc["parameters"])

    reader = _BinaryReader(view[json_end:], model_name, header_length is not None)
    request.inputs = _decode_inputs(doc, reader, model_name, max_tensor_bytes)
    reader.finish()
    request.outputs = _decode_outputs(doc)
    return request


def _parse_json(buf: memoryview) -> Any:
    """Parses the JSON header; like Triton (rapidjson with kParseNanAndInfFlag) it accepts
    NaN and Infinity, which orjson rejects, by retrying with the standard library."""
    try:
        return orjson.loads(buf)
    except orjson.JSONDecodeError as e:
        error = e
    raw = bytes(buf)
    if b"NaN" in raw or b"Infinity" in raw:  # only then can the slow parser do better
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            pass
    raise _invalid(f"failed to parse the request JSON buffer: {error}") from None


def _request_parameters(params: Any) -> dict[str, Any]:
    """Checks the request-level parameters the way Triton's ParseJsonTritonParams does."""
    if not isinstance(params, dict):
        raise _invalid("failed to get request params.: attempt to get members for non-object")
    for key, value in params.items():
        if key == "sequence_id":
            if not (_is_uint(value) or type(value) is str):
                raise _invalid(f"Unable to parse 'sequence_id': {_NOT_STRING}")
        elif key in ("sequence_start", "sequence_end", "binary_data_output"):
            if type(value) is not bool:
                raise _invalid(f"Unable to parse '{key}': {_NOT_BOOL}")
        elif key in ("priority", "timeout"):
            if not _is_uint(value):
                raise _invalid(f"Unable to parse '{key}': {_NOT_UINT}")
        elif key.startswith("triton_"):
            raise _invalid(
                "parameter keys starting with 'triton_' are reserved for Triton usage and "
                "should not be specified."
            )
        elif not (
            type(value) in (str, bool, float) or (type(value) is int and _I64_MIN <= value <= _I64_MAX)
        ):
            raise _invalid(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
            )
    return dict(params)


def _tensor_parameters(entry: dict[str, Any]) -> dict[str, Any]:
    params = entry.get("parameters", {})
    if not isinstance(params, dict):
        raise _invalid(f"Unable to parse 'parameters': {_NOT_OBJECT}")
    return params


def _shm_ref(params: dict[str, Any], name: str) -> ShmRef | None:
    """The shared-memory reference in a tensor's parameters, or None; region and byte size come
    together (wording from Triton's gRPC ParseSharedMemoryParams, the HTTP server has none)."""
    has_region = "shared_memory_region" in params
    for key in ("shared_memory_offset", "shared_memory_byte_size"):
        if key in params and not has_region:
            raise _invalid(
                f"'{key}' can not be specified without 'shared_memory_region' parameter "
                f"for tensor '{name}'"
            )
    if not has_region:
        return None
    region = params["shared_memory_region"]
    if type(region) is not str:
        raise _invalid(f"Unable to parse 'shared_memory_region': {_NOT_STRING}")
    if "shared_memory_byte_size" not in params:
        raise _invalid(
            "'shared_memory_byte_size' must be specified along with 'shared_memory_region' "
            f"parameter for tensor '{name}'"
        )
    byte_size = params["shared_memory_byte_size"]
    if not _is_uint(byte_size):
        raise _invalid(f"Unable to parse 'shared_memory_byte_size': {_NOT_UINT}")
    offset = params.get("shared_memory_offset", 0)
    if not _is_uint(offset):
        raise _invalid(f"Unable to parse 'shared_memory_offset': {_NOT_UINT}")
    return ShmRef(region=region, byte_size=byte_size, offset=offset)


def _member_str(entry: dict[str, Any], key: str) -> str:
    if key not in entry:
        raise _invalid(f"Unable to parse '{key}': attempt to access non-existing object member '{key}'")
    value = entry[key]
    if type(value) is not str:
        raise _invalid(f"Unable to parse '{key}': {_NOT_STRING}")
    return value


def _member_list(entry: dict[str, Any], key: str) -> list[Any]:
    if key not in entry:
        raise _invalid(f"Unable to parse '{key}': attempt to access non-existing object member '{key}'")
    value = entry[key]
    if type(value) is not list:
        raise _invalid(f"Unable to parse '{key}': {_NOT_ARRAY}")
    return value


def _check_content_type(entry: dict[str, Any], params: dict[str, Any]) -> None:
    """Exactly one of data, binary data and shared memory (Triton's ValidateInputContentType)."""
    has_data = "data" in entry
    has_binary = "binary_data_size" in params
    has_shm = "shared_memory_region" in params
    if has_data + has_binary + has_shm == 1:
        return
    message = (
        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
        "'parameters', 'shared_memory_region' in 'parameters'. But"
    )
    if not (has_data or has_binary or has_shm):
        message += " no field is set"
    else:
        message += " set"
        message += " 'data'" if has_data else ""
        message += " 'binary_data_size'" if has_binary else ""
        message += " 'shared_memory_region'" if has_shm else ""
    raise _invalid(message)


def _shape(entry: dict[str, Any], name: str, datatype: str, item_bytes: int, limit: int) -> list[int]:
    """The shape, checked: unsigned dims, rank <= MAX_DIMS, and at most ``limit`` bytes.

    The byte bound multiplies the non-zero dims so that a zero dim cannot hide a huge one
    (numpy refuses such shapes too); Python ints cannot overflow, and the product stops early.
    """
    shape = _member_list(entry, "shape")
    if len(shape) > MAX_DIMS:
        raise _invalid(
            f"Unable to parse 'shape': input '{name}' has {len(shape)} dimensions, more than "
            f"the {MAX_DIMS} supported"
        )
    if not all(map(_is_uint, shape)):
        raise _invalid(f"Unable to parse 'shape': {_NOT_UINT}")
    nbytes = item_bytes
    for dim in shape:
        if dim:
            nbytes *= dim
            if nbytes > limit:
                raise _invalid(
                    f"input '{name}' with shape {_dims(shape)} and datatype {datatype} is too "
                    f"large: more than {limit} bytes"
                )
    return shape


def _dims(shape: list[int]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def _decode_inputs(
    doc: dict[str, Any], reader: _BinaryReader, model_name: str, limit: int
) -> list[InputTensor]:
    inputs: list[InputTensor] = []
    seen: set[str] = set()
    for entry in _member_list(doc, "inputs"):
        if not isinstance(entry, dict):
            raise _invalid(f"Unable to parse 'inputs': {_NOT_OBJECT}")
        params = _tensor_parameters(entry)
        _check_content_type(entry, params)
        name = _member_str(entry, "name")
        datatype = _member_str(entry, "datatype")
        if datatype not in _DTYPES:
            raise _invalid(f"invalid datatype for input {name}")
        dtype, itemsize = _DTYPES[datatype]
        shape = _shape(entry, name, datatype, itemsize or 4, limit)
        if name in seen:
            raise _invalid(f"input '{name}' already exists in request")
        seen.add(name)
        count = math.prod(shape)
        tensor = InputTensor(
            name=name,
            datatype=datatype,
            shape=shape,
            parameters={k: v for k, v in params.items() if k not in _INPUT_KEYS},
        )
        # Checked on every input, so that a stray shared_memory_byte_size/offset is an error.
        tensor.shm = _shm_ref(params, name)
        if "binary_data_size" in params:
            size = params["binary_data_size"]
            if not _is_uint(size):
                raise _invalid(f"Unable to parse 'binary_data_size': {_NOT_UINT}")
            chunk = reader.take(name, size)
            tensor.data = _binary_tensor(chunk, name, datatype, dtype, itemsize, shape, count, model_name)
        elif tensor.shm is None:
            tensor.data = _json_tensor(entry["data"], name, datatype, dtype, shape, count)
        inputs.append(tensor)
    return inputs


class _BinaryReader:
    """Hands out the binary section after the JSON header, in input order."""

    __slots__ = ("_has_header", "_model_name", "_offset", "_view")

    def __init__(self, view: memoryview, model_name: str, has_header: bool) -> None:
        self._view = view
        self._offset = 0
        self._model_name = model_name
        self._has_header = has_header

    def take(self, name: str, size: int) -> memoryview:
        if size and not self._has_header:
            raise _invalid(
                "must specify valid 'Infer-Header-Content-Length' in request header and "
                "'binary_data_size' when passing inputs in binary data format"
            )
        start, end = self._offset, self._offset + size
        if end > self._view.nbytes:
            raise _invalid(
                f"unexpected size for input '{name}', expecting {end - self._view.nbytes} "
                f"additional bytes for model '{self._model_name}'"
            )
        self._offset = end
        return self._view[start:end]

    def finish(self) -> None:
        if self._offset != self._view.nbytes:
            raise _invalid(f"unexpected additional input data for model '{self._model_name}'")


def _binary_tensor(
    chunk: memoryview,
    name: str,
    datatype: str,
    dtype: np.dtype,
    itemsize: int,
    shape: list[int],
    count: int,
    model_name: str,
) -> np.ndarray:
    """An input's binary data: a zero-copy view, or for BYTES an object array of bytes."""
    if itemsize == 0:
        return _decode_bytes(chunk, name, count, model_name).reshape(shape)
    expected = count * itemsize
    if chunk.nbytes != expected:
        raise _invalid(
            f"input byte size mismatch for input '{name}' for model '{model_name}'. "
            f"Expected {expected}, got {chunk.nbytes}"
        )
    return np.frombuffer(chunk, dtype=dtype).reshape(shape)


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
            raise _invalid(
                f"incomplete string length indicator {where}, expecting 4 bytes but only "
                f"{end - offset} bytes available"
            )
        (length,) = struct.unpack_from("<I", chunk, offset)
        offset += 4 + length
        if offset > end:
            break
        found += 1
    if found > count:
        raise _invalid(f"unexpected number of string elements {found} {where}, expecting {count}")
    raise _invalid(f"expected {count} string elements {where}, got {found}")


def _flatten(items: list[Any], depth: int = 1) -> list[Any]:
    """Row-major flattening of nested ``data`` lists; rows of scalars are copied at C speed."""
    if list not in set(map(type, items)):
        return items
    if depth >= MAX_DIMS:
        raise _invalid(f"Unable to parse 'data': nested deeper than {MAX_DIMS} levels")
    flat: list[Any] = []
    for item in items:
        if type(item) is list:
            flat.extend(_flatten(item, depth + 1))
        else:
            flat.append(item)
    return flat


def _json_tensor(
    data: Any, name: str, datatype: str, dtype: np.dtype, shape: list[int], count: int
) -> np.ndarray:
    """An input's JSON ``data`` (flat or nested, row-major) as an array of ``shape``."""
    if datatype == "BF16":
        raise _invalid(
            "receiving BF16 data via JSON is not supported. Please use the binary data format "
            f"for input {name}"
        )
    if type(data) is not list:
        raise _invalid(f"Unable to parse 'data': {_NOT_ARRAY}")
    flat = _flatten(data)
    if len(flat) != count:
        raise _invalid("Unable to parse 'data': Shape does not match true shape of 'data' field")
    kinds = set(map(type, flat))
    kind = dtype.kind
    if kind == "b":
        if kinds - {bool}:
            raise _invalid(f"Unable to parse 'data': {_NOT_BOOL}")
        array = np.array(flat, dtype=dtype)
    elif kind in "iu":
        if kinds - {int}:
            raise _invalid(f"Unable to parse 'data': {_NOT_INT if kind == 'i' else _NOT_UINT}")
        if flat:
            info = np.iinfo(dtype)
            low, high = min(flat), max(flat)
            if kind == "u" and low < 0:
                raise _invalid(f"Unable to parse 'data': {_NOT_UINT}")
            if low < info.min or high > info.max:
                bad = low if low < info.min else high
                raise _invalid(f"Unable to parse 'data': {bad} is out of range for {datatype}")
        array = np.array(flat, dtype=dtype)
    elif kind == "f":
        if kinds - {int, float}:
            raise _invalid(f"Unable to parse 'data': {_NOT_NUMBER}")
        try:
            wide = np.array(flat, dtype=np.float64)
        except OverflowError:  # a huge integer: only the standard-library parser yields one
            raise _invalid(f"Unable to parse 'data': {_NOT_NUMBER}") from None
        with np.errstate(over="ignore"):  # like Triton's double -> float cast: inf, no error
            array = wide.astype(dtype, copy=False)
    else:  # BYTES: strings, sent on as their UTF-8 bytes
        if kinds - {str}:
            raise _invalid(f"Unable to parse 'data': {_NOT_STRING}")
        try:
            encoded = [s.encode() for s in flat]
        except UnicodeEncodeError as e:  # a lone surrogate escape ("\ud800")
            raise _invalid(f"Unable to parse 'data': {e}") from None
        array = np.empty(count, dtype=object)
        array[:] = encoded
    return array.reshape(shape)


def _decode_outputs(doc: dict[str, Any]) -> list[RequestedOutput]:
    if "outputs" not in doc:
        return []
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for entry in _member_list(doc, "outputs"):
        if not isinstance(entry, dict):
            raise _invalid(f"Unable to parse 'outputs': {_NOT_OBJECT}")
        params = _tensor_parameters(entry)
        binary = params.get("binary_data")
        if binary is not None and type(binary) is not bool:
            raise _invalid(f"Unable to parse 'binary_data': {_NOT_BOOL}")
        if "shared_memory_region" in params:  # Triton's ValidateOutputParameter
            if "classification" in params:
                raise _invalid("Output can't set both 'shared_memory_region' and 'classification'")
            if binary:
                raise _invalid("Output can't set both 'shared_memory_region' and 'binary_data'")
        name = _member_str(entry, "name")
        if name in seen:
            raise _invalid(f"output '{name}' already requested")
        seen.add(name)
        classes = params.get("classification", 0)
        if not _is_uint(classes):
            raise _invalid(f"Unable to set 'classification': {_NOT_UINT}")
        outputs.append(
            RequestedOutput(
                name=name,
                binary_data=binary,
                shm=_shm_ref(params, name),
                classification=classes,
                parameters={k: v for k, v in params.items() if k not in _OUTPUT_KEYS},
            )
        )
    return outputs
