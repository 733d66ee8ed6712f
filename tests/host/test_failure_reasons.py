"""The failure reasons of the statistics (Triton's ``reason`` label of
``nv_inference_request_failure``) and the pending-request count, through the in-process API: what
each way of failing counts as, and that the statistics extension's ``fail`` counts them all."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stubhost
from stubhost.host.errors import InferenceError
from stubhost.host.stats import FAILURE_REASONS, ModelStatistics
from tests.host.repo_factory import SLEEPY_PY, copy_examples, sleepy_config, wait_until, write_model

TIMEOUT = 30.0  # generous: waiting this long is a failure, never a pacing device
ZERO = dict.fromkeys(FAILURE_REASONS, 0)

FAILING_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise pb_utils.TritonModelException("no")  # an error response would be an answer: a success
"""


# ---- ModelStatistics alone ------------------------------------------------------------------------
def test_failures_are_counted_by_reason_and_all_in_fail() -> None:
    stats = ModelStatistics()
    for reason in ("REJECTED", "CANCELED", "CANCELED", "BACKEND"):
        stats.record_failure(1, 100, 200, reason)
    stats.record_failure(1, 100, 300)  # no reason given: OTHER
    stats.record_failure(1, 100, 300, "NONSENSE")  # not one of Triton's: OTHER, never a new series
    assert stats.failures(1) == {"REJECTED": 1, "CANCELED": 2, "BACKEND": 1, "OTHER": 2}
    [entry] = stats.snapshot("m", [1])
    assert entry["inference_stats"]["fail"] == {"count": 6, "ns": 4 * 100 + 2 * 200}
    assert stats.failures(2) == ZERO  # a version with no request yet


# ---- through a server -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo = tmp_path_factory.mktemp("reasons") / "models"
    write_model(repo, "direct", SLEEPY_PY, sleepy_config("direct"))
    write_model(repo, "bounded", SLEEPY_PY, sleepy_config(
        "bounded", extra="dynamic_batching { default_queue_policy { max_queue_size: 1 } }"))
    write_model(repo, "failing", FAILING_PY, sleepy_config("failing"))
    copy_examples(repo, "repeat")
    with stubhost.Server(repo) as srv:
        yield srv


def failures(server: stubhost.Server, model: str) -> dict[str, int]:
    return server._models[model].stats.failures(1)


def fail_count(server: stubhost.Server, model: str) -> int:
    return server.statistics(model)["model_stats"][0]["inference_stats"]["fail"]["count"]


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in before}


def x() -> dict[str, np.ndarray]:
    return {"INPUT0": np.ones(2, np.float32)}


def run_busy(server: stubhost.Server, pool: ThreadPoolExecutor, model: str, marker: Path,
             seconds: float) -> Future[Any]:
    """A request that holds the model's only instance for `seconds`, once it surely started."""
    future = pool.submit(server.infer, model, x(), parameters={"sleep": seconds, "touch": str(marker)})
    assert wait_until(lambda: marker.exists() or future.done(), TIMEOUT), "the busy request never started"
    assert not future.done(), f"the busy request ended early: {future.exception()}"
    return future


def test_model_errors_are_backend_and_refused_inputs_other(server: stubhost.Server) -> None:
    before, fail_before = failures(server, "failing"), fail_count(server, "failing")
    with pytest.raises(InferenceError, match="no"):
        server.infer("failing", x())
    with pytest.raises(InferenceError, match="unexpected inference input"):
        server.infer("failing", {"WRONG": np.ones(2, np.float32)})
    assert delta(before, failures(server, "failing")) == {**ZERO, "BACKEND": 1, "OTHER": 1}
    assert fail_count(server, "failing") - fail_before == 2


def test_the_callers_timeout_on_a_running_request_is_canceled(tmp_path: Path) -> None:
    """Its own server: the stub that did not answer is replaced (by one with a new pool)."""
    repo = tmp_path / "models"
    write_model(repo, "direct", SLEEPY_PY, sleepy_config("direct"))
    with stubhost.Server(repo) as server:
        with pytest.raises(InferenceError, match="Request timeout expired"):
            server.infer("direct", x(), parameters={"sleep": 5}, timeout=0.3)
        assert failures(server, "direct") == {**ZERO, "CANCELED": 1}
        server.infer("direct", x())  # served again, by the new stub


def test_a_full_queue_is_rejected_and_pending_counts_the_queued(server: stubhost.Server, tmp_path: Path) -> None:
    model = server._models["bounded"]
    before = failures(server, "bounded")
    with ThreadPoolExecutor(2) as pool:
        busy = run_busy(server, pool, "bounded", tmp_path / "started", 1.5)
        queued = pool.submit(server.infer, "bounded", x())
        assert wait_until(lambda: model.pending(1) == 1, TIMEOUT)
        with pytest.raises(InferenceError, match="Exceeds maximum queue size"):
            server.infer("bounded", x())
        busy.result(TIMEOUT)
        queued.result(TIMEOUT)
    assert model.pending(1) == 0
    assert delta(before, failures(server, "bounded")) == {**ZERO, "REJECTED": 1}


def test_the_callers_timeout_in_the_queue_is_canceled(server: stubhost.Server, tmp_path: Path) -> None:
    before = failures(server, "bounded")
    with ThreadPoolExecutor(1) as pool:
        busy = run_busy(server, pool, "bounded", tmp_path / "started", 1.5)
        with pytest.raises(InferenceError, match="Request timeout expired"):
            server.infer("bounded", x(), timeout=0.3)
        busy.result(TIMEOUT)
    assert delta(before, failures(server, "bounded")) == {**ZERO, "CANCELED": 1}


def test_a_cancelled_coroutine_is_canceled(server: stubhost.Server, tmp_path: Path) -> None:
    before = failures(server, "bounded")

    async def cancel_one() -> None:
        for model, parameters in (("direct", {"sleep": 1.0}), ("bounded", {})):
            task = asyncio.ensure_future(server.infer_async(model, x(), parameters=parameters))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    direct_before = failures(server, "direct")
    with ThreadPoolExecutor(1) as pool:
        busy = run_busy(server, pool, "bounded", tmp_path / "started", 2.0)  # the second one waits queued
        asyncio.run(cancel_one())
        busy.result(TIMEOUT)
    assert delta(direct_before, failures(server, "direct")) == {**ZERO, "CANCELED": 1}
    assert delta(before, failures(server, "bounded")) == {**ZERO, "CANCELED": 1}
    assert server._models["bounded"].pending(1) == 0  # withdrawn from the queue


def test_a_stream_left_before_its_end_is_canceled(server: stubhost.Server) -> None:
    before, fail_before = failures(server, "repeat"), fail_count(server, "repeat")
    inputs = {"IN": np.arange(50, dtype=np.int32), "DELAY_MS": np.array([20], np.uint32)}
    responses = server.stream("repeat", inputs)
    next(responses)
    responses.close()
    assert delta(before, failures(server, "repeat")) == {**ZERO, "CANCELED": 1}
    assert fail_count(server, "repeat") - fail_before == 1
    assert len(list(server.stream("repeat", {"IN": np.arange(3, dtype=np.int32)}))) == 3
    assert delta(before, failures(server, "repeat")) == {**ZERO, "CANCELED": 1}


def test_unloading_fails_the_queued_requests_as_other(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "bounded", SLEEPY_PY, sleepy_config("bounded", extra="dynamic_batching { }"))
    with stubhost.Server(repo) as server, ThreadPoolExecutor(2) as pool:
        model = server._models["bounded"]
        busy = run_busy(server, pool, "bounded", tmp_path / "started", 1.0)
        queued = pool.submit(server.infer, "bounded", x())
        assert wait_until(lambda: model.pending(1) == 1, TIMEOUT)
        unloading = threading.Thread(target=server.unload, args=("bounded",))
        unloading.start()
        with pytest.raises(InferenceError, match="unloading"):
            queued.result(TIMEOUT)
        busy.result(TIMEOUT)
        unloading.join(TIMEOUT)
        assert model.stats.failures(1) == {**ZERO, "OTHER": 1}
