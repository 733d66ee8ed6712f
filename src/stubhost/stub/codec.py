"""Turns request records into pb_utils objects and pb_utils responses into response records."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from stubhost import _core
from stubhost._core import Pool, RecordKind
from stubhost.backend_utils.request import _UNTRACED, InferenceRequest, InferenceTrace
from stubhost.backend_utils.response import InferenceResponse
from stubhost.backend_utils.response_sender import SenderState
from stubhost.backend_utils.tensor import Tensor
from stubhost.gpu import cuda
from stubhost.gpu.cuda import CudaError
from stubhost.gpu.layout import is_gpu_description
from stubhost.stub.gpu_io import CudaTarget, StubGpu, host_entry
from stubhost.protocol import (
    MAX_BATCH_RECORDS,
    OUTPUT_DESTINATION_SEP,
    REQUEST_FIXED_STRINGS,
    RESPONSE_DEFERRED,
    RESPONSE_EMPTY,
    decode_destination,
    output_too_large,
)

_RESPONSE = int(RecordKind.RESPONSE)
_INTERNAL = 1  # TritonError.INTERNAL
_INVALID_ARG = 3  # TritonError.INVALID_ARG
_BYTES = int(_core.DataType.BYTES)
_GPU_VIEW = _core.GpuView


def read_requests(pool: Pool, first: int, model_name: str, model_version: int,
                  regions: dict[int, memoryview] | None = None, gpu: StubGpu | None = None) -> list[InferenceRequest]:
    """The requests of an Execute chain; their tensors are views of the parent's records (or of
    the client regions in `regions`, by id; GPU tensors in CUDA regions come through `gpu`)."""
    requests: list[InferenceRequest] = []
    handle = first
    while handle:
        if len(requests) >= MAX_BATCH_RECORDS:
            raise _core.FormatError("request chain is longer than any batch can be")
        this = handle
        # Positional arguments: pybind11's keyword path costs about a microsecond a call.
        _, serial, ints, handle, strings, tensors = (_core.read_record(pool, handle, False, regions) if regions
                                                     else _core.read_record(pool, handle))
        if len(strings) < REQUEST_FIXED_STRINGS:
            raise _core.FormatError("request record lacks its fixed strings")
        inputs = [Tensor._wrap(*t) if type(t[2]) is not tuple else _gpu_input(t, gpu) for t in tensors]
        correlation: int | str = strings[2] if strings[2] else ints[1]
        requested = strings[REQUEST_FIXED_STRINGS:]
        destinations = None
        if requested and any(OUTPUT_DESTINATION_SEP in s for s in requested):
            destinations = {}
            names = []
            for text in requested:
                name, where = decode_destination(text)
                names.append(name)
                if where is not None:
                    destinations[name] = where
            requested = names
        trace_id, _, context = strings[3].partition(" ")  # "<id>[ <OpenTelemetry context>]"
        trace = InferenceTrace._of(int(trace_id), context) if trace_id.isdigit() else _UNTRACED
        request = InferenceRequest._from_stub(inputs, requested, strings[0], correlation, ints[0], ints[2],
                                              strings[1] or "{}", model_name, model_version, trace)
        request._destinations = destinations
        request._state = SenderState(this, serial)  # a request record's status holds its serial
        requests.append(request)
    return requests


def _gpu_input(entry: tuple[str, int, tuple[object, ...]], gpu: StubGpu | None) -> Tensor:
    """An input the record describes instead of viewing: a GPU tensor in a client CUDA region."""
    name = entry[0]
    if gpu is None or not is_gpu_description(entry[2]):
        raise _core.FormatError(f"input '{name}' lies in memory this stub has not mapped")
    return Tensor._wrap(*gpu.input_tensor(*entry))


def write_error(pool: Pool, message: str, code: int = _INTERNAL, next_handle: int = 0,
                times: tuple[int, int, int] = (0, 0, 0)) -> int:
    """One response record that fails its request with `message`."""
    return _core.write_record(pool, _RESPONSE, 1 + code, times, (message, "{}"), (), next_handle)


def write_flags(pool: Pool, times: tuple[int, int, int], next_handle: int = 0) -> int:
    """A response record without a response: only its flags (times[2]), e.g. the final flag."""
    return _core.write_record(pool, _RESPONSE, 0, (times[0], times[1], times[2] | RESPONSE_EMPTY), ("", "{}"), (),
                              next_handle)


def _place(tensor: Tensor, where: tuple[int, int, int], targets: dict[int, memoryview]) -> tuple[object, ...]:
    """Writes an output into the client region the caller named (its one copy) and returns the
    record entry that describes it there."""
    region, offset, size = where
    target = targets.get(region)
    if target is None or offset > len(target) or size > len(target) - offset:
        raise ValueError(f"output '{tensor._name}' names a client region that is not mapped")
    array = tensor._array
    if type(target) is not memoryview or type(array) is _GPU_VIEW:
        return _place_gpu(tensor, region, offset, size, target)
    if tensor._dtype == _BYTES:
        items = array.ravel()
        nbytes = _core.encoded_bytes_size(items)
    else:
        array = np.ascontiguousarray(array)
        nbytes = array.nbytes
    if nbytes > size:
        raise _TooSmall(output_too_large(tensor._name, size, nbytes))
    window = target[offset:offset + nbytes]
    if tensor._dtype == _BYTES:
        _core.encode_bytes_into(window, items)
    elif nbytes:
        window[:] = memoryview(array).cast("B")
    return (tensor._name, array.shape, tensor._dtype, region, offset, nbytes)


def _place_gpu(tensor: Tensor, region: int, offset: int, size: int, target: memoryview | CudaTarget) -> tuple[object, ...]:
    """`_place` where a GPU is involved: a GPU output, or a client CUDA region, or both (one
    copy: device to device, device to host or host to device)."""
    array = tensor._array
    shape = tuple(array.shape)
    gpu = type(array) is _GPU_VIEW
    if tensor._dtype == _BYTES:  # serialized on the host, then copied to the device
        array = np.frombuffer(_core.encode_bytes(array.ravel()), dtype=np.uint8)
    elif not gpu:
        array = np.ascontiguousarray(array)
    nbytes = array.byte_size if gpu else array.nbytes
    if nbytes > size:
        raise _TooSmall(output_too_large(tensor._name, size, nbytes))
    if type(target) is memoryview:  # a GPU output into a system region: device to host
        window = np.frombuffer(target[offset:offset + nbytes], dtype=np.uint8)
        cuda.runtime().copy(window.ctypes.data, array.ptr, nbytes, array.device_id)
    else:
        target.write(offset, array, nbytes, tensor._name)
    return (tensor._name, shape, tensor._dtype, region, offset, nbytes)


def _no_room(pool: Pool, request: InferenceRequest, next_handle: int, times: tuple[int, int, int]) -> int:
    # The core's text names segments, which clients must never see (ARCHITECTURE §5).
    return write_error(pool, f"failed to send the response of request '{request.request_id()}': no room in "
                             "the instance's shared memory", next_handle=next_handle, times=times)


class _TooSmall(ValueError):
    """A client region cannot hold an output (the client's mistake: INVALID_ARG)."""


def write_response(pool: Pool, request: InferenceRequest, response: InferenceResponse, next_handle: int,
                   times: tuple[int, int, int] = (0, 0, 0), targets: dict[int, memoryview] | None = None) -> int:
    """The record of one response; outputs the caller did not ask for are dropped, outputs bound
    for a client region are written there. `times` are the record's ints: (execute start,
    execute end, 0) in CLOCK_MONOTONIC nanoseconds."""
    error = response.error()
    if error is not None:
        return _core.write_record(pool, _RESPONSE, 1 + error.code(), times, (error.message(), "{}"), (),
                                  next_handle)
    requested = request.requested_output_names()
    outputs = response.output_tensors()
    if requested:
        outputs = [t for t in outputs if t._name in requested]
    destinations = request._destinations
    try:
        if destinations:
            tensors: list[tuple[object, ...]] = [
                _place(t, destinations[t._name], targets or {}) if t._name in destinations else
                (t._name, t._array, t._dtype) if type(t._array) is not _GPU_VIEW else host_entry(t) for t in outputs]
        else:
            tensors = [(t._name, t._array, t._dtype) if type(t._array) is not _GPU_VIEW else host_entry(t)
                       for t in outputs]
    except _TooSmall as e:
        return write_error(pool, str(e), _INVALID_ARG, next_handle, times)
    except (_core.PoolFullError, _core.ShmError, _core.ShmSpaceError):
        return _no_room(pool, request, next_handle, times)
    except (_core.CoreError, TypeError, ValueError, CudaError) as e:
        return write_error(pool, f"failed to send the response of request '{request.request_id()}': {e}",
                           next_handle=next_handle, times=times)
    try:
        return _core.write_record(pool, _RESPONSE, 0, times, ("", response.parameters()), tensors, next_handle)
    except (_core.PoolFullError, _core.ShmError, _core.ShmSpaceError):
        return _no_room(pool, request, next_handle, times)
    except (_core.CoreError, TypeError, ValueError) as e:
        return write_error(pool, f"failed to send the response of request '{request.request_id()}': {e}",
                           next_handle=next_handle, times=times)


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


def _write_reply(pool: Pool, request: InferenceRequest, response: InferenceResponse | None, next_handle: int,
                 times: tuple[int, int, int], targets: dict[int, memoryview] | None) -> int:
    if response is None:  # answered through the request's response sender
        return write_flags(pool, (times[0], times[1], RESPONSE_DEFERRED), next_handle)
    return write_response(pool, request, response, next_handle, times, targets)


def write_responses(pool: Pool, requests: Sequence[InferenceRequest],
                    responses: Sequence[InferenceResponse | None], times: tuple[int, int, int] = (0, 0, 0),
                    targets: dict[int, memoryview] | None = None) -> int:
    """Writes one record per request, chained in request order; returns the first handle. A
    None response writes a DEFERRED placeholder (the request's sender answers it)."""
    if len(requests) == 1:  # the common case, without the chain machinery
        return _write_reply(pool, requests[0], responses[0], 0, times, targets)
    return _chain(pool, (functools.partial(_write_reply, pool, request, response, times=times, targets=targets)
                         for request, response in zip(reversed(requests), reversed(responses))))


def write_errors(pool: Pool, count: int, message: str, code: int = _INTERNAL,
                 times: tuple[int, int, int] = (0, 0, 0)) -> int:
    """`count` chained records that all fail with the same message (a failed execute)."""
    return _chain(pool, (functools.partial(write_error, pool, message, code, times=times) for _ in range(count)))
