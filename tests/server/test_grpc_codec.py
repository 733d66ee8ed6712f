"""grpc_codec against tritonclient: requests built by tritonclient's own request builder decode to
the arrays it was given, and responses we encode read back through tritonclient's InferResult."""

from __future__ import annotations

import struct
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as tc_grpc
import tritonclient.grpc.service_pb2 as tc_pb2
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonclient.grpc._utils import _get_inference_request

from stubhost.host.errors import InferenceError
from stubhost.server import grpc_service_pb2 as pb
from stubhost.server.grpc_codec import (
    decode_infer_request,
    decode_parameters,
    encode_infer_response,
    encode_parameters,
)
from stubhost.server.types import InferResult, OutputTensor, ShmRef

NUMERIC = {
    "BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}
DATATYPES = [*NUMERIC, "BYTES"]
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


def arrays_of(datatype: str) -> st.SearchStrategy[np.ndarray]:
    if datatype == "BYTES":
        return hnp.arrays(object, SHAPES, elements=st.binary(max_size=12))
    return hnp.arrays(NUMERIC[datatype], SHAPES)


def tc_input(name: str, array: np.ndarray, datatype: str | None = None) -> tc_grpc.InferInput:
    datatype = datatype or ("BYTES" if array.dtype == object else tc_grpc.np_to_triton_dtype(array.dtype))
    return tc_grpc.InferInput(name, list(array.shape), datatype).set_data_from_numpy(array)


def tc_request(inputs: list, outputs: list | None = None, **kw: Any) -> tc_pb2.ModelInferRequest:
    """tritonclient's own request (what InferenceServerClient.infer sends)."""
    args: dict[str, Any] = {"model_name": "m", "inputs": inputs, "model_version": "", "request_id": "",
                            "outputs": outputs, "sequence_id": 0, "sequence_start": False, "sequence_end": False,
                            "priority": 0, "timeout": None, "parameters": None, **kw}
    return _get_inference_request(**args)


def over_the_wire(message: Any, cls: Any = pb.ModelInferRequest) -> Any:
    return cls.FromString(message.SerializeToString())


def decode(message: Any):
    return decode_infer_request(over_the_wire(message))


def same_array(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    if expected.dtype == object:
        assert got.dtype == object
        assert got.tolist() == expected.tolist()
    else:
        assert got.dtype == expected.dtype
        assert got.tobytes() == expected.tobytes()  # bitwise: NaNs and -0.0 included


def raise_invalid(match: str):
    return pytest.raises(InferenceError, match=match)


# ---- requests: data --------------------------------------------------------------------------

@pytest.mark.parametrize("datatype", DATATYPES)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_raw_inputs_from_tritonclient_decode_to_their_arrays(datatype: str, data: st.DataObject) -> None:
    array = data.draw(arrays_of(datatype))
    other = np.arange(3, dtype=np.int32)
    request = decode(tc_request([tc_input("X", array), tc_input("Y", other)]))
    x, y = request.inputs
    assert (x.name, x.datatype, x.shape, x.shm) == ("X", datatype, list(array.shape), None)
    same_array(x.data, array)
    same_array(y.data, other)


@pytest.mark.parametrize("datatype", list(NUMERIC))
def test_raw_inputs_are_views_of_the_message_bytes(datatype: str) -> None:
    array = np.ones((2, 3), dtype=NUMERIC[datatype])
    x = decode(tc_request([tc_input("X", array)])).inputs[0].data
    assert not x.flags.owndata and not x.flags.writeable
    base = x
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, bytes) and len(base) == array.nbytes


def test_str_elements_decode_as_their_utf8_bytes() -> None:
    array = np.array([["héllo", ""], ["x", "∑"]], dtype=object)
    got = decode(tc_request([tc_input("S", array)])).inputs[0].data
    assert got.tolist() == [[b"h\xc3\xa9llo", b""], [b"x", "∑".encode()]]


def test_bf16_decodes_to_uint16_words() -> None:
    array = np.array([1.0, -2.5, 3.0], dtype=ml_dtypes.bfloat16)
    got = decode(tc_request([tc_input("B", array, "BF16")])).inputs[0]
    assert got.datatype == "BF16"
    same_array(got.data, array.view(np.uint16))


def typed_request(datatype: str, shape: list[int], **contents: Any) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="T", datatype=datatype, shape=shape)
    tensor.contents.SetInParent()  # present even when every list is empty
    for field, values in contents.items():
        getattr(tensor.contents, field).extend(values)
    return request


TYPED = [
    ("BOOL", "bool_contents", [True, False, True, True]),
    ("INT8", "int_contents", [-128, 127, 0, -1]),
    ("INT16", "int_contents", [-32768, 32767, 5, -1]),
    ("INT32", "int_contents", [-(2**31), 2**31 - 1, 0, 7]),
    ("INT64", "int64_contents", [-(2**63), 2**63 - 1, 0, 9]),
    ("UINT8", "uint_contents", [0, 255, 1, 2]),
    ("UINT16", "uint_contents", [0, 65535, 1, 2]),
    ("UINT32", "uint_contents", [0, 2**32 - 1, 1, 2]),
    ("UINT64", "uint64_contents", [0, 2**64 - 1, 1, 2]),
    ("FP32", "fp32_contents", [1.5, -0.0, float("inf"), 3.25]),
    ("FP64", "fp64_contents", [1e300, -0.0, float("-inf"), 3.25]),
    ("BYTES", "bytes_contents", [b"a", b"", b"\x00\xff", b"long" * 10]),
]


@pytest.mark.parametrize(("datatype", "field", "values"), TYPED)
def test_typed_contents_decode_to_the_tensor_datatype(datatype: str, field: str, values: list) -> None:
    request = decode_infer_request(over_the_wire(typed_request(datatype, [2, 2], **{field: values})))
    got = request.inputs[0].data
    expected = np.array(values, dtype=object if datatype == "BYTES" else NUMERIC[datatype]).reshape(2, 2)
    same_array(got, expected)


@pytest.mark.parametrize("datatype", DATATYPES)
def test_empty_typed_contents_decode_a_zero_element_tensor(datatype: str) -> None:
    got = decode_infer_request(typed_request(datatype, [0, 3])).inputs[0].data
    assert got.shape == (0, 3)


def test_shared_memory_inputs_take_no_raw_entry() -> None:
    a, c = np.arange(4, dtype=np.float32), np.array([b"q"], dtype=object)
    b = tc_grpc.InferInput("B", [8], "INT64")
    b.set_shared_memory("in_region", 64, offset=128)
    d = tc_grpc.InferInput("D", [2], "FP16")
    d.set_shared_memory("in_region", 4)
    request = decode(tc_request([tc_input("A", a), b, tc_input("C", c), d]))
    got = {t.name: t for t in request.inputs}
    same_array(got["A"].data, a)
    same_array(got["C"].data, c)
    assert got["B"].data is None and got["B"].shm == ShmRef("in_region", 64, 128)
    assert got["D"].data is None and got["D"].shm == ShmRef("in_region", 4, 0)
    assert got["B"].parameters == {} and got["B"].shape == [8] and got["B"].datatype == "INT64"


def test_a_request_of_only_shared_memory_inputs() -> None:
    b = tc_grpc.InferInput("B", [8], "INT64")
    b.set_shared_memory("r", 64)
    (tensor,) = decode(tc_request([b])).inputs
    assert tensor.shm == ShmRef("r", 64)


# ---- requests: outputs and parameters ---------------------------------------------------------

def test_requested_outputs() -> None:
    plain = tc_grpc.InferRequestedOutput("PLAIN")
    top = tc_grpc.InferRequestedOutput("TOP", class_count=3)
    shm = tc_grpc.InferRequestedOutput("SHM")
    shm.set_shared_memory("out_region", 256, offset=16)
    request = tc_request([tc_input("X", np.zeros(1, np.float32))], [plain, top, shm])
    request.outputs[0].parameters["binary_data"].bool_param = False  # meaningless for gRPC: dropped
    request.outputs[0].parameters["custom"].string_param = "kept"
    outputs = decode(request).outputs
    assert [o.name for o in outputs] == ["PLAIN", "TOP", "SHM"]
    assert outputs[0].binary_data is None and outputs[0].parameters == {"custom": "kept"}
    assert outputs[1].classification == 3 and outputs[1].shm is None and outputs[1].parameters == {}
    assert outputs[2].shm == ShmRef("out_region", 256, 16) and outputs[2].classification == 0


def test_no_requested_outputs_means_an_empty_list() -> None:
    assert decode(tc_request([tc_input("X", np.zeros(1, np.float32))])).outputs == []


def test_request_header_and_parameters() -> None:
    request = decode(tc_request(
        [tc_input("X", np.zeros(1, np.float32))], model_version="3", request_id="abc", sequence_id=42,
        sequence_start=True, sequence_end=False, priority=2, timeout=1000,
        parameters={"s": "text", "i": -7, "f": 0.5, "b": True}))
    assert (request.model_name, request.model_version, request.id) == ("m", "3", "abc")
    assert request.parameters == {"sequence_id": 42, "sequence_start": True, "sequence_end": False,
                                  "priority": 2, "timeout": 1000, "s": "text", "i": -7, "f": 0.5, "b": True}
    assert isinstance(request.parameters["b"], bool)


def test_parameters_round_trip_through_the_map() -> None:
    values = {"b": False, "i": -(2**63), "u": 2**64 - 1, "d": -1.25, "s": "", "n": np.int32(5),
              "f": np.float32(0.5)}
    message = pb.ModelInferResponse()
    encode_parameters(values, message.parameters)
    assert message.parameters["u"].WhichOneof("parameter_choice") == "uint64_param"
    assert message.parameters["i"].WhichOneof("parameter_choice") == "int64_param"
    assert decode_parameters(message.parameters) == {**values, "n": 5, "f": 0.5}


@pytest.mark.parametrize(("value", "error"), [(2**64, ValueError), (-(2**63) - 1, ValueError),
                                              (b"bytes", TypeError), (None, TypeError), ([1], TypeError)])
def test_encode_parameters_rejects_what_the_wire_cannot_carry(value: Any, error: type) -> None:
    with pytest.raises(error, match="'k'"):
        encode_parameters({"k": value}, pb.ModelInferResponse().parameters)


# ---- requests: errors ---------------------------------------------------------------------------

def two_inputs() -> tc_pb2.ModelInferRequest:
    return tc_request([tc_input("A", np.zeros(2, np.float32)), tc_input("B", np.zeros(2, np.int32))])


def test_too_few_raw_entries() -> None:
    request = two_inputs()
    del request.raw_input_contents[1]
    with raise_invalid(r"^unable to find data for input tensor 'B' for model 'm' in request\.$") as e:
        decode(request)
    assert e.value.code == "INVALID_ARG"


def test_too_many_raw_entries() -> None:
    request = two_inputs()
    request.raw_input_contents.append(b"\0" * 8)
    with raise_invalid(r"expected 2 entries in raw_input_contents .* but got 3 for model 'm'"):
        decode(request)


def test_raw_entry_for_a_shared_memory_input_is_a_count_mismatch() -> None:
    request = two_inputs()
    request.inputs[1].parameters["shared_memory_region"].string_param = "r"
    request.inputs[1].parameters["shared_memory_byte_size"].int64_param = 8
    with raise_invalid("expected 1 entries in raw_input_contents"):
        decode(request)


def test_raw_and_typed_contents_together() -> None:
    request = two_inputs()
    request.inputs[0].contents.fp32_contents.extend([1.0, 2.0])
    with raise_invalid("^contents field must not be specified when using raw_input_contents for 'A' for model 'm'$"):
        decode(request)


def test_shared_memory_and_contents_together() -> None:
    request = typed_request("FP32", [1], fp32_contents=[1.0])
    request.inputs[0].parameters["shared_memory_region"].string_param = "r"
    request.inputs[0].parameters["shared_memory_byte_size"].int64_param = 4
    with raise_invalid("^unexpected 'content' provided when using shared memory for input tensor 'T' for model 'm'$"):
        decode(request)


def test_an_input_without_any_data() -> None:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="T", datatype="FP32", shape=[1])
    with raise_invalid("^unable to find data for input tensor 'T' for model 'm' in request.$"):
        decode(request)


@pytest.mark.parametrize(("datatype", "shape", "nbytes", "expected"), [
    ("FP32", [2, 2], 12, 16), ("INT64", [3], 32, 24), ("FP16", [], 4, 2), ("BOOL", [0], 1, 0)])
def test_raw_byte_size_mismatch(datatype: str, shape: list[int], nbytes: int, expected: int) -> None:
    request = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\0" * nbytes])
    request.inputs.add(name="X", datatype=datatype, shape=shape)
    with raise_invalid(rf"^input byte size mismatch for input 'X' for model 'm'\. Expected {expected}, "
                       rf"got {nbytes}$"):
        decode(request)


def bytes_request(shape: list[int], raw: bytes) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", raw_input_contents=[raw])
    request.inputs.add(name="S", datatype="BYTES", shape=shape)
    return request


def test_bytes_element_count_mismatch() -> None:
    raw = b"".join(struct.pack("<I", len(s)) + s for s in (b"ab", b"c"))
    with raise_invalid(r"^expected 3 string elements for inference input 'S' for model 'm', got 2$"):
        decode(bytes_request([3], raw))
    with raise_invalid(r"^expected 1 string elements for inference input 'S' for model 'm', got 2$"):
        decode(bytes_request([1], raw))


def test_a_forged_bytes_shape_is_an_element_count_mismatch() -> None:
    raw = struct.pack("<I", 1) + b"a"
    with raise_invalid(rf"^expected {2**124} string elements for inference input 'S' for model 'm', got 1$"):
        decode(bytes_request([2**62, 2**62], raw))
    with raise_invalid(r"^expected 0 string elements for inference input 'S' for model 'm', got 1$"):
        decode(bytes_request([0], raw))


@pytest.mark.parametrize("raw", [b"\x05\0\0\0abc", b"\x01\0", b"\x01\0\0\0a\x02"])
def test_malformed_bytes(raw: bytes) -> None:
    with raise_invalid(r"^invalid BYTES data for inference input 'S' for model 'm': BYTES "):
        decode(bytes_request([1], raw))


@pytest.mark.parametrize(("datatype", "field", "values", "held"), [
    ("INT32", "fp32_contents", [1.0], "FP32"),
    ("FP16", "fp32_contents", [1.0], "FP32"),  # FP16 has no typed field
    ("BF16", "uint_contents", [1], "UINT32"),
    ("INT64", "int_contents", [1], "INT32"),
    ("UINT8", "int_contents", [1], "INT32"),
    ("BYTES", "int_contents", [1], "INT32"),
    ("FP32", "bytes_contents", [b"x"], "BYTES"),
])
def test_typed_contents_of_another_datatype(datatype: str, field: str, values: list, held: str) -> None:
    with raise_invalid(rf"^unexpected explicit tensor data for input tensor 'T' for model 'm' of type '{held}', "
                       rf"expected datatype '{datatype}'$"):
        decode(typed_request(datatype, [1], **{field: values}))


def test_two_typed_fields() -> None:
    with raise_invalid("^unexpected explicit tensor data for input tensor 'T' for model 'm', binary data was "
                       "already supplied.$"):
        decode(typed_request("INT32", [1], int_contents=[1], fp32_contents=[1.0]))


@pytest.mark.parametrize(("datatype", "field", "values", "message"), [
    ("INT32", "int_contents", [1, 2, 3], r"input byte size mismatch for input 'T' for model 'm'\. Expected 8, got 12"),
    ("INT8", "int_contents", [1], r"input byte size mismatch for input 'T' for model 'm'\. Expected 2, got 1"),
    ("FP64", "fp64_contents", [], r"input byte size mismatch for input 'T' for model 'm'\. Expected 16, got 0"),
    ("BYTES", "bytes_contents", [b"x"], r"expected 2 string elements for inference input 'T' for model 'm', got 1"),
    ("BYTES", "bytes_contents", [], r"expected 2 string elements for inference input 'T' for model 'm', got 0"),
])
def test_typed_element_count_mismatch(datatype: str, field: str, values: list, message: str) -> None:
    with raise_invalid(f"^{message}$"):
        decode(typed_request(datatype, [2], **{field: values}))


def shm_request(**params: tuple[str, Any]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="T", datatype="FP32", shape=[1])
    for key, (kind, value) in params.items():
        setattr(tensor.parameters[key], kind, value)
    return request


@pytest.mark.parametrize(("params", "message"), [
    ({"shared_memory_region": ("string_param", "r")},
     "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter for tensor 'T'"),
    ({"shared_memory_byte_size": ("int64_param", 4)},
     "'shared_memory_byte_size' can not be specified without 'shared_memory_region' parameter for tensor 'T'"),
    ({"shared_memory_offset": ("int64_param", 4)},
     "'shared_memory_offset' can not be specified without 'shared_memory_region' parameter for tensor 'T'"),
    ({"shared_memory_region": ("int64_param", 1), "shared_memory_byte_size": ("int64_param", 4)},
     "invalid value type for 'shared_memory_region' parameter for tensor 'T', expected string_param."),
    ({"shared_memory_region": ("string_param", "r"), "shared_memory_byte_size": ("uint64_param", 4)},
     "invalid value type for 'shared_memory_byte_size' parameter for tensor 'T', expected int64_param."),
    ({"shared_memory_region": ("string_param", "r"), "shared_memory_byte_size": ("int64_param", 4),
      "shared_memory_offset": ("string_param", "0")},
     "invalid value type for 'shared_memory_offset' parameter for tensor 'T', expected int64_param."),
    ({"shared_memory_region": ("string_param", "r"), "shared_memory_byte_size": ("int64_param", -4)},
     "'shared_memory_offset' and 'shared_memory_byte_size' parameters for tensor 'T' must not be negative"),
    ({"shared_memory_region": ("string_param", "r"), "shared_memory_byte_size": ("int64_param", 4),
      "shared_memory_offset": ("int64_param", -1)},
     "'shared_memory_offset' and 'shared_memory_byte_size' parameters for tensor 'T' must not be negative"),
])
def test_shared_memory_parameter_mistakes_on_inputs(params: dict, message: str) -> None:
    with pytest.raises(InferenceError) as e:
        decode(shm_request(**params))
    assert (e.value.code, e.value.message) == ("INVALID_ARG", message)


def test_shared_memory_parameter_mistakes_on_outputs() -> None:
    request = tc_request([tc_input("X", np.zeros(1, np.float32))], [tc_grpc.InferRequestedOutput("O")])
    request.outputs[0].parameters["shared_memory_region"].string_param = "r"
    with raise_invalid("^'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter "
                       "for tensor 'O'$"):
        decode(request)


@pytest.mark.parametrize(("kind", "value", "message"), [
    ("string_param", "3", "invalid value type for 'classification' parameter, expected int64_param"),
    ("int64_param", 0, "invalid value for 'classification' parameter, expected >= 0"),
    ("int64_param", -2, "invalid value for 'classification' parameter, expected >= 0"),
])
def test_classification_mistakes(kind: str, value: Any, message: str) -> None:
    request = tc_request([tc_input("X", np.zeros(1, np.float32))], [tc_grpc.InferRequestedOutput("O")])
    setattr(request.outputs[0].parameters["classification"], kind, value)
    with raise_invalid(f"^{message}$"):
        decode(request)


def test_classification_and_shared_memory_together() -> None:
    out = tc_grpc.InferRequestedOutput("O")
    out.set_shared_memory("r", 8)
    request = tc_request([tc_input("X", np.zeros(1, np.float32))], [out])
    request.outputs[0].parameters["classification"].int64_param = 2  # tritonclient refuses to send this
    with raise_invalid("^output can't set both 'shared_memory_region' and 'classification'$"):
        decode(request)


def test_unknown_datatype_and_negative_dims() -> None:
    request = pb.ModelInferRequest(model_name="m", raw_input_contents=[b""])
    tensor = request.inputs.add(name="X", datatype="FP8", shape=[1])
    with raise_invalid("^invalid datatype 'FP8' for input tensor 'X' for model 'm'$"):
        decode(request)
    tensor.datatype, tensor.shape[0] = "FP32", -1
    with raise_invalid(r"^invalid shape \[-1\] for input tensor 'X' for model 'm'"):
        decode(request)


@pytest.mark.parametrize("datatype", ["FP32", "BYTES"])
@pytest.mark.parametrize("typed", [False, True])
def test_a_zero_element_shape_too_large_for_numpy(datatype: str, typed: bool) -> None:
    shape = [0, 2**62, 2**62]
    request = typed_request(datatype, shape) if typed else pb.ModelInferRequest(model_name="m", raw_input_contents=[b""])
    if not typed:
        request.inputs.add(name="T", datatype=datatype, shape=shape)
    with raise_invalid(rf"^invalid shape \[0, {2**62}, {2**62}\] for input tensor 'T' for model 'm': too large$"):
        decode(request)


def test_parameter_without_a_value() -> None:
    request = two_inputs()
    request.parameters["empty"].SetInParent()
    with raise_invalid("^invalid value type for 'empty' parameter, no value was set$"):
        decode(request)


# ---- responses ----------------------------------------------------------------------------------

def as_tritonclient(response: pb.ModelInferResponse) -> tc_grpc.InferResult:
    return tc_grpc.InferResult(over_the_wire(response, tc_pb2.ModelInferResponse))


def output(name: str, datatype: str, data: np.ndarray | None = None, shm: ShmRef | None = None,
           shape: list[int] | None = None) -> OutputTensor:
    shape = list(data.shape) if shape is None else shape
    return OutputTensor(name, datatype, shape, data, shm)


@pytest.mark.parametrize("datatype", DATATYPES)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_encoded_outputs_read_back_through_tritonclient(datatype: str, data: st.DataObject) -> None:
    array = data.draw(arrays_of(datatype))
    tail = np.arange(5, dtype=np.uint16)
    result = InferResult("m", "1", "id", outputs=[output("OUT", datatype, array), output("TAIL", "UINT16", tail)])
    parsed = as_tritonclient(encode_infer_response(result))
    same_array(parsed.as_numpy("OUT"), array)
    same_array(parsed.as_numpy("TAIL"), tail)
    tensor = parsed.get_output("OUT")
    assert (tensor.datatype, list(tensor.shape)) == (datatype, list(array.shape))


def test_response_header_and_parameters() -> None:
    result = InferResult("m", "7", "req-1", parameters={"sequence_end": True, "n": 3, "big": 2**63, "x": 0.5,
                                                        "s": "t"})
    response = as_tritonclient(encode_infer_response(result)).get_response()
    assert (response.model_name, response.model_version, response.id) == ("m", "7", "req-1")
    params = response.parameters
    assert params["sequence_end"].bool_param and params["n"].int64_param == 3
    assert params["big"].uint64_param == 2**63 and params["x"].double_param == 0.5
    assert params["s"].string_param == "t"


def test_shared_memory_outputs_keep_the_raw_entries_in_step() -> None:
    """An output in shared memory gets an empty raw entry, so the outputs after it are still found
    by position (how tritonclient's as_numpy reads them)."""
    a, c = np.arange(4, dtype=np.float32), np.array([b"x", b"yz"], dtype=object)
    result = InferResult("m", "1", outputs=[
        output("A", "FP32", a),
        output("B", "INT64", shm=ShmRef("out", 64, 32), shape=[8]),
        output("C", "BYTES", c),
        output("D", "FP16", shm=ShmRef("out", 4), shape=[2]),
    ])
    response = encode_infer_response(result)
    assert list(response.raw_output_contents)[1::2] == [b"", b""]
    parsed = as_tritonclient(response)
    same_array(parsed.as_numpy("A"), a)
    same_array(parsed.as_numpy("C"), c)
    b = parsed.get_output("B")
    assert list(b.shape) == [8] and b.datatype == "INT64"
    assert b.parameters["shared_memory_region"].string_param == "out"
    assert b.parameters["shared_memory_byte_size"].int64_param == 64
    assert b.parameters["shared_memory_offset"].int64_param == 32
    d = parsed.get_output("D")
    assert "shared_memory_offset" not in d.parameters
    assert d.parameters["shared_memory_byte_size"].int64_param == 4
    assert "shared_memory_region" not in parsed.get_output("A").parameters


def test_non_contiguous_and_big_endian_outputs_are_sent_little_endian_in_c_order() -> None:
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    strided = base[::2, ::3].T
    swapped = np.arange(6, dtype=">f8").reshape(2, 3)
    result = InferResult("m", "1", outputs=[output("S", "INT32", strided), output("E", "FP64", swapped)])
    parsed = as_tritonclient(encode_infer_response(result))
    same_array(parsed.as_numpy("S"), np.ascontiguousarray(strided))
    same_array(parsed.as_numpy("E"), swapped.astype("<f8"))


def test_bf16_outputs_accept_uint16_words_and_bfloat16() -> None:
    values = np.array([1.0, -2.5], dtype=ml_dtypes.bfloat16)
    result = InferResult("m", "1", outputs=[output("W", "BF16", values.view(np.uint16)), output("F", "BF16", values)])
    parsed = as_tritonclient(encode_infer_response(result))
    assert parsed.as_numpy("W").tobytes() == parsed.as_numpy("F").tobytes() == values.tobytes()


def test_bytes_outputs_of_str_and_numpy_string_arrays() -> None:
    result = InferResult("m", "1", outputs=[output("U", "BYTES", np.array(["é", "b"])),
                                            output("S", "BYTES", np.array([b"a", b"bc"]))])
    parsed = as_tritonclient(encode_infer_response(result))
    assert parsed.as_numpy("U").tolist() == ["é".encode(), b"b"]
    assert parsed.as_numpy("S").tolist() == [b"a", b"bc"]


@pytest.mark.parametrize(("tensor", "match"), [
    (OutputTensor("O", "FP32", [2]), "neither data nor a shared-memory region"),
    (OutputTensor("O", "FP32", [2], np.zeros(2, np.float64)), "is FP32 but its array is float64"),
    (OutputTensor("O", "BF16", [2], np.zeros(2, np.float32)), "is BF16 but its array is float32"),
    (OutputTensor("O", "FP32", [3], np.zeros(2, np.float32)), "has 2 elements but its shape is"),
    (OutputTensor("O", "FP8", [2], np.zeros(2, np.uint8)), "unknown datatype 'FP8'"),
])
def test_inconsistent_outputs_are_our_bug_not_the_clients(tensor: OutputTensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        encode_infer_response(InferResult("m", "1", outputs=[tensor]))


def test_a_request_round_trip_through_decode_and_encode() -> None:
    """What a front end does for an identity model: inputs come back as outputs unchanged."""
    arrays = {"A": np.arange(6, dtype=np.float16).reshape(2, 3), "B": np.array([[b"x"], [b""]], dtype=object),
              "C": np.array([True, False])}
    request = decode(tc_request([tc_input(n, a) for n, a in arrays.items()]))
    outputs = [OutputTensor(t.name, t.datatype, t.shape, t.data) for t in request.inputs]
    parsed = as_tritonclient(encode_infer_response(InferResult("m", "1", outputs=outputs)))
    for name, array in arrays.items():
        same_array(parsed.as_numpy(name), array)
