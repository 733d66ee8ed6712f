"""KServe v2 gRPC messages <-> :mod:`stubhost.server.types`.

:func:`decode_infer_request` turns a ``ModelInferRequest`` into an :class:`InferRequest`,
:func:`encode_infer_response` an :class:`InferResult` into a ``ModelInferResponse``. Neither knows
about models: the front end checks inputs against the model, resolves shared memory and runs the
request. Errors are ``InferenceError("INVALID_ARG", ...)`` worded like Triton's gRPC front end.

Tensor data:

- ``raw_input_contents`` holds one entry per input that does not use shared memory, in the
  order of ``inputs`` (what tritonclient sends and Triton reads). Fixed-size types become
  read-only numpy views of the ``bytes`` object protobuf hands out for the entry (protobuf copies
  a field out of the message when it is read; we add no copy of our own); BYTES (4-byte
  little-endian length, then the bytes, per element) become object arrays of ``bytes``.
- Otherwise each such input carries typed ``contents`` (int8/int16 widened to ``int_contents``,
  uint8/uint16 to ``uint_contents``); FP16 and BF16 have no typed field and travel only raw.
- BF16 arrays are numpy ``uint16`` words (numpy has no bfloat16), as elsewhere in stubhost.
- Responses carry one ``raw_output_contents`` entry per output, in order, empty for an output
  written to shared memory: tritonclient's ``InferResult.as_numpy`` finds an output's bytes by
  its position among the outputs, and Triton's server likewise adds an entry for every output.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping
from typing import Any

import numpy as np

from stubhost import _core
from stubhost.host.errors import InferenceError
from stubhost.server import grpc_service_pb2 as pb
from stubhost.server.types import (
    InferRequest,
    InferResult,
    InputTensor,
    OutputTensor,
    RequestedOutput,
    ShmRef,
)

__all__ = ["decode_infer_request", "decode_parameters", "encode_infer_response", "encode_parameters"]

# Fixed-size datatypes: their numpy dtype (little-endian, as on the wire).
_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "INT8": np.dtype("i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "UINT8": np.dtype("u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),
}
_DATATYPES = frozenset(_NUMPY) | {"BYTES"}

# Each typed contents field and the datatype Triton takes it to hold. int_contents/uint_contents
# also carry the narrower integers (see _content_datatype).
_CONTENT_FIELDS: tuple[tuple[str, str], ...] = (
    ("bool_contents", "BOOL"), ("int_contents", "INT32"), ("int64_contents", "INT64"),
    ("uint_contents", "UINT32"), ("uint64_contents", "UINT64"), ("fp32_contents", "FP32"),
    ("fp64_contents", "FP64"), ("bytes_contents", "BYTES"),
)
_FIELD_DATATYPE = dict(_CONTENT_FIELDS)
_NARROW = {"int_contents": ("INT8", "INT16"), "uint_contents": ("UINT8", "UINT16")}

_SHM_REGION = "shared_memory_region"
_SHM_BYTE_SIZE = "shared_memory_byte_size"
_SHM_OFFSET = "shared_memory_offset"
_CONSUMED_INPUT = frozenset({_SHM_REGION, _SHM_BYTE_SIZE, _SHM_OFFSET})
_CONSUMED_OUTPUT = _CONSUMED_INPUT | {"classification", "binary_data"}

_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1


def _invalid(message: str) -> InferenceError:
    return InferenceError("INVALID_ARG", message)


# ---- parameters ---------------------------------------------------------------------------------

def decode_parameters(params: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """A ``map<string, InferParameter>`` as plain Python values (bool, int, str, float).
    Raises InferenceError(INVALID_ARG) for a parameter with no value set."""
    out: dict[str, Any] = {}
    for key, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        if kind is None:
            raise _invalid(f"invalid value type for '{key}' parameter, no value was set")
        out[key] = getattr(param, kind)
    return out


def encode_parameters(values: Mapping[str, Any], target: MutableMapping[str, pb.InferParameter]) -> None:
    """Writes Python values into a ``map<string, InferParameter>``: bool, str, float, and int
    (int64, or uint64 above the int64 range). Raises TypeError/ValueError for anything else,
    since result parameters come from our own code, not from a client."""
    for key, value in values.items():
        param = target[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, (int, np.integer)):
            value = int(value)
            if _INT64_MIN <= value <= _INT64_MAX:
                param.int64_param = value
            elif _INT64_MAX < value <= _UINT64_MAX:
                param.uint64_param = value
            else:
                raise ValueError(f"parameter '{key}' = {value} does not fit in 64 bits")
        elif isinstance(value, (float, np.floating)):
            param.double_param = float(value)
        elif isinstance(value, str):
            param.string_param = value
        else:
            raise TypeError(f"parameter '{key}' has unsupported type {type(value).__name__}")


def _shm_ref(tensor: Any) -> ShmRef | None:
    """The shared-memory parameters of an input or requested output (Triton's rules and words)."""
    params = tensor.parameters
    if not params:
        return None
    name = tensor.name
    if _SHM_REGION not in params:
        for key in (_SHM_OFFSET, _SHM_BYTE_SIZE):
            if key in params:
                raise _invalid(f"'{key}' can not be specified without '{_SHM_REGION}' parameter for tensor "
                               f"'{name}'")
        return None
    region = params[_SHM_REGION]
    if region.WhichOneof("parameter_choice") != "string_param":
        raise _invalid(f"invalid value type for '{_SHM_REGION}' parameter for tensor '{name}', expected "
                       "string_param.")
    offset = 0
    if _SHM_OFFSET in params:
        param = params[_SHM_OFFSET]
        if param.WhichOneof("parameter_choice") != "int64_param":
            raise _invalid(f"invalid value type for '{_SHM_OFFSET}' parameter for tensor '{name}', expected "
                           "int64_param.")
        offset = param.int64_param
    if _SHM_BYTE_SIZE not in params:
        raise _invalid(f"'{_SHM_BYTE_SIZE}' must be specified along with '{_SHM_REGION}' parameter for tensor "
                       f"'{name}'")
    param = params[_SHM_BYTE_SIZE]
    if param.WhichOneof("parameter_choice") != "int64_param":
        raise _invalid(f"invalid value type for '{_SHM_BYTE_SIZE}' parameter for tensor '{name}', expected "
                       "int64_param.")
    byte_size = param.int64_param
    # Triton reads these into unsigned sizes; a negative one can only be a client bug.
    if offset < 0 or byte_size < 0:
        raise _invalid(f"'{_SHM_OFFSET}' and '{_SHM_BYTE_SIZE}' parameters for tensor '{name}' must not be "
                       "negative")
    return ShmRef(region.string_param, byte_size, offset)


# ---- requests -----------------------------------------------------------------------------------

def decode_infer_request(msg: pb.ModelInferRequest) -> InferRequest:
    """The request's inputs, requested outputs and parameters, with tensor data decoded (numpy
    views of the raw input bytes where the datatype allows). Raises InferenceError(INVALID_ARG)."""
    model = msg.model_name
    raw = msg.raw_input_contents
    inputs: list[InputTensor] = []
    raw_index = 0
    for tensor in msg.inputs:
        shape = list(tensor.shape)
        _check_input_header(tensor.name, tensor.datatype, shape, model)
        shm = params = None
        if tensor.parameters:  # most requests carry none: skip the map's walks
            shm = _shm_ref(tensor)
            params = {k: v for k, v in decode_parameters(tensor.parameters).items() if k not in _CONSUMED_INPUT}
        data = None
        if shm is not None:
            if tensor.HasField("contents"):
                raise _invalid(f"unexpected 'content' provided when using shared memory for input tensor "
                               f"'{tensor.name}' for model '{model}'")
        elif raw:
            if tensor.HasField("contents"):
                raise _invalid(f"contents field must not be specified when using raw_input_contents for "
                               f"'{tensor.name}' for model '{model}'")
            if raw_index >= len(raw):
                raise _invalid(f"unable to find data for input tensor '{tensor.name}' for model '{model}' in "
                               "request.")
            data = _from_raw(tensor.name, tensor.datatype, shape, raw[raw_index], model)
            raw_index += 1
        elif tensor.HasField("contents"):
            data = _from_contents(tensor.name, tensor.datatype, shape, tensor.contents, model)
        else:
            raise _invalid(f"unable to find data for input tensor '{tensor.name}' for model '{model}' in "
                           "request.")
        inputs.append(InputTensor(tensor.name, tensor.datatype, shape, data, shm, params or {}))
    if raw_index != len(raw):
        # Triton ignores the surplus; a client that sent it has its inputs and data out of step.
        raise _invalid(f"expected {raw_index} entries in raw_input_contents (one per input not in shared "
                       f"memory) but got {len(raw)} for model '{model}'")
    outputs = [_requested_output(o) for o in msg.outputs]
    return InferRequest(model_name=model, model_version=msg.model_version, id=msg.id,
                        parameters=decode_parameters(msg.parameters) if msg.parameters else {}, inputs=inputs,
                        outputs=outputs)


def _check_input_header(name: str, datatype: str, shape: list[int], model: str) -> None:
    if datatype not in _DATATYPES:
        raise _invalid(f"invalid datatype '{datatype}' for input tensor '{name}' for model '{model}'")
    if shape and min(shape) < 0:
        raise _invalid(f"invalid shape {shape} for input tensor '{name}' for model '{model}': dimensions must "
                       "not be negative")


def _requested_output(tensor: pb.ModelInferRequest.InferRequestedOutputTensor) -> RequestedOutput:
    if not tensor.parameters:
        return RequestedOutput(tensor.name)
    shm = _shm_ref(tensor)
    classification = 0
    if "classification" in tensor.parameters:
        param = tensor.parameters["classification"]
        if param.WhichOneof("parameter_choice") != "int64_param":
            raise _invalid("invalid value type for 'classification' parameter, expected int64_param")
        classification = param.int64_param
        if classification <= 0:
            raise _invalid("invalid value for 'classification' parameter, expected >= 0")
        if shm is not None:
            raise _invalid("output can't set both 'shared_memory_region' and 'classification'")
    params = {k: v for k, v in decode_parameters(tensor.parameters).items() if k not in _CONSUMED_OUTPUT}
    # binary_data is an HTTP notion: gRPC always returns raw bytes, so it is dropped here.
    return RequestedOutput(tensor.name, None, shm, classification, params)


def _reshape(flat: np.ndarray, shape: list[int], name: str, model: str) -> np.ndarray:
    """``flat`` (whose size already matches the shape) in ``shape``. Only a zero-element shape
    can still fail here: numpy refuses one whose other dimensions multiply past its size limit."""
    try:
        return flat.reshape(shape)
    except ValueError:
        raise _invalid(f"invalid shape {shape} for input tensor '{name}' for model '{model}': too large") from None


def _from_raw(name: str, datatype: str, shape: list[int], raw: bytes, model: str) -> np.ndarray:
    count = math.prod(shape)
    if datatype == "BYTES":
        return _decode_bytes(name, shape, count, raw, model)
    dtype = _NUMPY[datatype]
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise _invalid(f"input byte size mismatch for input '{name}' for model '{model}'. Expected {expected}, got "
                       f"{len(raw)}")
    return _reshape(np.frombuffer(raw, dtype=dtype), shape, name, model)


def _decode_bytes(name: str, shape: list[int], count: int, raw: bytes, model: str) -> np.ndarray:
    # Every element takes at least its 4-byte length, so a larger count cannot be right; checking
    # first also keeps a forged shape's element count (up to 2^64^n) away from the C++ decoder.
    if count <= len(raw) // 4:
        try:
            return _reshape(_core.decode_bytes(raw, count), shape, name, model)
        except _core.FormatError:
            pass  # explained below: the wrong number of elements, or malformed data
    try:
        found = _core.count_bytes_elements(raw)
    except _core.FormatError as e:
        raise _invalid(f"invalid BYTES data for inference input '{name}' for model '{model}': {e}") from None
    raise _invalid(f"expected {count} string elements for inference input '{name}' for model '{model}', got "
                   f"{found}")


def _content_datatype(field: str, datatype: str) -> str:
    """The datatype Triton takes a typed contents field to hold for a tensor of ``datatype``."""
    if datatype in _NARROW.get(field, ()):
        return datatype
    return _FIELD_DATATYPE[field]


def _from_contents(name: str, datatype: str, shape: list[int], contents: pb.InferTensorContents,
                   model: str) -> np.ndarray:
    count = math.prod(shape)
    present = [field for field, _ in _CONTENT_FIELDS if len(getattr(contents, field))]
    if len(present) > 1:
        raise _invalid(f"unexpected explicit tensor data for input tensor '{name}' for model '{model}', binary "
                       "data was already supplied.")
    if not present:  # an empty contents message: valid only for a tensor with no elements
        if datatype != "BYTES" and count:
            raise _invalid(f"input byte size mismatch for input '{name}' for model '{model}'. Expected "
                           f"{count * _NUMPY[datatype].itemsize}, got 0")
        if count:
            raise _invalid(f"expected {count} string elements for inference input '{name}' for model '{model}', "
                           "got 0")
        return _reshape(np.empty(0, dtype=object if datatype == "BYTES" else _NUMPY[datatype]), shape, name,
                        model)
    field = present[0]
    held = _content_datatype(field, datatype)
    if held != datatype:
        raise _invalid(f"unexpected explicit tensor data for input tensor '{name}' for model '{model}' of type "
                       f"'{held}', expected datatype '{datatype}'")
    values = getattr(contents, field)
    if datatype == "BYTES":
        if len(values) != count:
            raise _invalid(f"expected {count} string elements for inference input '{name}' for model '{model}', "
                           f"got {len(values)}")
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return _reshape(array, shape, name, model)
    dtype = _NUMPY[datatype]
    if len(values) != count:
        raise _invalid(f"input byte size mismatch for input '{name}' for model '{model}'. Expected "
                       f"{count * dtype.itemsize}, got {len(values) * dtype.itemsize}")
    # int8/int16 (uint8/uint16) arrive widened; Triton keeps the low bytes, as this cast does.
    wide = np.array(values, dtype=_NUMPY[_FIELD_DATATYPE[field]])
    return _reshape(wide.astype(dtype, copy=False), shape, name, model)


# ---- responses ----------------------------------------------------------------------------------

def encode_infer_response(result: InferResult) -> pb.ModelInferResponse:
    """The response message for a finished inference. Outputs with data go to
    ``raw_output_contents``; an output written to shared memory gets an empty entry there and
    its shared-memory parameters echoed. Raises ValueError for an output that is inconsistent
    (no data and no shm, or data that does not match its datatype and shape)."""
    response = pb.ModelInferResponse(model_name=result.model_name, model_version=result.model_version,
                                     id=result.id)
    encode_parameters(result.parameters, response.parameters)
    for output in result.outputs:
        tensor = response.outputs.add(name=output.name, datatype=output.datatype, shape=output.shape)
        if output.shm is not None:
            tensor.parameters[_SHM_REGION].string_param = output.shm.region
            tensor.parameters[_SHM_BYTE_SIZE].int64_param = output.shm.byte_size
            if output.shm.offset:
                tensor.parameters[_SHM_OFFSET].int64_param = output.shm.offset
            response.raw_output_contents.append(b"")
        elif output.data is not None:
            response.raw_output_contents.append(_to_raw(output, output.data))
        else:
            raise ValueError(f"output '{output.name}' has neither data nor a shared-memory region")
    return response


def _to_raw(output: OutputTensor, data: np.ndarray) -> bytes:
    if data.size != math.prod(output.shape):
        raise ValueError(f"output '{output.name}' has {data.size} elements but its shape is {output.shape}")
    if output.datatype == "BYTES":
        return _core.encode_bytes(data.ravel(order="C"))
    dtype = _NUMPY.get(output.datatype)
    if dtype is None:
        raise ValueError(f"output '{output.name}' has unknown datatype '{output.datatype}'")
    if output.datatype == "BF16":  # uint16 words, or any 2-byte bfloat16 type (ml_dtypes, ...)
        if data.dtype.itemsize != 2:
            raise ValueError(f"output '{output.name}' is BF16 but its array is {data.dtype}")
        return data.tobytes(order="C")
    if data.dtype.newbyteorder("=") != dtype.newbyteorder("="):
        raise ValueError(f"output '{output.name}' is {output.datatype} but its array is {data.dtype}")
    # astype to the little-endian wire dtype: a no-op for native arrays on little-endian hosts.
    return data.astype(dtype, copy=False).tobytes(order="C")
