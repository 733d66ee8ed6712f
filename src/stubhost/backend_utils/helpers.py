"""The module-level helpers of pb_utils: tensor and config look-ups, dtype conversions, the BYTES
(de)serializers, model dir."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any

import numpy as np

from stubhost import _core
from stubhost._core import DataType
from stubhost.backend_utils.request import InferenceRequest
from stubhost.backend_utils.response import InferenceResponse
from stubhost.backend_utils.tensor import Tensor
from stubhost.tensor import numpy_to_triton_dtype, triton_to_numpy_dtype

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

_model_dir = ""


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input tensor called `name`, or None."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output tensor called `name`, or None."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The entry of `model_config["input"]` called `name`, or None."""
    for entry in model_config.get("input", []):
        if entry.get("name") == name:
            return entry
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The entry of `model_config["output"]` called `name`, or None."""
    for entry in model_config.get("output", []):
        if entry.get("name") == name:
            return entry
    return None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """numpy type of a config data type such as "TYPE_FP32" (TYPE_STRING -> np.object_)."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def numpy_to_triton_type(data_type: Any) -> int | None:
    """TRITONSERVER data type number of a numpy type (bytes/str/object -> BYTES), or None."""
    try:
        return int(numpy_to_triton_dtype(data_type))
    except TypeError:
        return None


def triton_to_numpy_type(data_type: int) -> Any:
    """numpy type of a TRITONSERVER data type number (BYTES -> np.object_), or None."""
    try:
        return triton_to_numpy_dtype(DataType(int(data_type))).type
    except (TypeError, ValueError):
        return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """True when the model configuration (the dict ``initialize`` gets, parsed) sets
    ``model_transaction_policy { decoupled: true }``."""
    policy = model_config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | tuple[()] | None:
    """Triton's BYTES layout of a bytes tensor: for each element, in C order, its length as 4
    little-endian bytes and then its bytes, concatenated into one ``bytes`` object.

    As Triton's ``serialize_byte_tensor`` does:

    - an empty tensor (``size == 0``), whatever its dtype, gives ``()`` (an empty tuple);
    - an ``object`` array: an element of type exactly ``bytes`` is written as it is, any other
      element as ``str(element)`` in UTF-8 (so a ``np.bytes_`` or ``bytearray`` element is
      written as its ``str()``, ``"b'...'"``, as Triton writes it);
    - a ``np.bytes_`` (``S``) array: each element as numpy reads it, that is without its trailing
      NUL bytes (use an ``object`` array to keep them);
    - any other dtype (``np.str_`` included) gives ``None``; an object without ``.size`` (a
      list) raises ``AttributeError``.

    The encoding is the one stubhost uses for BYTES tensors (``_core.encode_bytes``).
    """
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype == np.object_:
        flat = input_tensor.ravel(order="C")
        if any(_written_as_str(t) for t in set(map(type, flat))):
            return _core.encode_bytes(_triton_elements(flat))
        return _core.encode_bytes(flat)
    if input_tensor.dtype.type == np.bytes_:
        return _core.encode_bytes(input_tensor.ravel(order="C"))
    return None


def _written_as_str(kind: type) -> bool:
    """True for the element types that the encoder writes raw but Triton writes as ``str(x)``:
    subclasses of bytes (``np.bytes_``) and of str, and bytearray."""
    return kind is not bytes and kind is not str and issubclass(kind, (bytes, bytearray, str))


def _triton_elements(flat: Iterable[Any]) -> list[Any]:
    """The elements of an object array as Triton writes them: exact ``bytes`` kept, others as str."""
    return [x if type(x) is bytes else str(x) for x in flat]


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The elements of a buffer in Triton's BYTES layout (what ``serialize_byte_tensor``
    writes), as a 1-D ``object`` array of ``bytes``, in order; ``b""`` gives an empty array.

    Any contiguous bytes-like object is read (``bytes``, ``bytearray``, ``memoryview``, a uint8
    numpy array); another object raises ``TypeError``. A buffer whose last element or length
    prefix runs past its end raises ``struct.error``, the exception Triton's reader raises.
    """
    view = memoryview(encoded_tensor).cast("B")
    try:
        return _core.decode_bytes(view, _core.count_bytes_elements(view))
    except _core.FormatError as e:
        raise struct.error(f"not a serialized BYTES tensor: {e}") from None


def get_model_dir() -> str:
    """The directory of the model this stub serves (``<repository>/<model>``)."""
    return _model_dir


def set_model_dir(path: str) -> None:
    """Set by the stub runtime before the model module is imported."""
    global _model_dir
    _model_dir = path
