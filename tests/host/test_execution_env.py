"""EXECUTION_ENV_PATH: a model's stubs run in its own packed (or unpacked) Python environment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

import stubhost
from stubhost.host.execution_env import ExecutionEnvError, ExecutionEnvs
from tests.host.repo_factory import config_pbtxt, instance, io, wait_until, write_model

# Reports where it runs: the interpreter, a module only the environment has, and what the
# environment's activate script exported.
WHERE_MODEL = """
import json, os, sys
import numpy as np
import triton_python_backend_utils as pb_utils
import envonly

class TritonPythonModel:
    def execute(self, requests):
        report = {"executable": sys.executable, "prefix": sys.prefix, "envonly": envonly.VALUE,
                  "activated": os.environ.get("ENV_ACTIVATED"), "conda_prefix": os.environ.get("CONDA_PREFIX"),
                  "ld_library_path": os.environ.get("LD_LIBRARY_PATH", ""),
                  "pythonhome": os.environ.get("PYTHONHOME")}
        out = np.array([json.dumps(report).encode()], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out)]) for _ in requests]
"""

# What conda-pack's activate script does, in short: everything relative to the script's folder,
# so the environment works wherever it is unpacked.
ACTIVATE = """
_env_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CONDA_PREFIX="$_env_root"
export PATH="$_env_root/bin:$PATH"
export ENV_ACTIVATED="yes, in $_env_root"
unset PYTHONHOME
"""

VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"


def make_env(folder: Path, value: str = "from-the-env") -> Path:
    """A relocatable environment: a venv with a copied interpreter (numpy from this one's site
    packages), a module of its own, and a conda-pack style activate script."""
    subprocess.run([sys.executable, "-m", "venv", "--copies", "--system-site-packages", "--without-pip", str(folder)],
                   check=True, capture_output=True)
    site = folder / "lib" / VERSION / "site-packages"
    (site / "envonly.py").write_text(f"VALUE = {value!r}\n")
    (folder / "bin" / "activate").write_text(ACTIVATE)
    return folder


def pack(folder: Path, archive: Path) -> Path:
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=".")
    return archive


def where_model(repo: Path, name: str, env_value: str, *, extra: str = "") -> Path:
    params = f'parameters: {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{env_value}" }} }}\n{extra}'
    return write_model(repo, name, WHERE_MODEL,
                       config_pbtxt(name, [io("INPUT0", "TYPE_FP32", [1])], [io("OUTPUT0", "TYPE_STRING", [1])],
                                    extra=params))


def report(server: stubhost.Server, name: str) -> dict[str, str]:
    out = server.infer(name, {"INPUT0": np.zeros(1, np.float32)})
    return json.loads(out["OUTPUT0"][0])


def test_a_model_runs_in_the_environment_its_archive_holds(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    model_dir = where_model(repo, "packed", "$$TRITON_MODEL_DIRECTORY/env.tar.gz",
                            extra="instance_group [ { count: 2 kind: KIND_CPU } ]")
    pack(make_env(tmp_path / "built"), model_dir / "env.tar.gz")
    # A second model naming the same archive shares its unpacked folder.
    where_model(repo, "same_archive", str(model_dir / "env.tar.gz"))
    with stubhost.Server(repo) as server:
        seen = report(server, "packed")
        root = Path(seen["prefix"])
        assert root != tmp_path / "built" and not str(root).startswith(str(tmp_path))  # it was unpacked
        assert Path(seen["executable"]).parent == root / "bin"
        assert seen["envonly"] == "from-the-env"
        assert seen["activated"] == f"yes, in {root}" and seen["conda_prefix"] == str(root)
        assert seen["ld_library_path"].split(os.pathsep)[0] == str(root / "lib")
        assert seen["pythonhome"] is None
        assert report(server, "same_archive")["prefix"] == str(root)
        assert root.is_dir()
    assert not root.exists()  # the server removed what it unpacked


def test_a_model_runs_in_an_unpacked_environment_folder(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    model_dir = where_model(repo, "unpacked", "$$TRITON_MODEL_DIRECTORY/env")
    env = make_env(model_dir / "env", value="unpacked")
    with stubhost.Server(repo) as server:
        seen = report(server, "unpacked")
    assert Path(seen["prefix"]) == env.resolve()
    assert seen["envonly"] == "unpacked"
    assert seen["activated"] == f"yes, in {env.resolve()}"
    assert env.is_dir()  # a folder the user gave is left alone


def test_a_restarted_stub_runs_in_the_same_environment(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    model_dir = where_model(repo, "packed", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    pack(make_env(tmp_path / "built"), model_dir / "env.tar.gz")
    with stubhost.Server(repo) as server:
        before = report(server, "packed")
        inst = instance(server, "packed")
        crashed = inst.process.pid
        os.kill(crashed, signal.SIGKILL)
        assert wait_until(lambda: inst.process.pid != crashed and server.model_ready("packed"), 15.0)
        assert report(server, "packed") == before


def load_error(repo: Path, name: str) -> str:
    with stubhost.Server(repo, exit_on_error=False) as server:
        assert not server.model_ready(name)
        return server.load_errors[name]


def test_a_missing_environment_is_a_load_error_naming_it(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    where_model(repo, "missing", "$$TRITON_MODEL_DIRECTORY/nowhere.tar.gz")
    error = load_error(repo, "missing")
    assert f"Failed to get the canonical path for {repo / 'missing' / 'nowhere.tar.gz'}." in error


def test_an_environment_without_an_activate_script_is_refused_with_tritons_words(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    model_dir = where_model(repo, "noactivate", "$$TRITON_MODEL_DIRECTORY/env")
    (model_dir / "env" / "bin").mkdir(parents=True)
    error = load_error(repo, "noactivate")
    assert (f"Path {model_dir / 'env' / 'bin' / 'activate'} does not exist. The Python environment should "
            f"contain an 'activate' script.") in error


def test_an_environment_of_another_python_version_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    model_dir = where_model(repo, "oldpython", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    fake = tmp_path / "fake"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "activate").write_text("export X=1\n")
    (fake / "lib" / "python3.6").mkdir(parents=True)
    pack(fake, model_dir / "env.tar.gz")
    error = load_error(repo, "oldpython")
    assert f"has no {VERSION}" in error and "found: python3.6" in error


def test_an_activate_script_that_fails_is_a_load_error_with_its_output(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    model_dir = where_model(repo, "badactivate", "$$TRITON_MODEL_DIRECTORY/env")
    env = make_env(model_dir / "env")
    (env / "bin" / "activate").write_text("echo 'cannot set up the env (act-fail-31)' >&2\nreturn 3\n")
    error = load_error(repo, "badactivate")
    assert "exited with 3" in error and "act-fail-31" in error


def test_a_model_cannot_set_both_an_environment_and_an_interpreter(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    where_model(repo, "both", "$$TRITON_MODEL_DIRECTORY/env",
                extra=f'parameters: {{ key: "STUBHOST_PYTHON_EXECUTABLE" value: {{ string_value: "{sys.executable}" }} }}')
    error = load_error(repo, "both")
    assert "sets both EXECUTION_ENV_PATH and STUBHOST_PYTHON_EXECUTABLE" in error


def test_an_archive_that_changed_is_unpacked_again_into_a_new_folder(tmp_path: Path) -> None:
    archive = pack(make_env(tmp_path / "v1", value="one"), tmp_path / "env.tar.gz")
    envs = ExecutionEnvs()
    try:
        base = dict(os.environ)
        first = envs.get(str(archive), base)
        assert envs.get(str(archive), base) is first  # unpacked and activated once
        pack(make_env(tmp_path / "v2", value="two"), archive)
        os.utime(archive, ns=(1, 1))  # another modification time even on a coarse clock
        second = envs.get(str(archive), base)
        assert second.root != first.root
        site = Path("lib") / VERSION / "site-packages" / "envonly.py"
        assert (second.root / site).read_text() == "VALUE = 'two'\n"
        assert (first.root / site).read_text() == "VALUE = 'one'\n"  # stubs of an earlier load may run there
    finally:
        envs.close()
    assert not first.root.exists() and not second.root.exists()


def test_an_archive_member_outside_the_folder_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar.gz"
    payload = tmp_path / "payload"
    payload.write_text("x")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(payload, arcname="../escaped")
    envs = ExecutionEnvs()
    try:
        with pytest.raises(ExecutionEnvError, match="failed to extract"):
            envs.get(str(archive), dict(os.environ))
    finally:
        envs.close()
    assert not (tmp_path / "escaped").exists()
