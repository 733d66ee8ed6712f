"""What a stub's answer to one request becomes on the parent's side: its result, or the one
response a default-mode model sends through its response sender instead of returning it."""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from stubhost.host.errors import AnsweredError, InferenceError
from stubhost.host.streams import StreamItem


class ExecuteResult(NamedTuple):
    """What one request's response record held, and when it was sent and executed.

    ``outputs`` are (name, dtype, array) with arrays viewing the pool; the instants are
    CLOCK_MONOTONIC nanoseconds, ``exec_start``/``exec_end`` as the stub reported them.
    """

    outputs: list[tuple[str, int, np.ndarray]]
    parameters: str
    sent: int
    exec_start: int
    exec_end: int


def request_timeout(instance: str, timeout: float | None) -> InferenceError:
    """The error of a request whose instance did not answer within its timeout."""
    return InferenceError("UNAVAILABLE", f"Request timeout expired: instance '{instance}' did not answer within "
                                         f"{timeout} s")


class SenderAnswer:
    """Gathers the one response a default-mode model sends through its response sender."""

    __slots__ = ("instance", "sent", "item", "error", "timeout", "deadline")

    def __init__(self, instance: str, sent: int, timeout: float | None, deadline: float | None) -> None:
        self.instance = instance
        self.sent = sent
        self.item: StreamItem | None = None
        self.error: InferenceError | None = None
        self.timeout = timeout
        self.deadline = deadline  # time.monotonic() by which the answer must be in (None: no limit)

    def remaining(self) -> float | None:
        """Seconds left until the deadline."""
        return None if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)

    def take(self, item: StreamItem | None) -> ExecuteResult | None:
        """Takes the next item (None: the time ran out); the answer once the final one is in."""
        if item is None:
            raise request_timeout(self.instance, self.timeout)
        return self.result() if self.add(item) else None

    def add(self, item: StreamItem) -> bool:
        """Takes one item; True once the final one is in."""
        if item.error is not None:
            self.error = self.error or item.error
        elif item.outputs is not None and self.item is None:
            self.item = item
        return item.final

    def result(self) -> ExecuteResult:
        """The response, or the error the model (or its stub) sent."""
        if self.error is not None:
            if isinstance(self.error, AnsweredError):
                self.error.sent = self.sent  # times the request, which counts as answered
            raise self.error
        if self.item is None:
            raise InferenceError("INTERNAL", f"model instance '{self.instance}' sent no response for the request: "
                                             "execute returned None for it and its response sender sent nothing")
        return ExecuteResult(self.item.outputs, self.item.parameters, self.sent,  # type: ignore[arg-type]
                             self.item.exec_start, self.item.exec_end)
