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
