"""http_codec against tritonclient: request bodies built by tritonclient's own builder decode to the
arrays they were given, and response bodies we encode read back through tritonclient's parser."""

from __future__ import annotations

import struct
from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from stubhost.host.errors import InferenceError
from stubhost.server.http_codec import DEFAULT_MAX_TENSOR_BYTES, MAX_DIMS, decode_infer_request
from stubhost.server.http_response import encode_error, encode_infer_response
from stubhost.server.types import InferResult, OutputTensor, ShmRef

Client = httpclient.InferenceServerClient

NUMERIC = {
    "BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}
DATATYPES = [*NUMERIC, "BYTES"]
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4)


def arrays_of(datatype: str, *, utf8: bool = False) -> st.SearchStrategy[np.ndarray]:
    """Arrays of a datatype; BYTES elements are bytes (valid UTF-8 when they must go as JSON)."""
    if datatype == "BYTES":
        elements = st.text(max_size=8).map(str.encode) if utf8 else st.binary(max_size=12)
        return hnp.arrays(object, SHAPES, elements=elements)
    return hnp.arrays(NUMERIC[datatype], SHAPES)


def tc_input(name: str, array: np.ndarray, binary: bool = True, datatype: str | None = None) -> Any:
    datatype = datatype or ("BYTES" if array.dtype == object else httpclient.np_to_triton_dtype(array.dtype))
    return httpclient.InferInput(name, list(array.shape), datatype).set_data_from_numpy(array, binary_data=binary)


def tc_body(inputs: list, outputs: list | None = None, **kw: Any) -> tuple[bytes, int | None]:
    """The body and Inference-Header-Content-Length that tritonclient's infer() would send."""
    return Client.generate_request_body(inputs, outputs=outputs, **kw)


def decode(inputs: list, outputs: list | None = None, **kw: Any):
    body, header_length = tc_body(inputs, outputs, **kw)
    return decode_infer_request("m", "1", body, header_length)


def decode_json(doc: Any, binary: bytes = b"", **kw: Any):
    """Decodes a hand-written request: ``doc`` as JSON, then ``binary`` after it."""
    head = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    return decode_infer_request("m", "1", head + binary, len(head) if binary else None, **kw)


def parse(result: InferResult, **kw: Any):
    """Encodes a result and reads it back with tritonclient."""
    chunks, header_length = encode_infer_response(result, **kw)
    return Client.parse_response_body(b"".join(chunks), header_length=header_length)


def same_array(got: np.ndarray, expected: np.ndarray, *, bitwise: bool = True) -> None:
    """Same shape, dtype and values: bitwise (NaN payloads, -0.0) unless the data went as JSON,
    where a NaN is just NaN."""
    assert got.shape == expected.shape
    if expected.dtype == object:
        assert got.dtype == object
        assert got.tolist() == expected.tolist()
    else:
        assert got.dtype == expected.dtype
        if bitwise:
            assert got.tobytes() == expected.tobytes()
        else:
            assert np.array_equal(got, expected, equal_nan=expected.dtype.kind == "f")


def invalid(match: str):
    return pytest.raises(InferenceError, match=match)


def fp32(name: str = "X", **params: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "datatype": "FP32", "shape": [2]}
    if params:
        entry["parameters"] = params
    return entry


# ---- requests: data ---------------------------------------------------------------------------

@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_inputs_from_tritonclient_decode_to_their_arrays(datatype: str, binary: bool, data: st.DataObject) -> None:
    array = data.draw(arrays_of(datatype, utf8=not binary))
    other = np.arange(3, dtype=np.int32)
    request = decode([tc_input("X", array, binary), tc_input("Y", other, not binary)])
    x, y = request.inputs
    assert (x.name, x.datatype, x.shape, x.shm, x.parameters) == ("X", datatype, list(array.shape), None, {})
    same_array(x.data, array, bitwise=binary)
    same_array(y.data, other)


@pytest.mark.parametrize("datatype", list(NUMERIC))
def test_binary_inputs_are_views_of_the_body(datatype: str) -> None:
    array = np.ones((2, 3), dtype=NUMERIC[datatype])
    body, header_length = tc_body([tc_input("X", array)])
    buffer = bytearray(body)
    x = decode_infer_request("m", "1", buffer, header_length).inputs[0].data
    buffer[header_length:] = bytes(len(buffer) - header_length)  # zero the binary section
    assert not x.any()
    readonly = decode_infer_request("m", "1", body, header_length).inputs[0].data
    assert not readonly.flags.writeable


def test_json_data_may_be_nested_or_flat() -> None:
    nested = decode_json({"inputs": [{"name": "X", "datatype": "INT32", "shape": [2, 2], "data": [[1, 2], [3, 4]]}]})
    flat = decode_json({"inputs": [{"name": "X", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]}]})
    ragged = decode_json({"inputs": [{"name": "X", "datatype": "INT32", "shape": [2, 2], "data": [[1], [2, 3], 4]}]})
    for request in (nested, flat, ragged):  # Triton only counts elements, row-major
        same_array(request.inputs[0].data, np.array([[1, 2], [3, 4]], dtype=np.int32))


def test_json_numbers_at_the_edges_of_each_type() -> None:
    cases = [("INT64", [-(2**63), 2**63 - 1]), ("UINT64", [0, 2**64 - 1]), ("INT8", [-128, 127]),
             ("UINT8", [0, 255]), ("FP64", [1, -0.0]), ("FP16", [65504, 0.5]), ("BOOL", [True, False])]
    for datatype, values in cases:
        doc = {"inputs": [{"name": "X", "datatype": datatype, "shape": [2], "data": values}]}
        same_array(decode_json(doc).inputs[0].data, np.array(values, dtype=NUMERIC[datatype]))


def test_nan_and_infinity_in_json_data_are_accepted_like_triton() -> None:
    array = np.array([np.nan, np.inf, -np.inf, 1.5], dtype=np.float32)
    body, header_length = tc_body([tc_input("X", array, binary=False)])
    assert b"NaN" in body and header_length is None  # tritonclient writes the non-standard literals
    same_array(decode_infer_request("m", "1", body, None).inputs[0].data, array)


def test_str_elements_decode_as_their_utf8_bytes() -> None:
    array = np.array([["héllo", ""], ["x", "∑"]], dtype=object)
    got = decode([tc_input("S", array, binary=False)]).inputs[0].data
    assert got.tolist() == [[b"h\xc3\xa9llo", b""], [b"x", "∑".encode()]]


def test_bf16_binary_decodes_to_uint16_words() -> None:
    array = np.array([1.0, -2.5, 3.0], dtype=ml_dtypes.bfloat16)
    got = decode([tc_input("B", array, datatype="BF16")]).inputs[0]
    assert got.datatype == "BF16"
    same_array(got.data, array.view(np.uint16))


def test_zero_element_inputs() -> None:
    for binary in (True, False):
        for datatype in DATATYPES:
            array = np.zeros((0, 3), dtype=object if datatype == "BYTES" else NUMERIC[datatype])
            same_array(decode([tc_input("X", array, binary)]).inputs[0].data, array)


def test_binary_inputs_take_their_slices_in_input_order() -> None:
    a, b = np.arange(3, dtype=np.int64), np.array([b"q", b"rs"], dtype=object)
    c, d = np.array([True, False]), np.arange(4, dtype=np.float16).reshape(2, 2)
    request = decode([tc_input("A", a), tc_input("B", b), tc_input("C", c, binary=False), tc_input("D", d)])
    for tensor, expected in zip(request.inputs, (a, b, c, d)):
        same_array(tensor.data, expected)


# ---- requests: shared memory, outputs, parameters ----------------------------------------------

def test_shared_memory_inputs() -> None:
    a = np.arange(4, dtype=np.float32)
    b = httpclient.InferInput("B", [8], "INT64")
    b.set_shared_memory("in_region", 64, offset=128)
    d = httpclient.InferInput("D", [2], "FP16")
    d.set_shared_memory("in_region", 4)
    got = {t.name: t for t in decode([tc_input("A", a), b, d]).inputs}
    same_array(got["A"].data, a)
    assert got["B"].data is None and got["B"].shm == ShmRef("in_region", 64, 128)
    assert got["D"].data is None and got["D"].shm == ShmRef("in_region", 4, 0)
    assert got["B"].parameters == {} and got["B"].shape == [8] and got["B"].datatype == "INT64"


def test_requested_outputs() -> None:
    plain = httpclient.InferRequestedOutput("PLAIN", binary_data=False)
    top = httpclient.InferRequestedOutput("TOP", class_count=3)
    shm = httpclient.InferRequestedOutput("SHM", binary_data=False)
    shm.set_shared_memory("out_region", 256, offset=16)
    outputs = decode([tc_input("X", np.zeros(1, np.float32))], [plain, top, shm]).outputs
    assert [o.name for o in outputs] == ["PLAIN", "TOP", "SHM"]
    assert outputs[0].binary_data is False and outputs[0].classification == 0 and outputs[0].shm is None
    assert outputs[1].binary_data is True and outputs[1].classification == 3
    assert outputs[2].shm == ShmRef("out_region", 256, 16) and outputs[2].parameters == {}


def test_no_outputs_and_no_binary_data_say_none() -> None:
    doc = {"inputs": [fp32(binary_data_size=8)], "outputs": [{"name": "O"}]}
    request = decode_json(doc, bytes(8))
    assert request.outputs[0].binary_data is None
    assert decode([tc_input("X", np.zeros(1, np.float32))]).outputs == []


def test_request_header_and_parameters() -> None:
    request = decode([tc_input("X", np.zeros(1, np.float32))], request_id="req-1",
                     sequence_id=7, sequence_start=True, priority=2, timeout=100,
                     parameters={"custom": "v", "n": 3, "flag": False, "f": 0.5})
    assert (request.model_name, request.model_version, request.id) == ("m", "1", "req-1")
    assert request.parameters == {"sequence_id": 7, "sequence_start": True, "sequence_end": False,
                                  "priority": 2, "timeout": 100, "binary_data_output": True,
                                  "custom": "v", "n": 3, "flag": False, "f": 0.5}
    labelled = decode([tc_input("X", np.zeros(1, np.float32))], sequence_id="seq-a")
    assert labelled.parameters["sequence_id"] == "seq-a"


def test_unknown_tensor_parameters_are_kept() -> None:
    doc = {"inputs": [{**fp32(binary_data_size=8, extra="x"), "name": "X"},
                      {**fp32("Y", shared_memory_region="r", shared_memory_byte_size=8, mine=1)}],
           "outputs": [{"name": "O", "parameters": {"binary_data": True, "classification": 2, "k": [1]}}]}
    request = decode_json(doc, bytes(8))
    assert request.inputs[0].parameters == {"extra": "x"}
    assert request.inputs[1].parameters == {"mine": 1}
    assert request.outputs[0].parameters == {"k": [1]}


# ---- requests: errors --------------------------------------------------------------------------

def data_input(datatype: str, shape: list[int], data: Any) -> dict[str, Any]:
    return {"inputs": [{"name": "X", "datatype": datatype, "shape": shape, "data": data}]}


ERRORS: list[tuple[str, Any, bytes, str]] = [
    # the document
    ("bad json", b'{"inputs": [', b"", "^failed to parse the request JSON buffer: "),
    ("bad json with NaN", b'{"inputs": [NaN', b"", "^failed to parse the request JSON buffer: "),
    ("not an object", [], b"", "^Unable to parse 'inputs': attempt to access non-existing object member 'inputs'$"),
    ("missing inputs", {}, b"", "^Unable to parse 'inputs': attempt to access non-existing object member 'inputs'$"),
    ("inputs not a list", {"inputs": {}}, b"", "^Unable to parse 'inputs': attempt to access JSON non-array as array$"),
    ("input not an object", {"inputs": [1]}, b"", "^Unable to parse 'inputs': attempt to access JSON non-object as object$"),
    ("id not a string", {"id": 5, "inputs": []}, b"", "^Unable to parse 'id': attempt to access JSON non-string as string$"),
    ("parameters not an object", {"parameters": [], "inputs": []}, b"",
     r"^failed to get request params\.: attempt to get members for non-object$"),
    ("sequence_start not bool", {"parameters": {"sequence_start": 1}, "inputs": []}, b"",
     "^Unable to parse 'sequence_start': attempt to access JSON non-boolean as boolean$"),
    ("priority negative", {"parameters": {"priority": -1}, "inputs": []}, b"",
     "^Unable to parse 'priority': attempt to access JSON non-unsigned-integer as unsigned-integer$"),
    ("sequence_id a float", {"parameters": {"sequence_id": 1.5}, "inputs": []}, b"", "^Unable to parse 'sequence_id'"),
    ("binary_data_output not bool", {"parameters": {"binary_data_output": "yes"}, "inputs": []}, b"",
     "^Unable to parse 'binary_data_output'"),
    ("reserved parameter", {"parameters": {"triton_x": 1}, "inputs": []}, b"",
     "^parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified.$"),
    ("parameter of a list", {"parameters": {"p": [1]}, "inputs": []}, b"",
     "^parameter 'p' has invalid type. It should be either 'int', 'bool', or 'string'.$"),
    ("parameter of null", {"parameters": {"p": None}, "inputs": []}, b"", "^parameter 'p' has invalid type"),
    # input header
    ("no content", {"inputs": [fp32()]}, b"",
     (r"^Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
      r"'shared_memory_region' in 'parameters'\. But no field is set$")),
    ("data and binary", {"inputs": [{**fp32(binary_data_size=8), "data": [1, 2]}]}, bytes(8),
     r"But set 'data' 'binary_data_size'$"),
    ("data and shm", {"inputs": [{**fp32(shared_memory_region="r", shared_memory_byte_size=8), "data": [1, 2]}]},
     b"", r"But set 'data' 'shared_memory_region'$"),
    ("binary and shm", {"inputs": [fp32(binary_data_size=8, shared_memory_region="r", shared_memory_byte_size=8)]},
     bytes(8), r"But set 'binary_data_size' 'shared_memory_region'$"),
    ("input parameters not an object", {"inputs": [{**fp32(), "parameters": 3, "data": [1, 2]}]}, b"",
     "^Unable to parse 'parameters': attempt to access JSON non-object as object$"),
    ("missing name", {"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]}, b"",
     "^Unable to parse 'name': attempt to access non-existing object member 'name'$"),
    ("name not a string", {"inputs": [{"name": 1, "datatype": "FP32", "shape": [1], "data": [1]}]}, b"",
     "^Unable to parse 'name': attempt to access JSON non-string as string$"),
    ("missing datatype", {"inputs": [{"name": "X", "shape": [1], "data": [1]}]}, b"",
     "^Unable to parse 'datatype': attempt to access non-existing object member 'datatype'$"),
    ("unknown datatype", data_input("FP8", [1], [1]), b"", "^invalid datatype for input X$"),
    ("lower-case datatype", data_input("fp32", [1], [1]), b"", "^invalid datatype for input X$"),
    ("missing shape", {"inputs": [{"name": "X", "datatype": "FP32", "data": [1]}]}, b"",
     "^Unable to parse 'shape': attempt to access non-existing object member 'shape'$"),
    ("shape not a list", data_input("FP32", 1, [1]), b"",  # type: ignore[arg-type]
     "^Unable to parse 'shape': attempt to access JSON non-array as array$"),
    ("negative dim", data_input("FP32", [-1], [1]), b"",
     "^Unable to parse 'shape': attempt to access JSON non-unsigned-integer as unsigned-integer$"),
    ("float dim", data_input("FP32", [1.0], [1]), b"", "^Unable to parse 'shape': attempt to access JSON non-unsigned"),
    ("bool dim", data_input("FP32", [True], [1]), b"", "^Unable to parse 'shape': attempt to access JSON non-unsigned"),
    ("dim past uint64", b'{"inputs":[{"name":"X","datatype":"FP32","shape":[18446744073709551616],"data":[1]}]}', b"", "^Unable to parse 'shape': attempt to access JSON non-unsigned"),
    ("too many dims", data_input("FP32", [1] * (MAX_DIMS + 1), [1]), b"",
     f"^Unable to parse 'shape': input 'X' has {MAX_DIMS + 1} dimensions, more than the {MAX_DIMS} supported$"),
    ("huge shape", data_input("FP32", [2**31, 2**31], [1]), b"",
     (r"^input 'X' with shape \[2147483648,2147483648\] and datatype FP32 is too large: more than "
      rf"{DEFAULT_MAX_TENSOR_BYTES} bytes$")),
    ("zero hiding a huge dim", data_input("INT8", [0, 2**62], []), b"", "is too large"),
    ("huge BYTES shape", data_input("BYTES", [2**31], []), b"", "is too large"),
    ("duplicate input", {"inputs": [{**fp32(), "data": [1, 2]}, {**fp32(), "data": [1, 2]}]}, b"",
     "^input 'X' already exists in request$"),
    # JSON data
    ("data not a list", data_input("FP32", [1], 1.0), b"", "^Unable to parse 'data': attempt to access JSON non-array as array$"),
    ("too few elements", data_input("FP32", [3], [1, 2]), b"",
     "^Unable to parse 'data': Shape does not match true shape of 'data' field$"),
    ("too many elements", data_input("FP32", [2, 2], [[1, 2], [3, 4], [5]]), b"", "Shape does not match true shape"),
    ("elements for an empty tensor", data_input("FP32", [0], [1]), b"", "Shape does not match true shape"),
    ("deep nesting", data_input("FP32", [1], [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]), b"",
     f"^Unable to parse 'data': nested deeper than {MAX_DIMS} levels$"),
    ("bool for an int", data_input("INT32", [2], [1, True]), b"",
     "^Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer$"),
    ("float for an int", data_input("INT64", [1], [1.0]), b"", "non-signed-integer as signed-integer"),
    ("negative for a uint", data_input("UINT32", [1], [-1]), b"",
     "^Unable to parse 'data': attempt to access JSON non-unsigned-integer as unsigned-integer$"),
    ("int for a bool", data_input("BOOL", [1], [1]), b"",
     "^Unable to parse 'data': attempt to access JSON non-boolean as boolean$"),
    ("string for a float", data_input("FP32", [1], ["1"]), b"",
     "^Unable to parse 'data': attempt to access JSON non-number as double$"),
    ("null for a float", data_input("FP64", [1], [None]), b"", "non-number as double"),
    ("bool for a float", data_input("FP16", [1], [False]), b"", "non-number as double"),
    ("number for BYTES", data_input("BYTES", [1], [1]), b"",
     "^Unable to parse 'data': attempt to access JSON non-string as string$"),
    ("lone surrogate", b'{"inputs":[{"name":"X","datatype":"BYTES","shape":[1],"data":["\\ud800 NaN"]}]}', b"",
     "^Unable to parse 'data': "),
    ("uint8 overflow", data_input("UINT8", [1], [256]), b"", "^Unable to parse 'data': 256 is out of range for UINT8$"),
    ("int8 underflow", data_input("INT8", [2], [0, -129]), b"", "^Unable to parse 'data': -129 is out of range for INT8$"),
    ("int64 overflow", data_input("INT64", [1], [2**63]), b"", "^Unable to parse 'data': 9223372036854775808 is out"),
    ("uint64 overflow", b'{"inputs":[{"name":"X","datatype":"UINT64","shape":[1],"data":[18446744073709551616]}]}', b"",
     "non-unsigned-integer"),  # orjson reads it as a float
    ("huge int for a float", b'{"inputs":[{"name":"X","datatype":"FP64","shape":[1],"data":[1' + b"0" * 400 + b'], "NaN": 1}]}',
     b"", "^Unable to parse 'data': attempt to access JSON non-number as double$"),  # the slow parser's big int
    ("bf16 as json", data_input("BF16", [1], [1.0]), b"",
     "^receiving BF16 data via JSON is not supported. Please use the binary data format for input X$"),
    # binary data
    ("binary size not uint", {"inputs": [fp32(binary_data_size=-8)]}, bytes(8),
     "^Unable to parse 'binary_data_size': attempt to access JSON non-unsigned-integer as unsigned-integer$"),
    ("binary size a string", {"inputs": [fp32(binary_data_size="8")]}, bytes(8), "^Unable to parse 'binary_data_size'"),
    ("binary size mismatch", {"inputs": [fp32(binary_data_size=4)]}, bytes(4),
     r"^input byte size mismatch for input 'X' for model 'm'\. Expected 8, got 4$"),
    ("binary section short", {"inputs": [fp32(binary_data_size=8), fp32("Y", binary_data_size=8)]}, bytes(12),
     "^unexpected size for input 'Y', expecting 4 additional bytes for model 'm'$"),
    ("trailing bytes", {"inputs": [fp32(binary_data_size=8)]}, bytes(9), "^unexpected additional input data for model 'm'$"),
    ("trailing bytes, json inputs", {"inputs": [{**fp32(), "data": [1, 2]}]}, b"\x00",
     "^unexpected additional input data for model 'm'$"),
    # BYTES binary data
    ("bytes prefix cut", {"inputs": [{"name": "S", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 7}}]},
     struct.pack("<I", 1) + b"a" + b"\x02\x00",
     (r"^incomplete string length indicator for inference input 'S' for model 'm', "
      r"expecting 4 bytes but only 2 bytes available$")),
    ("bytes element past the end", {"inputs": [{"name": "S", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": 9}}]},
     struct.pack("<I", 1) + b"a" + struct.pack("<I", 9),
     "^expected 2 string elements for inference input 'S' for model 'm', got 1$"),
    ("bytes huge length prefix", {"inputs": [{"name": "S", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 4}}]},
     b"\xff\xff\xff\xff", "^expected 1 string elements for inference input 'S' for model 'm', got 0$"),
    ("bytes too many elements", {"inputs": [{"name": "S", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 8}}]},
     struct.pack("<I", 0) * 2, "^unexpected number of string elements 2 for inference input 'S' for model 'm', expecting 1$"),
    ("bytes for an empty tensor", {"inputs": [{"name": "S", "datatype": "BYTES", "shape": [0], "parameters": {"binary_data_size": 4}}]},
     struct.pack("<I", 0), "^unexpected number of string elements 1 for inference input 'S'"),
    # shared memory
    ("shm region without byte size", {"inputs": [fp32(shared_memory_region="r")]}, b"",
     "^'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor 'X'$"),
    ("shm byte size without region", {"inputs": [{**fp32(shared_memory_byte_size=8), "data": [1, 2]}]}, b"",
     "^'shared_memory_byte_size' can not be specified without 'shared_memory_region' parameter for tensor 'X'$"),
    ("shm offset without region", {"inputs": [fp32(binary_data_size=8, shared_memory_offset=8)]}, bytes(8),
     "^'shared_memory_offset' can not be specified without 'shared_memory_region' parameter for tensor 'X'$"),
    ("shm region not a string", {"inputs": [fp32(shared_memory_region=1, shared_memory_byte_size=8)]}, b"",
     "^Unable to parse 'shared_memory_region': attempt to access JSON non-string as string$"),
    ("shm byte size negative", {"inputs": [fp32(shared_memory_region="r", shared_memory_byte_size=-1)]}, b"",
     "^Unable to parse 'shared_memory_byte_size': attempt to access JSON non-unsigned-integer as unsigned-integer$"),
    ("shm offset a string", {"inputs": [fp32(shared_memory_region="r", shared_memory_byte_size=8, shared_memory_offset="0")]},
     b"", "^Unable to parse 'shared_memory_offset'"),
    # outputs
    ("outputs not a list", {"inputs": [], "outputs": {}}, b"", "^Unable to parse 'outputs': attempt to access JSON non-array as array$"),
    ("output not an object", {"inputs": [], "outputs": ["O"]}, b"", "^Unable to parse 'outputs': attempt to access JSON non-object"),
    ("output without name", {"inputs": [], "outputs": [{}]}, b"",
     "^Unable to parse 'name': attempt to access non-existing object member 'name'$"),
    ("output binary_data not bool", {"inputs": [], "outputs": [{"name": "O", "parameters": {"binary_data": 1}}]}, b"",
     "^Unable to parse 'binary_data': attempt to access JSON non-boolean as boolean$"),
    ("classification negative", {"inputs": [], "outputs": [{"name": "O", "parameters": {"classification": -1}}]}, b"",
     "^Unable to set 'classification': attempt to access JSON non-unsigned-integer as unsigned-integer$"),
    ("shm and classification", {"inputs": [], "outputs": [{"name": "O", "parameters": {
        "shared_memory_region": "r", "shared_memory_byte_size": 4, "classification": 1}}]}, b"",
     "^Output can't set both 'shared_memory_region' and 'classification'$"),
    ("shm and binary_data", {"inputs": [], "outputs": [{"name": "O", "parameters": {
        "shared_memory_region": "r", "shared_memory_byte_size": 4, "binary_data": True}}]}, b"",
     "^Output can't set both 'shared_memory_region' and 'binary_data'$"),
    ("output shm without byte size", {"inputs": [], "outputs": [{"name": "O", "parameters": {"shared_memory_region": "r"}}]},
     b"", "^'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor 'O'$"),
    ("output shm byte size alone", {"inputs": [], "outputs": [{"name": "O", "parameters": {"shared_memory_byte_size": 4}}]},
     b"", "^'shared_memory_byte_size' can not be specified without 'shared_memory_region' parameter for tensor 'O'$"),
    ("duplicate output", {"inputs": [], "outputs": [{"name": "O"}, {"name": "O"}]}, b"", "^output 'O' already requested$"),
    ("output parameters not an object", {"inputs": [], "outputs": [{"name": "O", "parameters": []}]}, b"",
     "^Unable to parse 'parameters'"),
]


@pytest.mark.parametrize(("doc", "binary", "match"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_malformed_requests_are_invalid_arg(doc: Any, binary: bytes, match: str) -> None:
    with invalid(match) as caught:
        decode_json(doc, binary)
    assert caught.value.code == "INVALID_ARG"


def test_binary_data_needs_the_header_length() -> None:
    body = orjson.dumps({"inputs": [fp32(binary_data_size=8)]})
    with invalid("^must specify valid 'Infer-Header-Content-Length' in request header and 'binary_data_size' "
                 "when passing inputs in binary data format$"):
        decode_infer_request("m", "1", body, None)


@pytest.mark.parametrize("header_length", [-1, 1000])
def test_header_length_out_of_range(header_length: int) -> None:
    body = orjson.dumps({"inputs": []})
    with invalid(rf"^inference header size should be in range \(0, {len(body)}\), got: {header_length}$"):
        decode_infer_request("m", "1", body, header_length)


def test_a_zero_header_length_raw_binary_request_is_refused() -> None:
    with invalid("raw binary requests"):
        decode_infer_request("m", "1", b"\x00" * 8, 0)


def test_header_length_cuts_the_json() -> None:
    body, header_length = tc_body([tc_input("X", np.arange(2, dtype=np.int32))])
    with invalid("^failed to parse the request JSON buffer"):
        decode_infer_request("m", "1", body, header_length - 1)


def test_max_tensor_bytes_bounds_every_input() -> None:
    doc = {"inputs": [fp32(shared_memory_region="r", shared_memory_byte_size=8)]}
    decode_json(doc, max_tensor_bytes=8)
    with invalid("is too large: more than 7 bytes"):
        decode_json(doc, max_tensor_bytes=7)


def test_deepest_allowed_nesting() -> None:
    data: Any = [1]
    for _ in range(MAX_DIMS - 1):
        data = [data]
    decode_json(data_input("INT8", [1] * MAX_DIMS, data))


@settings(max_examples=200, deadline=None)
@given(garbage=st.binary(max_size=64), cut=st.integers(0, 64))
def test_garbage_bodies_raise_only_invalid_arg(garbage: bytes, cut: int) -> None:
    body, header_length = tc_body([tc_input("X", np.arange(3, dtype=np.int16)),
                                   tc_input("S", np.array([b"ab"], dtype=object))])
    mangled = body[:header_length] + garbage + body[header_length + cut:]
    try:
        decode_infer_request("m", "1", mangled, header_length)
    except InferenceError as e:
        assert e.code == "INVALID_ARG"


# ---- requests: a repeated header ---------------------------------------------------------------

def repeated_body(a: np.ndarray, b: np.ndarray) -> tuple[bytes, int | None]:
    """A request whose header stays the same while ``a`` and ``b`` keep their byte sizes."""
    shm = httpclient.InferInput("R", [2], "INT64")
    shm.set_shared_memory("in_region", 16, offset=8)
    out = httpclient.InferRequestedOutput("O", binary_data=True)
    return tc_body([tc_input("A", a), tc_input("B", b), shm], [out], request_id="same", priority=1)


def repeated_arrays(i: int) -> tuple[np.ndarray, np.ndarray]:
    return np.arange(6, dtype=np.float32).reshape(2, 3) + i, np.array([b"x%d" % i, b"yz"], dtype=object)


def test_a_repeated_header_decodes_each_body_to_its_own_request() -> None:
    requests = []
    for i in range(4):  # from the third on, the header's template serves the decode
        a, b = repeated_arrays(i)
        body, header_length = repeated_body(a, b)
        request = decode_infer_request("m", str(i), body, header_length)
        same_array(request.inputs[0].data, a)
        same_array(request.inputs[1].data, b)
        assert not request.inputs[0].data.flags.writeable
        assert [(t.name, t.datatype, t.shape, t.shm, t.parameters) for t in request.inputs] == [
            ("A", "FP32", [2, 3], None, {}), ("B", "BYTES", [2], None, {}),
            ("R", "INT64", [2], ShmRef("in_region", 16, 8), {})]
        assert [(o.name, o.binary_data, o.shm, o.classification) for o in request.outputs] == [("O", True, None, 0)]
        assert (request.model_version, request.id, request.parameters["priority"]) == (str(i), "same", 1)
        requests.append(request)
    third, fourth = requests[2:]
    # Each request owns its mutable parts: changing one leaves the next decode alone.
    assert third.parameters is not fourth.parameters and third.inputs[0].shape is not fourth.inputs[0].shape
    fourth.parameters["priority"] = 9
    fourth.inputs[0].shape.append(1)
    fourth.outputs[0].parameters["k"] = 1
    again = decode_infer_request("m", "1", *repeated_body(*repeated_arrays(5)))
    assert again.parameters["priority"] == 1 and again.inputs[0].shape == [2, 3] and again.outputs[0].parameters == {}


@pytest.mark.parametrize(("change", "match"), [
    (lambda body: body[:-1], "^unexpected size for input 'B', expecting 1 additional bytes for model 'm'$"),
    (lambda body: body + b"\x00", "^unexpected additional input data for model 'm'$"),
    # the second string's length prefix says 3 where 2 bytes are left
    (lambda body: body[:-6] + struct.pack("<I", 3) + body[-2:],
     "^expected 2 string elements for inference input 'B' for model 'm', got 1$"),
])
def test_a_repeated_header_with_bad_binary_data_is_refused_as_the_first_time(change: Any, match: str) -> None:
    for i in range(3):
        decode_infer_request("m", "1", *repeated_body(*repeated_arrays(i)))
    body, header_length = repeated_body(*repeated_arrays(3))
    with invalid(match):
        decode_infer_request("m", "1", change(body), header_length)


def test_a_repeated_header_keeps_the_max_tensor_bytes_it_is_given() -> None:
    doc = {"inputs": [fp32(shared_memory_region="r", shared_memory_byte_size=8)]}
    for _ in range(3):
        decode_json(doc, max_tensor_bytes=8)
    with invalid("is too large: more than 7 bytes"):
        decode_json(doc, max_tensor_bytes=7)


# ---- responses ---------------------------------------------------------------------------------

def result_of(*outputs: OutputTensor, **kw: Any) -> InferResult:
    return InferResult(model_name="m", model_version="1", outputs=list(outputs), **kw)


@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_outputs_read_back_through_tritonclient(datatype: str, binary: bool, data: st.DataObject) -> None:
    array = data.draw(arrays_of(datatype, utf8=not binary))
    other = np.arange(3, dtype=np.int32)
    parsed = parse(result_of(OutputTensor("X", datatype, list(array.shape), array, binary_data=binary),
                             OutputTensor("Y", "INT32", [3], other, binary_data=not binary)))
    got = parsed.as_numpy("X")
    if datatype == "BYTES" and not binary:  # tritonclient hands back JSON strings as str
        array = np.array([b.decode() for b in array.reshape(-1)] or [], dtype=object).reshape(array.shape)
    if datatype == "FP16" and not binary:  # tritonclient: np.array(data, dtype=float16)
        got = got.astype(np.float16)
    same_array(got, array, bitwise=binary)
    same_array(parsed.as_numpy("Y"), other)


def test_response_header_fields() -> None:
    parsed = parse(result_of(OutputTensor("X", "INT8", [1], np.array([3], np.int8)), id="r-9",
                             parameters={"p": "v", "n": 2}))
    assert parsed.get_response() == {"id": "r-9", "model_name": "m", "model_version": "1",
                                      "parameters": {"p": "v", "n": 2},
                                      "outputs": [{"name": "X", "datatype": "INT8", "shape": [1], "data": [3]}]}
    bare = parse(result_of()).get_response()
    assert bare == {"model_name": "m", "model_version": "1", "outputs": []}  # no empty id or parameters


def test_json_only_responses_have_no_header_length() -> None:
    chunks, header_length = encode_infer_response(result_of(OutputTensor("X", "FP32", [1], np.ones(1, np.float32))))
    assert header_length is None and len(chunks) == 1
    empty = OutputTensor("E", "FP32", [0], np.ones(0, np.float32), binary_data=True)
    chunks, header_length = encode_infer_response(result_of(empty))  # as Triton: nothing follows
    assert header_length is None and orjson.loads(chunks[0])["outputs"][0]["parameters"] == {"binary_data_size": 0}


def test_binary_outputs_are_views_of_their_arrays() -> None:
    array = np.arange(6, dtype=np.float64).reshape(2, 3)
    chunks, header_length = encode_infer_response(result_of(OutputTensor("X", "FP64", [2, 3], array, binary_data=True)))
    assert header_length == len(chunks[0])
    assert isinstance(chunks[1], memoryview)
    assert np.shares_memory(np.frombuffer(chunks[1], np.uint8), array)


def test_binary_default_sends_every_output_binary() -> None:
    chunks, header_length = encode_infer_response(
        result_of(OutputTensor("X", "INT16", [2], np.array([1, 2], np.int16))), binary_default=True)
    assert header_length is not None and bytes(chunks[1]) == np.array([1, 2], "<i2").tobytes()


def test_non_contiguous_and_big_endian_outputs() -> None:
    base = np.arange(12, dtype=np.int32).reshape(3, 4)
    for array in (base.T, base[:, ::2], base.astype(">i4"), base.astype(">i4").T):
        for binary in (True, False):
            parsed = parse(result_of(OutputTensor("X", "INT32", list(array.shape), array, binary_data=binary)))
            same_array(parsed.as_numpy("X"), np.ascontiguousarray(array, dtype=np.int32))


def test_nan_and_infinity_outputs_as_json_like_triton() -> None:
    array = np.array([np.nan, np.inf, -np.inf, 0.25], dtype=np.float32)
    chunks, _ = encode_infer_response(result_of(OutputTensor("X", "FP32", [4], array)))
    assert b'"data":[NaN,Infinity,-Infinity,0.25]' in chunks[0]
    same_array(parse(result_of(OutputTensor("X", "FP32", [4], array))).as_numpy("X"), array)


def test_shared_memory_outputs_carry_no_data() -> None:
    out = OutputTensor("X", "FP32", [2, 2], shm=ShmRef("region", 16, 32))
    chunks, header_length = encode_infer_response(result_of(out), binary_default=True)
    assert header_length is None
    assert orjson.loads(chunks[0])["outputs"] == [{"name": "X", "datatype": "FP32", "shape": [2, 2]}]


def test_bf16_outputs() -> None:
    words = np.array([1.0, -2.0], dtype=ml_dtypes.bfloat16)
    for array in (words.view(np.uint16), words):
        parsed = parse(result_of(OutputTensor("X", "BF16", [2], array, binary_data=True)))
        same_array(parsed.as_numpy("X").view(np.uint16), words.view(np.uint16))
    with invalid("^sending BF16 data via JSON is not supported. Please use the binary data format for output$"):
        encode_infer_response(result_of(OutputTensor("X", "BF16", [2], words)))


def test_bytes_outputs_of_str_and_fixed_width_arrays() -> None:
    for array in (np.array(["é", "b"]), np.array([b"a", b"bc"]), np.array(["x", b"y"], dtype=object)):
        for binary in (True, False):
            got = parse(result_of(OutputTensor("S", "BYTES", [2], array, binary_data=binary))).as_numpy("S")
            expected = [x.encode() if isinstance(x, str) else bytes(x) for x in array.tolist()]
            assert [x.encode() if isinstance(x, str) else x for x in got.tolist()] == expected


def test_non_utf8_bytes_cannot_go_as_json() -> None:
    array = np.array([b"\xff\xfe"], dtype=object)
    with invalid("^output 'S' holds BYTES that are not valid UTF-8"):
        encode_infer_response(result_of(OutputTensor("S", "BYTES", [1], array)))
    parsed = parse(result_of(OutputTensor("S", "BYTES", [1], array, binary_data=True)))
    same_array(parsed.as_numpy("S"), array)


@pytest.mark.parametrize(("out", "code", "match"), [
    (OutputTensor("X", "FP32", [3], np.zeros(2, np.float32)), "INTERNAL",
     "^output tensor shape does not match size of output for 'X'$"),
    (OutputTensor("X", "FP32", [2], np.zeros(2, np.float64)), "INTERNAL", "^output 'X' holds float64 data, not FP32$"),
    (OutputTensor("X", "INT32", [2], np.zeros(2, np.float32)), "INTERNAL", "holds float32 data, not INT32"),
    (OutputTensor("X", "BYTES", [2], np.zeros(2, np.int8)), "INTERNAL", "holds int8 data, not BYTES"),
    (OutputTensor("X", "BF16", [2], np.zeros(2, np.float16)), "INTERNAL", "holds float16 data, not BF16"),
    (OutputTensor("X", "FP32", [2]), "INTERNAL", "^output 'X' has no data$"),
    (OutputTensor("X", "FP8", [2], np.zeros(2, np.uint8)), "INVALID_ARG", "^Invalid data type for output tensor$"),
])
def test_unencodable_outputs(out: OutputTensor, code: str, match: str) -> None:
    with pytest.raises(InferenceError, match=match) as caught:
        encode_infer_response(result_of(out))
    assert caught.value.code == code


def test_unencodable_response_parameters() -> None:
    with pytest.raises(InferenceError, match="unable to encode the inference response") as caught:
        encode_infer_response(result_of(parameters={"p": object()}))
    assert caught.value.code == "INTERNAL"


def test_encode_error() -> None:
    message = 'bad "input" \\ é\n'
    assert orjson.loads(encode_error(message)) == {"error": message}


def test_a_decoded_request_round_trips_through_a_response() -> None:
    """The echo a model would do: decoded inputs are valid outputs for the encoder."""
    arrays = [np.arange(6, dtype=np.uint16).reshape(3, 2), np.array([[b"x", b""]], dtype=object)]
    request = decode([tc_input("A", arrays[0]), tc_input("B", arrays[1])])
    outputs = [OutputTensor(t.name, t.datatype, t.shape, t.data, binary_data=True) for t in request.inputs]
    parsed = parse(result_of(*outputs))
    for name, array in zip("AB", arrays):
        same_array(parsed.as_numpy(name), array)
