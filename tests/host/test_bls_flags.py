"""``InferenceRequest.set_flags``: sequence START/END flags set on a BLS request after it was built
reach a sequence-batching target, in real stubs. Also ``request.trace()``, which Triton models pass
on to their BLS requests (``trace=request.trace()``).

The caller builds each request of a sequence without flags, sets them with ``set_flags`` and sends
it; the target (``sequence_batching { }``) answers the flags and correlation id it received. The
sequence batcher refuses a first request without START and a request after END, so those answers
show that the flags were honoured end to end, not only copied.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import stubhost
from stubhost.backend_utils import InferenceRequest
from tests.host.repo_factory import config_pbtxt, io, write_model

START, END = 1, 2

# Answers the flags and correlation id it received.
TARGET_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("FLAGS", np.array([r.flags()], np.uint32)),
            pb_utils.Tensor("CORR", np.array([r.correlation_id()], np.uint64)),
        ]) for r in requests]
"""

# Parameters: "corr", "steps": [{"flags": n, "init": n (flags given to the constructor)}, ...]. Sends
# one BLS request per step to "target" and answers, per step, what the target saw or its error.
CALLER_PY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            seen = []
            for step in params["steps"]:
                bls = pb_utils.InferenceRequest(
                    model_name="target", inputs=[pb_utils.Tensor("X", np.ones(1, np.float32))],
                    requested_output_names=["FLAGS", "CORR"], correlation_id=params["corr"],
                    flags=step.get("init", 0), trace=request.trace())
                if "flags" in step:
                    bls.set_flags(step["flags"])
                entry = {"flags_before_exec": bls.flags()}
                response = bls.exec()
                if response.has_error():
                    entry["error"] = response.error().message()
                else:
                    entry["flags"] = int(pb_utils.get_output_tensor_by_name(response, "FLAGS").as_numpy()[0])
                    entry["corr"] = int(pb_utils.get_output_tensor_by_name(response, "CORR").as_numpy()[0])
                seen.append(entry)
            bad = []
            for value in (-1, 1 << 32, 1.0, "1", None):
                try:
                    bls.set_flags(value)
                    bad.append("accepted")
                except TypeError:
                    bad.append("TypeError")
            try:
                pb_utils.InferenceRequest(model_name="target", inputs=[], requested_output_names=[],
                                          trace="not a trace")
                bad_trace = "accepted"
            except TypeError:
                bad_trace = "TypeError"
            trace = request.trace()
            report = {"seen": seen, "bad": bad, "bad_trace": bad_trace, "context": trace.get_context(),
                      "trace_type": type(trace).__name__, "is_pb_utils": isinstance(trace, pb_utils.InferenceTrace)}
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OBS", np.array([json.dumps(report).encode()], np.object_))]))
        return responses
"""

NO_START = "must specify the START flag on the first request of the sequence"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo = tmp_path_factory.mktemp("bls_flags") / "models"
    write_model(repo, "target", TARGET_PY, config_pbtxt(
        "target", [io("X", "TYPE_FP32", [1])], [io("FLAGS", "TYPE_UINT32", [1]), io("CORR", "TYPE_UINT64", [1])],
        extra="sequence_batching { max_sequence_idle_microseconds: 60000000 }"))
    write_model(repo, "caller", CALLER_PY, config_pbtxt(
        "caller", [io("X", "TYPE_FP32", [1])], [io("OBS", "TYPE_STRING", [1])]))
    with stubhost.Server(repo) as s:
        yield s


def run(server: stubhost.Server, corr: int, steps: list[dict[str, int]]) -> dict[str, Any]:
    out = server.infer("caller", {"X": np.ones(1, np.float32)}, parameters={"corr": corr, "steps": steps})
    return json.loads(out["OBS"][0])


def test_flags_set_after_construction_open_and_close_a_sequence(server: stubhost.Server) -> None:
    seen = run(server, 501, [{"flags": START}, {}, {"flags": 0}, {"flags": END}, {}])["seen"]
    assert [s["flags_before_exec"] for s in seen] == [START, 0, 0, END, 0]
    assert [s.get("flags") for s in seen[:4]] == [START, 0, 0, END]
    assert all(s.get("corr") == 501 for s in seen[:4])
    # END closed the sequence: a request without START is refused by the sequence batcher
    assert NO_START in seen[4]["error"]


def test_without_set_flags_the_first_request_lacks_start(server: stubhost.Server) -> None:
    seen = run(server, 502, [{}])["seen"]
    assert NO_START in seen[0]["error"]


def test_set_flags_replaces_the_constructor_flags(server: stubhost.Server) -> None:
    seen = run(server, 503, [{"init": 0, "flags": START | END}, {"init": START, "flags": 0}])["seen"]
    assert seen[0]["flags"] == START | END  # opened and closed at once
    assert seen[1]["flags_before_exec"] == 0 and NO_START in seen[1]["error"]  # START was cleared


def test_set_flags_refuses_what_tritons_uint32_binding_refuses(server: stubhost.Server) -> None:
    assert run(server, 504, [{"flags": START | END}])["bad"] == ["TypeError"] * 5


def test_a_requests_trace_is_passed_on_to_bls_requests_with_no_context(server: stubhost.Server) -> None:
    report = run(server, 505, [{"flags": START | END}])
    assert report["seen"][0]["flags"] == START | END  # the BLS request built with trace= was served
    assert report["trace_type"] == "InferenceTrace" and report["is_pb_utils"]
    assert report["context"] is None  # stubhost does not trace: Triton's answer for an untraced request
    assert report["bad_trace"] == "TypeError"


def test_set_flags_outside_a_stub() -> None:
    request = InferenceRequest(model_name="m", inputs=[], requested_output_names=[], flags=START)
    request.set_flags(np.uint32(END))
    assert request.flags() == END and type(request.flags()) is int
    request.set_flags(True)  # bool is an int, as for pybind11
    assert request.flags() == 1
    request.set_flags(0xFFFFFFFF)
    assert request.flags() == 0xFFFFFFFF
    with pytest.raises(TypeError):
        request.set_flags(-1)
    assert request.flags() == 0xFFFFFFFF
