"""A caller that gives up while a default-mode ``execute`` runs its request: the model sees
``request.is_cancelled()`` turn true and can stop early; the next request is not cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import WAITER_PY, wait_until, waiter_config, write_model

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
