"""The HTTP/REST response encoder: KServe v2 JSON with Triton's binary tensor data extension.

``encode_infer_response`` turns an :class:`InferResult` into body chunks (binary outputs are
zero-copy views of C-contiguous output arrays); ``encode_error`` is the ``{"error": ...}`` body.
Requests are decoded by :mod:`stubhost.server.http_codec`, which shares its datatype table.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import orjson

from stubhost import _core
from stubhost.host.errors import InferenceError
from stubhost.server.http_tensors import WIRE_DTYPES, invalid
from stubhost.server.types import InferResult, OutputTensor

__all__ = ["encode_error", "encode_infer_response"]


# --------------------------------------------------------------------------------------------
# Responses
# --------------------------------------------------------------------------------------------


def encode_infer_response(
    result: InferResult, *, binary_default: bool = False
) -> tuple[list[bytes | memoryview], int | None]:
    """Encodes a result as body chunks: the JSON header, then the binary tensor data.

    An output is sent binary when its ``binary_data`` says so or, when the client did not say
    (None), when ``binary_default`` (the request's ``binary_data_output``) does; binary data are
    zero-copy views of C-contiguous arrays.
    Returns the chunks and the ``Inference-Header-Content-Length`` value, None when no binary
    data follows (as Triton, which sets the header only when some binary output is non-empty).
    Outputs written to shared memory carry no data and no parameters, as in Triton.
    Raises ``InferenceError`` for outputs that cannot be encoded.
    """
    head: dict[str, Any] = {}
    if result.id:
        head["id"] = result.id
    head["model_name"] = result.model_name
    head["model_version"] = result.model_version
    if result.parameters:
        head["parameters"] = result.parameters
    entries: list[dict[str, Any] | bytes] = []  # bytes: an entry with JSON data spliced in
    spliced = False
    chunks: list[bytes | memoryview] = []
    for out in result.outputs:
        shape = out.shape if type(out.shape) is list else list(out.shape)
        entry: dict[str, Any] = {"name": out.name, "datatype": out.datatype, "shape": shape}
        if out.shm is not None:
            entries.append(entry)
            continue
        array = _output_array(out)
        if out.binary_data if out.binary_data is not None else binary_default:
            chunk = _binary_chunk(array, out.datatype)
            entry["parameters"] = {"binary_data_size": len(chunk)}
            if len(chunk):
                chunks.append(chunk)
            entries.append(entry)
        else:
            # orjson cannot splice raw JSON, so the data array is appended to the object's bytes.
            entries.append(_dumps(entry)[:-1] + b',"data":' + _json_data(array, out) + b"}")
            spliced = True
    header = _header(head, entries, spliced)
    if not chunks:
        return [header], None
    return [header, *chunks], len(header)


def _header(head: dict[str, Any], entries: list[dict[str, Any] | bytes], spliced: bool) -> bytes:
    """The response's JSON header: ``head`` with its ``outputs``; one orjson call unless some
    entry was ``spliced`` by hand (is bytes)."""
    if not spliced:
        head["outputs"] = entries
        return _dumps(head)
    parts = [e if type(e) is bytes else _dumps(e) for e in entries]  # type: ignore[arg-type]
    return _dumps(head)[:-1] + b',"outputs":[' + b",".join(parts) + b"]}"


def encode_error(message: str) -> bytes:
    """The body of an error response: ``{"error": message}``."""
    return orjson.dumps({"error": message})


def _dumps(value: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError as e:  # a parameter value JSON cannot hold
        raise InferenceError("INTERNAL", f"unable to encode the inference response: {e}") from None


def _output_array(out: OutputTensor) -> np.ndarray:
    """The output's data as a C-contiguous little-endian array of its datatype (BF16: uint16
    bits), checked against its shape with Triton's WriteDataToJsonCheck wording."""
    wire = WIRE_DTYPES.get(out.datatype)
    if wire is None:
        raise invalid("Invalid data type for output tensor")
    if out.data is None:
        raise InferenceError("INTERNAL", f"output '{out.name}' has no data")
    dtype, itemsize = wire
    array = np.asarray(out.data)
    if array.size != math.prod(out.shape):
        raise InferenceError(
            "INTERNAL", f"output tensor shape does not match size of output for '{out.name}'"
        )
    if array.dtype == dtype:  # the usual case: the wire's own type, nothing to check or convert
        return np.ascontiguousarray(array)
    if itemsize == 0:
        ok = array.dtype.kind in "OSU"
    elif out.datatype == "BF16":  # uint16 bits or a 2-byte bfloat16 type such as ml_dtypes'
        ok = array.dtype.itemsize == 2 and array.dtype.kind not in "fb"
    else:  # the same type, byte order aside
        ok = array.dtype.kind == dtype.kind and array.dtype.itemsize == itemsize
    if not ok:
        raise InferenceError(
            "INTERNAL", f"output '{out.name}' holds {array.dtype} data, not {out.datatype}"
        )
    array = np.ascontiguousarray(array)
    if out.datatype == "BF16":
        return array.view(np.uint16)
    if itemsize and array.dtype != dtype:
        array = array.astype(dtype)  # big-endian data
    return array


def _binary_chunk(array: np.ndarray, datatype: str) -> bytes | memoryview:
    """The binary data of a C-contiguous output array (BYTES: Triton's length-prefixed layout)."""
    if datatype == "BYTES":
        return _core.encode_bytes(array.reshape(-1))
    if array.ndim == 1:  # skips the reshape; memoryview cannot cast N-d views with a zero dim
        return memoryview(array).cast("B")
    return array.reshape(-1).data.cast("B")


def _json_data(array: np.ndarray, out: OutputTensor) -> bytes:
    """The ``data`` JSON of an output, flat row-major."""
    flat = array.reshape(-1)
    datatype = out.datatype
    if datatype == "BF16":
        raise invalid(
            "sending BF16 data via JSON is not supported. Please use the binary data format for output"
        )
    if datatype == "BYTES":
        try:
            items = [x.decode() if isinstance(x, bytes) else str(x) for x in flat.tolist()]
        except UnicodeDecodeError:
            # Triton would write the raw bytes and so send invalid JSON; refuse instead.
            raise invalid(
                f"output '{out.name}' holds BYTES that are not valid UTF-8 and cannot be sent "
                "as JSON. Please use the binary data format for output"
            ) from None
        return orjson.dumps(items)
    if flat.dtype.kind != "f":
        return orjson.dumps(flat, option=orjson.OPT_SERIALIZE_NUMPY)
    if flat.dtype.itemsize == 2:  # float16 (BF16 was refused above)
        flat = flat.astype(np.float32)  # exact; orjson has no float16
    data = orjson.dumps(flat, option=orjson.OPT_SERIALIZE_NUMPY)
    if b"null" in data:  # only NaN and infinities become null, and this costs less than isfinite
        # Triton writes NaN/Infinity/-Infinity (rapidjson kWriteNanAndInfFlag) where orjson
        # writes null; the standard library writes the same literals.
        return json.dumps(flat.tolist(), allow_nan=True, separators=(",", ":")).encode()
    return data
