"""The consumer's side of one streamed request of a LoadedModel (a decoupled model): its
responses, its whole-stream timeout, and its statistics (and trace) once it ends."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from stubhost.host.errors import AnsweredError, InferenceError
from stubhost.host.stats import BACKEND, CANCELED
from stubhost.host.streams import StreamItem

if TYPE_CHECKING:
    from stubhost.host.instance import RequestStream
    from stubhost.host.model import LoadedModel
    from stubhost.host.result import InferResponse
    from stubhost.host.trace import RequestTrace


class StreamTally:
    """What a consumer of a streamed request has seen: turns items into responses, enforces the
    whole-stream timeout, and records the request's statistics when it ends (and its
    timestamps, when it is traced)."""

    def __init__(self, model: LoadedModel, version: int, tensors: list[tuple[str, Any, int]], begin: int,
                 request_id: str, timeout: float | None, trace: RequestTrace | None = None) -> None:
        self.model = model
        self.version = version
        self.tensors = tensors
        self.begin = begin
        self.request_id = request_id
        self.timeout = timeout
        self.trace = trace
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.first: StreamItem | None = None
        self.last: StreamItem | None = None
        self.failed = False
        self.reason = BACKEND  # of a failure: the model's error, or CANCELED when the timeout ran out
        self.done = False

    def remaining(self) -> float | None:
        """Seconds left of the stream's timeout."""
        return None if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)

    def take(self, item: StreamItem | None) -> InferResponse:
        """The response an item carries (None: the timeout ran out, which raises)."""
        if item is None:
            self.failed, self.reason = True, CANCELED
            raise InferenceError("UNAVAILABLE", f"Request timeout expired: model '{self.model.name}' did not "
                                                f"complete the request within {self.timeout} s")
        self.first, self.last = self.first or item, item
        # An error the model answered with (AnsweredError) is a response like any other, as Triton
        # counts it; one that ends a failed execute fails the request.
        self.failed = self.failed or (item.error is not None and not isinstance(item.error, AnsweredError))
        self.done = item.final
        return self.model._stream_response(self.version, item, self.request_id)

    def close(self, stream: RequestStream) -> None:
        """The consumer is done (a request still open is cancelled); statistics are recorded:
        a request left before its end counts as a CANCELED failure."""
        stream.close()
        if self.failed or (self.last is not None and self.last.final):
            self.model._record_stream(self.version, self.tensors, self.begin, stream.sent, self.first, self.last,
                                      self.failed, self.reason)
            if self.trace is not None and not self.failed and self.first is not None and self.last is not None:
                # the first response's execute start, the last one's end (the stub stamps each)
                self.trace.executed(self.model.name, self.version, self.request_id, self.begin, stream.sent,
                                    self.first.exec_start, self.last.exec_end, time.monotonic_ns())
        else:
            self.model.stats.record_failure(self.version, self.begin, time.monotonic_ns(), CANCELED)
