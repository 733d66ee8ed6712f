"""Responses that a stub sends on its own schedule (response senders), gathered per request.

A decoupled model answers a request with any number of RESPONSE_SEND messages, the last one
flagged final; a default-mode model may answer through its sender too. The stub process's
calls thread reads each message into a ``StreamItem`` and puts it on the request's
``ResponseStream``; one consumer (a thread or a coroutine) takes the items off in order.

The request record stays allocated until both the Execute message was answered and the final
response arrived: the model may read its inputs until it closes the request.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from stubhost import _core
from stubhost._core import Pool, RecordKind
from stubhost.host.errors import AnsweredError, InferenceError
from stubhost.protocol import RESPONSE_DEFERRED, RESPONSE_EMPTY, RESPONSE_FAILED, RESPONSE_FINAL, error_code_name

_RESPONSE = int(RecordKind.RESPONSE)


class ResponseRecord(NamedTuple):
    """A response record as read from the pool (outputs view it through a lease)."""

    code: int     # 0, or 1 + the TRITONSERVER error code
    times: tuple[int, int, int]
    strings: list[str]
    outputs: list[tuple[str, int, np.ndarray]]


def read_response(pool: Pool, handle: int) -> ResponseRecord:
    """Reads one response record; records chained after it are freed (one request, one
    record). Raises CoreError on a malformed record."""
    kind, code, times, next_record, strings, outputs = _core.read_record(pool, handle, lease=True)
    if next_record:
        _core.free_record_chain(pool, next_record)
    if kind != _RESPONSE:
        raise _core.FormatError("the reply is not a response record")
    return ResponseRecord(code, times, strings, outputs)


def request_serial(pool: Pool, record: int) -> int:
    """The serial the parent wrote into a request record (its status field)."""
    return _core.read_record(pool, record)[1]


def is_deferred(pool: Pool, handle: int) -> bool:
    """True when an Execute reply record is a DEFERRED placeholder."""
    _, _, times, _, _, _ = _core.read_record(pool, handle)
    return bool(times[2] & RESPONSE_DEFERRED)


class StreamItem(NamedTuple):
    """One response of a stream: outputs, or an error, or (outputs None) only the final flag."""

    outputs: list[tuple[str, int, np.ndarray]] | None
    parameters: str
    error: InferenceError | None
    final: bool
    exec_start: int = 0
    exec_end: int = 0


def stream_item(pool: Pool, handle: int, instance_name: str) -> StreamItem:
    """The item a RESPONSE_SEND record carries (a malformed record becomes a final error)."""
    try:
        record = read_response(pool, handle)
    except _core.CoreError as e:
        return StreamItem(None, "{}", InferenceError("INTERNAL", f"instance '{instance_name}' sent a malformed "
                                                                 f"response: {e}"), True)
    code, times, strings, outputs = record
    flags = times[2]
    final = bool(flags & RESPONSE_FINAL)
    if code:
        name, text = error_code_name(code - 1), strings[0] if strings else ""
        # a failed execute's error, or the model's own answer
        error = InferenceError(name, text) if flags & RESPONSE_FAILED else AnsweredError(name, text, 0, *times[:2])
        return StreamItem(None, "{}", error, final, times[0], times[1])
    if flags & RESPONSE_EMPTY:
        return StreamItem(None, "{}", None, final, times[0], times[1])
    return StreamItem(outputs, strings[1] if len(strings) > 1 else "{}", None, final, times[0], times[1])


class ResponseStream:
    """The responses of one request, in arrival order, for one consumer.

    ``put`` and ``executed`` are called from the stub process's threads; ``next``/``next_async``
    by the consumer. ``abandon`` is for a consumer that leaves early (the caller cancelled).
    """

    __slots__ = ("_lock", "_items", "_waker", "pool", "serial", "record", "_executed", "final", "abandoned",
                 "_event", "_aevent", "_loop", "_on_release")

    def __init__(self, pool: Pool, serial: int, on_release: Callable[[ResponseStream], None] | None = None) -> None:
        """`on_release` runs just before the request record is freed: whoever finds streams by
        record must stop doing so then, since the pool may hand the same offset to a new request.
        `serial` is the request's (what a cancellation names it by)."""
        self._lock = threading.Lock()
        self._on_release = on_release
        self._items: deque[StreamItem] = deque()
        self._waker: Callable[[], None] | None = None
        self.pool = pool
        self.serial = serial
        self.record = 0           # the request record: freed once executed and final
        self._executed = False
        self.final = False        # the final item arrived
        self.abandoned = False    # nobody reads on: items are dropped as they come
        self._event: threading.Event | None = None
        self._aevent: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- producer side ---------------------------------------------------------------------------
    def put(self, item: StreamItem) -> None:
        """Adds an item (after the final one, items are dropped: the request is over)."""
        with self._lock:
            if self.final:
                return
            self.final = item.final
            if not self.abandoned:
                self._items.append(item)
            record = self._take_record()
            waker = self._waker
        self._free(record)
        if waker is not None:
            waker()

    def executed(self, record: int = 0) -> None:
        """The Execute message was answered; `record` (if given) is the request record to free
        once the final item is in."""
        with self._lock:
            self._executed = True
            if record:
                self.record = record
            record = self._take_record()
        self._free(record)

    def fail(self, error: InferenceError) -> None:
        """Ends the stream with `error` (the stub is gone: its pool, and the record, with it)."""
        with self._lock:
            self.record = 0
        self.put(StreamItem(None, "{}", error, True))

    def _take_record(self) -> int:
        """The record, if it may be freed now (called with the lock held)."""
        if self.final and self._executed and self.record:
            record, self.record = self.record, 0
            return record
        return 0

    def _free(self, record: int) -> None:
        if record:
            if self._on_release is not None:
                self._on_release(self)
            try:
                self.pool.free(record)
            except _core.CoreError:
                pass  # the pool went with its stub

    # ---- consumer side ---------------------------------------------------------------------------
    def abandon(self) -> bool:
        """The consumer leaves; returns True when the request was still open (so the model
        should be told that it is cancelled)."""
        with self._lock:
            self.abandoned = True
            self._items.clear()
            return not self.final

    def next(self, timeout: float | None) -> StreamItem | None:
        """The next item, waiting up to `timeout` seconds (None: the time ran out)."""
        if self._event is None:
            self._event = threading.Event()
            self._waker = self._event.set
        while True:
            with self._lock:
                if self._items:
                    return self._items.popleft()
                self._event.clear()
            if not self._event.wait(timeout):
                with self._lock:
                    return self._items.popleft() if self._items else None

    async def next_async(self, timeout: float | None = None) -> StreamItem | None:
        """``next`` for a coroutine (bound to the first caller's event loop)."""
        try:
            return await asyncio.wait_for(self._next_async(), timeout)
        except asyncio.TimeoutError:
            return None

    async def _next_async(self) -> StreamItem:
        if self._aevent is None:
            self._aevent = asyncio.Event()
            self._loop = asyncio.get_running_loop()
            self._waker = self._wake_loop
        while True:
            with self._lock:
                if self._items:
                    return self._items.popleft()
                self._aevent.clear()
            await self._aevent.wait()

    def _wake_loop(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._aevent.set)  # type: ignore[union-attr]
        except RuntimeError:
            pass  # the consumer's loop is closed: nobody is left to wake
