"""Models that fail to load (bad model.py, failing initialize) and one that fails to finalize."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import child_stub_pids, config_pbtxt, instance, io, pid_alive, wait_until, write_model

GOOD_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy() * 2)])
                for r in requests]
"""

SYNTAX_ERROR_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests)
        return []
"""

IMPORT_ERROR_PY = """
import triton_python_backend_utils as pb_utils
import no_such_module_q9z


class TritonPythonModel:
    def execute(self, requests):
        return []
"""

INIT_RAISES_PY = """
def check_weights(path):
    raise RuntimeError(f"weights file {path!r} is corrupt (init-boom-77)")


class TritonPythonModel:
    def initialize(self, args):
        check_weights("w.bin")

    def execute(self, requests):
        return []
"""

NO_CLASS_PY = """
class SomethingElse:
    pass
"""

FINALIZE_RAISES_PY = GOOD_PY + """
    def finalize(self):
        raise ValueError("finalize-boom-31")
"""


def config(name: str) -> str:
    return config_pbtxt(name, [io("INPUT0", "TYPE_FP32", [-1])], [io("OUTPUT0", "TYPE_FP32", [-1])])


def repo_with(tmp_path: Path, **models: str) -> Path:
    repo = tmp_path / "models"
    for name, source in models.items():
        write_model(repo, name, source, config(name))
    return repo


def load_failure(repo: Path) -> stubhost.InferenceError:
    with pytest.raises(stubhost.InferenceError) as info:
        with stubhost.Server(repo):
            pass
    return info.value


def test_syntax_error_fails_construction_with_the_traceback(tmp_path: Path) -> None:
    error = load_failure(repo_with(tmp_path, broken=SYNTAX_ERROR_PY))
    assert "SyntaxError" in error.message
    assert "model.py" in error.message
    assert "broken" in error.message  # the model's name


def test_import_error_fails_construction_with_the_traceback(tmp_path: Path) -> None:
    error = load_failure(repo_with(tmp_path, broken=IMPORT_ERROR_PY))
    assert "ModuleNotFoundError: No module named 'no_such_module_q9z'" in error.message
    assert "model.py(3)" in error.message  # the model's frame: file and line of the import


def test_missing_model_class_fails_construction(tmp_path: Path) -> None:
    error = load_failure(repo_with(tmp_path, broken=NO_CLASS_PY))
    assert "TritonPythonModel" in error.message


def test_missing_model_file_fails_construction(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "empty", None, config("empty"))
    (repo / "empty" / "1").mkdir()
    error = load_failure(repo)
    assert "model.py" in error.message


def test_exception_in_initialize_is_a_load_error_with_its_message(tmp_path: Path) -> None:
    error = load_failure(repo_with(tmp_path, initfail=INIT_RAISES_PY))
    assert "RuntimeError: weights file 'w.bin' is corrupt (init-boom-77)" in error.message
    assert "check_weights" in error.message  # the frame that raised
    assert "initfail" in error.message


def test_load_error_leaves_no_stub_running(tmp_path: Path) -> None:
    before = child_stub_pids()
    load_failure(repo_with(tmp_path, initfail=INIT_RAISES_PY, good=GOOD_PY))
    # every stub this test started is gone (the good model's too: construction failed)
    assert wait_until(lambda: not (child_stub_pids() - before), 5.0), child_stub_pids() - before


def test_without_exit_on_error_server_comes_up_not_ready(tmp_path: Path) -> None:
    repo = repo_with(tmp_path, broken=SYNTAX_ERROR_PY, initfail=INIT_RAISES_PY, good=GOOD_PY)
    with stubhost.Server(repo, exit_on_error=False) as server:
        assert not server.ready()
        assert set(server.load_errors) == {"broken", "initfail"}
        assert "SyntaxError" in server.load_errors["broken"]
        assert "init-boom-77" in server.load_errors["initfail"]
        assert server.model_ready("good")
        assert not server.model_ready("broken")
        assert not server.model_ready("initfail")
        out = server.infer("good", {"INPUT0": np.array([1.0, 2.0], dtype=np.float32)})
        np.testing.assert_array_equal(out["OUTPUT0"], [2.0, 4.0])
        with pytest.raises(stubhost.InferenceError) as info:
            server.infer("broken", {"INPUT0": np.array([1.0], dtype=np.float32)})
        assert info.value.code in ("NOT_FOUND", "UNAVAILABLE")


def test_fixing_a_broken_model_and_loading_it_makes_the_server_ready(tmp_path: Path) -> None:
    repo = repo_with(tmp_path, broken=SYNTAX_ERROR_PY, good=GOOD_PY)
    with stubhost.Server(repo, exit_on_error=False) as server:
        assert not server.ready()
        with pytest.raises(stubhost.InferenceError):
            server.load("broken")
        assert "broken" in server.load_errors
        write_model(repo, "broken", GOOD_PY)
        server.load("broken")
        assert server.load_errors == {}
        assert server.ready()
        out = server.infer("broken", {"INPUT0": np.array([3.0], dtype=np.float32)})
        np.testing.assert_array_equal(out["OUTPUT0"], [6.0])


def test_exception_in_finalize_is_logged_and_close_still_cleans_up(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="stubhost")
    repo = repo_with(tmp_path, finfail=FINALIZE_RAISES_PY)
    with stubhost.Server(repo) as server:
        out = server.infer("finfail", {"INPUT0": np.array([1.0], dtype=np.float32)})
        np.testing.assert_array_equal(out["OUTPUT0"], [2.0])
        pid = instance(server, "finfail").process.pid
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("finalize-boom-31" in m for m in errors), errors
    assert any("finfail" in m for m in errors), errors
    assert wait_until(lambda: not pid_alive(pid), 5.0)
    # (the autouse fixture checks that no segment is left)


INIT_HANGS_PY = """
import time


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(60)

    def execute(self, requests):
        return []
"""

INIT_EXITS_PY = """
import os


class TritonPythonModel:
    def initialize(self, args):
        os._exit(3)

    def execute(self, requests):
        return []
"""

FINALIZE_HANGS_PY = GOOD_PY + """
    def finalize(self):
        import time
        time.sleep(60)
"""


def test_initialize_that_hangs_fails_after_init_timeout(tmp_path: Path) -> None:
    import time
    before = child_stub_pids()
    start = time.monotonic()
    with pytest.raises(stubhost.InferenceError) as info:
        with stubhost.Server(repo_with(tmp_path, hangs=INIT_HANGS_PY), init_timeout=0.5):
            pass
    assert time.monotonic() - start < 10.0
    assert "hangs" in info.value.message
    assert wait_until(lambda: not (child_stub_pids() - before), 5.0), "the hung stub was left running"


IMPORT_EXITS_PY = """
import os

os._exit(4)
"""


def test_stub_exiting_in_initialize_fails_the_load_at_once_with_its_exit_code(tmp_path: Path) -> None:
    """A stub that dies while initializing is noticed at once, not after init_timeout."""
    import time
    start = time.monotonic()
    with pytest.raises(stubhost.InferenceError) as info:
        with stubhost.Server(repo_with(tmp_path, exits=INIT_EXITS_PY), init_timeout=20.0):
            pass
    elapsed = time.monotonic() - start
    assert elapsed < 5.0, f"the load failed only after {elapsed:.1f} s: {info.value.message}"
    assert "exits" in info.value.message
    assert "code 3" in info.value.message, info.value.message


def test_stub_exiting_while_importing_the_model_fails_the_load_at_once(tmp_path: Path) -> None:
    import time
    start = time.monotonic()
    with pytest.raises(stubhost.InferenceError) as info:
        with stubhost.Server(repo_with(tmp_path, exits=IMPORT_EXITS_PY), init_timeout=20.0):
            pass
    elapsed = time.monotonic() - start
    assert elapsed < 5.0, f"the load failed only after {elapsed:.1f} s: {info.value.message}"
    assert "code 4" in info.value.message, info.value.message


def test_finalize_that_hangs_is_cut_short_by_finalize_timeout(tmp_path: Path) -> None:
    import time
    with stubhost.Server(repo_with(tmp_path, finhang=FINALIZE_HANGS_PY), finalize_timeout=0.5) as server:
        pid = instance(server, "finhang").process.pid
        start = time.monotonic()
        server.close()
        assert time.monotonic() - start < 5.0
    assert wait_until(lambda: not pid_alive(pid), 5.0)
