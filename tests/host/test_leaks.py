"""Many requests leave the stubs' pools as they found them: every request, response and error record
is freed (outputs when their last numpy view goes), and no segment is added to /dev/shm."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import SLEEPY_PY, config_pbtxt, copy_examples, instance, io, own_shm_entries, \
    sleepy_config, wait_until, write_model

FAILING_PY = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        mode = json.loads(requests[0].parameters())["mode"]
        if mode == "raise":
            raise ValueError("always fails")
        if mode == "error":
            return [pb_utils.InferenceResponse(error=pb_utils.TritonError("no", pb_utils.TritonError.INVALID_ARG))
                    for _ in requests]
        return None
"""

A = np.array([1, 2, 3, 4], dtype=np.float32)
B = np.array([4, 3, 2, 1], dtype=np.float32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    """Shared by the tests that neither restart a stub nor grow a pool (a new segment would count as
    that test's leak)."""
    repo = copy_examples(tmp_path_factory.mktemp("leaks") / "models", "add_sub", "string_upper")
    write_model(repo, "failing", FAILING_PY, config_pbtxt(
        "failing", [io("INPUT0", "TYPE_FP32", [-1])], [io("OUTPUT0", "TYPE_FP32", [-1])]))
    with stubhost.Server(repo) as s:
        yield s


@pytest.fixture
def sleepy_server(tmp_path: Path) -> Iterator[stubhost.Server]:
    repo = tmp_path / "models"
    write_model(repo, "sleepy", SLEEPY_PY, sleepy_config("sleepy"))
    with stubhost.Server(repo) as s:
        yield s


def used(server: stubhost.Server, model: str) -> int:
    gc.collect()
    return int(instance(server, model).process.pool.used_bytes)


def assert_no_growth(server: stubhost.Server, model: str, one: Callable[[], None], n: int,
                     warm_up: Callable[[], None] | None = None) -> None:
    for _ in range(50):  # warm-up: lazily created structures exist from here on, and the stub has
        (warm_up or one)()  # released its initialize message (it does so after answering it)
    baseline, segments = used(server, model), own_shm_entries()
    for _ in range(n):
        one()
    assert used(server, model) == baseline, f"{used(server, model) - baseline} bytes leaked over {n} requests"
    assert own_shm_entries() == segments


def test_ten_thousand_add_sub_requests_leak_nothing(server: stubhost.Server) -> None:
    expected0, expected1 = A + B, A - B
    mismatches = 0

    def one() -> None:
        nonlocal mismatches
        out = server.infer("add_sub", {"INPUT0": A, "INPUT1": B})
        if not (np.array_equal(out["OUTPUT0"], expected0) and np.array_equal(out["OUTPUT1"], expected1)):
            mismatches += 1

    assert_no_growth(server, "add_sub", one, 10_000)
    assert mismatches == 0


def test_requests_for_one_output_leak_nothing(server: stubhost.Server) -> None:
    assert_no_growth(server, "add_sub",
                     lambda: server.infer("add_sub", {"INPUT0": A, "INPUT1": B}, outputs=["OUTPUT1"]), 1000)


def test_bytes_requests_leak_nothing(server: stubhost.Server) -> None:
    words = np.array([b"alpha", b"", "\u00df".encode(), b"z" * 100], dtype=np.object_)
    assert_no_growth(server, "string_upper", lambda: server.infer("string_upper", {"INPUT0": words}), 1000)


@pytest.mark.parametrize("mode", ["raise", "error", "none"])
def test_failing_requests_leak_nothing(server: stubhost.Server, mode: str) -> None:
    def one() -> None:
        with pytest.raises(stubhost.InferenceError):
            server.infer("failing", {"INPUT0": A}, parameters={"mode": mode})

    assert_no_growth(server, "failing", one, 1000)


def test_rejected_requests_leak_nothing(server: stubhost.Server) -> None:
    def one() -> None:
        with pytest.raises(stubhost.InferenceError):
            server.infer("add_sub", {"INPUT0": A, "INPUT1": B[:2]})

    assert_no_growth(server, "add_sub", one, 1000,
                     warm_up=lambda: server.infer("add_sub", {"INPUT0": A, "INPUT1": B}) and None)


def test_outputs_hold_pool_memory_until_their_last_view_goes(server: stubhost.Server) -> None:
    for _ in range(10):
        server.infer("add_sub", {"INPUT0": A, "INPUT1": B})
    baseline = used(server, "add_sub")
    kept = [server.infer("add_sub", {"INPUT0": A, "INPUT1": B})["OUTPUT0"] for _ in range(100)]
    assert used(server, "add_sub") > baseline  # zero-copy: the outputs are views of the pool
    views = [k[1:] for k in kept]
    del kept
    assert used(server, "add_sub") > baseline  # a slice still holds its record
    np.testing.assert_array_equal(views[0], (A + B)[1:])
    del views
    assert used(server, "add_sub") == baseline


def test_timed_out_request_leaves_the_new_pool_clean(sleepy_server: stubhost.Server) -> None:
    server = sleepy_server
    with pytest.raises(stubhost.InferenceError):
        server.infer("sleepy", {"INPUT0": A}, parameters={"sleep": 60}, timeout=0.3)
    # after the replacement, the new pool serves without growth
    assert wait_until(lambda: server.model_ready("sleepy") and instance(server, "sleepy").restarts == 1, 15.0)
    assert_no_growth(server, "sleepy", lambda: server.infer("sleepy", {"INPUT0": A}), 500)


def test_large_tensors_grow_the_pool_and_round_trip(sleepy_server: stubhost.Server) -> None:
    server = sleepy_server
    x = np.random.default_rng(5).standard_normal(6 << 20).astype(np.float32)  # 24 MiB, over the first segment
    out = server.infer("sleepy", {"INPUT0": x})["OUTPUT0"]
    assert out.tobytes() == x.tobytes()
    del out
    baseline = used(server, "sleepy")
    for _ in range(5):
        assert server.infer("sleepy", {"INPUT0": x})["OUTPUT0"].tobytes() == x.tobytes()
    assert used(server, "sleepy") == baseline


def test_outputs_stay_readable_after_the_server_closed(tmp_path: Path) -> None:
    repo = copy_examples(tmp_path / "models", "add_sub", "string_upper")
    with stubhost.Server(repo) as server:
        out = server.infer("add_sub", {"INPUT0": A, "INPUT1": B})
        words = server.infer("string_upper", {"INPUT0": np.array([b"abc"], dtype=np.object_)})
    # the segments' names are gone (the autouse fixture checks), the mappings live on with the arrays
    np.testing.assert_array_equal(out["OUTPUT0"], A + B)
    np.testing.assert_array_equal(out["OUTPUT1"], A - B)
    assert words["OUTPUT0"].tolist() == [b"ABC"]


def test_outputs_stay_readable_after_their_stub_was_replaced(sleepy_server: stubhost.Server) -> None:
    import os
    import signal
    server = sleepy_server
    out = server.infer("sleepy", {"INPUT0": A})
    pid = instance(server, "sleepy").process.pid
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: instance(server, "sleepy").process.pid != pid and server.model_ready("sleepy"), 15.0)
    np.testing.assert_array_equal(out["OUTPUT0"], A)
