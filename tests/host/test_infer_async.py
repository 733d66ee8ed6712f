"""infer_async waits without a thread per call: many awaits at once, timeouts, cancellation, death."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import SLEEPY_PY, instance, sleepy_config, wait_until, write_model


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    write_model(tmp_path, "sleepy", SLEEPY_PY, sleepy_config("sleepy"))
    return tmp_path


def test_a_thousand_concurrent_awaits_need_no_thread_each(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        async def run() -> tuple[list[dict[str, np.ndarray]], int]:
            calls = [server.infer_async("sleepy", {"INPUT0": np.full(3, i, np.float32)}) for i in range(1000)]
            peak = 0

            async def watch() -> None:
                nonlocal peak
                while True:
                    peak = max(peak, threading.active_count())
                    await asyncio.sleep(0.001)

            watcher = asyncio.ensure_future(watch())
            results = await asyncio.gather(*calls)
            watcher.cancel()
            return results, peak

        results, peak = asyncio.run(run())
        for i, out in enumerate(results):
            np.testing.assert_array_equal(out["OUTPUT0"], np.full(3, i, np.float32))
        assert peak < 20, f"{peak} threads for 1000 awaits: infer_async must not wait in a thread per call"
        assert instance(server, "sleepy").process.pool.check() is None


def test_async_timeout_of_a_running_request_replaces_the_stub(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        old_pid = instance(server, "sleepy").process.pid

        async def run() -> None:
            with pytest.raises(stubhost.InferenceError) as err:
                await server.infer_async("sleepy", {"INPUT0": np.zeros(1, np.float32)}, parameters={"sleep": 10},
                                         timeout=0.3)
            assert err.value.code == "UNAVAILABLE" and "timeout" in err.value.message.lower()
            out = await server.infer_async("sleepy", {"INPUT0": np.ones(1, np.float32)}, timeout=30)
            np.testing.assert_array_equal(out["OUTPUT0"], np.ones(1, np.float32))

        asyncio.run(run())
        assert instance(server, "sleepy").process.pid != old_pid


def test_cancelling_an_await_leaves_the_stub_serving_and_frees_the_request(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        inst = instance(server, "sleepy")
        # The stub drops its reference to a message just after answering it, so the baseline is
        # taken once only the control block and its four queues are left in the pool.
        assert wait_until(lambda: inst.process.pool.allocations == 5, 5.0), inst.process.pool.allocations
        baseline = inst.process.pool.used_bytes

        async def run() -> None:
            task = asyncio.ensure_future(server.infer_async("sleepy", {"INPUT0": np.zeros(1, np.float32)},
                                                            parameters={"sleep": 0.3}))
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            out = await server.infer_async("sleepy", {"INPUT0": np.ones(1, np.float32)})
            np.testing.assert_array_equal(out["OUTPUT0"], np.ones(1, np.float32))

        asyncio.run(run())
        assert inst.restarts == 0
        # The abandoned request's records are reaped by the health monitor once the stub answers.
        assert wait_until(lambda: inst.process.pool.used_bytes == baseline, 5.0), inst.process.pool.used_bytes


def test_a_stub_killed_under_an_await_fails_it_and_the_next_one_succeeds(repo: Path, tmp_path: Path) -> None:
    started = tmp_path / "started"
    with stubhost.Server(repo) as server:
        pid = instance(server, "sleepy").process.pid

        async def run() -> None:
            call = asyncio.ensure_future(server.infer_async(
                "sleepy", {"INPUT0": np.zeros(1, np.float32)}, parameters={"sleep": 10, "touch": str(started)}))
            while not started.exists():
                await asyncio.sleep(0.01)
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(stubhost.InferenceError, match="is not healthy"):
                await asyncio.wait_for(call, 5)
            out = await server.infer_async("sleepy", {"INPUT0": np.ones(1, np.float32)}, timeout=30)
            np.testing.assert_array_equal(out["OUTPUT0"], np.ones(1, np.float32))

        asyncio.run(run())
