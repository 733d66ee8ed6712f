"""Bad arguments to Server.infer fail that call with INVALID_ARG and harm nothing else: the stub is
not replaced, and the next call succeeds."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import SLEEPY_PY, instance, sleepy_config, write_model

X = np.array([1.0, 2.0], dtype=np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo = tmp_path_factory.mktemp("args") / "models"
    write_model(repo, "sleepy", SLEEPY_PY, sleepy_config("sleepy"))
    with stubhost.Server(repo) as s:
        yield s


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[stubhost.Server]:
    """A server of the test's own, for calls that might (wrongly) replace the stub: a replacement's
    new pool would count as the shared server's leak."""
    repo = tmp_path / "models"
    write_model(repo, "sleepy", SLEEPY_PY, sleepy_config("sleepy"))
    with stubhost.Server(repo) as s:
        yield s


@contextlib.contextmanager
def untouched(server: stubhost.Server) -> Iterator[None]:
    """Asserts that the block left the stub in place and serving."""
    inst = instance(server, "sleepy")
    pid, restarts = inst.process.pid, inst.restarts
    yield
    time.sleep(0.1)  # a kill would be noticed by now
    assert (inst.process.pid, inst.restarts, inst.process.alive()) == (pid, restarts, True), \
        "the call replaced a healthy stub"
    np.testing.assert_array_equal(server.infer("sleepy", {"INPUT0": X}, timeout=10.0)["OUTPUT0"], X)


def invalid(server: stubhost.Server, **kwargs: Any) -> stubhost.InferenceError:
    kwargs.setdefault("inputs", {"INPUT0": X})
    with pytest.raises(stubhost.InferenceError) as info:
        server.infer("sleepy", **kwargs)
    assert info.value.code == "INVALID_ARG", info.value
    return info.value


def test_zero_timeout_does_not_kill_a_healthy_stub(own_server: stubhost.Server) -> None:
    """Triton reads a timeout of 0 as "none" (and so does the model: request.timeout() == 0); at the
    least, a caller's zero must not make the server kill a stub that is doing fine."""
    with untouched(own_server):
        try:
            out = own_server.infer("sleepy", {"INPUT0": X}, parameters={"sleep": 0.05}, timeout=0)
        except stubhost.InferenceError as e:
            assert e.code == "INVALID_ARG", e
        else:
            np.testing.assert_array_equal(out["OUTPUT0"], X)


@pytest.mark.parametrize("timeout", [-1.0, math.nan], ids=["negative", "nan"])
def test_meaningless_timeout_is_an_invalid_argument(own_server: stubhost.Server, timeout: float) -> None:
    with untouched(own_server):
        invalid(own_server, timeout=timeout)


def test_infinite_timeout_waits_without_bound(own_server: stubhost.Server) -> None:
    with untouched(own_server):
        try:
            out = own_server.infer("sleepy", {"INPUT0": X}, timeout=math.inf)
        except stubhost.InferenceError as e:
            assert e.code == "INVALID_ARG", e
        else:
            np.testing.assert_array_equal(out["OUTPUT0"], X)


@pytest.mark.parametrize("correlation_id", [-1, 1 << 64, True, 1.5, b"bytes"], ids=repr)
def test_bad_correlation_id(server: stubhost.Server, correlation_id: Any) -> None:
    with untouched(server):
        assert "correlation_id" in invalid(server, correlation_id=correlation_id).message


@pytest.mark.parametrize("flags", [-1, 1 << 32, 1.0], ids=repr)
def test_bad_flags(server: stubhost.Server, flags: Any) -> None:
    with untouched(server):
        assert "flags" in invalid(server, flags=flags).message


def test_largest_correlation_id_and_flags_pass(server: stubhost.Server) -> None:
    out = server.infer("sleepy", {"INPUT0": X}, correlation_id=(1 << 64) - 1, flags=(1 << 32) - 1)
    np.testing.assert_array_equal(out["OUTPUT0"], X)


def test_parameters_that_are_not_json(server: stubhost.Server) -> None:
    assert "parameters" in invalid(server, parameters={"x": object()}).message


def test_inputs_that_are_not_a_mapping(server: stubhost.Server) -> None:
    invalid(server, inputs=[X])


def test_input_that_is_a_list_is_taken_as_an_array(server: stubhost.Server) -> None:
    # a list becomes float64, which the FP32 input refuses by name
    assert "'INPUT0'" in invalid(server, inputs={"INPUT0": [1.0, 2.0]}).message


def test_server_closed_refuses_infer(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "sleepy", SLEEPY_PY, sleepy_config("sleepy"))
    server = stubhost.Server(repo)
    server.close()
    with pytest.raises(stubhost.InferenceError) as info:
        server.infer("sleepy", {"INPUT0": X})
    assert info.value.code in ("UNAVAILABLE", "NOT_FOUND")
