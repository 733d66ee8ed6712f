"""Triton's generate extension: text-oriented JSON in, JSON (or server-sent events) out.

``POST v2/models/<m>[/versions/<v>]/generate`` and ``.../generate_stream`` take one flat JSON
object: keys naming a model input become that input (a scalar or a nested list, converted to the
input's datatype and shaped by its dims), ``parameters`` holds request parameters, and any other
key is a parameter too. A response is ``{"model_name", "model_version", <output>: value, ...}``
with one-element outputs as scalars and BYTES as text. ``generate_stream`` sends each response
as an SSE ``data:`` event, and an error after the first response as ``data: {"error": ...}``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from stubhost import _core
from stubhost.host.errors import InferenceError
from stubhost.server.types import InferRequest, InferResult, InputTensor
from stubhost.tensor import triton_to_numpy_dtype


def _invalid(message: str) -> InferenceError:
    return InferenceError("INVALID_ARG", message)


def _shape_for(value: np.ndarray, dims: list[int], name: str) -> tuple[int, ...]:
    """The input's dims with the variable ones (-1) resolved for `value`'s element count: the
    last variable dim takes the remainder, the others (a batch dim) are 1."""
    known = 1
    for d in dims:
        if d >= 0:
            known *= d
    variable = [i for i, d in enumerate(dims) if d < 0]
    size = value.size
    if not variable:
        if known != size:
            raise _invalid(f"input '{name}' has {size} element(s) but the model expects shape {dims}")
        return tuple(dims)
    if known == 0 or size % known:
        raise _invalid(f"input '{name}' has {size} element(s), which does not fit shape {dims}")
    shape = [1 if d < 0 else d for d in dims]
    shape[variable[-1]] = size // known
    return tuple(shape)


def _input_tensor(name: str, value: Any, datatype: str, dims: list[int]) -> InputTensor:
    if datatype == "BYTES":
        flat = np.asarray(value, dtype=object).ravel()
        items = [v.encode("utf-8") if isinstance(v, str) else v for v in flat]
        if not all(isinstance(v, bytes) for v in items):
            raise _invalid(f"input '{name}' must be text (or a list of text) for datatype BYTES")
        array = np.empty(len(items), dtype=object)
        array[:] = items
    else:
        try:
            array = np.asarray(value, dtype=triton_to_numpy_dtype(_core.dtype_from_name(datatype)))
        except (TypeError, ValueError, OverflowError) as e:
            raise _invalid(f"input '{name}' cannot be read as {datatype}: {e}") from None
        if array.dtype.kind == "O":
            raise _invalid(f"input '{name}' cannot be read as {datatype}")
    array = array.reshape(_shape_for(array, dims, name))
    return InputTensor(name, datatype, list(array.shape), data=array)


def decode_generate_request(model_name: str, version: str, body: bytes,
                            inputs: list[dict[str, Any]]) -> InferRequest:
    """The inference request a generate body describes; `inputs` is the model metadata's list
    (name, datatype, shape)."""
    try:
        document = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError as e:
        raise _invalid(f"failed to parse the request JSON buffer: {e}") from None
    if not isinstance(document, dict):
        raise _invalid("the generate request must be a JSON object")
    by_name = {entry["name"]: entry for entry in inputs}
    parameters: dict[str, Any] = {}
    explicit = document.get("parameters", {})
    if not isinstance(explicit, dict):
        raise _invalid("'parameters' must be a JSON object")
    tensors: list[InputTensor] = []
    for key, value in document.items():
        if key == "parameters":
            continue
        entry = by_name.get(key)
        if entry is not None:
            tensors.append(_input_tensor(key, value, entry["datatype"], list(entry["shape"])))
        else:
            parameters[key] = value
    parameters.update(explicit)
    for key, value in parameters.items():
        if not isinstance(value, (str, int, float, bool)):
            raise _invalid(f"parameter '{key}' must be a string, a number or a boolean")
    return InferRequest(model_name, version, "", parameters, tensors, [])


def _json_value(data: np.ndarray) -> Any:
    if data.dtype.kind == "O":
        items = [v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else v for v in data.ravel()]
        return items[0] if len(items) == 1 else np.asarray(items, dtype=object).reshape(data.shape).tolist()
    if data.size == 1:
        return data.ravel()[0].item()
    return data.tolist()


def encode_generate_response(result: InferResult) -> bytes:
    """The JSON object of one generate response."""
    document: dict[str, Any] = {"model_name": result.model_name, "model_version": result.model_version}
    for output in result.outputs:
        if output.data is not None:
            document[output.name] = _json_value(output.data)
    return orjson.dumps(document)


def sse_event(payload: bytes) -> bytes:
    """One server-sent event carrying a JSON payload."""
    return b"data: " + payload + b"\n\n"
