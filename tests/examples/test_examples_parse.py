"""The example repository is laid out as Triton expects: <model>/config.pbtxt (except the model that
auto-completes its config) and <model>/1/model.py that compiles and imports no backend but
triton_python_backend_utils."""

from __future__ import annotations

import ast
import py_compile
import re
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2] / "examples" / "models"
MODELS = ["add_sub", "add_sub_twice", "auto_complete", "identity", "optional_inputs", "repeat", "string_upper"]
NO_CONFIG = {"auto_complete"}  # configured by its auto_complete_config()
ENSEMBLES = {"add_sub_twice"}  # platform "ensemble": steps over the other models, no model.py
ALLOWED_THIRD_PARTY = {"numpy"}


def test_repository_holds_exactly_the_example_models() -> None:
    assert sorted(p.name for p in REPOSITORY.iterdir() if p.is_dir()) == MODELS


@pytest.mark.parametrize("model", MODELS)
def test_config_pbtxt(model: str) -> None:
    config = REPOSITORY / model / "config.pbtxt"
    if model in NO_CONFIG:
        assert not config.exists(), f"{model} must have no config.pbtxt: it auto-completes its config"
        return
    text = config.read_text()
    if model in ENSEMBLES:
        assert re.search(r'^platform:\s*"ensemble"\s*$', text, re.M), f"{config}: no platform: \"ensemble\""
        assert not re.search(r"^backend:", text, re.M), f"{config}: an ensemble has no backend"
    else:
        assert re.search(r'^backend:\s*"python"\s*$', text, re.M), f"{config}: no backend: \"python\""
    assert re.search(rf'^name:\s*"{model}"\s*$', text, re.M), f"{config}: name is not {model!r}"
    body = re.sub(r'"[^"]*"|#.*', "", text)
    assert body.count("{") == body.count("}") and body.count("[") == body.count("]"), f"{config}: unbalanced"


@pytest.mark.parametrize("model", MODELS)
def test_model_py_compiles_and_imports_only_pb_utils(model: str, tmp_path: Path) -> None:
    versions = [p for p in (REPOSITORY / model).iterdir() if p.is_dir()]
    assert [p.name for p in versions] == ["1"], f"{model}: expected the single version folder 1/"
    if model in ENSEMBLES:
        assert not list(versions[0].glob("*.py")), f"{model}: an ensemble's version folder holds no model file"
        return
    source = versions[0] / "model.py"
    py_compile.compile(str(source), cfile=str(tmp_path / "model.pyc"), doraise=True)

    tree = ast.parse(source.read_text(), str(source))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module, f"{source}: relative import"
            imported.add(node.module.split(".")[0])
    backend = imported - set(sys.stdlib_module_names) - ALLOWED_THIRD_PARTY
    assert backend == {"triton_python_backend_utils"}, f"{source} imports {sorted(backend)}"

    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    methods = {n.name for n in classes["TritonPythonModel"].body if isinstance(n, ast.FunctionDef)}
    assert {"initialize", "execute", "finalize"} <= methods
    assert ("auto_complete_config" in methods) == (model in NO_CONFIG)
