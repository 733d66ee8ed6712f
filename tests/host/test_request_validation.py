"""Requests the server rejects before they reach a stub (INVALID_ARG / NOT_FOUND, in Triton's words),
optional inputs, and requested outputs."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import config_pbtxt, copy_examples, io, write_model

A = np.array([1, 2, 3, 4], dtype=np.float32)
B = np.array([0.5, 0.5, 0.5, 0.5], dtype=np.float32)

BATCHED_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy() + 1)])
                for r in requests]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo = copy_examples(tmp_path_factory.mktemp("validation") / "models", "add_sub", "optional_inputs",
                         "string_upper")
    write_model(repo, "batched", BATCHED_PY, config_pbtxt(
        "batched", [io("INPUT0", "TYPE_INT32", [3])], [io("OUTPUT0", "TYPE_INT32", [3])], max_batch_size=4))
    with stubhost.Server(repo) as s:
        yield s


def rejected(server: stubhost.Server, model: str, inputs: dict[str, object], **kwargs: object) -> stubhost.InferenceError:
    with pytest.raises(stubhost.InferenceError) as info:
        server.infer(model, inputs, **kwargs)  # type: ignore[arg-type]
    return info.value


# ---- inputs ------------------------------------------------------------------------------------------
def test_valid_request(server: stubhost.Server) -> None:
    out = server.infer("add_sub", {"INPUT0": A, "INPUT1": B})
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)
    np.testing.assert_array_equal(out["OUTPUT1"], A - B)


def test_unknown_input(server: stubhost.Server) -> None:
    error = rejected(server, "add_sub", {"INPUT0": A, "BOGUS": A})
    assert error.code == "INVALID_ARG"
    assert error.message == "[request id: <id_unknown>] unexpected inference input 'BOGUS' for model 'add_sub'"


def test_more_inputs_than_the_model_has(server: stubhost.Server) -> None:
    """Triton's words, down to its list of the request's inputs (newest first, from a hash map)
    and its empty list of missing inputs, printed as ``]``."""
    error = rejected(server, "add_sub", {"INPUT0": A, "INPUT1": B, "BOGUS": A})
    assert error.code == "INVALID_ARG"
    assert error.message == ("[request id: <id_unknown>] expected 2 inputs but got 3 inputs for model 'add_sub'. "
                             "Got input(s) ['BOGUS','INPUT1','INPUT0'], but missing required input(s) ]. Please "
                             "provide all required input(s).")


def test_error_names_the_request_id(server: stubhost.Server) -> None:
    error = rejected(server, "add_sub", {"INPUT0": A, "INPUT1": B, "BOGUS": A}, request_id="rq-9")
    assert error.message.startswith("[request id: rq-9] ")


def test_error_without_request_id_says_id_unknown(server: stubhost.Server) -> None:
    error = rejected(server, "add_sub", {"INPUT0": A, "INPUT1": B, "BOGUS": A})
    assert error.message.startswith("[request id: <id_unknown>] ")


def test_missing_required_input(server: stubhost.Server) -> None:
    error = rejected(server, "add_sub", {"INPUT0": A})
    assert error.code == "INVALID_ARG"
    assert error.message == ("[request id: <id_unknown>] expected 2 inputs but got 1 inputs for model 'add_sub'. "
                             "Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. Please provide all "
                             "required input(s).")


def test_wrong_input_dtype(server: stubhost.Server) -> None:
    error = rejected(server, "add_sub", {"INPUT0": A.astype(np.int32), "INPUT1": B})
    assert error.code == "INVALID_ARG"
    assert "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'" in error.message


def test_input_of_a_dtype_triton_has_not(server: stubhost.Server) -> None:
    error = rejected(server, "add_sub", {"INPUT0": A.astype(np.complex64), "INPUT1": B})
    assert error.code == "INVALID_ARG"
    assert "'INPUT0'" in error.message and "FP32" in error.message


def test_strings_for_a_numeric_input(server: stubhost.Server) -> None:
    error = rejected(server, "add_sub", {"INPUT0": np.array([b"a"] * 4, dtype=np.object_), "INPUT1": B})
    assert error.code == "INVALID_ARG"
    assert "'INPUT0'" in error.message and "FP32" in error.message


def test_numbers_for_a_bytes_input(server: stubhost.Server) -> None:
    error = rejected(server, "string_upper", {"INPUT0": np.array([1.0, 2.0], dtype=np.float32)})
    assert error.code == "INVALID_ARG"
    assert "inference input 'INPUT0' data-type is 'FP32', but model 'string_upper' expects 'BYTES'" in error.message


def test_wrong_input_shape(server: stubhost.Server) -> None:
    error = rejected(server, "add_sub", {"INPUT0": A[:3], "INPUT1": B})
    assert error.code == "INVALID_ARG"
    assert "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [4], got [3]" in error.message


def test_wrong_input_rank(server: stubhost.Server) -> None:
    error = rejected(server, "add_sub", {"INPUT0": A.reshape(2, 2), "INPUT1": B})
    assert error.code == "INVALID_ARG"
    assert "Expected [4], got [2,2]" in error.message


def test_batched_model_accepts_up_to_max_batch_size(server: stubhost.Server) -> None:
    x = np.arange(12, dtype=np.int32).reshape(4, 3)
    np.testing.assert_array_equal(server.infer("batched", {"INPUT0": x})["OUTPUT0"], x + 1)


def test_batched_model_rejects_a_larger_batch(server: stubhost.Server) -> None:
    error = rejected(server, "batched", {"INPUT0": np.zeros((5, 3), dtype=np.int32)})
    assert error.code == "INVALID_ARG"
    assert "batch-size must be <= 4" in error.message


def test_batched_model_shape_error_shows_the_batch_dimension(server: stubhost.Server) -> None:
    error = rejected(server, "batched", {"INPUT0": np.zeros((2, 4), dtype=np.int32)})
    assert "Expected [-1,3], got [2,4]. NOTE: Setting a non-zero max_batch_size in the model config requires a " \
           "batch dimension to be prepended to each input shape." in error.message  # Triton's note


def test_rejected_request_does_not_disturb_the_next(server: stubhost.Server) -> None:
    rejected(server, "add_sub", {"INPUT0": A})
    out = server.infer("add_sub", {"INPUT0": A, "INPUT1": B})
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)


# ---- optional inputs -------------------------------------------------------------------------------
def test_optional_input_omitted(server: stubhost.Server) -> None:
    out = server.infer("optional_inputs", {"INPUT0": A})
    np.testing.assert_array_equal(out["OUTPUT0"], A + 1)


def test_optional_input_given(server: stubhost.Server) -> None:
    out = server.infer("optional_inputs", {"INPUT0": A, "INPUT1": B})
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)


def test_required_input_of_a_model_with_optional_ones_is_still_required(server: stubhost.Server) -> None:
    error = rejected(server, "optional_inputs", {"INPUT1": B})
    assert error.code == "INVALID_ARG"
    assert "missing required input(s) ['INPUT0']" in error.message


def test_a_request_with_no_inputs_for_a_model_with_optional_ones(server: stubhost.Server) -> None:
    error = rejected(server, "optional_inputs", {})
    assert error.message == ("[request id: <id_unknown>] expected number of inputs between 1 and 2 but got 0 inputs "
                             "for model 'optional_inputs'. Got input(s) [], but missing required input(s) "
                             "['INPUT0']. Please provide all required input(s).")


def test_model_error_response_for_mismatched_optional_input(server: stubhost.Server) -> None:
    error = rejected(server, "optional_inputs", {"INPUT0": A, "INPUT1": B[:2]})
    assert error.code == "INVALID_ARG"
    assert "INPUT1 has shape [2]" in error.message


# ---- outputs -----------------------------------------------------------------------------------------
def test_requested_outputs_return_only_those(server: stubhost.Server) -> None:
    out = server.infer("add_sub", {"INPUT0": A, "INPUT1": B}, outputs=["OUTPUT0"])
    assert set(out) == {"OUTPUT0"}
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)


def test_requested_second_output_only(server: stubhost.Server) -> None:
    out = server.infer("add_sub", {"INPUT0": A, "INPUT1": B}, outputs=["OUTPUT1"])
    assert set(out) == {"OUTPUT1"}
    np.testing.assert_array_equal(out["OUTPUT1"], A - B)


def test_no_requested_outputs_return_all(server: stubhost.Server) -> None:
    assert set(server.infer("add_sub", {"INPUT0": A, "INPUT1": B}, outputs=None)) == {"OUTPUT0", "OUTPUT1"}


def test_unknown_requested_output(server: stubhost.Server) -> None:
    error = rejected(server, "add_sub", {"INPUT0": A, "INPUT1": B}, outputs=["OUTPUT0", "NOPE"])
    assert error.code == "INVALID_ARG"
    assert "unexpected inference output 'NOPE' for model 'add_sub'" in error.message


# ---- models and versions ----------------------------------------------------------------------------
def test_unknown_model(server: stubhost.Server) -> None:
    error = rejected(server, "no_such_model", {"INPUT0": A})
    assert error.code == "NOT_FOUND"
    assert "no_such_model" in error.message


def test_unknown_model_version(server: stubhost.Server) -> None:
    error = rejected(server, "add_sub", {"INPUT0": A, "INPUT1": B}, model_version="7")
    assert error.code == "NOT_FOUND"
    assert "add_sub" in error.message and "7" in error.message


def test_malformed_model_version(server: stubhost.Server) -> None:
    error = rejected(server, "add_sub", {"INPUT0": A, "INPUT1": B}, model_version="latest")
    assert error.code == "INVALID_ARG"


def test_unknown_model_is_not_ready(server: stubhost.Server) -> None:
    assert not server.model_ready("no_such_model")
    assert server.model_ready("add_sub")
    assert server.model_ready("add_sub", "1")
    assert not server.model_ready("add_sub", "2")
