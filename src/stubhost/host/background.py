"""A process-wide event loop, on a thread of its own, on which sync callers run the server's
coroutines: an ensemble called without asyncio, and a traced BLS call (only the asyncio paths
carry a request's trace)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Coroutine, Generator
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def run_in_background(coroutine: Coroutine[Any, Any, T]) -> T:
    """Runs `coroutine` on the background loop (started on first use) and waits for its result;
    if this thread is interrupted while it waits, the coroutine is cancelled."""
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="stubhost-background", daemon=True).start()
            _loop = loop
    future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, _loop)
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


def iterate_in_background(items: AsyncGenerator[T, None]) -> Generator[T, None, None]:
    """The items of an async generator, each awaited on the background loop; closing this
    generator closes `items` there (a stream's caller leaving early cancels its request)."""
    try:
        while True:
            try:
                yield run_in_background(items.__anext__())  # type: ignore[arg-type]
            except StopAsyncIteration:
                return
    finally:
        run_in_background(items.aclose())
