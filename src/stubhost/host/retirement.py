"""Retiring a model that a reload replaced, as Triton does: the requests it admitted finish on
it, requests that reach it afterwards go to its successor, and it stops once idle.

A caller looks a model up and then calls it; a reload may swap the model in between. Without
this, such a request would meet a model that is already stopping and fail, although a newer
copy of the same model is serving.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any


class Retirable:
    """Counts the requests a model is running and hands late ones to its successor.

    A class using it implements ``_infer``, ``_infer_async``, ``_stream``, ``_stream_async`` and
    ``_submit`` (the same arguments as the public methods here) and calls ``Retirable.__init__``.
    """

    def __init__(self) -> None:
        self._uses = 0
        self._successor: Any = None  # set: retired, requests go there
        self._idle = threading.Condition(threading.Lock())

    # ---- the count ---------------------------------------------------------------------------------
    def _enter(self) -> Any:
        """Counts one request in; returns the successor that takes it instead, once retired."""
        with self._idle:
            if self._successor is None:
                self._uses += 1
            return self._successor

    def _leave(self) -> None:
        with self._idle:
            self._uses -= 1
            if self._successor is not None and not self._uses:
                self._idle.notify_all()

    def retire(self, successor: Any) -> None:
        """From now on requests go to `successor` (the model that replaced this one)."""
        with self._idle:
            self._successor = successor

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

    def submit(self, *args: Any, done: Callable[[Any], None], **kwargs: Any) -> bool:
        """Starts one request with no thread waiting for it; see ``_submit``. A retired model
        starts nothing: its caller takes the waiting path, which its successor serves."""
        if self._enter() is not None:
            return False

        def finished(outcome: Any) -> None:
            self._leave()
            done(outcome)

        started = False
        try:
            started = self._submit(*args, done=finished, **kwargs)  # type: ignore[attr-defined]
            return started
        finally:
            if not started:
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


class RetiringModels:
    """The models reloads replaced that still finish requests: each stops once idle (at once if
    it is idle already), or when ``stop_all`` runs (the server closes)."""

    def __init__(self, stop: Callable[[Any], None]) -> None:
        self._stop = stop
        self._lock = threading.Lock()
        self._models: set[Any] = set()
        self._closed = threading.Event()

    def retire(self, old: Any, successor: Any) -> None:
        """`successor` replaced `old`: `old` finishes what it admitted, then stops."""
        if not isinstance(old, Retirable):  # an ensemble runs nothing of its own
            self._stop(old)
            return
        old.retire(successor)
        if old.wait_idle(0):
            self._stop(old)
            return
        with self._lock:
            self._models.add(old)
        threading.Thread(target=self._stop_when_idle, args=(old,), name=f"stubhost-retire-{old.name}",
                         daemon=True).start()

    def _stop_when_idle(self, old: Retirable) -> None:
        while not old.wait_idle(0.5) and not self._closed.is_set():
            pass
        with self._lock:
            mine = old in self._models  # else stop_all took it
            self._models.discard(old)
        if mine:
            self._stop(old)

    def stop_all(self) -> None:
        """Stops every retiring model now, whatever still runs on it."""
        self._closed.set()
        with self._lock:
            models, self._models = list(self._models), set()
        for model in models:
            self._stop(model)
