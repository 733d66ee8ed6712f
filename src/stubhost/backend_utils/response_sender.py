"""``pb_utils.InferenceResponseSender``: how a model answers a request on its own schedule.

A decoupled model sends any number of responses per request, from any thread, during or after
``execute``, and ends the request with ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``. Since Triton
24.06 a default-mode model may use the sender too, for exactly one response. Error texts are
Triton's, since users grep for them.

The sender does not know how responses travel: the stub installs a transport
(``set_transport``) that writes them into the pool and queues them for the parent.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

from stubhost.backend_utils.constants import TRITONSERVER_RESPONSE_COMPLETE_FINAL
from stubhost.backend_utils.errors import TritonModelException
from stubhost.backend_utils.response import InferenceResponse

if TYPE_CHECKING:
    from stubhost.backend_utils.request import InferenceRequest


class ResponseTransport(Protocol):
    """What the stub provides to deliver responses to the parent."""

    decoupled: bool

    def send(self, request: InferenceRequest, response: InferenceResponse | None, flags: int) -> None:
        """Delivers one response (None: flags only) of `request`."""

    def is_cancelled(self, request: InferenceRequest) -> bool:
        """True once the request's caller has cancelled it."""

    def released(self, handle: int, token: int) -> None:
        """The request and its sender are gone (garbage) before the final flag was sent;
        `token` is the one its watch was given."""


class _Unattached:
    decoupled = False

    def send(self, request: InferenceRequest, response: InferenceResponse | None, flags: int) -> None:
        raise TritonModelException("Unable to send response. The request was not received by a model instance.")

    def is_cancelled(self, request: InferenceRequest) -> bool:
        return False

    def released(self, handle: int, token: int) -> None:
        pass


_transport: ResponseTransport = _Unattached()


def set_transport(transport: ResponseTransport) -> None:
    """Installs the stub's transport (once, when the model is initialized)."""
    global _transport
    _transport = transport


def transport() -> ResponseTransport:
    """The installed transport."""
    return _transport


class SenderState:
    """What a request and its sender share: whether it is closed, and how many were sent.

    It lives as long as either of them; when both are gone the transport learns of it, so a
    request a model dropped without the final flag does not leave its caller waiting forever.
    """

    __slots__ = ("lock", "closed", "sent", "claimed", "handle", "serial", "watched", "__weakref__")

    def __init__(self, handle: int, serial: int = 0) -> None:
        self.lock = threading.Lock()
        self.closed = False
        self.sent = 0          # responses counted: sent through the sender, or claimed
        self.claimed = False   # its one response is the one execute returned (sent with the reply)
        self.handle = handle   # the request record's handle: names the request to the parent
        self.serial = serial   # the parent's number for it (a record is reused by later requests)
        self.watched = 0       # the token of the stub's watch (0: not watched)

    def count(self, response: InferenceResponse | None, flags: int, decoupled: bool) -> None:
        """Counts one response under Triton's rules (and wording); raises when it may not go."""
        with self.lock:
            if not decoupled:
                if response is not None and self.sent > 0:
                    raise TritonModelException("Unable to send response. Non-decoupled model cannot send more "
                                               "than one response.")
                if response is None and flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL and self.sent == 0:
                    raise TritonModelException("Unable to send response. Non-decoupled model cannot send complete "
                                               "final before sending a response.")
            if self.closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                self.closed = True
            self.sent += 1

    def claim(self, response: InferenceResponse) -> None:
        """Counts the response a default-mode ``execute`` returned as the request's final one."""
        self.count(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, False)
        self.claimed = True

    def close(self) -> int | None:
        """Closes the sender; how many responses went through it (None: it was closed already)."""
        with self.lock:
            if self.closed:
                return None
            self.closed = True
            return self.sent - self.claimed


class InferenceResponseSender:
    """Sends the responses of one request (``request.get_response_sender()``)."""

    __slots__ = ("_request", "_state")

    def __init__(self, request: InferenceRequest, state: SenderState) -> None:
        self._request = request
        self._state = state

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        """Sends `response` (None with the final flag: just end the request)."""
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException("Inference Response object must be provided when the response flags is set "
                                       "to zero.")
        if response is not None and not isinstance(response, InferenceResponse):
            raise TypeError(f"response must be a pb_utils.InferenceResponse, got {type(response).__name__}")
        self._state.count(response, flags, _transport.decoupled)
        _transport.send(self._request, response, flags)

    def is_cancelled(self) -> bool:
        """True once the caller has cancelled the request."""
        return _transport.is_cancelled(self._request)

    def __repr__(self) -> str:
        return f"InferenceResponseSender(request_id={self._request.request_id()!r}, closed={self._state.closed})"
