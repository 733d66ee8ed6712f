"""Turns request records into pb_utils objects and pb_utils responses into response records."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence

from stubhost import _core
from stubhost._core import Pool, RecordKind
from stubhost.backend_utils.request import InferenceRequest
from stubhost.backend_utils.response import InferenceResponse
from stubhost.backend_utils.tensor import Tensor
from stubhost.protocol import MAX_BATCH_RECORDS, REQUEST_FIXED_STRINGS

_RESPONSE = int(RecordKind.RESPONSE)
_INTERNAL = 1  # TritonError.INTERNAL


def read_requests(pool: Pool, first: int, model_name: str, model_version: int) -> list[InferenceRequest]:
    """The requests of an Execute chain; their tensors are views of the parent's records."""
    requests: list[InferenceRequest] = []
    handle = first
    while handle:
        if len(requests) >= MAX_BATCH_RECORDS:
            raise _core.FormatError("request chain is longer than any batch can be")
        _, _, ints, handle, strings, tensors = _core.read_record(pool, handle)
        if len(strings) < REQUEST_FIXED_STRINGS:
            raise _core.FormatError("request record lacks its fixed strings")
        inputs = [Tensor._wrap(name, dtype, array) for name, dtype, array in tensors]
        correlation: int | str = strings[2] if strings[2] else ints[1]
        requests.append(InferenceRequest._from_stub(
            inputs, strings[REQUEST_FIXED_STRINGS:], strings[0], correlation, ints[0], ints[2],
            strings[1] or "{}", model_name, model_version))
    return requests


def write_error(pool: Pool, message: str, code: int = _INTERNAL, next_handle: int = 0) -> int:
    """One response record that fails its request with `message`."""
    return _core.write_record(pool, _RESPONSE, 1 + code, (0, 0, 0), (message, "{}"), (), next_handle)


def write_response(pool: Pool, request: InferenceRequest, response: InferenceResponse, next_handle: int) -> int:
    """The record of one response; outputs the caller did not ask for are dropped."""
    error = response.error()
    if error is not None:
        return _core.write_record(pool, _RESPONSE, 1 + error.code(), (0, 0, 0), (error.message(), "{}"), (),
                                  next_handle)
    requested = request.requested_output_names()
    outputs = response.output_tensors()
    if requested:
        outputs = [t for t in outputs if t._name in requested]
    tensors = [(t._name, t._array, t._dtype) for t in outputs]
    try:
        return _core.write_record(pool, _RESPONSE, 0, (0, 0, 0), ("", response.parameters()), tensors, next_handle)
    except (_core.CoreError, TypeError, ValueError) as e:
        return write_error(pool, f"failed to send the response of request '{request.request_id()}': {e}",
                           next_handle=next_handle)


def _chain(pool: Pool, writers: Iterable[Callable[[int], int]]) -> int:
    """Runs each writer with the handle of the record written before it (so the last writer's
    record comes first in the chain); frees what was written if one fails."""
    handle = 0
    try:
        for write in writers:
            handle = write(handle)
    except BaseException:
        if handle:
            _core.free_record_chain(pool, handle)
        raise
    return handle


def write_responses(pool: Pool, requests: Sequence[InferenceRequest], responses: Sequence[InferenceResponse]) -> int:
    """Writes one record per request, chained in request order; returns the first handle."""
    return _chain(pool, (functools.partial(write_response, pool, request, response)
                         for request, response in zip(reversed(requests), reversed(responses))))


def write_errors(pool: Pool, count: int, message: str, code: int = _INTERNAL) -> int:
    """`count` chained records that all fail with the same message (a failed execute)."""
    return _chain(pool, (functools.partial(write_error, pool, message, code) for _ in range(count)))
