"""The stub's side of response senders: responses written into the pool and queued for the parent.

Each ``sender.send()`` becomes one RESPONSE_SEND message on ``stub_to_parent_mq`` naming the
request's record; nobody waits for it, so a model streams at the queue's pace. The parent's
cancellations arrive on ``parent_to_stub_mq`` and are read by a thread of their own, so
``is_cancelled()`` is a dictionary lookup, not a round trip. A cancellation names the request's
record and the serial the parent wrote in it, so one that arrives after the request ended never
reaches a newer request the parent sent in the same record, and one that arrives while the
request still waits in the stub's inbox is there when it starts.

A request that is dropped without its final flag (its sender and the request object both
garbage) is closed here with a flags-only final response, so its caller is not left waiting.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Callable, Sequence

from stubhost import _core
from stubhost._core import Command, IPCMessage, MessageQueue, Pool
from stubhost.backend_utils.errors import TritonError
from stubhost.backend_utils.logger import Logger
from stubhost.backend_utils.request import InferenceRequest
from stubhost.backend_utils.response import InferenceResponse
from stubhost.backend_utils.response_sender import InferenceResponseSender
from stubhost.protocol import RESPONSE_FAILED, RESPONSE_FINAL
from stubhost.stub import codec


_NOT_OPEN = (0, 0, -1)  # (start, watch token, serial): -1 matches no serial
# Cancellations kept for requests not started: far more than a stub's inbox holds, so only
# entries of requests that ended before their cancellation came are dropped.
MAX_CANCELLED = 4096
PUSH_RETRY_S = 1.0  # a full queue is retried while the parent lives (the parent drains it)


class StubResponder:
    """Delivers response senders' responses to the parent; tracks requests not yet closed."""

    def __init__(self, pool: Pool, calls: MessageQueue, parent_alive: Callable[[], bool],
                 targets: dict[int, memoryview]) -> None:
        self.pool = pool
        self.calls = calls
        self.parent_alive = parent_alive
        self.targets = targets  # client regions by id, for outputs placed there
        self.decoupled = False
        # record handle -> (execute start in ns, watch token, serial) of the requests not closed yet
        self.open: dict[int, tuple[int, int, int]] = {}
        # record handle -> serial of the default-mode requests a synchronous execute is running
        self.running: dict[int, int] = {}
        # record handle -> serial of the requests the parent cancelled, started or not
        self.cancelled: dict[int, int] = {}
        self._tokens = itertools.count(1)
        # Reentrant: a finalizer (``released``) may run in a garbage collection that an
        # allocation under this very lock set off.
        self._lock = threading.RLock()

    # ---- the transport pb_utils senders use --------------------------------------------------------
    def send(self, request: InferenceRequest, response: InferenceResponse | None, flags: int) -> None:
        """Writes one response (or just the flags) and queues it for the parent."""
        handle = request._state.handle  # type: ignore[union-attr]
        final = flags & RESPONSE_FINAL
        with self._lock:
            start = (self.open.pop(handle, None) if final else self.open.get(handle)) or _NOT_OPEN
            if final:
                self.cancelled.pop(handle, None)
        times = (start[0] or time.monotonic_ns(), time.monotonic_ns(), final | (flags & RESPONSE_FAILED))
        if response is None:
            record = codec.write_flags(self.pool, times)
        else:
            record = codec.write_response(self.pool, request, response, 0, times, self.targets)
        self.post(handle, record)

    def is_cancelled(self, request: InferenceRequest) -> bool:
        """True once the parent said the request's caller cancelled it."""
        state = request._state
        return state is not None and self.cancelled.get(state.handle, -1) == state.serial

    def released(self, handle: int, token: int) -> None:
        """The request and its sender are garbage: close it if the model never did. `token`
        tells the request from a newer one the parent sent in the same record after this one
        ended (a finalizer may run long after the request's final response)."""
        with self._lock:
            entry = self.open.get(handle)
            if entry is None or entry[1] != token:
                return
            start = self.open.pop(handle)[0]
            self.cancelled.pop(handle, None)
        Logger.log_warn("a request was released without its final response; it is closed now")
        try:
            self.post(handle, codec.write_flags(self.pool, (start, time.monotonic_ns(), RESPONSE_FINAL)))
        except _core.CoreError as e:  # runs from a finalizer: it must not raise
            Logger.log_error(f"could not close a released request: {e}")

    # ---- bookkeeping -------------------------------------------------------------------------------
    def watch(self, request: InferenceRequest, start: int) -> None:
        """Tracks a request until its final response, or until it is garbage."""
        state = request._state
        if state is None:
            return
        with state.lock:
            if state.closed:
                return
            first = not state.watched  # a rescheduled request is watched again by each execute
            if first:
                state.watched = next(self._tokens)
            with self._lock:
                self.open[state.handle] = (start, state.watched, state.serial)
        if first:
            weakref.finalize(state, self.released, state.handle, state.watched)

    def cancel(self, handle: int, serial: int) -> None:
        """The parent's CANCEL_REQUEST: the request's ``is_cancelled()`` turns true, also when
        the request still waits in the inbox (it starts cancelled). Only the request with this
        serial matches, so one that ended meanwhile leaves an entry no request reads."""
        if serial <= 0:
            return  # 0 is the status of records no parent numbered (BLS requests): it names none
        with self._lock:
            cancelled = self.cancelled
            cancelled.pop(handle, None)  # re-inserted last: the dictionary's order is arrival order
            cancelled[handle] = serial
            if len(cancelled) > MAX_CANCELLED:
                self._forget_stale_cancellations()

    def _forget_stale_cancellations(self) -> None:
        """Drops the oldest cancellations of requests neither running nor open: most ended
        before their cancellation came (a request's end removes only an entry it finds)."""
        running, open_ = self.running, self.open
        # A snapshot: ``end`` removes entries without the lock (list() copies in one step).
        stale = [h for h in list(self.cancelled) if h not in running and h not in open_]
        for handle in stale[:len(stale) - MAX_CANCELLED // 2]:
            self.cancelled.pop(handle, None)

    # begin and end run on every Execute, so they take no lock: each dictionary operation is
    # atomic, and a cancellation that races with `end` can only leave an entry under the old
    # serial, which no later request matches (and whose handle's next end removes it).
    def begin(self, requests: Sequence[InferenceRequest]) -> None:
        """A synchronous default-mode ``execute`` starts on `requests`: they may be cancelled."""
        running = self.running
        for request in requests:
            state = request._state
            if state is not None:
                running[state.handle] = state.serial

    def end(self, requests: Sequence[InferenceRequest]) -> None:
        """That ``execute`` was answered: a request its sender still answers stays open, and
        the others are over."""
        running, cancelled = self.running, self.cancelled
        for request in requests:
            state = request._state
            if state is not None and running.pop(state.handle, None) is not None and cancelled \
                    and state.handle not in self.open:
                cancelled.pop(state.handle, None)

    def close_with_error(self, requests: Sequence[InferenceRequest], message: str,
                         code: int = TritonError.INTERNAL) -> None:
        """Ends every request not closed yet: an error response (or, when the one response a
        default-mode request may have was sent, just the final flag), as Triton does when
        ``execute`` fails."""
        for request in requests:
            state = request._state
            sent = state.close() if state is not None else None
            if sent is None:
                continue
            response = None if sent and not self.decoupled else InferenceResponse(error=TritonError(message, code))
            try:
                self.send(request, response, RESPONSE_FINAL | RESPONSE_FAILED)
            except _core.CoreError as e:
                Logger.log_error(f"could not send the error of request '{request.request_id()}': {e}")

    def deliver(self, requests: Sequence[InferenceRequest], responses: Sequence[InferenceResponse | None]) -> None:
        """Sends what a default-mode async ``execute`` returned, each as the request's final."""
        for request, response in zip(requests, responses):
            if response is not None:
                InferenceResponseSender(request, request._state).send(response, RESPONSE_FINAL)  # type: ignore[arg-type]

    # ---- the queue ---------------------------------------------------------------------------------
    def post(self, request_handle: int, record: int) -> None:
        """Queues a RESPONSE_SEND message; waits for room while the parent lives."""
        try:
            message = IPCMessage.create(self.pool, Command.RESPONSE_SEND, args=record, request_id=request_handle)
        except BaseException:
            _core.free_record_chain(self.pool, record)
            raise
        while not self.calls.push(message.handle, timeout=PUSH_RETRY_S):
            if not self.parent_alive():
                message.release()
                _core.free_record_chain(self.pool, record)
                return
