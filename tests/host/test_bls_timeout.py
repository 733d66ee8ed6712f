"""A BLS request's ``timeout`` is Triton's request timeout: the target sees it in
``request.timeout()`` (with or without a queue), and a target that takes longer still answers;
its stub is not taken for hung."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import config_pbtxt, instance, io, write_model

TARGET_PY = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.3)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SEEN", np.array([r.timeout()], np.uint64))])
                for r in requests]
"""

CALLER_PY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            target = json.loads(request.parameters())["target"]
            response = pb_utils.InferenceRequest(model_name=target, inputs=[], requested_output_names=["SEEN"],
                                                 timeout=100_000).exec()  # 0.1 s, less than the target takes
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(response, "SEEN")]))
        return out
"""


@pytest.mark.parametrize("target", ["direct", "queued"])
def test_the_target_sees_the_timeout_and_still_answers(tmp_path: Path, target: str) -> None:
    repo = tmp_path / "models"
    write_model(repo, "direct", TARGET_PY, config_pbtxt("direct", [], [io("SEEN", "TYPE_UINT64", [1])]))
    write_model(repo, "queued", TARGET_PY, config_pbtxt("queued", [], [io("SEEN", "TYPE_UINT64", [1])],
                                                       max_batch_size=4, extra="dynamic_batching { }"))
    write_model(repo, "caller", CALLER_PY, config_pbtxt("caller", [io("X", "TYPE_INT32", [1])],
                                                       [io("SEEN", "TYPE_UINT64", [-1])]))
    with stubhost.Server(repo) as server:
        pid = instance(server, target).process.pid
        out = server.infer("caller", {"X": np.zeros(1, np.int32)}, parameters={"target": target}, timeout=30)
        assert out["SEEN"].ravel().tolist() == [100_000]
        assert instance(server, target).process.pid == pid, "the target's stub was restarted"
        assert instance(server, target).restarts == 0


COUNTING_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = 0

    def execute(self, requests):
        self.runs += len(requests)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("RUNS", np.array([self.runs], np.int64))])
                for _ in requests]
"""

SHORT_CALLER_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            response = pb_utils.InferenceRequest(model_name="counting", inputs=[], requested_output_names=["RUNS"],
                                                 timeout=5).exec()  # 5 us: over before it can run
            text = response.error().message() if response.has_error() else "ran"
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("WHAT", np.array([text.encode()], np.object_))]))
        return out
"""


def test_a_request_timeout_over_before_dispatch_is_rejected_without_running(tmp_path: Path) -> None:
    """Triton's QA test_timeout: a 5 us request timeout, on a model whose queue policy honours
    it, is rejected (``Request timeout expired``) and the model never runs; from BLS and from
    an in-process caller alike."""
    repo = tmp_path / "models"
    policy = "dynamic_batching { default_queue_policy { allow_timeout_override: true } }"
    write_model(repo, "counting", COUNTING_PY, config_pbtxt("counting", [], [io("RUNS", "TYPE_INT64", [1])],
                                                           max_batch_size=4, extra=policy))
    write_model(repo, "short", SHORT_CALLER_PY, config_pbtxt("short", [io("X", "TYPE_INT32", [1])],
                                                            [io("WHAT", "TYPE_STRING", [1])]))
    with stubhost.Server(repo) as server:
        out = server.infer("short", {"X": np.zeros(1, np.int32)}, timeout=30)
        assert out["WHAT"][0].decode() == "Request timeout expired"
        with pytest.raises(stubhost.InferenceError, match="^Request timeout expired$") as info:
            server.infer_response("counting", {}, request_timeout_us=5)
        assert info.value.code == "UNAVAILABLE"
        assert server.infer("counting", {})["RUNS"].ravel().tolist() == [1]  # neither ran
