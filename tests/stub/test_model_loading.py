"""How the stub imports a model file: as a module of its version folder (a package), so relative and
plain imports of files next to it work; default_model_filename picks another file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import config_pbtxt, io, write_model

PKG_MODEL_PY = """
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils

from .helper import f
from .sub.deep import g
import helper
import common  # lies in the model folder, next to the version folders


class TritonPythonModel:
    def execute(self, requests):
        observed = {
            "relative": f(),
            "plain": helper.f(),
            "subpackage": g(),
            "model_folder": common.VALUE,
            "helper_file": os.path.basename(helper.__file__),
            "module": __name__,
            "package": __package__,
            "file": os.path.basename(__file__),
        }
        text = np.array([json.dumps(observed).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", text)]) for _ in requests]
"""

HELPER_PY = """
def f():
    return 41
"""

DEEP_PY = """
from ..helper import f


def g():
    return f() + 1
"""

ENTRY_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        text = np.array([b"from entry.py"], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", text)]) for _ in requests]
"""

WRONG_FILE_PY = """
raise RuntimeError("model.py must not be imported when default_model_filename names entry.py")
"""


def out_config(name: str, extra: str = "") -> str:
    return config_pbtxt(name, [io("INPUT0", "TYPE_INT32", [1])], [io("OUT", "TYPE_STRING", [1])], extra=extra)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo = tmp_path_factory.mktemp("loading") / "models"
    write_model(repo, "pkg", PKG_MODEL_PY, out_config("pkg"), files={
        "1/helper.py": HELPER_PY,
        "1/sub/__init__.py": "",
        "1/sub/deep.py": DEEP_PY,
        "common.py": "VALUE = 'model folder'\n",
    })
    write_model(repo, "entry", ENTRY_PY, out_config("entry", 'default_model_filename: "entry.py"'),
                filename="entry.py", files={"1/model.py": WRONG_FILE_PY})
    with stubhost.Server(repo) as s:
        yield s


def observe(server: stubhost.Server, model: str) -> bytes:
    return bytes(server.infer(model, {"INPUT0": np.zeros(1, np.int32)})["OUT"][0])


def test_relative_import_from_the_version_folder(server: stubhost.Server) -> None:
    assert json.loads(observe(server, "pkg"))["relative"] == 41


def test_plain_import_of_a_file_next_to_model_py(server: stubhost.Server) -> None:
    obs = json.loads(observe(server, "pkg"))
    assert obs["plain"] == 41
    assert obs["helper_file"] == "helper.py"


def test_relative_import_inside_a_subpackage_of_the_version_folder(server: stubhost.Server) -> None:
    assert json.loads(observe(server, "pkg"))["subpackage"] == 42


def test_import_of_a_file_in_the_model_folder(server: stubhost.Server) -> None:
    assert json.loads(observe(server, "pkg"))["model_folder"] == "model folder"


def test_model_module_is_named_after_its_version_folder(server: stubhost.Server) -> None:
    obs = json.loads(observe(server, "pkg"))
    assert obs["module"] == "1.model"
    assert obs["package"] == "1"
    assert obs["file"] == "model.py"


def test_default_model_filename_is_honoured(server: stubhost.Server) -> None:
    assert observe(server, "entry") == b"from entry.py"
    assert server.model_config("entry")["default_model_filename"] == "entry.py"


def test_default_model_filename_missing_file_fails_to_load(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "entry", ENTRY_PY, out_config("entry", 'default_model_filename: "missing.py"'),
                filename="entry.py")
    with pytest.raises(stubhost.InferenceError) as info:
        with stubhost.Server(repo):
            pass
    assert "missing.py" in info.value.message


def test_default_model_filename_outside_the_version_folder_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "entry", ENTRY_PY, out_config("entry", 'default_model_filename: "../entry.py"'),
                filename="entry.py")
    with pytest.raises(stubhost.InferenceError) as info:
        with stubhost.Server(repo):
            pass
    assert info.value.code == "INVALID_ARG"
