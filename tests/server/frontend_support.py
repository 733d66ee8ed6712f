"""What the front-end suites share: a model repository built for them, and tritonclient helpers.

    repo = build_repository(tmp_path_factory.mktemp("models"), "add_sub", "echo")
    with ServeProcess(repo) as srv:
        conn = Conn.open("grpc", srv)
        result = conn.client.infer("add_sub", [conn.input("INPUT0", a), conn.input("INPUT1", b)])

Every model here is plain Triton Python-backend code: it would load in Triton unchanged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from tests.host.repo_factory import (
    SLEEPY_PY,
    config_pbtxt,
    copy_examples,
    io,
    sleepy_config,
    write_model,
)

PROTOCOLS = ("http", "grpc")

# ---- every datatype ---------------------------------------------------------------------------
NUMERIC = {
    "BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}
DATATYPES = [*NUMERIC, "BYTES"]
_CONFIG_TYPE = {**{dt: f"TYPE_{dt}" for dt in NUMERIC}, "BYTES": "TYPE_STRING"}


def sample(datatype: str, *, utf8: bool = False) -> np.ndarray:
    """A [2, 3] array of `datatype` with its extremes (and NaN/inf/-0.0 for floats); BYTES holds
    empty, NUL-containing and (unless `utf8`) non-UTF-8 elements."""
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    if datatype == "BYTES":
        items = [b"", b"hello", "h\u00e9llo \u2603".encode(), b"a\x00b", b"x" * 300,
                 b"plain" if utf8 else b"\xff\xfe\x80 not utf-8"]
        return np.array(items, dtype=object).reshape(2, 3)
    dtype = np.dtype(NUMERIC[datatype])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.array([[info.min, info.max, 0], [1, info.max - 1, 7]], dtype=dtype)
    info = np.finfo(dtype)
    return np.array([[info.min, info.max, -0.0], [np.inf, -np.inf, np.nan]], dtype=dtype)


# ---- model sources ----------------------------------------------------------------------------
# IN_<DT> (optional, any 2-D shape) -> OUT_<DT>, for every datatype.
ALL_TYPES_PY = """
import triton_python_backend_utils as pb_utils

DATATYPES = %r


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for dt in DATATYPES:
                tensor = pb_utils.get_input_tensor_by_name(request, "IN_" + dt)
                if tensor is not None:
                    outputs.append(pb_utils.Tensor("OUT_" + dt, tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
""" % (DATATYPES,)


def all_types_config(name: str) -> str:
    return config_pbtxt(name, [io(f"IN_{dt}", _CONFIG_TYPE[dt], [-1, -1], optional=True) for dt in DATATYPES],
                        [io(f"OUT_{dt}", _CONFIG_TYPE[dt], [-1, -1]) for dt in DATATYPES])


# OUTPUT0 = INPUT0; META = JSON of what the request carried (parameters, correlation id, flags,
# request id). The response carries parameters RESPONSE_PARAMETERS (+ "echo": the request's
# "tag" parameter). Request parameter {"fail": true} answers an error response instead.
RESPONSE_PARAMETERS = {"answer": 42, "greeting": "hello", "ok": True}
ECHO_PY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            if params.get("fail"):
                error = pb_utils.TritonError("echo was asked to fail", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            meta = {"parameters": params, "correlation_id": request.correlation_id(),
                    "flags": request.flags(), "request_id": request.request_id()}
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out_params = dict(%r)
            if "tag" in params:
                out_params["echo"] = params["tag"]
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", x.copy()),
                 pb_utils.Tensor("META", np.array([json.dumps(meta).encode()], dtype=object))],
                parameters=out_params))
        return responses
""" % (RESPONSE_PARAMETERS,)
ECHO_CONFIG = config_pbtxt("echo", [io("INPUT0", "TYPE_FP32", [-1])],
                           [io("OUTPUT0", "TYPE_FP32", [-1]), io("META", "TYPE_STRING", [1])])

RAISER_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise RuntimeError("raiser always raises")
"""
RAISER_CONFIG = config_pbtxt("raiser", [io("INPUT0", "TYPE_FP32", [-1])], [io("OUTPUT0", "TYPE_FP32", [-1])])

# OUTPUT0 = INPUT0 + version, two versions both served.
VERSIONED_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() + np.float32(self.version))])
                for r in requests]
"""
VERSIONED_CONFIG = config_pbtxt("versioned", [io("INPUT0", "TYPE_FP32", [-1])], [io("OUTPUT0", "TYPE_FP32", [-1])],
                                extra="version_policy: { all { } }")

BATCHED_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
"""
BATCHED_CONFIG = config_pbtxt("batched", [io("INPUT0", "TYPE_FP32", [2])], [io("OUTPUT0", "TYPE_FP32", [2])],
                              max_batch_size=8)

# A model whose initialize fails: the repository has a broken model.
BROKEN_PY = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("broken on purpose")

    def execute(self, requests):
        return []
"""
BROKEN_CONFIG = config_pbtxt("broken", [io("INPUT0", "TYPE_FP32", [-1])], [io("OUTPUT0", "TYPE_FP32", [-1])])

EXAMPLE_MODELS = ("add_sub", "identity", "string_upper", "optional_inputs")


def build_repository(repo: Path, *names: str) -> Path:
    """Writes the named models into `repo` (example models are copied, the rest written)."""
    repo.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name in EXAMPLE_MODELS:
            copy_examples(repo, name)
        elif name == "all_types":
            write_model(repo, name, ALL_TYPES_PY, all_types_config(name))
        elif name == "echo":
            write_model(repo, name, ECHO_PY, ECHO_CONFIG)
        elif name == "raiser":
            write_model(repo, name, RAISER_PY, RAISER_CONFIG)
        elif name == "versioned":
            write_model(repo, name, {1: VERSIONED_PY, 2: VERSIONED_PY}, VERSIONED_CONFIG)
        elif name == "batched":
            write_model(repo, name, BATCHED_PY, BATCHED_CONFIG)
        elif name == "slow":
            write_model(repo, name, SLEEPY_PY, sleepy_config(name))
        elif name == "broken":
            write_model(repo, name, BROKEN_PY, BROKEN_CONFIG)
        else:
            raise KeyError(name)
    return repo


# ---- tritonclient ---------------------------------------------------------------------------------
def client_module(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


@dataclass
class Conn:
    """A tritonclient client of one protocol, with the module that goes with it."""

    protocol: str
    mod: Any
    client: Any

    @classmethod
    def open(cls, protocol: str, server: Any) -> Conn:
        mod = client_module(protocol)
        url = server.http_url if protocol == "http" else server.grpc_url
        return cls(protocol, mod, mod.InferenceServerClient(url))

    def close(self) -> None:
        self.client.close()

    def input(self, name: str, array: np.ndarray, datatype: str | None = None, *, binary: bool = True) -> Any:
        """An InferInput holding `array` (binary or JSON on HTTP; gRPC always sends raw contents)."""
        if datatype is None:
            datatype = "BYTES" if array.dtype == object else self.mod.np_to_triton_dtype(array.dtype)
        tensor = self.mod.InferInput(name, list(array.shape), datatype)
        if self.protocol == "http":
            tensor.set_data_from_numpy(array, binary_data=binary)
        else:
            tensor.set_data_from_numpy(array)
        return tensor

    def output(self, name: str, *, binary: bool = True) -> Any:
        if self.protocol == "http":
            return self.mod.InferRequestedOutput(name, binary_data=binary)
        return self.mod.InferRequestedOutput(name)

    def response(self, result: Any) -> dict[str, Any]:
        """The whole response as a dict (gRPC's protobuf converted to JSON form)."""
        if self.protocol == "http":
            return result.get_response()
        return result.get_response(as_json=True)

    def response_parameters(self, result: Any) -> dict[str, Any]:
        """The response's parameters as plain Python values."""
        if self.protocol == "http":
            return dict(result.get_response().get("parameters", {}))
        params = result.get_response().parameters
        return {key: getattr(value, value.WhichOneof("parameter_choice")) for key, value in params.items()}


def error_of(call: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    """Runs a tritonclient call that must fail and returns its exception."""
    with pytest.raises(InferenceServerException) as info:
        call(*args, **kwargs)
    return info.value


def expect_status(conn: Conn, error: InferenceServerException, http: int, grpc: str) -> None:
    """The error's status is `http` (an HTTP code) on HTTP and StatusCode.`grpc` on gRPC."""
    if conn.protocol == "http":
        assert error.status() == str(http), f"HTTP status {error.status()}: {error.message()}"
    else:
        assert error.status() == f"StatusCode.{grpc}", f"gRPC status {error.status()}: {error.message()}"


def stats_counts(conn: Conn, model: str) -> tuple[int, int, int, int]:
    """(success count, fail count, inference_count, execution_count) of a model's version 1."""
    stats = conn.client.get_inference_statistics(model)
    if conn.protocol == "grpc":
        stats = proto_json(stats)
    [entry] = [e for e in stats["model_stats"] if e["name"] == model]
    inference = entry["inference_stats"]

    def count(key: str) -> int:
        return int(inference.get(key, {}).get("count", 0))

    return count("success"), count("fail"), int(entry.get("inference_count", 0)), int(entry.get("execution_count", 0))


def proto_json(message: Any) -> dict[str, Any]:
    """A protobuf message as a dict with the proto's own field names (int64s come as strings)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def server_pid_segments(pid: int) -> list[str]:
    """/dev/shm names of a server process's own pool segments."""
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"stubhost_{pid}_"))
