"""A caller that gives up while a default-mode ``execute`` runs its request: the model sees
``request.is_cancelled()`` turn true and can stop early; the next request is not cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import WAITER_PY, instance, wait_until, waiter_config, write_model

TIMEOUT = 10.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo = tmp_path_factory.mktemp("cancellation") / "models"
    write_model(repo, "direct", WAITER_PY, waiter_config("direct"))  # one instance, no queue
    write_model(repo, "queued", WAITER_PY, waiter_config("queued", "dynamic_batching { }"))
    write_model(repo, "two", WAITER_PY, waiter_config("two", "instance_group [{ count: 2, kind: KIND_CPU }]"))
    with stubhost.Server(repo) as s:
        yield s


def one(value: int) -> dict[str, np.ndarray]:
    return {"INPUT0": np.array([value], np.int32)}


def cancel_while_running(server: stubhost.Server, model: str, tmp_path: Path) -> None:
    """Starts a request that runs until cancelled, cancels its asyncio task once the model runs
    it, and checks that the model saw the cancellation."""
    started, cancelled = tmp_path / f"{model}.started", tmp_path / f"{model}.cancelled"

    async def main() -> None:
        task = asyncio.ensure_future(server.infer_async(
            model, one(1), parameters={"wait": 30, "started": str(started), "cancelled": str(cancelled)}))
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, wait_until, started.exists, TIMEOUT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert wait_until(cancelled.exists, TIMEOUT), "the model never saw its request cancelled"


@pytest.mark.parametrize("model", ["direct", "queued", "two"])
def test_a_running_default_mode_request_sees_its_cancellation(server: stubhost.Server, model: str,
                                                               tmp_path: Path) -> None:
    cancel_while_running(server, model, tmp_path)
    # The instance is free again at once, and the next request (which may well be written into
    # the record the cancelled one used) is not cancelled.
    out = server.infer(model, one(4), parameters={"wait": 0.2, "cancelled": str(tmp_path / "next")}, timeout=TIMEOUT)
    np.testing.assert_array_equal(out["OUTPUT0"], [5])
    assert not (tmp_path / "next").exists()


def test_a_request_that_ended_is_not_cancelled_by_a_late_cancellation(server: stubhost.Server,
                                                                        tmp_path: Path) -> None:
    """Many cancellations racing with the end of their requests: none reaches a later request."""
    async def main() -> int:
        later_cancelled = 0
        for i in range(40):
            task = asyncio.ensure_future(server.infer_async("direct", one(i), parameters={"wait": 0}))
            await asyncio.sleep(0.0002 * (i % 5))
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            flag = tmp_path / f"later{i}"
            out = await server.infer_async("direct", one(i), parameters={"wait": 0.01, "cancelled": str(flag)})
            np.testing.assert_array_equal(out["OUTPUT0"], [i + 1])
            later_cancelled += flag.exists()
        return later_cancelled

    assert asyncio.run(main()) == 0


def test_a_request_cancelled_while_it_waits_for_a_busy_stub_starts_cancelled(server: stubhost.Server,
                                                                              tmp_path: Path) -> None:
    """The second request of a one-instance model waits in the stub's inbox behind the first;
    its caller gives up there, and the model sees it cancelled as soon as it starts it."""
    started, second = tmp_path / "first.started", tmp_path / "second.cancelled"
    process = instance(server, "direct").process

    async def main() -> None:
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(server.infer_async("direct", one(1), parameters={"wait": 30, "started": str(started)}))
        assert await loop.run_in_executor(None, wait_until, started.exists, TIMEOUT)
        waiting = asyncio.ensure_future(server.infer_async("direct", one(2), parameters={"wait": 30, "cancelled": str(second)}))
        while len(process.inflight) < 2:  # sent: it waits in the stub's inbox
            await asyncio.sleep(0.005)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first

    asyncio.run(main())
    assert wait_until(second.exists, TIMEOUT), "the waiting request started as if nobody had cancelled it"
    out = server.infer("direct", one(4), parameters={"wait": 0.05, "cancelled": str(tmp_path / "next")}, timeout=TIMEOUT)
    np.testing.assert_array_equal(out["OUTPUT0"], [5])
    assert not (tmp_path / "next").exists()


def test_a_request_whose_timeout_runs_out_while_it_waits_for_a_busy_stub_starts_cancelled(
        server: stubhost.Server, tmp_path: Path) -> None:
    """``Server.infer(timeout=...)`` gives up a request still waiting behind a running one: the
    caller gets Triton's timeout error, the instance is not taken for hung, and the model sees
    the request cancelled when it gets to it."""
    started, second = tmp_path / "first.started", tmp_path / "second.cancelled"

    async def main() -> None:
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(server.infer_async("direct", one(1), parameters={"wait": 30, "started": str(started)}))
        assert await loop.run_in_executor(None, wait_until, started.exists, TIMEOUT)
        with pytest.raises(stubhost.InferenceError, match="Request timeout expired") as info:
            await loop.run_in_executor(None, lambda: server.infer(
                "direct", one(2), parameters={"wait": 30, "cancelled": str(second)}, timeout=0.3))
        assert info.value.code == "UNAVAILABLE"
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first

    asyncio.run(main())
    assert wait_until(second.exists, TIMEOUT), "the model ran the timed-out request as if it were still wanted"
    out = server.infer("direct", one(4), timeout=TIMEOUT)
    np.testing.assert_array_equal(out["OUTPUT0"], [5])
