"""BLS from the stub: a model's ``InferenceRequest(...).exec()`` sent to the parent and answered.

The request is written into the stub's own pool as one record and named by an inline-reply
INFER_EXEC_REQUEST on ``stub_to_parent_mq``; the caller waits on the reply with the GIL
released. The parent writes the response into the same pool, so its outputs reach the model as
views (freed when the last view goes), and a failed call comes back as ``response.error()``.
"""

from __future__ import annotations

import itertools
import queue
import threading
import weakref
from collections.abc import Callable

from stubhost import _core
from stubhost._core import Command, IPCMessage, MessageQueue, Pool, RecordKind
from stubhost.backend_utils.bls import BLS_OUTSIDE_EXECUTE
from stubhost.backend_utils.errors import TritonError, TritonModelException
from stubhost.backend_utils.constants import TRITONSERVER_MEMORY_GPU
from stubhost.backend_utils.request import InferenceRequest, PreferredMemory
from stubhost.backend_utils.response import InferenceResponse
from stubhost.backend_utils.tensor import Tensor
from stubhost.stub.gpu_io import host_entry, on_gpu
from stubhost.protocol import REPLY_OK, RESPONSE_EMPTY, RESPONSE_FINAL, read_payload, write_payload

_REQUEST = int(RecordKind.REQUEST)
_RESPONSE = int(RecordKind.RESPONSE)
WAIT_SLICE_S = 1.0  # how often a waiting call checks that the parent still lives


class ResponseIterator:
    """The responses of a decoupled BLS call (``exec(decoupled=True)``), as they come.

    As in Triton, the last item is the response that carried the final flag, which is empty
    (no outputs) when the model sent the flag alone. ``cancel()`` asks the target to stop; an
    iterator dropped before its end cancels too.

    Also as in Triton, the iterator keeps the responses it handed out: once the last one has
    been read, a new ``iter()`` (a new ``for`` loop) goes over all of them again from the first,
    and a loop left early resumes where it stopped.
    """

    def __init__(self, caller: StubCaller, stream_id: int, inbox: queue.SimpleQueue[tuple[int, int]],
                 preferred: PreferredMemory | None = None) -> None:
        self._caller = caller
        self._preferred = preferred
        self._id = stream_id
        self._inbox = inbox
        self._done = [False]  # shared with the finalizer, which must not hold the iterator
        self._seen: list[InferenceResponse] = []  # every response handed out, for a replay
        self._replay = 0  # next of _seen to hand out again, once the stream is done
        self._first: tuple[int, int] | None = None  # the first response, taken before the call returned
        self._finalizer = weakref.finalize(self, caller.forget_stream, stream_id, self._done)

    def __iter__(self) -> ResponseIterator:
        if self._done[0] and self._replay >= len(self._seen):
            self._replay = 0
        return self

    def __next__(self) -> InferenceResponse:
        if self._done[0]:
            if self._replay < len(self._seen):
                self._replay += 1
                return self._seen[self._replay - 1]
            raise StopIteration
        response = self._receive()
        self._seen.append(response)
        if self._done[0]:
            self._replay = len(self._seen)  # a replay starts only at the next iter()
        return response

    def wait_first(self) -> None:
        """Waits for the first response, as Triton's ``exec(decoupled=True)`` does before it
        returns: iterating then starts without a wait, and ``async_exec`` hands over an iterator
        whose first step does not block the event loop."""
        self._first = self._take()

    def _take(self) -> tuple[int, int]:
        """The next (record, flags) of the target (GIL released while the queue waits)."""
        if self._first is not None:
            first, self._first = self._first, None
            return first
        while True:
            try:
                return self._inbox.get(timeout=WAIT_SLICE_S)
            except queue.Empty:
                if not self._caller.parent_alive():
                    self._done[0] = True
                    raise TritonModelException("BLS request failed: the server is gone") from None

    def _receive(self) -> InferenceResponse:
        """The target's next response, waited for."""
        record, flags = self._take()
        if flags & RESPONSE_FINAL:
            self._done[0] = True
            self._finalizer()
        return self._caller._read(record, self._preferred) if record else InferenceResponse()

    def cancel(self) -> None:
        """Asks the target model to stop (its ``request.is_cancelled()`` turns true)."""
        if not self._done[0]:
            self._caller.cancel_stream(self._id)


class StubCaller:
    """Runs BLS requests through the parent; usable from any thread of the model."""

    def __init__(self, pool: Pool, calls: MessageQueue, parent_alive: Callable[[], bool]) -> None:
        self.pool = pool
        self.calls = calls
        self.parent_alive = parent_alive
        self.allowed = False  # True between initialize and finalize (Triton's rule)
        self._ids = itertools.count(1)
        self._streams: dict[int, queue.SimpleQueue[tuple[int, int]]] = {}
        self._lock = threading.Lock()

    # ---- decoupled calls ---------------------------------------------------------------------------
    def stream(self, request: InferenceRequest) -> ResponseIterator:
        """Sends `request` (to a decoupled model, typically) and returns its responses' iterator."""
        self._check(request)
        stream_id = next(self._ids)
        inbox: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
        with self._lock:
            self._streams[stream_id] = inbox
        iterator = ResponseIterator(self, stream_id, inbox, request._preferred_memory)
        record = self._write(request)
        if not self._post(Command.INFER_STREAM_EXEC_REQUEST, record, stream_id):
            self.pool.free(record)
            raise TritonModelException("BLS request failed: the server is gone")
        iterator.wait_first()
        return iterator

    def deliver(self, stream_id: int, record: int) -> None:
        """A response of a decoupled call arrived (answers thread)."""
        try:
            _, _, times, _, _, _ = _core.read_record(self.pool, record)
            flags = times[2]
        except _core.CoreError:
            flags = RESPONSE_FINAL  # unreadable: it ends the stream with an error response below
        with self._lock:
            inbox = self._streams.get(stream_id)
        if inbox is None:  # nobody listens any more
            _core.free_record_chain(self.pool, record)
            return
        if flags & RESPONSE_EMPTY:
            _core.free_record_chain(self.pool, record)
            record = 0
        inbox.put((record, flags))

    def forget_stream(self, stream_id: int, done: list[bool]) -> None:
        """The iterator is gone or finished: a stream not finished is cancelled."""
        with self._lock:
            inbox = self._streams.pop(stream_id, None)
        if not done[0]:
            self.cancel_stream(stream_id)
        while inbox is not None:  # responses nobody will read
            try:
                record, _ = inbox.get_nowait()
            except queue.Empty:
                break
            if record:
                _core.free_record_chain(self.pool, record)

    def cancel_stream(self, stream_id: int) -> None:
        """Tells the parent that the model cancelled a decoupled call."""
        try:
            self._post(Command.CANCEL_REQUEST, 0, stream_id)
        except _core.CoreError:
            pass  # nothing to cancel with: the pool is full or the parent gone

    def _post(self, command: Command, args: int, request_id: int) -> bool:
        """Queues a one-way message for the parent; False if the parent is gone."""
        message = IPCMessage.create(self.pool, command, args=args, request_id=request_id)
        while not self.calls.push(message.handle, timeout=WAIT_SLICE_S):
            if not self.parent_alive():
                message.release()
                return False
        return True

    # ---- custom metrics ----------------------------------------------------------------------------
    def metric(self, payload: dict[str, object]) -> None:
        """Sends one metric update; nobody waits for it."""
        args = write_payload(self.pool, payload)
        if not self._post(Command.METRIC_REQUEST, args, 0):
            self.pool.free(args)

    def metric_value(self, payload: dict[str, object]) -> float:
        """A metric's value, as the server holds it."""
        return float(self._ask(Command.METRIC_REQUEST, payload))  # type: ignore[arg-type]

    # ---- model control ---------------------------------------------------------------------------
    def control(self, payload: dict[str, object]) -> object:
        """Runs a model-control call (load, unload, ready) in the parent; returns its result,
        raises TritonModelException with the parent's text when it failed."""
        if not self.allowed:
            raise TritonModelException("model control is only supported during the 'execute' function.")
        return self._ask(Command.MODEL_CONTROL_REQUEST, payload)

    def _ask(self, command: Command, payload: dict[str, object]) -> object:
        """An inline-reply call with a JSON payload, answered ``{"result"}`` or ``{"error"}``."""
        args = write_payload(self.pool, payload)
        message = IPCMessage.create(self.pool, command, args=args, inline_reply=True)
        pushed = False
        try:
            while not self.calls.push(message.handle, timeout=WAIT_SLICE_S):
                if not self.parent_alive():
                    raise TritonModelException(f"{command.name} failed: the server is gone")
            pushed = True
            while not message.wait_reply(WAIT_SLICE_S):
                if not self.parent_alive():
                    raise TritonModelException(f"{command.name} failed: the server is gone")
            status, reply = message.reply_status, message.reply_args
        finally:
            message.release()
            if not pushed:
                message.release()
                self.pool.free(args)
        answer = read_payload(self.pool, reply) if reply else {}
        if status != REPLY_OK or not isinstance(answer, dict) or "error" in answer:
            text = answer.get("error") if isinstance(answer, dict) else None
            raise TritonModelException(str(text or f"{command.name} failed"))
        return answer.get("result")

    def _check(self, request: InferenceRequest) -> None:
        if not self.allowed:
            raise TritonModelException(BLS_OUTSIDE_EXECUTE)
        if not request.model_name():
            raise TritonModelException("BLS request has no model name")

    def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Sends `request` to the model it names and waits for the response."""
        self._check(request)
        record = self._write(request)
        try:
            # Positional arguments: pybind11's keyword path costs about a microsecond a call.
            message = IPCMessage.create(self.pool, Command.INFER_EXEC_REQUEST, record, 0, True)
        except BaseException:
            self.pool.free(record)
            raise
        pushed = False
        try:
            while not self.calls.push(message.handle, WAIT_SLICE_S):
                if not self.parent_alive():
                    raise TritonModelException("BLS request failed: the server is gone")
            pushed = True  # the parent now holds the message's other reference and the record
            while not message.wait_reply(WAIT_SLICE_S):
                if not self.parent_alive():
                    raise TritonModelException("BLS request failed: the server is gone")
            status, reply = message.reply_status, message.reply_args
        finally:
            message.release()
            if not pushed:  # never delivered: the parent's reference and the record are ours
                message.release()
                self.pool.free(record)
        if status != REPLY_OK:
            payload = read_payload(self.pool, reply) if reply else {}
            text = payload.get("message", "") if isinstance(payload, dict) else ""
            return InferenceResponse(error=TritonError(str(text or "BLS request failed")))
        return self._read(reply, request._preferred_memory)

    def _write(self, request: InferenceRequest) -> int:
        correlation = request.correlation_id()
        corr_int, corr_text = (correlation, "") if isinstance(correlation, int) else (0, str(correlation))
        # GPU inputs travel through the pool: copied to the host once (the parent passes CPU
        # tensors between instances).
        tensors = [(t._name, t._array, t._dtype) if t.is_cpu() else host_entry(t) for t in request.inputs()]
        trace_id = request.trace()._id
        strings = (request.request_id(), request.parameters(), corr_text, str(trace_id) if trace_id else "",
                   request.model_name(), str(request.model_version()), *request.requested_output_names())
        try:
            return _core.write_record(self.pool, _REQUEST, 0, (request.flags(), corr_int, request.timeout()),
                                      strings, tensors)
        except (_core.PoolFullError, _core.ShmError, _core.ShmSpaceError):
            raise TritonModelException("BLS request failed: no room for its inputs in the instance's shared "
                                       "memory") from None

    def _read(self, handle: int, preferred: PreferredMemory | None = None) -> InferenceResponse:
        try:
            kind, code, _, next_record, strings, tensors = _core.read_record(self.pool, handle, True)
            if next_record:
                _core.free_record_chain(self.pool, next_record)
            if kind != _RESPONSE:
                raise _core.FormatError("the BLS reply is not a response record")
        except _core.CoreError as e:
            return InferenceResponse(error=TritonError(f"BLS request failed: malformed response: {e}"))
        if code:
            return InferenceResponse(error=TritonError(strings[0] if strings else "", code - 1))
        outputs = [Tensor._wrap(name, dtype, array) for name, dtype, array in tensors]
        if preferred is not None and preferred.preferred_memory_type == TRITONSERVER_MEMORY_GPU:
            outputs = on_gpu(outputs, preferred.preferred_device_id)
        return InferenceResponse(outputs, parameters=strings[1] if len(strings) > 1 else None)
