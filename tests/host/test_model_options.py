"""Per-model options a Triton user relies on: is_ready(), the model's own Python executable."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import config_pbtxt, io, write_model

READY_FLAG_MODEL = """
import os
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.flag = os.path.join(args["model_repository"], "ready")

    def is_ready(self):
        return os.path.exists(self.flag)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())])
                for r in requests]
"""

EXECUTABLE_MODEL = """
import sys
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([sys.executable.encode()],
                                                                                 dtype=object))])
                for _ in requests]
"""


def test_model_ready_follows_the_models_is_ready(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, "flagged", READY_FLAG_MODEL,
                            config_pbtxt("flagged", [io("INPUT0", "TYPE_FP32", [-1])],
                                         [io("OUTPUT0", "TYPE_FP32", [-1])]))
    with stubhost.Server(tmp_path) as server:
        assert not server.model_ready("flagged")
        assert not server.ready()
        (model_dir / "ready").touch()
        assert server.model_ready("flagged")
        assert server.ready()
        out = server.infer("flagged", {"INPUT0": np.ones(2, np.float32)})
        np.testing.assert_array_equal(out["OUTPUT0"], np.ones(2, np.float32))


def test_a_model_can_name_its_own_python_executable(tmp_path: Path) -> None:
    # A symlink to this interpreter stands in for a model's own environment.
    python = tmp_path / "model-python"
    python.symlink_to(sys.executable)
    write_model(tmp_path / "repo", "which", EXECUTABLE_MODEL,
                config_pbtxt("which", [], [io("OUTPUT0", "TYPE_STRING", [1])], extra=f"""
                    parameters: {{ key: "STUBHOST_PYTHON_EXECUTABLE" value: {{ string_value: "{python}" }} }}
                """))
    with stubhost.Server(tmp_path / "repo") as server:
        out = server.infer("which", {})
    assert out["OUTPUT0"][0].decode() == str(python)


def test_a_missing_python_executable_is_a_load_error(tmp_path: Path) -> None:
    write_model(tmp_path, "which", EXECUTABLE_MODEL,
                config_pbtxt("which", [], [io("OUTPUT0", "TYPE_STRING", [1])], extra="""
                    parameters: { key: "STUBHOST_PYTHON_EXECUTABLE" value: { string_value: "/nonexistent/python" } }
                """))
    with pytest.raises(stubhost.InferenceError, match="nonexistent"):
        stubhost.Server(tmp_path)
