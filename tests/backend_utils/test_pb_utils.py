"""Every pb_utils call, made from inside a model running in a real stub.

The "observer" model runs the probe that a request's parameters name ({"probe": "..."}) and
answers with what it observed, as JSON text in its BYTES output OBS; the tests read that JSON.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import config_pbtxt, io, wait_until, write_model

OBSERVER_PY = r'''
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def probe_request(self, request, x):
    return {
        "input_names": [t.name() for t in request.inputs()],
        "requested_output_names": list(request.requested_output_names()),
        "request_id": request.request_id(),
        "correlation_id": request.correlation_id(),
        "correlation_id_type": type(request.correlation_id()).__name__,
        "flags": request.flags(),
        "parameters": request.parameters(),
        "parameters_type": type(request.parameters()).__name__,
        "timeout": request.timeout(),
    }


def probe_tensor(self, request, x):
    t = pb_utils.get_input_tensor_by_name(request, "INPUT0")
    a = t.as_numpy()
    b = t.as_numpy()
    obs = {
        "name": t.name(), "shape": t.shape(), "triton_dtype": t.triton_dtype(), "is_cpu": t.is_cpu(),
        "dtype": str(a.dtype), "values": a.tolist(),
        "same_memory_each_call": bool(np.shares_memory(a, b)),
        "owndata": bool(a.flags.owndata), "writeable": bool(a.flags.writeable),
    }
    if a.size and a.flags.writeable:
        old = float(a[0])
        a[0] = 12345.0
        obs["input_write_seen"] = float(t.as_numpy()[0]) == 12345.0
        a[0] = old
    # An output built from numpy wraps that very array.
    y = np.arange(6, dtype=np.int32)
    out = pb_utils.Tensor("Y", y)
    y[0] = 77
    obs["output_is_view"] = int(out.as_numpy()[0]) == 77 and bool(np.shares_memory(out.as_numpy(), y))
    # A non-contiguous array is made contiguous, with the same values.
    grid = np.arange(24, dtype=np.float64).reshape(4, 6)
    for label, nc in (("strided", grid[:, ::2]), ("transposed", grid.T), ("reversed", grid[::-1])):
        tn = pb_utils.Tensor("N", nc)
        obs["noncontig_" + label] = {
            "c_contiguous": bool(tn.as_numpy().flags.c_contiguous),
            "equal": bool(np.array_equal(tn.as_numpy(), nc)), "shape": tn.shape(),
        }
    # DLPack: capsule round trip, __dlpack__ through numpy, numpy array into from_dlpack.
    capsule = t.to_dlpack()
    back = pb_utils.Tensor.from_dlpack("D", capsule)
    obs["dlpack_capsule"] = {"name": back.name(), "shares": bool(np.shares_memory(back.as_numpy(), a)),
                             "equal": bool(np.array_equal(back.as_numpy(), a)),
                             "triton_dtype": back.triton_dtype(), "shape": back.shape()}
    via_numpy = np.from_dlpack(t)
    obs["dlpack_numpy"] = {"shares": bool(np.shares_memory(via_numpy, a)),
                           "equal": bool(np.array_equal(via_numpy, a)), "dtype": str(via_numpy.dtype)}
    obs["dlpack_device"] = list(t.__dlpack_device__())
    i16 = np.arange(5, dtype=np.int16)
    from_np = pb_utils.Tensor.from_dlpack("E", i16)
    obs["dlpack_from_numpy"] = {"triton_dtype": from_np.triton_dtype(), "values": from_np.as_numpy().tolist(),
                                "shares": bool(np.shares_memory(from_np.as_numpy(), i16))}
    try:
        pb_utils.Tensor("S", np.array([b"a"], dtype=np.object_)).to_dlpack()
        obs["dlpack_bytes"] = "no error"
    except pb_utils.TritonModelException as e:
        obs["dlpack_bytes"] = "TritonModelException"
    return obs


def probe_helpers(self, request, x):
    names = ["TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64", "TYPE_INT8", "TYPE_INT16",
             "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32", "TYPE_FP64", "TYPE_STRING"]
    numpy_types = [np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64,
                   np.float16, np.float32, np.float64, np.object_, np.bytes_]
    response = pb_utils.InferenceResponse([pb_utils.Tensor("A", np.zeros(2, np.float32))])
    return {
        "triton_string_to_numpy": {n: np.dtype(pb_utils.triton_string_to_numpy(n)).str for n in names},
        "numpy_to_triton_type": {np.dtype(t).name: pb_utils.numpy_to_triton_type(t) for t in numpy_types},
        "numpy_to_triton_type_unknown": pb_utils.numpy_to_triton_type(np.complex64),
        "triton_to_numpy_type": {str(i): np.dtype(pb_utils.triton_to_numpy_type(i)).str for i in range(1, 14)},
        "triton_to_numpy_type_invalid": repr(pb_utils.triton_to_numpy_type(999)),
        "model_dir": pb_utils.get_model_dir(),
        "cwd": os.getcwd(),
        "input_config": pb_utils.get_input_config_by_name(self.config, "INPUT0"),
        "input_config_missing": pb_utils.get_input_config_by_name(self.config, "NOPE"),
        "output_config": pb_utils.get_output_config_by_name(self.config, "OBS"),
        "output_config_missing": pb_utils.get_output_config_by_name(self.config, "NOPE"),
        "input_tensor_missing": pb_utils.get_input_tensor_by_name(request, "NOPE") is None,
        "output_tensor_name": pb_utils.get_output_tensor_by_name(response, "A").name(),
        "output_tensor_missing": pb_utils.get_output_tensor_by_name(response, "NOPE") is None,
        "response_has_error": response.has_error(),
        "constants": {
            "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START": pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
            "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END": pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
            "TRITONSERVER_RESPONSE_COMPLETE_FINAL": pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            "TRITONSERVER_REQUEST_RELEASE_ALL": pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL,
            "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE": pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
        },
        "error_codes": {n: getattr(pb_utils.TritonError, n) for n in
                        ["UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED",
                         "ALREADY_EXISTS", "CANCELLED"]},
        "error_default": [pb_utils.TritonError("m").message(), pb_utils.TritonError("m").code()],
        "error_explicit": [pb_utils.TritonError("bad", pb_utils.TritonError.NOT_FOUND).message(),
                           pb_utils.TritonError("bad", pb_utils.TritonError.NOT_FOUND).code()],
        "error_response_has_error": pb_utils.InferenceResponse(error=pb_utils.TritonError("e")).has_error(),
        "module_is_stubhost": pb_utils.__name__,
    }


def probe_init_args(self, request, x):
    return {"args": self.args, "types": sorted({type(v).__name__ for v in self.args.values()})}


def probe_log(self, request, x):
    token = json.loads(request.parameters())["token"]
    pb_utils.Logger.log_info("info " + token)
    pb_utils.Logger.log_warn("warn " + token)
    pb_utils.Logger.log_error("error " + token)
    pb_utils.Logger.log_verbose("verbose " + token)
    pb_utils.Logger.log("multi\nline " + token, pb_utils.LogLevel.WARNING)
    return {}


PROBES = {"request": probe_request, "tensor": probe_tensor, "helpers": probe_helpers,
          "init_args": probe_init_args, "log": probe_log}


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        self.config = json.loads(args["model_config"])

    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            if "error" in params:
                code = getattr(pb_utils.TritonError, params["error"])
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(params["message"], code)))
                continue
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            observed = PROBES[params.get("probe", "request")](self, request, x)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OBS", np.array([json.dumps(observed).encode()], dtype=np.object_)),
                pb_utils.Tensor("OUTPUT0", x[::-1]),  # negative strides: made contiguous on the way out
            ]))
        return responses
'''

GROUP = "grp"
ERROR_CODES = ["UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED", "ALREADY_EXISTS",
               "CANCELLED"]
X = np.array([1.5, -2.0, 3.25, 8.0], dtype=np.float32)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("pb_utils") / "models"
    write_model(repo, "observer", OBSERVER_PY, config_pbtxt(
        "observer", [io("INPUT0", "TYPE_FP32", [-1])],
        [io("OBS", "TYPE_STRING", [1]), io("OUTPUT0", "TYPE_FP32", [-1])],
        extra=f'instance_group [ {{ name: "{GROUP}" count: 1 kind: KIND_CPU }} ]'))
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[stubhost.Server]:
    with stubhost.Server(repo) as s:
        yield s


def observe(server: stubhost.Server, probe: str, x: np.ndarray = X, **kwargs: Any) -> dict[str, Any]:
    params = {"probe": probe, **kwargs.pop("parameters", {})}
    out = server.infer("observer", {"INPUT0": x}, parameters=params, **kwargs)
    assert out["OBS"].dtype == np.object_ and out["OBS"].shape == (1,)
    return json.loads(out["OBS"][0])


# ---- initialize(args) ----------------------------------------------------------------------------
def test_initialize_args_are_exactly_the_seven_triton_keys(server: stubhost.Server) -> None:
    args = observe(server, "init_args")["args"]
    assert sorted(args) == sorted(["model_config", "model_instance_kind", "model_instance_name",
                                   "model_instance_device_id", "model_repository", "model_version", "model_name"])


def test_initialize_args_are_all_strings(server: stubhost.Server) -> None:
    assert observe(server, "init_args")["types"] == ["str"]


def test_initialize_args_values(server: stubhost.Server, repo: Path) -> None:
    args = observe(server, "init_args")["args"]
    assert args["model_name"] == "observer"
    assert args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_device_id"] == "0"
    assert args["model_instance_name"] == f"{GROUP}_0"
    assert os.path.realpath(args["model_repository"]) == os.path.realpath(repo / "observer")


def test_initialize_model_config_is_the_served_config_as_json(server: stubhost.Server) -> None:
    config = json.loads(observe(server, "init_args")["args"]["model_config"])
    assert config["name"] == "observer"
    assert config["backend"] == "python"
    assert [i["name"] for i in config["input"]] == ["INPUT0"]
    assert config["input"][0]["data_type"] == "TYPE_FP32" and config["input"][0]["dims"] == [-1]
    assert [o["name"] for o in config["output"]] == ["OBS", "OUTPUT0"]
    assert config == server.model_config("observer")


# ---- InferenceRequest accessors ------------------------------------------------------------------
def test_request_defaults(server: stubhost.Server) -> None:
    obs = observe(server, "request")
    assert obs["input_names"] == ["INPUT0"]
    assert obs["requested_output_names"] == []
    assert obs["request_id"] == ""
    assert obs["correlation_id"] == 0 and obs["correlation_id_type"] == "int"
    assert obs["flags"] == 0
    assert obs["timeout"] == 0


def test_request_id_reaches_the_model(server: stubhost.Server) -> None:
    assert observe(server, "request", request_id="req-ü-42")["request_id"] == "req-ü-42"


def test_requested_output_names_reach_the_model(server: stubhost.Server) -> None:
    obs = json.loads(server.infer("observer", {"INPUT0": X}, outputs=["OBS"],
                                  parameters={"probe": "request"})["OBS"][0])
    assert obs["requested_output_names"] == ["OBS"]


def test_integer_correlation_id(server: stubhost.Server) -> None:
    obs = observe(server, "request", correlation_id=2**40 + 7)
    assert obs["correlation_id"] == 2**40 + 7 and obs["correlation_id_type"] == "int"


def test_string_correlation_id(server: stubhost.Server) -> None:
    obs = observe(server, "request", correlation_id="seq-abc")
    assert obs["correlation_id"] == "seq-abc" and obs["correlation_id_type"] == "str"


def test_flags_reach_the_model(server: stubhost.Server) -> None:
    flags = 1 | 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START | _END
    assert observe(server, "request", flags=flags)["flags"] == flags


def test_parameters_are_json_text(server: stubhost.Server) -> None:
    obs = observe(server, "request", parameters={"n": 3, "s": "text", "b": True})
    assert obs["parameters_type"] == "str"
    assert json.loads(obs["parameters"]) == {"probe": "request", "n": 3, "s": "text", "b": True}


def test_timeout_reaches_the_model_in_microseconds(server: stubhost.Server) -> None:
    assert observe(server, "request", timeout=5.0)["timeout"] == 5_000_000


# ---- Tensor ----------------------------------------------------------------------------------------
def test_input_tensor_accessors(server: stubhost.Server) -> None:
    obs = observe(server, "tensor")
    assert obs["name"] == "INPUT0"
    assert obs["shape"] == [4]
    assert obs["triton_dtype"] == 11  # TRITONSERVER_TYPE_FP32
    assert obs["is_cpu"] is True
    assert obs["dtype"] == "float32"
    assert obs["values"] == X.tolist()


def test_input_as_numpy_is_a_view_not_a_copy(server: stubhost.Server) -> None:
    obs = observe(server, "tensor")
    assert obs["owndata"] is False
    assert obs["same_memory_each_call"] is True


def test_input_as_numpy_write_is_seen_through_the_tensor(server: stubhost.Server) -> None:
    obs = observe(server, "tensor")
    assert obs["writeable"] is True
    assert obs["input_write_seen"] is True


def test_output_tensor_wraps_the_models_array(server: stubhost.Server) -> None:
    assert observe(server, "tensor")["output_is_view"] is True


@pytest.mark.parametrize("layout", ["strided", "transposed", "reversed"])
def test_non_contiguous_array_is_made_contiguous(server: stubhost.Server, layout: str) -> None:
    obs = observe(server, "tensor")["noncontig_" + layout]
    assert obs["c_contiguous"] is True
    assert obs["equal"] is True


def test_non_contiguous_output_reaches_the_caller_in_order(server: stubhost.Server) -> None:
    out = server.infer("observer", {"INPUT0": X}, parameters={"probe": "request"})
    np.testing.assert_array_equal(out["OUTPUT0"], X[::-1])


def test_non_contiguous_input_from_the_caller(server: stubhost.Server) -> None:
    grid = np.arange(12, dtype=np.float32).reshape(3, 4)
    column = grid[:, 1]  # stride 16 bytes
    assert not column.flags.c_contiguous
    obs = observe(server, "tensor", x=column)
    assert obs["values"] == column.tolist()


def test_to_dlpack_from_dlpack_round_trip_shares_memory(server: stubhost.Server) -> None:
    obs = observe(server, "tensor")["dlpack_capsule"]
    assert obs == {"name": "D", "shares": True, "equal": True, "triton_dtype": 11, "shape": [4]}


def test_dunder_dlpack_through_numpy_from_dlpack(server: stubhost.Server) -> None:
    obs = observe(server, "tensor")
    assert obs["dlpack_numpy"] == {"shares": True, "equal": True, "dtype": "float32"}
    assert obs["dlpack_device"] == [1, 0]


def test_from_dlpack_of_a_numpy_array(server: stubhost.Server) -> None:
    obs = observe(server, "tensor")["dlpack_from_numpy"]
    assert obs == {"triton_dtype": 7, "values": [0, 1, 2, 3, 4], "shares": True}  # INT16


def test_dlpack_of_bytes_tensor_raises_triton_model_exception(server: stubhost.Server) -> None:
    assert observe(server, "tensor")["dlpack_bytes"] == "TritonModelException"


# ---- module helpers ------------------------------------------------------------------------------
def test_triton_string_to_numpy(server: stubhost.Server) -> None:
    got = observe(server, "helpers")["triton_string_to_numpy"]
    expected = {"TYPE_BOOL": "|b1", "TYPE_UINT8": "|u1", "TYPE_UINT16": "<u2", "TYPE_UINT32": "<u4",
                "TYPE_UINT64": "<u8", "TYPE_INT8": "|i1", "TYPE_INT16": "<i2", "TYPE_INT32": "<i4",
                "TYPE_INT64": "<i8", "TYPE_FP16": "<f2", "TYPE_FP32": "<f4", "TYPE_FP64": "<f8", "TYPE_STRING": "|O"}
    assert got == expected


def test_numpy_to_triton_type(server: stubhost.Server) -> None:
    obs = observe(server, "helpers")
    assert obs["numpy_to_triton_type"] == {
        "bool": 1, "uint8": 2, "uint16": 3, "uint32": 4, "uint64": 5, "int8": 6, "int16": 7, "int32": 8,
        "int64": 9, "float16": 10, "float32": 11, "float64": 12, "object": 13, "bytes": 13}
    assert obs["numpy_to_triton_type_unknown"] is None


def test_triton_to_numpy_type(server: stubhost.Server) -> None:
    obs = observe(server, "helpers")
    assert obs["triton_to_numpy_type"] == {
        "1": "|b1", "2": "|u1", "3": "<u2", "4": "<u4", "5": "<u8", "6": "|i1", "7": "<i2", "8": "<i4",
        "9": "<i8", "10": "<f2", "11": "<f4", "12": "<f8", "13": "|O"}
    assert obs["triton_to_numpy_type_invalid"] == "None"


def test_get_model_dir_is_the_version_folder(server: stubhost.Server, repo: Path) -> None:
    """As in Triton (the folder of the model file): where vLLM and TensorRT-LLM read their
    model.json / engine config."""
    assert os.path.realpath(observe(server, "helpers")["model_dir"]) == os.path.realpath(repo / "observer" / "1")


def test_get_input_and_output_config_by_name(server: stubhost.Server) -> None:
    obs = observe(server, "helpers")
    assert obs["input_config"]["name"] == "INPUT0"
    assert obs["input_config"]["data_type"] == "TYPE_FP32"
    assert obs["input_config"]["dims"] == [-1]
    assert obs["output_config"]["name"] == "OBS"
    assert obs["output_config"]["data_type"] == "TYPE_STRING"
    assert obs["input_config_missing"] is None and obs["output_config_missing"] is None


def test_get_input_and_output_tensor_by_name(server: stubhost.Server) -> None:
    obs = observe(server, "helpers")
    assert obs["input_tensor_missing"] is True
    assert obs["output_tensor_name"] == "A"
    assert obs["output_tensor_missing"] is True
    assert obs["response_has_error"] is False
    assert obs["error_response_has_error"] is True


def test_tritonserver_constants(server: stubhost.Server) -> None:
    assert observe(server, "helpers")["constants"] == {
        "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START": 1, "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END": 2,
        "TRITONSERVER_RESPONSE_COMPLETE_FINAL": 1, "TRITONSERVER_REQUEST_RELEASE_ALL": 1,
        "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE": 2}


def test_triton_error_codes_message_and_default_code(server: stubhost.Server) -> None:
    obs = observe(server, "helpers")
    assert obs["error_codes"] == {n: i for i, n in enumerate(ERROR_CODES)}
    assert obs["error_default"] == ["m", 1]  # INTERNAL
    assert obs["error_explicit"] == ["bad", 2]


def test_triton_python_backend_utils_is_stubhosts_pb_utils(server: stubhost.Server) -> None:
    assert observe(server, "helpers")["module_is_stubhost"] == "stubhost.backend_utils"


# ---- InferenceResponse(error=TritonError(...)) -----------------------------------------------------
@pytest.mark.parametrize("code", ERROR_CODES)
def test_response_error_code_and_message_reach_the_caller(server: stubhost.Server, code: str) -> None:
    with pytest.raises(stubhost.InferenceError) as info:
        server.infer("observer", {"INPUT0": X}, parameters={"error": code, "message": f"failed with {code}"})
    assert info.value.code == code
    assert "failed with " + code in info.value.message


# ---- Logger -----------------------------------------------------------------------------------------
def test_logger_lines_reach_the_stubhost_logger_with_level_and_instance(
        server: stubhost.Server, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="stubhost")
    token = "tok-7f3a"
    observe(server, "log", parameters={"token": token})

    def mine() -> list[logging.LogRecord]:
        return [r for r in caplog.records if token in r.getMessage()]

    assert wait_until(lambda: len(mine()) >= 5, 5.0), [r.getMessage() for r in caplog.records]
    levels = {r.getMessage(): r.levelno for r in mine()}  # the message alone, as Triton shows it
    assert levels == {f"info {token}": logging.INFO, f"warn {token}": logging.WARNING,
                      f"error {token}": logging.ERROR, f"verbose {token}": logging.DEBUG,
                      f"multi\nline {token}": logging.WARNING}
    for record in mine():
        assert record.name == "stubhost"
        assert record.model_instance == f"{GROUP}_0"  # type: ignore[attr-defined]
        assert record.filename == "model.py" and record.lineno > 0  # the model file and line that logged
