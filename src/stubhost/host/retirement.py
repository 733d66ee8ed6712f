"""Retiring a model that a reload replaced, as Triton does: the requests it admitted finish on
it, requests that reach it afterwards go to its successor, and it stops once idle.

A caller looks a model up and then calls it; a reload may swap the model in between. Without
this, such a request would meet a model that is already stopping and fail, although a newer
copy of the same model is serving.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, Generator
from typing import Any


class Retirable:
    """Counts the requests a model is running and hands late ones to its successor.

    A class using it implements ``_infer``, ``_infer_async``, ``_stream`` and ``_stream_async``
    (the same arguments as the public methods here) and calls ``Retirable.__init__``.
    """

    def __init__(self) -> None:
        self._uses = 0
        self._retired = False
        self._successor: Any = None
        self._idle = threading.Condition(threading.Lock())

    # ---- the count ---------------------------------------------------------------------------------
    def _enter(self) -> Any:
        """Counts one request in; returns the successor that takes it instead, once retired."""
        with self._idle:
            if not self._retired:
                self._uses += 1
                return None
            return self._successor

    def _leave(self) -> None:
        with self._idle:
            self._uses -= 1
            if self._retired and not self._uses:
                self._idle.notify_all()

    def retire(self, successor: Any) -> None:
        """From now on requests go to `successor` (the model that replaced this one)."""
        with self._idle:
            self._successor = successor
            self._retired = True

    def wait_idle(self, timeout: float | None) -> bool:
        """Waits until no admitted request runs any more; False if `timeout` seconds passed."""
        with self._idle:
            return self._idle.wait_for(lambda: self._uses == 0, timeout)

    # ---- the entry points --------------------------------------------------------------------------
    def infer(self, *args: Any, **kwargs: Any) -> Any:
        """Runs one request; see ``_infer``."""
        successor = self._enter()
        if successor is not None:
            return successor.infer(*args, **kwargs)
        try:
            return self._infer(*args, **kwargs)  # type: ignore[attr-defined]
        finally:
            self._leave()

    async def infer_async(self, *args: Any, **kwargs: Any) -> Any:
        """Runs one request for an asyncio caller; see ``_infer_async``."""
        successor = self._enter()
        if successor is not None:
            return await successor.infer_async(*args, **kwargs)
        try:
            return await self._infer_async(*args, **kwargs)  # type: ignore[attr-defined]
        finally:
            self._leave()

    def stream(self, *args: Any, **kwargs: Any) -> Generator[Any, None, None]:
        """The responses of one request as they come; see ``_stream``."""
        successor = self._enter()
        if successor is not None:
            yield from successor.stream(*args, **kwargs)
            return
        try:
            yield from self._stream(*args, **kwargs)  # type: ignore[attr-defined]
        finally:
            self._leave()

    async def stream_async(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        """``stream`` for asyncio callers; see ``_stream_async``."""
        successor = self._enter()
        responses = (successor.stream_async if successor is not None else self._stream_async)(  # type: ignore[attr-defined]
            *args, **kwargs)
        try:
            async for response in responses:
                yield response
        finally:
            # Closed here and now: a consumer that leaves early cancels the request at once.
            await responses.aclose()
            if successor is None:
                self._leave()
