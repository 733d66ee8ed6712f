"""The doorbell: how a stub wakes the event loop that waits for its answers, with no thread between.

Without it, a stub's answer to a caller that waits without a thread goes through the stub
process's completion thread, which then wakes the caller's loop (``call_soon_threadsafe``): two
wake-ups per request, about 70 µs on a 2-core VM. With it, the stub writes an eventfd that the
loop watches, and the loop reads the answer itself: one wake-up.

One loop at a time listens to a stub's doorbell: the first that asks, until it is closed. A
single eventfd cannot serve several loops, because the first loop to read it would clear the
wake-up of the others. Callers on any other loop, and threads, keep the completion thread. That
thread also polls the doorbell's messages, so an answer whose loop stopped, or is stuck, still
reaches its callback (a batch's answer frees its instance for everyone) within its poll period.

The one wake-up left is spared too when the answer is quick: the awaiting coroutine first keeps
its loop awake a moment (``AnswerSpin``), so the loop sees the bell ring without sleeping.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable

LOOP_SPIN_S = 200e-6  # how long a coroutine keeps its loop awake for a quick answer
SPIN_BACKOFF = 64     # answers that did not come within a spin: this many sends wait without one


class _Spinning(threading.local):
    on = False  # a coroutine of the loop running in this thread spins (one at a time is enough)


_SPINNING = _Spinning()


class AnswerSpin:
    """Keeps an event loop awake a moment for a quick answer from one stub (or one scheduler),
    or, from an HTTP connection, for a client's next request.

    Where the loop would sleep until the stub's doorbell rings, the waiting coroutine instead
    yields to the loop again and again for up to `seconds` (default LOOP_SPIN_S): the loop runs its
    other work as usual and polls its descriptors without blocking, so the doorbell's answer is
    handled at once. A thread that slept costs a wake-up, and cold caches after it, which on a
    small VM cost more than a quick model's whole execute. Unlike waiting in the loop's thread,
    a spin holds up nothing else. A spin in vain (a slow model, an idle client) turns spinning
    off for the next SPIN_BACKOFF waits, and only one coroutine per loop spins at a time.
    """

    __slots__ = ("skip", "seconds")

    def __init__(self, seconds: float | None = None) -> None:
        self.skip = 0
        self.seconds = seconds  # None: LOOP_SPIN_S

    def armed(self) -> bool:
        """Whether a spin is worth starting now (no other spin of this loop's thread, no
        backoff); counts the backoff down."""
        if self.skip:
            self.skip -= 1
            return False
        return not _SPINNING.on

    async def wait(self, done: asyncio.Future[None], timeout: float | None) -> None:
        """Spins until `done` is resolved, or for `seconds`; the caller then awaits `done`."""
        seconds = LOOP_SPIN_S if self.seconds is None else self.seconds
        if self.armed() and (timeout is None or timeout > seconds):
            await self.until(done.done)

    async def until(self, ready: Callable[[], object]) -> None:
        """Spins until `ready()` is true, or for `seconds` (then backs off). Call it when
        ``armed()`` said so."""
        if _SPINNING.on:
            return  # another coroutine began a spin meanwhile
        _SPINNING.on = True
        try:
            end = time.monotonic() + (LOOP_SPIN_S if self.seconds is None else self.seconds)
            while not ready():
                if time.monotonic() >= end:
                    self.skip = SPIN_BACKOFF
                    return
                await asyncio.sleep(0)
        finally:
            _SPINNING.on = False


def resolve(future: asyncio.Future[None]) -> None:
    """Sets a waiting caller's future, unless its caller timed out or was cancelled meanwhile."""
    if not future.done():
        future.set_result(None)


def wake(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> None:
    """Resolves `future` of `loop`: at once from the loop's own thread (a doorbell's answer),
    through the loop from any other thread (the completion thread, whoever fails a message)."""
    if asyncio._get_running_loop() is loop:
        resolve(future)
        return
    try:
        loop.call_soon_threadsafe(resolve, future)
    except RuntimeError:
        pass  # the caller's loop is closed: nobody is left to wake


class Doorbell:
    """A stub's doorbell: an eventfd the stub inherits and writes after answering a message sent
    with ``ring``, and the one event loop that watches it.

    `on_ring(pending)` runs in the loop's thread each time the bell rang, with the handles of
    the messages sent while the loop listened (it removes those that are done).

    Thread safety: ``listen`` and ``expect`` are called from the listening loop's thread;
    ``close`` from any thread.
    """

    def __init__(self, on_ring: Callable[[set[int]], None]) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._on_ring = on_ring
        self._loop: asyncio.AbstractEventLoop | None = None
        self.pending: set[int] = set()  # messages sent with ``ring`` and not yet seen answered
        self._lock = threading.Lock()
        self._closed = False

    def listen(self, loop: asyncio.AbstractEventLoop) -> bool:
        """True when `loop` (running in the calling thread) listens to this doorbell: it
        already did, or it takes over a doorbell no open loop listens to."""
        if self._loop is loop:
            return True
        with self._lock:
            if self._closed or (self._loop is not None and not self._loop.is_closed()):
                return False
            # A closed loop's selector is gone with it: nothing to remove. Its pending messages
            # stay: their callers were cancelled, and the new loop's rings forget them.
            loop.add_reader(self.fd, self._rung)
            self._loop = loop
        return True

    def expect(self, handle: int) -> None:
        """Notes a message sent with ``ring`` by the listening loop's thread (before the stub can
        answer it: the loop reads the bell only once the sender returns to it)."""
        self.pending.add(handle)

    def _rung(self) -> None:
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:
            pass  # read already: the pending messages are looked at all the same
        self._on_ring(self.pending)

    def close(self) -> None:
        """Stops listening and closes the eventfd (at once, or in the loop's thread when that
        loop still runs elsewhere; a loop that never runs again keeps the descriptor open)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop = self._loop
        if loop is None or loop.is_closed():
            os.close(self.fd)
        elif asyncio._get_running_loop() is loop:
            self._unwatch(loop)
        else:
            try:
                loop.call_soon_threadsafe(self._unwatch, loop)
            except RuntimeError:  # closed meanwhile
                os.close(self.fd)

    def _unwatch(self, loop: asyncio.AbstractEventLoop) -> None:
        # The reader goes before the descriptor: a selector keeps fds by number, and a number
        # reused by a new descriptor would otherwise meet the stale registration.
        if not loop.is_closed():
            loop.remove_reader(self.fd)
        os.close(self.fd)
