"""``ensemble_scheduling.max_inflight_requests``: a bound on the requests in flight at one step of an
ensemble, shared by every request of that ensemble, as Triton's ensemble scheduler keeps it.

A step's request holds a place from just before it is sent until its model's final response. A
request that finds every place taken waits for one (FIFO), without an error; a waiting caller that
is cancelled gives up its turn. Callers wait from threads (synchronous ``infer``) and from event
loops alike, so places are handed over under a thread lock and, for a coroutine, through its own
loop's ``call_soon_threadsafe``. After ``GIVE_UP_S`` of waiting the request goes ahead over the
limit, logged as Triton logs it, so a graph that waits on itself cannot hang for ever.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque

log = logging.getLogger("stubhost")

GIVE_UP_S = 300.0  # Triton's kMutexTimeoutSeconds


class _Waiter:
    """One request waiting for a place: a thread's event, or a coroutine's future."""

    __slots__ = ("event", "future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.loop = loop
        self.event = threading.Event() if loop is None else None
        self.future: asyncio.Future[None] | None = None if loop is None else loop.create_future()


class StepLimiter:
    """At most ``limit`` requests in flight at step ``index`` of ensemble ``ensemble``."""

    def __init__(self, ensemble: str, index: int, limit: int) -> None:
        self.ensemble = ensemble
        self.index = index
        self.limit = limit
        self._lock = threading.Lock()
        self._inflight = 0
        self._waiting: deque[_Waiter] = deque()

    @property
    def inflight(self) -> int:
        """Places taken now (a request that went ahead over the limit counts too)."""
        return self._inflight

    def acquire(self) -> None:
        """Takes a place, waiting in this thread while there is none."""
        waiter = self._enter(None)
        if waiter is None or waiter.event.wait(GIVE_UP_S):  # type: ignore[union-attr]
            return
        self._give_up(waiter)

    async def acquire_async(self) -> None:
        """Takes a place, waiting in the running loop while there is none; cancellable."""
        waiter = self._enter(asyncio.get_running_loop())
        if waiter is None:
            return
        future = waiter.future
        assert future is not None
        try:
            done, _ = await asyncio.wait({future}, timeout=GIVE_UP_S)
        except asyncio.CancelledError:
            with self._lock:
                queued = self._remove(waiter)
            if queued:
                future.cancel()
            elif not future.cancel():  # handed over and granted: give it back (else _granted does)
                self.release()
            raise
        if not done:
            self._give_up(waiter)

    def release(self) -> None:
        """Frees a place: the longest waiter gets it."""
        with self._lock:
            if not self._waiting:
                if self._inflight > 0:
                    self._inflight -= 1
                else:
                    log.error("[Internal Error] step inflight request limiter underflow")
                return
            waiter = self._waiting.popleft()  # the place passes to it: the count stays
        self._hand_over(waiter)

    def __enter__(self) -> StepLimiter:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    async def __aenter__(self) -> StepLimiter:
        await self.acquire_async()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    # ---- internals -----------------------------------------------------------------------------------
    def _enter(self, loop: asyncio.AbstractEventLoop | None) -> _Waiter | None:
        """None when a place was free (it is now taken); else the queued waiter."""
        with self._lock:
            if self._inflight < self.limit and not self._waiting:
                self._inflight += 1
                return None
            waiter = _Waiter(loop)
            self._waiting.append(waiter)
            return waiter

    def _remove(self, waiter: _Waiter) -> bool:
        try:
            self._waiting.remove(waiter)
        except ValueError:
            return False
        return True

    def _give_up(self, waiter: _Waiter) -> None:
        """After GIVE_UP_S: goes ahead over the limit, unless a place came meanwhile."""
        with self._lock:
            if not self._remove(waiter):
                return  # handed a place at the last moment (a coroutine's comes through its loop)
            inflight = self._inflight
            self._inflight += 1
        log.error("[Internal Error] Ensemble '%s' unable to schedule step %d (inflight: %d >= limit: %d) for %d "
                  "seconds. Proceeding to avoid deadlock.", self.ensemble, self.index, inflight, self.limit,
                  int(GIVE_UP_S))

    def _hand_over(self, waiter: _Waiter) -> None:
        if waiter.event is not None:
            waiter.event.set()
            return
        try:
            waiter.loop.call_soon_threadsafe(self._granted, waiter.future)  # type: ignore[union-attr]
        except RuntimeError:  # its loop is closed: nobody will take the place
            self.release()

    def _granted(self, future: asyncio.Future[None]) -> None:
        if future.cancelled():  # its caller gave up after the place was handed over
            self.release()
        elif not future.done():
            future.set_result(None)
