"""Triton's Python-based backends through the in-process API: a backend written as
``<backend directory>/<backend>/model.py`` serves every model whose config.pbtxt names it (the way
the vLLM backend is installed), as Triton's qa/L0_backend_python/python_based_backends test uses
one: models ``add`` (two versions) and ``sub``, whose version folders hold only a ``model.json``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import write_model

# Named "json", like a module Python already has: the backend's model.py must be imported as the
# top-level module "model" from its own folder (as Triton imports it), not as "json.model".
BACKEND = "json"

BACKEND_PY = """
import json
import os

import triton_python_backend_utils as pb_utils

from helpers import apply  # a module next to the backend's model.py


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        for name in ("INPUT0", "INPUT1"):
            config.add_input({"name": name, "data_type": "TYPE_FP32", "dims": [4]})
        config.add_output({"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [4]})
        config.add_output({"name": "WHERE", "data_type": "TYPE_STRING", "dims": [1]})
        config.set_max_batch_size(0)
        return config

    def initialize(self, args):
        with open(os.path.join(pb_utils.get_model_dir(), "model.json")) as f:
            self.operation = json.load(f)["operation"]
        self.where = json.dumps({"model_dir": pb_utils.get_model_dir(), "repository": args["model_repository"],
                                 "version": args["model_version"], "file": __file__})

    def execute(self, requests):
        responses = []
        for request in requests:
            a, b = (pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in ("INPUT0", "INPUT1"))
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", apply(self.operation, a, b)),
                pb_utils.Tensor("WHERE", __import__("numpy").array([self.where], dtype=object))]))
        return responses
"""

HELPERS_PY = """
def apply(operation, a, b):
    return a + b if operation == "add" else a - b
"""


def backend_model(repo: Path, name: str, operation: str, config: str, versions: tuple[int, ...] = (1,)) -> None:
    write_model(repo, name, None, config)
    for version in versions:
        (repo / name / str(version)).mkdir()
        (repo / name / str(version) / "model.json").write_text(json.dumps({"operation": operation}))


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("backends")
    (root / BACKEND).mkdir()
    (root / BACKEND / "model.py").write_text(BACKEND_PY)
    (root / BACKEND / "helpers.py").write_text(HELPERS_PY)
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, backends: Path):
    repo = tmp_path_factory.mktemp("python_based") / "models"
    backend_model(repo, "add", "add", f'name: "add"\nbackend: "{BACKEND}"\n'
                                      'version_policy: { latest: { num_versions: 2 } }\n', versions=(1, 2))
    backend_model(repo, "sub", "sub", f'backend: "{BACKEND}"\n')
    with stubhost.Server(repo, backend_directory=backends) as s:
        yield s


def infer(server: stubhost.Server, model: str, version: str = "") -> dict[str, np.ndarray]:
    a, b = np.arange(4, dtype=np.float32), np.full(4, 10, np.float32)
    return server.infer(model, {"INPUT0": a, "INPUT1": b}, model_version=version)


def test_models_share_a_python_based_backend(server: stubhost.Server, backends: Path) -> None:
    a, b = np.arange(4, dtype=np.float32), np.full(4, 10, np.float32)
    np.testing.assert_array_equal(infer(server, "add")["OUTPUT"], a + b)
    np.testing.assert_array_equal(infer(server, "sub")["OUTPUT"], a - b)
    assert server.model_ready("add", "1") and server.model_ready("add", "2")
    np.testing.assert_array_equal(infer(server, "add", "1")["OUTPUT"], a + b)


def test_the_backend_sees_its_models_folders(server: stubhost.Server, backends: Path) -> None:
    """get_model_dir() is the version folder (where vLLM reads its model.json), model_repository
    the model's folder, and the code is the backend's model.py."""
    where = json.loads(infer(server, "add", "1")["WHERE"][0])
    repo = Path(where["repository"]).parent
    assert Path(where["repository"]) == repo / "add"
    assert Path(where["model_dir"]) == repo / "add" / "1" and where["version"] == "1"
    assert Path(where["file"]).resolve() == (backends / BACKEND / "model.py").resolve()


def test_the_configuration_shows_the_runtime_and_what_the_backend_completed(server: stubhost.Server) -> None:
    config = server.model_config("sub")
    assert config["backend"] == BACKEND and config["runtime"] == "model.py"
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]


@pytest.mark.parametrize("config, words", [
    ('backend: "nosuch"\n',
     "unable to find backend library for backend 'nosuch', try specifying runtime on the model configuration."),
    ('backend: "nosuch"\nruntime: "model.py"\n',
     "unable to find Python backend based backend library 'model.py' for model 'm', searched: '{backends}/nosuch/model.py'"),
    ('backend: "cpp"\n', "unsupported backend 'cpp' for m"),
])
def test_a_backend_that_cannot_be_found_fails_the_load_with_tritons_words(tmp_path: Path, backends: Path,
                                                                          config: str, words: str) -> None:
    (backends / "cpp").mkdir(exist_ok=True)
    (backends / "cpp" / "libtriton_cpp.so").write_bytes(b"")  # a C++ backend: not something stubhost runs
    (backends / "cpp" / "model.py").write_text(BACKEND_PY)
    repo = tmp_path / "models"
    backend_model(repo, "m", "add", config)
    with stubhost.Server(repo, backend_directory=backends, exit_on_error=False) as server:
        assert words.format(backends=backends) in server.load_errors["m"]
        assert not server.model_ready("m")


def test_an_environment_next_to_the_backend_is_its_models_default(tmp_path: Path) -> None:
    """Triton sets EXECUTION_ENV_PATH to <backend>/pb_exec_env_model.py.tar.gz for the models
    that name none; a model's own setting is kept."""
    from stubhost.config import ModelConfig
    from stubhost.host.python_based import backend_model_file
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "model.py").write_text(BACKEND_PY)
    environment = tmp_path / "b" / "pb_exec_env_model.py.tar.gz"
    environment.write_bytes(b"")
    plain, own = ModelConfig(backend="b"), ModelConfig(backend="b")
    own.parameters["EXECUTION_ENV_PATH"].string_value = "$$TRITON_MODEL_DIRECTORY/env.tar.gz"
    assert backend_model_file(plain, "m", tmp_path, "m/config.pbtxt") == tmp_path / "b" / "model.py"
    assert plain.runtime == "model.py"
    assert plain.parameters["EXECUTION_ENV_PATH"].string_value == str(environment)
    backend_model_file(own, "m", tmp_path, "m/config.pbtxt")
    assert own.parameters["EXECUTION_ENV_PATH"].string_value == "$$TRITON_MODEL_DIRECTORY/env.tar.gz"
