"""Triton's generate extension: text-oriented JSON in, JSON (or server-sent events) out.

``POST v2/models/<m>[/versions/<v>]/generate`` and ``.../generate_stream`` take one flat JSON
object: keys naming a model input become that input (a scalar or a nested list, converted to the
input's datatype and shaped by its dims), ``parameters`` holds request parameters, and any other
key is a parameter too. A response is ``{"model_name", "model_version", <output>: value, ...}``
with one-element outputs as scalars and BYTES as text. ``generate_stream`` sends each response
as an SSE ``data:`` event, and an error after the first response as ``data: {"error": ...}``.
"""

from __future__ import annotations

import json
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


def _leaves(value: Any) -> list[Any]:
    """The scalars of a JSON value, nested lists flattened (an object counts as one)."""
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def _input_tensor(name: str, value: Any, datatype: str, dims: list[int]) -> InputTensor:
    if datatype == "BYTES":
        leaves = _leaves(value)
        if not all(isinstance(v, str) for v in leaves):  # Triton's words (and code) for its JSON reader
            raise InferenceError("INTERNAL", "Unable to parse JSON bytes array: attempt to access JSON non-string "
                                             "as string")
        array = np.empty(len(leaves), dtype=object)
        array[:] = [v.encode("utf-8") for v in leaves]
    elif datatype == "BOOL" and not all(isinstance(v, bool) for v in _leaves(value)):
        raise InferenceError("INTERNAL", "Unable to parse 'data': attempt to access JSON non-boolean as boolean")
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
        # Pairs, not a dict: a key given twice is an error for an input, as in Triton.
        pairs = json.loads(body, object_pairs_hook=_Pairs) if body else _Pairs()
    except (ValueError, RecursionError) as e:
        raise InferenceError("INTERNAL", f"failed to parse the request JSON buffer: {e}") from None
    if not isinstance(pairs, _Pairs):
        raise _invalid("the generate request must be a JSON object")
    by_name = {entry["name"]: entry for entry in inputs}
    parameters: dict[str, Any] = {}
    explicit: Any = _Pairs()
    tensors: dict[str, InputTensor] = {}
    for key, value in pairs:
        if key == "parameters":
            explicit = value
            continue
        entry = by_name.get(key)
        if entry is None:
            parameters[key] = value
        elif key in tensors:
            raise _invalid(f"[request id: <id_unknown>] input '{key}' already exists in request")
        else:
            tensors[key] = _input_tensor(key, value, entry["datatype"], list(entry["shape"]))
    if not isinstance(explicit, _Pairs):
        raise _invalid("'parameters' must be a JSON object")
    parameters.update(explicit)
    for key, value in parameters.items():
        if not isinstance(value, (str, int, float, bool)):
            raise _invalid(f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'.")
    return InferRequest(model_name, version, "", parameters, list(tensors.values()), [])


class _Pairs(list):  # type: ignore[type-arg]
    """A JSON object as its (key, value) pairs, in order, repeats kept."""


def _json_value(data: np.ndarray) -> Any:
    if data.dtype.kind == "O":
        items = [v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else v for v in data.ravel()]
        return items[0] if len(items) == 1 else np.asarray(items, dtype=object).reshape(data.shape).tolist()
    if data.size == 1:
        return data.ravel()[0].item()
    return data.tolist()


def encode_generate_response(result: InferResult) -> bytes:
    """The JSON object of one generate response."""
    document: dict[str, Any] = {}  # the outputs first, as Triton writes them
    for output in result.outputs:
        if output.data is not None:
            document[output.name] = _json_value(output.data)
    document["model_name"] = result.model_name
    document["model_version"] = result.model_version
    return orjson.dumps(document)


def sse_event(payload: bytes) -> bytes:
    """One server-sent event carrying a JSON payload."""
    return b"data: " + payload + b"\n\n"
