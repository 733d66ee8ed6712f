"""StepLimiter, the place-keeper of ``max_inflight_requests``: FIFO turns across threads and event
loops, a cancelled waiter gives its turn on (and gives back a place handed to it), and a wait that
lasts too long goes ahead over the limit with Triton's log line."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from stubhost.host import step_limiter
from stubhost.host.step_limiter import StepLimiter
from tests.host.repo_factory import wait_until


def test_places_pass_to_waiting_threads_in_arrival_order() -> None:
    limiter = StepLimiter("e", 0, 1)
    limiter.acquire()
    order: list[int] = []

    def take(i: int) -> None:
        with limiter:
            order.append(i)

    threads = []
    for i in range(4):
        threads.append(threading.Thread(target=take, args=(i,)))
        threads[-1].start()
        assert wait_until(lambda: len(limiter._waiting) == i + 1, 5)  # each queued before the next starts
    limiter.release()
    for t in threads:
        t.join(5)
    assert order == [0, 1, 2, 3]
    assert limiter.inflight == 0


def test_a_coroutine_waits_for_a_place_a_thread_frees() -> None:
    limiter = StepLimiter("e", 0, 2)
    limiter.acquire()
    limiter.acquire()

    async def main() -> float:
        threading.Timer(0.2, limiter.release).start()
        start = time.monotonic()
        async with limiter:
            return time.monotonic() - start

    waited = asyncio.run(main())
    assert 0.15 < waited < 2
    assert limiter.inflight == 1


def test_a_cancelled_waiter_gives_its_turn_to_the_next() -> None:
    limiter = StepLimiter("e", 0, 1)

    async def main() -> None:
        await limiter.acquire_async()
        first = asyncio.ensure_future(limiter.acquire_async())
        second = asyncio.ensure_future(limiter.acquire_async())
        await asyncio.sleep(0.01)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        limiter.release()
        await asyncio.wait_for(second, 2)
        assert limiter.inflight == 1 and not limiter._waiting
        limiter.release()

    asyncio.run(main())
    assert limiter.inflight == 0


def test_a_place_handed_to_a_waiter_as_it_is_cancelled_comes_back() -> None:
    limiter = StepLimiter("e", 0, 1)

    async def main() -> None:
        await limiter.acquire_async()
        waiter = asyncio.ensure_future(limiter.acquire_async())
        await asyncio.sleep(0.01)
        limiter.release()  # handed over: the grant is on its way through the loop
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await asyncio.sleep(0.01)

    asyncio.run(main())
    assert limiter.inflight == 0 and not limiter._waiting


def test_a_wait_past_the_give_up_time_goes_ahead_and_is_logged(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(step_limiter, "GIVE_UP_S", 0.1)
    limiter = StepLimiter("ens", 3, 1)
    limiter.acquire()
    with caplog.at_level(logging.ERROR, logger="stubhost"):
        limiter.acquire()  # goes ahead after 0.1 s
        asyncio.run(limiter.acquire_async())
    assert limiter.inflight == 3
    assert caplog.text.count("[Internal Error] Ensemble 'ens' unable to schedule step 3 (inflight: 1 >= limit: 1) "
                             "for 0 seconds. Proceeding to avoid deadlock.") == 1
    for _ in range(3):
        limiter.release()
    assert limiter.inflight == 0


def test_a_release_without_a_place_is_logged_not_counted(caplog: pytest.LogCaptureFixture) -> None:
    limiter = StepLimiter("e", 0, 1)
    with caplog.at_level(logging.ERROR, logger="stubhost"):
        limiter.release()
    assert "[Internal Error] step inflight request limiter underflow" in caplog.text
    assert limiter.inflight == 0

