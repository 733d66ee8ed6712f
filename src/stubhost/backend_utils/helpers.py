"""The module-level helpers of pb_utils: tensor and config look-ups, dtype conversions, model dir."""

from __future__ import annotations

from typing import Any

import numpy as np

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


def get_model_dir() -> str:
    """The directory of the model this stub serves (``<repository>/<model>``)."""
    return _model_dir


def set_model_dir(path: str) -> None:
    """Set by the stub runtime before the model module is imported."""
    global _model_dir
    _model_dir = path
