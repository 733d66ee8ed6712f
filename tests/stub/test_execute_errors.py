"""A model whose execute misbehaves (raises, answers with the wrong count or type, returns the wrong
dtype, fails one response): the caller gets an InferenceError worded as Triton words it, the stub
survives, and the next request succeeds."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import config_pbtxt, instance, io, write_model

MISBEHAVE_PY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class CustomProblem(Exception):
    pass


def nested_helper():
    raise CustomProblem("boom-5150 from the model")


class TritonPythonModel:
    def execute(self, requests):
        mode = json.loads(requests[0].parameters()).get("mode", "ok")
        x = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        good = pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + 1),
                                           pb_utils.Tensor("OUTPUT1", np.array([7], dtype=np.int32))])
        if mode == "raise":
            nested_helper()
        if mode == "raise_triton_error":
            raise pb_utils.TritonError("raised triton error", pb_utils.TritonError.UNAVAILABLE)
        if mode == "none":
            return None
        if mode == "tuple":
            return (good,)
        if mode == "too_many":
            return [good, good]
        if mode == "too_few":
            return []
        if mode == "not_a_response":
            return ["a string"]
        if mode == "wrong_dtype":
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.astype(np.int64))])]
        if mode == "undeclared_output":
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + 1),
                                                pb_utils.Tensor("EXTRA", np.array([1.0], np.float32))])]
        if mode == "missing_output":
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT1", np.array([7], dtype=np.int32))])]
        if mode == "error":
            error = pb_utils.TritonError("bad value for INPUT0", pb_utils.TritonError.INVALID_ARG)
            return [pb_utils.InferenceResponse(error=error)]
        if mode == "error_default_code":
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("plain error"))]
        return [good]
"""

X = np.array([1.0, 2.0, 3.0], dtype=np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo = tmp_path_factory.mktemp("misbehave") / "models"
    write_model(repo, "misbehave", MISBEHAVE_PY, config_pbtxt(
        "misbehave", [io("INPUT0", "TYPE_FP32", [-1])],
        [io("OUTPUT0", "TYPE_FP32", [-1]), io("OUTPUT1", "TYPE_INT32", [1])]))
    with stubhost.Server(repo) as s:
        yield s


def call(server: stubhost.Server, mode: str) -> dict[str, np.ndarray]:
    return server.infer("misbehave", {"INPUT0": X}, parameters={"mode": mode})


def fails(server: stubhost.Server, mode: str) -> stubhost.InferenceError:
    with pytest.raises(stubhost.InferenceError) as info:
        call(server, mode)
    return info.value


def assert_still_serves(server: stubhost.Server, pid: int) -> None:
    out = call(server, "ok")
    np.testing.assert_array_equal(out["OUTPUT0"], X + 1)
    assert instance(server, "misbehave").process.pid == pid, "the stub was replaced"


def test_ok_mode_works(server: stubhost.Server) -> None:
    out = call(server, "ok")
    np.testing.assert_array_equal(out["OUTPUT0"], X + 1)
    np.testing.assert_array_equal(out["OUTPUT1"], [7])


def test_exception_in_execute_is_reported_with_tritons_words_and_the_exception(server: stubhost.Server) -> None:
    pid = instance(server, "misbehave").process.pid
    error = fails(server, "raise")
    assert "Failed to process the request(s) for model" in error.message
    assert "misbehave_0" in error.message  # the instance's name
    assert "CustomProblem: boom-5150 from the model" in error.message
    assert error.code == "INTERNAL"
    assert_still_serves(server, pid)


def test_exception_in_execute_message_has_the_models_frames(server: stubhost.Server) -> None:
    error = fails(server, "raise")
    assert "nested_helper" in error.message
    assert "model.py" in error.message


def test_raised_triton_error_fails_the_request(server: stubhost.Server) -> None:
    error = fails(server, "raise_triton_error")
    assert "raised triton error" in error.message


def test_execute_returning_none_without_a_sender_response(server: stubhost.Server) -> None:
    # Since Triton 24.06, None means "answered through the response sender"; a request the
    # sender never answers must still end, with an error that says why.
    pid = instance(server, "misbehave").process.pid
    error = fails(server, "none")
    assert error.code == "INTERNAL"
    assert "sent no response for the request" in error.message
    assert_still_serves(server, pid)


def test_execute_returning_a_tuple(server: stubhost.Server) -> None:
    assert "Expected a list in the execute return" in fails(server, "tuple").message


@pytest.mark.parametrize("mode", ["too_many", "too_few"])
def test_wrong_number_of_responses(server: stubhost.Server, mode: str) -> None:
    pid = instance(server, "misbehave").process.pid
    error = fails(server, mode)
    assert "Number of InferenceResponse objects do not match" in error.message
    assert_still_serves(server, pid)


def test_list_of_non_responses(server: stubhost.Server) -> None:
    assert "Expected an 'InferenceResponse' object" in fails(server, "not_a_response").message


def test_output_of_another_dtype_than_configured_reaches_the_caller_as_the_model_gave_it(
        server: stubhost.Server) -> None:
    out = call(server, "wrong_dtype")  # Triton 2.51 does not check output types against the config either
    assert out["OUTPUT0"].dtype == np.int64
    np.testing.assert_array_equal(out["OUTPUT0"], X.astype(np.int64))


def test_exception_frames_are_the_models_only(server: stubhost.Server) -> None:
    """As in Triton, whose runner is C++: the traceback lists the model's frames, innermost
    first, and none of stubhost's."""
    message = fails(server, "raise").message
    frames = message.split("At:\n", 1)[1].splitlines()
    assert [frame.rsplit(": ", 1)[1] for frame in frames if frame.strip()] == ["nested_helper", "execute"]
    assert all("model.py(" in frame for frame in frames if frame.strip())
    assert "stubhost" not in message.split("At:", 1)[1]


def test_error_response_carries_its_code_and_message(server: stubhost.Server) -> None:
    error = fails(server, "error")
    assert error.code == "INVALID_ARG"
    assert "bad value for INPUT0" in error.message


def test_error_response_without_code_is_internal(server: stubhost.Server) -> None:
    error = fails(server, "error_default_code")
    assert error.code == "INTERNAL"
    assert "plain error" in error.message


def test_error_response_fails_only_that_request(server: stubhost.Server) -> None:
    pid = instance(server, "misbehave").process.pid
    for _ in range(3):
        fails(server, "error")
        assert_still_serves(server, pid)


def test_missing_output_is_absent_from_the_result(server: stubhost.Server) -> None:
    out = call(server, "missing_output")
    assert set(out) == {"OUTPUT1"}


def test_requested_output_subset_drops_the_others(server: stubhost.Server) -> None:
    out = server.infer("misbehave", {"INPUT0": X}, outputs=["OUTPUT1"], parameters={"mode": "ok"})
    assert set(out) == {"OUTPUT1"}
    np.testing.assert_array_equal(out["OUTPUT1"], [7])


def test_requested_output_subset_drops_undeclared_outputs(server: stubhost.Server) -> None:
    out = server.infer("misbehave", {"INPUT0": X}, outputs=["OUTPUT0"], parameters={"mode": "undeclared_output"})
    assert set(out) == {"OUTPUT0"}


def test_error_response_status_is_reported_for_each_of_many_requests(server: stubhost.Server) -> None:
    for i in range(50):
        mode = "error" if i % 2 else "ok"
        if mode == "error":
            assert fails(server, mode).code == "INVALID_ARG"
        else:
            np.testing.assert_array_equal(call(server, mode)["OUTPUT0"], X + 1)
