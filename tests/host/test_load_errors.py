"""Models that fail to load (bad model.py, failing initialize), loads retried (model_load_retry_count),
and one that fails to finalize."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import (
    child_stub_pids,
    config_pbtxt,
    instance,
    io,
    own_shm_entries,
    pid_alive,
    pool_names,
    stub_pids,
    wait_until,
    write_model,
)

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


def test_stub_exiting_in_initialize_fails_the_load_at_once_with_its_exit_code(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A stub that dies while initializing is noticed at once, not after init_timeout; the error
    has Triton's words, and the log has the exit code."""
    import time
    start = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="stubhost"), pytest.raises(stubhost.InferenceError) as info:
        with stubhost.Server(repo_with(tmp_path, exits=INIT_EXITS_PY), init_timeout=20.0):
            pass
    elapsed = time.monotonic() - start
    assert elapsed < 5.0, f"the load failed only after {elapsed:.1f} s: {info.value.message}"
    assert info.value.message == ("load failed for model 'exits': version 1 is at UNAVAILABLE state: Internal: "
                                  "Stub process 'exits_0' is not healthy.;\n")
    assert "stub 'exits_0' exited with code 3" in caplog.text
    assert "failed to load 'exits' version 1: Internal: Stub process 'exits_0' is not healthy." in caplog.text


def test_stub_exiting_while_importing_the_model_fails_the_load_at_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import time
    start = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="stubhost"), pytest.raises(stubhost.InferenceError) as info:
        with stubhost.Server(repo_with(tmp_path, exits=IMPORT_EXITS_PY), init_timeout=20.0):
            pass
    elapsed = time.monotonic() - start
    assert elapsed < 5.0, f"the load failed only after {elapsed:.1f} s: {info.value.message}"
    assert "is not healthy" in info.value.message
    assert "exited with code 4" in caplog.text, caplog.text


def test_finalize_that_hangs_is_cut_short_by_finalize_timeout(tmp_path: Path) -> None:
    import time
    with stubhost.Server(repo_with(tmp_path, finhang=FINALIZE_HANGS_PY), finalize_timeout=0.5) as server:
        pid = instance(server, "finhang").process.pid
        start = time.monotonic()
        server.close()
        assert time.monotonic() - start < 5.0
    assert wait_until(lambda: not pid_alive(pid), 5.0)


# ---- model_load_retry_count (tritonserver's --model-load-retry-count) -------------------------------
# initialize fails on its first FAILURES attempts; it counts them in a file in the model's folder.
FLAKY_PY = """
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], "attempts")
        attempt = int(open(path).read()) + 1 if os.path.exists(path) else 1
        with open(path, "w") as f:
            f.write(str(attempt))
        if attempt <= FAILURES:
            raise RuntimeError(f"flaky initialize failed on attempt {attempt} (flaky-41)")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy() * 2)])
                for r in requests]
"""


def flaky_repo(tmp_path: Path, failures: int) -> Path:
    """A repository with one model, "flaky", whose initialize fails its first `failures` times."""
    return repo_with(tmp_path, flaky=FLAKY_PY.replace("FAILURES", str(failures)))


def attempts(repo: Path) -> int:
    return int((repo / "flaky" / "attempts").read_text())


def attempt_errors(caplog: pytest.LogCaptureFixture) -> list[int]:
    """The attempts whose failure the log reports, in order (each with its error)."""
    return [int(m.split("failed on attempt ")[1].split()[0]) for m in caplog.messages if "flaky-41" in m]


@pytest.mark.parametrize("failures, retries", [(0, 0), (2, 2), (1, 3)])
def test_a_load_that_fails_at_most_retry_count_times_succeeds(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                               failures: int, retries: int) -> None:
    repo = flaky_repo(tmp_path, failures)
    stubs, segments = child_stub_pids(), own_shm_entries()
    with caplog.at_level(logging.ERROR, logger="stubhost"), \
            stubhost.Server(repo, model_load_retry_count=retries) as server:
        assert server.ready() and server.load_errors == {} and attempts(repo) == failures + 1
        out = server.infer("flaky", {"INPUT0": np.array([1.0, 2.0], dtype=np.float32)})
        np.testing.assert_array_equal(out["OUTPUT0"], [2.0, 4.0])
        # The failed attempts left nothing behind: the loaded model's stub and pool are all there is.
        assert child_stub_pids() - stubs == set(stub_pids(server))
        assert own_shm_entries() - segments == set(pool_names(server))
    assert attempt_errors(caplog) == list(range(1, failures + 1))  # each failed attempt, with its error


@pytest.mark.parametrize("retries", [0, 2])
def test_a_load_that_fails_more_than_retry_count_times_fails_with_the_last_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, retries: int) -> None:
    repo = flaky_repo(tmp_path, 5)
    stubs, segments = child_stub_pids(), own_shm_entries()
    with caplog.at_level(logging.ERROR, logger="stubhost"):
        error = load_failure_with(repo, model_load_retry_count=retries)
    assert attempts(repo) == retries + 1
    assert f"failed on attempt {retries + 1} (flaky-41)" in error.message and error.code == "INVALID_ARG"
    assert attempt_errors(caplog).count(retries + 1) >= 1 and set(attempt_errors(caplog)) == set(range(1, retries + 2))
    assert wait_until(lambda: not (child_stub_pids() - stubs), 5.0), child_stub_pids() - stubs
    assert own_shm_entries() - segments == set()


def load_failure_with(repo: Path, **options: object) -> stubhost.InferenceError:
    with pytest.raises(stubhost.InferenceError) as info:
        with stubhost.Server(repo, **options):  # type: ignore[arg-type]
            pass
    return info.value


def test_explicit_loads_retry_too_and_a_failed_one_is_reported_as_before(tmp_path: Path) -> None:
    repo = flaky_repo(tmp_path, 3)
    with stubhost.Server(repo, exit_on_error=False, model_load_retry_count=1) as server:
        assert attempts(repo) == 2 and not server.ready()  # start-up: attempts 1 and 2 failed
        assert "failed on attempt 2 (flaky-41)" in server.load_errors["flaky"]
        server.load("flaky")  # attempt 3 fails, attempt 4 succeeds
        assert attempts(repo) == 4 and server.ready() and server.load_errors == {}
        (repo / "flaky" / "attempts").write_text("-10")  # the next ten attempts fail
        with pytest.raises(stubhost.InferenceError, match=r"failed on attempt -8 \(flaky-41\)"):
            server.load("flaky")  # two attempts: -9, then -8, whose error is the load's
        assert "failed on attempt -8" in server.load_errors["flaky"]
        assert server.model_ready("flaky")  # the copy that was loaded keeps serving, as before


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_a_bad_retry_count_is_refused(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValueError, match="model_load_retry_count must be a non-negative integer"):
        stubhost.Server(flaky_repo(tmp_path, 0), model_load_retry_count=bad)  # type: ignore[arg-type]
