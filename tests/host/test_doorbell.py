"""The doorbell: a stub wakes the one event loop that awaits its answers, with no thread between.

Real stubs and real event loops: the answers must arrive through the loop's own doorbell (no
completion thread), callers on a second loop or in threads must still be answered, a new loop
takes over once the first is closed, and closing a stub leaves no descriptor or registration
behind in any loop.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

import stubhost
from stubhost.host import doorbell
from stubhost.host.doorbell import SPIN_BACKOFF, AnswerSpin, Doorbell
from tests.host.repo_factory import SLEEPY_PY, config_pbtxt, instance, io, sleepy_config, wait_until, write_model


def _eventfds() -> int:
    """Event descriptors open in this process."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[eventfd]"
        except OSError:
            pass  # the descriptor listdir itself used
    return count


def _handovers(server: stubhost.Server, model: str) -> list[str]:
    """The names of the threads that hand the answers of `model`'s stub to their callers, as
    they come."""
    names: list[str] = []
    process = instance(server, model).process
    notify = process._notify

    def recorded(handle: int) -> None:
        if handle in process.waiters:
            names.append(threading.current_thread().name)
        notify(handle)

    process._notify = recorded
    return names


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    write_model(tmp_path, "sleepy", SLEEPY_PY, sleepy_config("sleepy"))
    batched = config_pbtxt("batched", [io("INPUT0", "TYPE_FP32", [-1])],
                           [io("OUTPUT0", "TYPE_FP32", [-1]), io("PID", "TYPE_INT64", [1])], max_batch_size=8,
                           extra="dynamic_batching { max_queue_delay_microseconds: 100000 }")
    write_model(tmp_path, "batched", SLEEPY_PY, batched)
    return tmp_path


async def _infer_many(server: stubhost.Server, model: str, count: int, batch: bool = False) -> None:
    async def one(i: int) -> None:
        data = np.full((1, 3) if batch else 3, i, np.float32)
        out = await server.infer_async(model, {"INPUT0": data})
        np.testing.assert_array_equal(out["OUTPUT0"], data)

    await asyncio.gather(*(one(i) for i in range(count)))


def test_awaits_in_one_loop_are_answered_through_its_doorbell(repo: Path) -> None:
    with stubhost.Server(repo, models=["sleepy", "batched"]) as server:
        direct, batches = _handovers(server, "sleepy"), _handovers(server, "batched")
        asyncio.run(_infer_many(server, "sleepy", 200))
        for _ in range(20):  # one at a time, and in batches the loop itself sends
            asyncio.run(_infer_many(server, "sleepy", 1))
        asyncio.run(_infer_many(server, "batched", 200, batch=True))
        assert len(direct) == 220 and len(batches) == 25
        assert set(direct) == set(batches) == {"MainThread"}, "answers went through another thread than the loop's"


def test_a_second_loop_is_answered_while_the_first_listens_and_takes_over_once_it_is_closed(repo: Path) -> None:
    with stubhost.Server(repo, models=["sleepy"]) as server:
        handovers = _handovers(server, "sleepy")
        first = asyncio.new_event_loop()
        runner = threading.Thread(target=first.run_forever, name="first", daemon=True)
        runner.start()
        try:
            asyncio.run_coroutine_threadsafe(_infer_many(server, "sleepy", 5), first).result(30)
            asyncio.run(_infer_many(server, "sleepy", 50))  # another loop: the completion thread answers it
            asyncio.run_coroutine_threadsafe(_infer_many(server, "sleepy", 5), first).result(30)
            assert handovers[:5] == handovers[-5:] == ["first"] * 5
            assert set(handovers[5:-5]) == {f"stubhost-done-{instance(server, 'sleepy').name}"}, handovers
        finally:
            first.call_soon_threadsafe(first.stop)
            runner.join(10)
            first.close()
        fresh = asyncio.new_event_loop()
        try:
            fresh.run_until_complete(_infer_many(server, "sleepy", 20))
            assert instance(server, "sleepy").process.doorbell.listen(fresh), "the closed loop's doorbell was not taken over"
        finally:
            fresh.close()


def test_a_thread_and_a_loop_sharing_batches_are_both_answered(repo: Path) -> None:
    with stubhost.Server(repo, models=["batched"]) as server:
        errors: list[BaseException] = []

        def sync_caller() -> None:
            try:
                for i in range(100):
                    data = np.full((1, 2), -i, np.float32)
                    np.testing.assert_array_equal(server.infer("batched", {"INPUT0": data}, timeout=30)["OUTPUT0"], data)
            except BaseException as e:  # noqa: BLE001  (reported by the main thread)
                errors.append(e)

        thread = threading.Thread(target=sync_caller)
        thread.start()
        asyncio.run(_infer_many(server, "batched", 300, batch=True))
        thread.join(60)
        assert not thread.is_alive() and errors == []


def test_closing_the_server_leaves_no_doorbell_open(repo: Path) -> None:
    baseline = _eventfds()
    server = stubhost.Server(repo, models=["sleepy"])
    asyncio.run(_infer_many(server, "sleepy", 10))
    server.close()  # its loop is closed: the descriptor goes at once
    assert _eventfds() == baseline

    async def inside_the_loop() -> None:
        inner = stubhost.Server(repo, models=["sleepy"])
        await _infer_many(inner, "sleepy", 10)
        inner.close()  # from the listening loop's own thread

    asyncio.run(inside_the_loop())
    assert _eventfds() == baseline

    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        server = stubhost.Server(repo, models=["sleepy"])
        asyncio.run_coroutine_threadsafe(_infer_many(server, "sleepy", 10), loop).result(30)
        server.close()  # from another thread while the loop runs: the loop lets go of it
        assert wait_until(lambda: _eventfds() == baseline, 5.0), (_eventfds(), baseline)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()



def test_a_stub_that_dies_under_awaits_fails_them_and_its_successor_rings_a_new_doorbell(repo: Path) -> None:
    baseline = _eventfds()
    with stubhost.Server(repo, models=["sleepy"]) as server:
        async def run() -> None:
            for _ in range(3):
                old = instance(server, "sleepy").process
                calls = [asyncio.ensure_future(server.infer_async("sleepy", {"INPUT0": np.zeros(1, np.float32)},
                                                                  parameters={"sleep": 0.2})) for _ in range(3)]
                await asyncio.sleep(0.05)
                os.kill(old.pid, signal.SIGKILL)
                for call in calls:
                    with pytest.raises(stubhost.InferenceError, match="is not healthy"):
                        await asyncio.wait_for(call, 10)
                await _infer_many(server, "sleepy", 5)  # waits for the restarted stub
                assert instance(server, "sleepy").process is not old
                # The dead stub's doorbell was let go by this loop: one descriptor per live stub.
                assert await asyncio.get_running_loop().run_in_executor(
                    None, wait_until, lambda: _eventfds() == baseline + 1, 5.0), (_eventfds(), baseline)

        asyncio.run(run())
    assert _eventfds() == baseline

def test_a_closed_doorbell_leaves_no_registration_for_a_descriptor_that_reuses_its_number() -> None:
    rung: list[int] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()
        old = Doorbell(lambda pending: None)
        assert old.listen(loop)
        old.close()
        new = Doorbell(lambda pending: rung.append(len(pending)))
        try:
            assert new.fd == old.fd, "the test needs the number reused"
            assert new.listen(loop)  # a stale registration of the number would refuse this
            os.eventfd_write(new.fd, 1)
            for _ in range(100):
                if rung:
                    break
                await asyncio.sleep(0.01)
        finally:
            new.close()

    asyncio.run(run())
    assert rung == [0]


# ---- AnswerSpin: the loop stays awake a moment for a quick answer ----------------------------------

class _RecordingSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The platform's selector, noting the timeout of every poll the loop makes."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []

    def select(self, timeout: float | None = None):  # type: ignore[no-untyped-def]
        self.timeouts.append(timeout)
        return super().select(timeout)


def _run(coroutine_function, selector: selectors.BaseSelector | None = None):  # type: ignore[no-untyped-def]
    loop = asyncio.SelectorEventLoop(selector)
    try:
        return loop.run_until_complete(coroutine_function())
    finally:
        loop.close()


@pytest.fixture
def slow_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    """A spin long enough that a loaded machine cannot run it out in these tests."""
    monkeypatch.setattr(doorbell, "LOOP_SPIN_S", 5.0)


def test_a_spin_runs_the_loops_other_work_and_never_lets_it_sleep(slow_spin: None) -> None:
    selector = _RecordingSelector()
    steps: list[int] = []

    async def main() -> None:
        done = asyncio.get_running_loop().create_future()

        async def other_work() -> None:
            for i in range(20):
                steps.append(i)
                await asyncio.sleep(0)
            doorbell.resolve(done)  # as the doorbell's callback does

        worker = asyncio.ensure_future(other_work())
        await asyncio.sleep(0)
        selector.timeouts.clear()
        spin = AnswerSpin()
        await spin.wait(done, None)
        assert done.done() and spin.skip == 0
        await worker

    _run(main, selector)
    assert steps == list(range(20))
    assert selector.timeouts and all(t == 0 for t in selector.timeouts), "the loop slept while a coroutine spun"


def test_a_spin_in_vain_turns_spinning_off_for_the_next_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(doorbell, "LOOP_SPIN_S", 0.002)
    selector = _RecordingSelector()

    async def main() -> None:
        done = asyncio.get_running_loop().create_future()
        spin = AnswerSpin()
        await spin.wait(done, None)  # nothing answers
        assert not done.done() and spin.skip == SPIN_BACKOFF
        selector.timeouts.clear()
        for left in range(SPIN_BACKOFF - 1, -1, -1):
            await spin.wait(done, None)
            assert spin.skip == left
        assert selector.timeouts == [], "a wait that should not spin yielded to the loop"
        await spin.wait(done, None)  # spins again, and again in vain
        assert spin.skip == SPIN_BACKOFF and selector.timeouts

    _run(main, selector)


def test_one_coroutine_per_loop_spins_and_a_short_timeout_never_does(slow_spin: None) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        first, second = loop.create_future(), loop.create_future()
        spinning = asyncio.ensure_future(AnswerSpin().wait(first, None))
        await asyncio.sleep(0)
        assert not spinning.done()
        await asyncio.wait_for(AnswerSpin().wait(second, None), 1.0)  # returns at once: the other spins
        assert not spinning.done()
        doorbell.resolve(first)
        await spinning
        await asyncio.wait_for(AnswerSpin().wait(second, doorbell.LOOP_SPIN_S / 2), 1.0)

    _run(main)


def test_a_cancelled_spin_lets_the_next_coroutine_spin(slow_spin: None) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(AnswerSpin().wait(loop.create_future(), None))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        done = loop.create_future()
        loop.call_soon(doorbell.resolve, done)
        spin = AnswerSpin()
        await spin.wait(done, None)
        assert done.done() and spin.skip == 0

    _run(main)


def test_an_instance_whose_answers_are_slow_stops_spinning_and_still_answers(repo: Path) -> None:
    with stubhost.Server(repo, models=["sleepy"]) as server:
        spin = instance(server, "sleepy")._spin

        async def main() -> None:
            data = np.ones(3, np.float32)
            out = await server.infer_async("sleepy", {"INPUT0": data}, parameters={"sleep": 0.05})
            np.testing.assert_array_equal(out["OUTPUT0"], data)
            assert spin.skip == SPIN_BACKOFF
            for _ in range(3):
                out = await server.infer_async("sleepy", {"INPUT0": data})
                np.testing.assert_array_equal(out["OUTPUT0"], data)
            assert spin.skip == SPIN_BACKOFF - 3

        asyncio.run(main())
