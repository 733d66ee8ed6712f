"""pb_utils constructors refuse bad arguments as Triton's binding does: a wrong argument type (None
included) is a TypeError, what the backend itself checks is a TritonModelException with Triton's
text. Models port unchanged only if the same mistakes fail the same way (Triton's
``argument_validation`` and ``response_parameters`` test models check exactly these)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from stubhost.backend_utils import (
    InferenceRequest,
    InferenceResponse,
    Logger,
    LogLevel,
    Tensor,
    TritonError,
    TritonModelException,
)

INPUTS = [Tensor("INPUT0", np.asarray([1, 2], dtype=np.int32))]


def request(**overrides: Any) -> InferenceRequest:
    kwargs: dict[str, Any] = {"model_name": "m", "inputs": INPUTS, "requested_output_names": ["OUT"]}
    kwargs.update(overrides)
    return InferenceRequest(**kwargs)


@pytest.mark.parametrize("overrides", [
    {"inputs": None}, {"model_name": None}, {"requested_output_names": None},
    {"requested_output_names": [None]}, {"request_id": None}, {"correlation_id": None},
    {"model_version": None}, {"flags": None}, {"correleation_id": 1},  # an unknown (misspelt) keyword
], ids=str)
def test_request_argument_of_the_wrong_type_is_a_type_error(overrides: dict[str, Any]) -> None:
    with pytest.raises(TypeError):
        request(**overrides)


def test_request_checks_of_the_backend_raise_tritons_texts() -> None:
    with pytest.raises(TritonModelException, match="^Input tensor for request with id 'r7' and model name 'm' "
                                                   "should not be empty.$"):
        request(inputs=[None], request_id="r7")
    with pytest.raises(TritonModelException, match="^Requested output name for request with id '' and model "
                                                   "name 'm' should not be empty.$"):
        request(requested_output_names=[""])
    with pytest.raises(TritonModelException, match="^Correlation ID must be integer or string$"):
        request(correlation_id=1.5)


@pytest.mark.parametrize("left_out", ["model_name", "inputs", "requested_output_names"])
def test_request_without_a_required_argument_is_a_type_error(left_out: str) -> None:
    kwargs: dict[str, Any] = {"model_name": "m", "inputs": INPUTS, "requested_output_names": ["OUT"]}
    del kwargs[left_out]
    with pytest.raises(TypeError):  # no default in Triton's binding either (Triton's test_bls_incorrect_args)
        InferenceRequest(**kwargs)


def test_request_reads_bytes_as_text_as_tritons_binding_does() -> None:
    built = request(model_name=b"m2", request_id=b"r1", requested_output_names=[b"OUT"])
    assert built.model_name() == "m2"
    assert built.request_id() == "r1" and built.requested_output_names() == ["OUT"]


def test_request_accepts_empty_lists_and_both_kinds_of_correlation_id() -> None:
    assert request(inputs=[], requested_output_names=[]).inputs() == []
    assert request(correlation_id="seq-1").correlation_id() == "seq-1"
    assert request(correlation_id=7).correlation_id() == 7


def test_response_argument_checks() -> None:
    with pytest.raises(TypeError):
        InferenceResponse(output_tensors=None)  # type: ignore[arg-type]
    with pytest.raises(TritonModelException, match="^Output tensor for inference response should not be empty.$"):
        InferenceResponse(output_tensors=[None])  # type: ignore[list-item]
    assert InferenceResponse(output_tensors=[]).output_tensors() == []
    assert InferenceResponse().output_tensors() == []
    assert InferenceResponse(INPUTS).output_tensors()[0].name() == "INPUT0"


@pytest.mark.parametrize(("parameters", "text"), [
    ([], "Expect dict, got <class 'list'>"),
    ({1: "int key"}, "Expect parameters keys to have type str, found type <class 'int'>"),
    ({"int": 2, "float": 0.5}, "Expect parameters values to have type bool/int/str, found type <class 'float'>"),
    ({"null": None}, "Expect parameters values to have type bool/int/str, found type <class 'NoneType'>"),
    ({"list": ["v"]}, "Expect parameters values to have type bool/int/str, found type <class 'list'>"),
], ids=["list", "int_key", "float", "null", "nested"])
def test_parameters_are_checked_with_tritons_texts(parameters: Any, text: str) -> None:
    for build in (lambda: InferenceResponse([], parameters=parameters), lambda: request(parameters=parameters)):
        with pytest.raises(TritonModelException) as info:
            build()
        assert text in str(info.value)


def test_valid_parameters_round_trip_as_json() -> None:
    params = {"bool": True, "str": "Hello World!", "int": 1024}
    assert InferenceResponse([], parameters=params).parameters() == '{"bool": true, "str": "Hello World!", "int": 1024}'
    assert request(parameters={}).parameters() == "{}"


def test_tensor_argument_checks() -> None:
    array = np.asarray([1, 2], dtype=np.int32)
    with pytest.raises(TypeError):
        Tensor(None, array)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Tensor("OUTPUT0", None)
    with pytest.raises(TypeError):
        Tensor("", None)
    with pytest.raises(TritonModelException, match="^Tensor name cannot be an empty string.$"):
        Tensor("", array)
    with pytest.raises(TritonModelException, match="^Tensor name cannot be an empty string.$"):
        Tensor.from_dlpack("", None)
    with pytest.raises(TritonModelException, match="^Provided tensor is not supported. Tensor must be a DLPack "
                                                   "capsule or have `__dlpack__` and `__dlpack_device__`"):
        Tensor.from_dlpack("OUTPUT0", None)


def test_tensor_messages_are_tritons() -> None:
    with pytest.raises(TritonModelException, match="^DLPack does not have support for string tensors.$"):
        Tensor("S", np.array([b"a"], dtype=np.object_)).to_dlpack()
    strided = np.arange(12, dtype=np.float32).reshape(3, 4).T
    with pytest.raises(TritonModelException, match="^DLPack tensor is not contiguous. Only contiguous DLPack "
                                                   "tensors that are stored in C-Order are supported.$"):
        Tensor.from_dlpack("X", strided)
    # A size-1 axis has no meaningful stride, so a column of one is still contiguous.
    assert Tensor.from_dlpack("X", np.arange(4, dtype=np.float32).reshape(4, 1)).shape() == [4, 1]
    assert Tensor("X", strided).as_numpy().flags.c_contiguous  # Tensor() itself copies to C order


@pytest.mark.parametrize("call", [
    lambda: Logger.log("Invalid Level", None), lambda: Logger.log("Invalid Level", 1),
    lambda: Logger.log_info(None), lambda: Logger.log_warn(None), lambda: Logger.log_error(None),
    lambda: Logger.log_verbose(None),
], ids=["level_none", "level_int", "info", "warn", "error", "verbose"])
def test_logger_argument_of_the_wrong_type_is_a_type_error(call: Callable[[], None]) -> None:
    with pytest.raises(TypeError):
        call()


def test_logger_accepts_its_levels(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("DEBUG", logger="stubhost.model"):
        Logger.log("Level unspecified")
        Logger.log("at error", LogLevel.ERROR)
        Logger.log("through the class", Logger.LogLevel.WARNING)
    assert [r.getMessage() for r in caplog.records] == ["Level unspecified", "at error", "through the class"]


def test_triton_error_message_must_be_text() -> None:
    with pytest.raises(TypeError):
        TritonError(None)  # type: ignore[arg-type]
    assert TritonError(message="m", code=TritonError.CANCELLED).code() == TritonError.CANCELLED
