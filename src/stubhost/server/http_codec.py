"""The HTTP/REST infer codec: KServe v2 JSON with Triton's binary tensor data extension.

``decode_infer_request`` turns an infer request body into an :class:`InferRequest` (responses
are encoded by :mod:`stubhost.server.http_response`; each tensor's data is decoded by
:mod:`stubhost.server.http_tensors`). ``decode_raw_request`` decodes Triton's raw binary request
(no JSON at all), for which the caller passes the model's configuration; otherwise none knows
about models or stubs. Malformed requests raise
``InferenceError("INVALID_ARG", ...)`` worded like Triton's HTTP server (``src/http_server.cc``), so clients written against Triton see the same
messages. Everything read from the wire is bounded: shape rank, tensor size, ``data`` nesting.

Binary inputs are zero-copy views of the request body (read-only when the body is ``bytes``;
possibly unaligned). A header that repeats is decoded once and then served from a template
(see "Header templates" below).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from stubhost.config.dtypes import config_dtype_to_triton
from stubhost.server.http_tensors import (
    MAX_DIMS,
    NOT_ARRAY,
    NOT_BOOL,
    NOT_OBJECT,
    NOT_STRING,
    NOT_UINT,
    WIRE_DTYPES,
    binary_tensor,
    invalid,
    json_tensor,
)
from stubhost.server.types import (
    InferRequest,
    InputTensor,
    RequestedOutput,
    ShmRef,
)

__all__ = [
    "DEFAULT_MAX_TENSOR_BYTES",
    "MAX_DIMS",
    "decode_infer_request",
    "decode_raw_request",
]

DEFAULT_MAX_TENSOR_BYTES = 2**32
"""Largest tensor a request may describe, in bytes (BYTES counts 4 per element, its length prefix)."""

_U64_MAX = 2**64 - 1
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1

_SHM_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
_INPUT_KEYS = frozenset(("binary_data_size", *_SHM_KEYS))
_OUTPUT_KEYS = frozenset(("binary_data", "classification", *_SHM_KEYS))
# Tensor parameters with only these keys need no shared-memory, classification or extra-parameter
# handling: the common request skips that work (a few hundred ns per tensor).
_PLAIN_INPUT_KEYS = frozenset(("binary_data_size",))
_PLAIN_OUTPUT_KEYS = frozenset(("binary_data",))


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
            raise invalid(
                f"inference header size should be in range (0, {total}), got: {header_length}"
            )
        if header_length == 0:
            # Triton reads a zero-length header as a raw binary request: without the model's
            # configuration its input has no name, so the caller decodes it with decode_raw_request.
            raise invalid(
                "raw binary requests ('Inference-Header-Content-Length' of 0) are decoded by "
                "decode_raw_request, with the model's configuration"
            )
        json_end = header_length
    header = None
    if json_end <= _TEMPLATE_HEADER_BYTES:
        header = body if json_end == total and type(body) is bytes else bytes(view[:json_end])
        template = _templates.get(header)
        if isinstance(template, _Template) and template.fits(total - json_end, max_tensor_bytes):
            return template.request(model_name, model_version, view, json_end)
    doc = _parse_json(view[:json_end])
    if not isinstance(doc, dict):
        raise invalid("Unable to parse 'inputs': attempt to access non-existing object member 'inputs'")

    request_id = doc.get("id", "")
    if type(request_id) is not str:
        raise invalid(f"Unable to parse 'id': {NOT_STRING}")
    parameters = _request_parameters(doc["parameters"]) if "parameters" in doc else {}

    reader = _BinaryReader(view, json_end, model_name, header_length is not None)
    inputs = _decode_inputs(doc, reader, model_name, max_tensor_bytes)
    reader.finish()
    outputs = _decode_outputs(doc)
    request = InferRequest(model_name, model_version, request_id, parameters, inputs, outputs)
    if header is not None:
        _remember(header, doc, request, total - json_end, max_tensor_bytes)
    return request


_NO_ID = "[request id: <id_unknown>] "
"""How Triton's core starts its errors for a request without an id (a raw request has none)."""


def decode_raw_request(
    model_name: str,
    model_version: str,
    body: bytes | bytearray | memoryview,
    config: Mapping[str, Any],
    *,
    max_tensor_bytes: int = DEFAULT_MAX_TENSOR_BYTES,
) -> InferRequest:
    """Decodes Triton's raw binary request (``Inference-Header-Content-Length: 0``): the whole
    body is the data of the model's only input, whose name, datatype and shape come from the
    model ``config`` (its JSON form), as Triton's core deduces them (``InferenceRequest::Normalize``).

    The shape is the configured dims, after a batch dimension of 1 when ``max_batch_size`` is
    not 0; one variable-sized dim takes the element count the byte size gives (rounded down:
    a size that is not a whole number of elements then fails the same byte-size check as any
    binary input). A BYTES input must have shape [1]: the body is its one element, with no
    length prefix. The request has no id, no parameters and asks for every output.
    Raises ``InferenceError("INVALID_ARG", ...)`` with Triton's wording.
    """
    view = memoryview(body)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    entries = config.get("input") or []
    if len(entries) != 1:
        raise invalid(
            f"{_NO_ID}Raw request must only have 1 input (found 1) to be deduced but got "
            f"{len(entries)} inputs in '{model_name}' model configuration"
        )
    entry = entries[0]
    name = str(entry["name"])
    datatype = config_dtype_to_triton(str(entry.get("data_type", "TYPE_INVALID")))
    dtype, itemsize = WIRE_DTYPES[datatype]
    shape = [1] if int(config.get("max_batch_size", 0)) != 0 else []
    variable = -1
    count = 1
    for dim in map(int, entry.get("dims", [])):
        if dim == -1:
            if variable != -1:
                raise invalid(
                    f"{_NO_ID}The shape of the raw input '{name}' can not be deduced because there "
                    "are more than one variable-sized dimension"
                )
            variable = len(shape)
        else:
            count *= dim
        shape.append(dim)
    total = view.nbytes
    if itemsize == 0:  # BYTES: Triton prepends the length itself, the body is one element
        if variable != -1 or count != 1:
            raise invalid(
                f"{_NO_ID}For BYTE datatype raw input '{name}', the model must have input shape [1]"
            )
        _check_raw_size(name, shape, datatype, total + 4, max_tensor_bytes)
        data = np.empty(1, dtype=object)
        data[0] = body if type(body) is bytes else view.tobytes()
        data = data.reshape(shape)
    else:
        if variable != -1:
            shape[variable] = total // count // itemsize if count else 0
        _check_raw_size(name, shape, datatype, total, max_tensor_bytes)
        data = binary_tensor(view, 0, total, name, dtype, itemsize, shape, math.prod(shape), model_name)
    return InferRequest(model_name, model_version, "", {}, [InputTensor(name, datatype, shape, data, None, {})], [])


def _check_raw_size(name: str, shape: list[int], datatype: str, size: int, limit: int) -> None:
    """A raw input is held to the tensor size limit of every input (the body limit comes first)."""
    if size > limit:
        raise invalid(
            f"input '{name}' with shape {_dims(shape)} and datatype {datatype} is too large: more "
            f"than {limit} bytes"
        )


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
    raise invalid(f"failed to parse the request JSON buffer: {error}") from None


def _request_parameters(params: Any) -> dict[str, Any]:
    """Checks the request-level parameters the way Triton's ParseJsonTritonParams does."""
    if not isinstance(params, dict):
        raise invalid("failed to get request params.: attempt to get members for non-object")
    for key, value in params.items():
        if key == "sequence_id":
            if not (_is_uint(value) or type(value) is str):
                raise invalid(f"Unable to parse 'sequence_id': {NOT_STRING}")
        elif key in ("sequence_start", "sequence_end", "binary_data_output"):
            if type(value) is not bool:
                raise invalid(f"Unable to parse '{key}': {NOT_BOOL}")
        elif key in ("priority", "timeout"):
            if not _is_uint(value):
                raise invalid(f"Unable to parse '{key}': {NOT_UINT}")
        elif key.startswith("triton_"):
            raise invalid(
                "parameter keys starting with 'triton_' are reserved for Triton usage and "
                "should not be specified."
            )
        elif not (
            type(value) in (str, bool, float) or (type(value) is int and _I64_MIN <= value <= _I64_MAX)
        ):
            raise invalid(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
            )
    return dict(params)


def _tensor_parameters(entry: dict[str, Any]) -> dict[str, Any]:
    params = entry.get("parameters", {})
    if not isinstance(params, dict):
        raise invalid(f"Unable to parse 'parameters': {NOT_OBJECT}")
    return params


def _shm_ref(params: dict[str, Any], name: str) -> ShmRef | None:
    """The shared-memory reference in a tensor's parameters, or None; region and byte size come
    together (wording from Triton's gRPC ParseSharedMemoryParams, the HTTP server has none)."""
    has_region = "shared_memory_region" in params
    for key in ("shared_memory_offset", "shared_memory_byte_size"):
        if key in params and not has_region:
            raise invalid(
                f"'{key}' can not be specified without 'shared_memory_region' parameter "
                f"for tensor '{name}'"
            )
    if not has_region:
        return None
    region = params["shared_memory_region"]
    if type(region) is not str:
        raise invalid(f"Unable to parse 'shared_memory_region': {NOT_STRING}")
    if "shared_memory_byte_size" not in params:
        raise invalid(
            "'shared_memory_byte_size' must be specified along with 'shared_memory_region' "
            f"parameter for tensor '{name}'"
        )
    byte_size = params["shared_memory_byte_size"]
    if not _is_uint(byte_size):
        raise invalid(f"Unable to parse 'shared_memory_byte_size': {NOT_UINT}")
    offset = params.get("shared_memory_offset", 0)
    if not _is_uint(offset):
        raise invalid(f"Unable to parse 'shared_memory_offset': {NOT_UINT}")
    return ShmRef(region=region, byte_size=byte_size, offset=offset)


def _member_str(entry: dict[str, Any], key: str) -> str:
    if key not in entry:
        raise invalid(f"Unable to parse '{key}': attempt to access non-existing object member '{key}'")
    value = entry[key]
    if type(value) is not str:
        raise invalid(f"Unable to parse '{key}': {NOT_STRING}")
    return value


def _member_list(entry: dict[str, Any], key: str) -> list[Any]:
    if key not in entry:
        raise invalid(f"Unable to parse '{key}': attempt to access non-existing object member '{key}'")
    value = entry[key]
    if type(value) is not list:
        raise invalid(f"Unable to parse '{key}': {NOT_ARRAY}")
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
    raise invalid(message)


def _shape(
    entry: dict[str, Any], name: str, datatype: str, item_bytes: int, limit: int
) -> tuple[list[int], int]:
    """The shape, checked: unsigned dims, rank <= MAX_DIMS, and at most ``limit`` bytes; and
    its element count.

    The byte bound multiplies the non-zero dims so that a zero dim cannot hide a huge one
    (numpy refuses such shapes too); Python ints cannot overflow, and the product stops early.
    A dim that is not unsigned is reported before the size, whichever comes first in the shape.
    """
    shape = _member_list(entry, "shape")
    if len(shape) > MAX_DIMS:
        raise invalid(
            f"Unable to parse 'shape': input '{name}' has {len(shape)} dimensions, more than "
            f"the {MAX_DIMS} supported"
        )
    nbytes = item_bytes
    count = 1
    for dim in shape:
        if type(dim) is not int or not 0 <= dim <= _U64_MAX:
            raise invalid(f"Unable to parse 'shape': {NOT_UINT}")
        count *= dim
        if dim:
            nbytes *= dim
            if nbytes > limit:
                if not all(map(_is_uint, shape)):
                    raise invalid(f"Unable to parse 'shape': {NOT_UINT}")
                raise invalid(
                    f"input '{name}' with shape {_dims(shape)} and datatype {datatype} is too "
                    f"large: more than {limit} bytes"
                )
    return shape, count


def _dims(shape: list[int]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def _decode_inputs(
    doc: dict[str, Any], reader: _BinaryReader, model_name: str, limit: int
) -> list[InputTensor]:
    inputs: list[InputTensor] = []
    seen: set[str] = set()
    for entry in _member_list(doc, "inputs"):
        if not isinstance(entry, dict):
            raise invalid(f"Unable to parse 'inputs': {NOT_OBJECT}")
        params = _tensor_parameters(entry)
        _check_content_type(entry, params)
        name = _member_str(entry, "name")
        datatype = _member_str(entry, "datatype")
        wire = WIRE_DTYPES.get(datatype)
        if wire is None:
            raise invalid(f"invalid datatype for input {name}")
        dtype, itemsize = wire
        shape, count = _shape(entry, name, datatype, itemsize or 4, limit)
        if name in seen:
            raise invalid(f"input '{name}' already exists in request")
        seen.add(name)
        if params.keys() <= _PLAIN_INPUT_KEYS:
            extra: dict[str, Any] = {}
            shm = None
        else:
            extra = {k: v for k, v in params.items() if k not in _INPUT_KEYS}
            # Checked on every input, so that a stray shared_memory_byte_size/offset is an error.
            shm = _shm_ref(params, name)
        data = None
        if "binary_data_size" in params:
            size = params["binary_data_size"]
            if not _is_uint(size):
                raise invalid(f"Unable to parse 'binary_data_size': {NOT_UINT}")
            offset = reader.take(name, size)
            data = binary_tensor(reader.view, offset, size, name, dtype, itemsize, shape, count, model_name)
        elif shm is None:
            data = json_tensor(entry["data"], name, datatype, dtype, shape, count)
        inputs.append(InputTensor(name, datatype, shape, data, shm, extra))
    return inputs


class _BinaryReader:
    """Hands out the binary section after the JSON header, in input order, as offsets into
    the whole body (``view``): arrays are made on the body itself, without slicing it first."""

    __slots__ = ("_has_header", "_model_name", "_offset", "view")

    def __init__(self, view: memoryview, start: int, model_name: str, has_header: bool) -> None:
        self.view = view
        self._offset = start
        self._model_name = model_name
        self._has_header = has_header

    def take(self, name: str, size: int) -> int:
        """The offset in ``view`` of the next ``size`` bytes, which are then taken."""
        if size and not self._has_header:
            raise invalid(
                "must specify valid 'Infer-Header-Content-Length' in request header and "
                "'binary_data_size' when passing inputs in binary data format"
            )
        start, end = self._offset, self._offset + size
        if end > self.view.nbytes:
            raise invalid(
                f"unexpected size for input '{name}', expecting {end - self.view.nbytes} "
                f"additional bytes for model '{self._model_name}'"
            )
        self._offset = end
        return start

    def finish(self) -> None:
        if self._offset != self.view.nbytes:
            raise invalid(f"unexpected additional input data for model '{self._model_name}'")


def _decode_outputs(doc: dict[str, Any]) -> list[RequestedOutput]:
    if "outputs" not in doc:
        return []
    outputs: list[RequestedOutput] = []
    seen: set[str] = set()
    for entry in _member_list(doc, "outputs"):
        if not isinstance(entry, dict):
            raise invalid(f"Unable to parse 'outputs': {NOT_OBJECT}")
        params = _tensor_parameters(entry)
        binary = params.get("binary_data")
        if binary is not None and type(binary) is not bool:
            raise invalid(f"Unable to parse 'binary_data': {NOT_BOOL}")
        if "shared_memory_region" in params:  # Triton's ValidateOutputParameter
            if "classification" in params:
                raise invalid("Output can't set both 'shared_memory_region' and 'classification'")
            if binary:
                raise invalid("Output can't set both 'shared_memory_region' and 'binary_data'")
        name = _member_str(entry, "name")
        if name in seen:
            raise invalid(f"output '{name}' already requested")
        seen.add(name)
        if params.keys() <= _PLAIN_OUTPUT_KEYS:
            outputs.append(RequestedOutput(name, binary, None, 0, {}))
            continue
        classes = params.get("classification", 0)
        if not _is_uint(classes):
            raise invalid(f"Unable to set 'classification': {NOT_UINT}")
        extra = {k: v for k, v in params.items() if k not in _OUTPUT_KEYS}
        outputs.append(RequestedOutput(name, binary, _shm_ref(params, name), classes, extra))
    return outputs


# --------------------------------------------------------------------------------------------
# Header templates
# --------------------------------------------------------------------------------------------
# A client sends the same JSON header request after request, only the binary data change. A
# header that decoded without error twice becomes a template: a later request with the same
# header bytes skips the JSON parse and every check of the header (about 7 µs of a two-input
# request) and only makes its arrays on its own binary section. A template holds no request
# data, and serves only a request whose binary section has the size its header describes, so
# that every error is still found, and worded, by the full decode. A header with JSON data or
# tensor parameters (any JSON, which requests must not share) gets no template; one that varies
# per request (an id, a sequence_id) is never seen twice.

_TEMPLATE_HEADER_BYTES = 2048
"""Longer headers are always decoded in full (copying and hashing one as a key costs about
0.3 µs per KiB, which a request with JSON data would pay for nothing)."""

_TEMPLATES_KEPT = 256
"""The cache is emptied when it holds this many headers, so that a client whose headers never
repeat costs a dictionary insertion per request and no more memory."""


@dataclass(frozen=True, slots=True)
class _InputTemplate:
    """A checked input of a template header: in the binary section (``size`` bytes, after the
    inputs before it), or in shared memory (``shm``)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    dtype: np.dtype
    itemsize: int  # 0: BYTES
    count: int
    size: int
    shm: ShmRef | None


@dataclass(frozen=True, slots=True)
class _Template:
    """What a header decodes to, less the binary data; ``request`` makes a new request of it."""

    id: str
    inputs: tuple[_InputTemplate, ...]
    outputs: tuple[tuple[str, bool | None, ShmRef | None, int], ...]
    parameters: dict[str, Any]  # JSON scalars (checked): each request gets a shallow copy
    binary_size: int
    max_tensor_bytes: int  # the limit the header was checked against

    def fits(self, binary_size: int, max_tensor_bytes: int) -> bool:
        """True when a request with this header and a binary section of ``binary_size`` bytes,
        under this limit, is exactly what the template holds."""
        return binary_size == self.binary_size and max_tensor_bytes == self.max_tensor_bytes

    def request(self, model_name: str, model_version: str, view: memoryview, offset: int) -> InferRequest:
        """The request with this header and the binary section at ``offset`` in ``view``
        (which has ``binary_size`` bytes there); the objects are the request's own."""
        inputs = []
        for t in self.inputs:
            data = None
            if t.shm is None:
                data = binary_tensor(view, offset, t.size, t.name, t.dtype, t.itemsize, t.shape, t.count,
                                      model_name)
                offset += t.size
            inputs.append(InputTensor(t.name, t.datatype, list(t.shape), data, t.shm, {}))
        outputs = [RequestedOutput(name, binary, shm, classes, {}) for name, binary, shm, classes in self.outputs]
        return InferRequest(model_name, model_version, self.id, dict(self.parameters), inputs, outputs)


_SEEN_ONCE = "seen once"
_NO_TEMPLATE = "no template"  # seen twice, and holds what requests cannot share
_templates: dict[bytes, _Template | str] = {}


def _remember(header: bytes, doc: dict[str, Any], request: InferRequest, binary_size: int,
              max_tensor_bytes: int) -> None:
    """Notes a header that decoded without error; the second time, makes its template."""
    seen = _templates.get(header)
    if seen is None:
        if len(_templates) >= _TEMPLATES_KEPT:
            _templates.clear()
        _templates[header] = _SEEN_ONCE
    elif seen is _SEEN_ONCE:
        _templates[header] = _template(doc, request, binary_size, max_tensor_bytes) or _NO_TEMPLATE


def _template(doc: dict[str, Any], request: InferRequest, binary_size: int,
              max_tensor_bytes: int) -> _Template | None:
    """The template of a decoded request, or None when its header holds data (JSON data) or
    what requests must not share (tensor parameters, which may be any JSON)."""
    inputs = []
    for entry, tensor in zip(doc["inputs"], request.inputs):
        if tensor.parameters or (tensor.shm is None and "data" in entry):
            return None
        dtype, itemsize = WIRE_DTYPES[tensor.datatype]
        size = entry["parameters"]["binary_data_size"] if tensor.shm is None else 0
        count = math.prod(tensor.shape)
        inputs.append(_InputTemplate(tensor.name, tensor.datatype, tuple(tensor.shape), dtype, itemsize, count,
                                     size, tensor.shm))
    if any(o.parameters for o in request.outputs):
        return None
    outputs = tuple((o.name, o.binary_data, o.shm, o.classification) for o in request.outputs)
    return _Template(request.id, tuple(inputs), outputs, dict(request.parameters), binary_size, max_tensor_bytes)
