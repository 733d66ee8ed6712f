"""`--http-header-forward-pattern` / `--grpc-header-forward-pattern` on a real `stubhost serve`:
matching request headers reach the model as string parameters, as in Triton's QA test of the
feature (case-insensitive unless the pattern starts with `(?-i)`, never steering the request).
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from stubhost.server.header_forward import HeaderForward
from tests.host.repo_factory import config_pbtxt, io, write_model
from tests.server.serve_process import ServeProcess

PARAMS_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "PARAMS", np.array([request.parameters().encode()], dtype=object))])
                for request in requests]
"""
HEADERS = {
    "header_1": "value_1",
    "my_header_1": "my_value_1",
    "my_header_2": "my_value_2",
    "my_header_3": 'This is a "quoted" string with a backslash\\ ',
    "priority": "not a number",  # forwarded by '.*priority': a parameter, not the request's priority
}
MATCHED = {k: v for k, v in HEADERS.items() if k.startswith("my_header")}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    models = tmp_path_factory.mktemp("forward") / "models"
    write_model(models, "params", PARAMS_PY, config_pbtxt(
        "params", [io("INPUT0", "TYPE_FP32", [1])], [io("PARAMS", "TYPE_STRING", [1])]))
    return models


def _http(srv: ServeProcess, headers: dict[str, str], parameters: dict | None = None) -> dict:
    client = httpclient.InferenceServerClient(srv.http_url)
    inp = httpclient.InferInput("INPUT0", [1], "FP32")
    inp.set_data_from_numpy(np.ones(1, np.float32))
    # A copy: tritonclient.http adds its own headers to the dict it is given.
    result = client.infer("params", [inp], headers=dict(headers), parameters=parameters)
    return json.loads(result.as_numpy("PARAMS")[0])


def _grpc_input() -> grpcclient.InferInput:
    inp = grpcclient.InferInput("INPUT0", [1], "FP32")
    inp.set_data_from_numpy(np.ones(1, np.float32))
    return inp


def _grpc(srv: ServeProcess, headers: dict[str, str], parameters: dict | None = None) -> dict:
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    result = client.infer("params", [_grpc_input()], headers=dict(headers), parameters=parameters)
    return json.loads(result.as_numpy("PARAMS")[0])


def test_matching_headers_reach_the_model_on_both_protocols(repo: Path) -> None:
    with ServeProcess(repo, "--http-header-forward-pattern=my_header.*|priority",
                      "--grpc-header-forward-pattern=MY_HEADER.*|priority") as srv:  # either case matches
        expected = {**MATCHED, "priority": "not a number", "key1": "value1", "key2": 2}
        assert _http(srv, HEADERS, {"key1": "value1", "key2": 2}) == expected
        assert _grpc(srv, HEADERS, {"key1": "value1", "key2": 2}) == expected
        assert _http(srv, {}) == {}

        # A stream's metadata applies to each of its requests.
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put(error or result), headers=dict(HEADERS))
        try:
            for n in range(2):
                client.async_stream_infer("params", [_grpc_input()], parameters={"n": n})
                answer = answers.get(timeout=30)
                assert not isinstance(answer, Exception), answer
                assert json.loads(answer.as_numpy("PARAMS")[0]) == {**MATCHED, "priority": "not a number", "n": n}
        finally:
            client.stop_stream()


def test_without_a_pattern_nothing_is_forwarded_and_case_can_be_required(repo: Path) -> None:
    with ServeProcess(repo, "--grpc-header-forward-pattern=(?-i)MY_HEADER.*") as srv:
        assert _http(srv, HEADERS, {"key1": True}) == {"key1": True}
        assert _grpc(srv, HEADERS) == {}  # gRPC metadata keys are lower case


def test_a_bad_pattern_stops_start_up(repo: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "stubhost", "serve", f"--model-repository={repo}",
                           "--http-port=0", "--grpc-port=0", "--metrics-port=0", "--http-header-forward-pattern=my_(["],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--http-header-forward-pattern: invalid regular expression 'my_(['" in done.stderr


@pytest.mark.parametrize("pattern, headers, expected", [
    ("my_header.*", [("My_Header_1", "a"), ("x", "b")], {"My_Header_1": "a"}),
    ("(?-i)my_header", [("My_Header_1", "a"), ("my_header_2", "b")], {"my_header_2": "b"}),
    ("header", [("x-header-y", "c")], {"x-header-y": "c"}),  # anywhere in the name, as RE2's PartialMatch
    ("^h$", [("h", "1"), ("hh", "2")], {"h": "1"}),
    ("k", [(b"k", b"\xc3\xa9"), ("k", "later")], {"k": "later"}),  # bytes decoded; the last one wins
])
def test_header_selection(pattern: str, headers: list, expected: dict[str, str]) -> None:
    forward = HeaderForward.parse("--flag", pattern)
    assert forward is not None and forward.select(headers) == expected


def test_an_empty_pattern_forwards_nothing() -> None:
    assert HeaderForward.parse("--flag", "") is None
