"""``pb_utils.InferenceRequest``: what ``execute`` receives (and, later, what BLS sends)."""

from __future__ import annotations

import asyncio
import functools
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stubhost.backend_utils import bls, response_sender
from stubhost.backend_utils.constants import TRITONSERVER_REQUEST_RELEASE_ALL, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
from stubhost.backend_utils.errors import TritonModelException
from stubhost.backend_utils.parameters import parameters_json
from stubhost.backend_utils.response_sender import InferenceResponseSender, SenderState
from stubhost.backend_utils.tensor import Tensor

if TYPE_CHECKING:
    pass


class PreferredMemory:
    """Where a BLS call's outputs should be placed: ``PreferredMemory(TRITONSERVER_MEMORY_GPU, 0)``.

    A preference, as in Triton: outputs land on the GPU when one is usable, else stay on the CPU.
    """

    __slots__ = ("preferred_memory_type", "preferred_device_id")

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = int(preferred_memory_type)
        self.preferred_device_id = int(preferred_device_id)

    def __repr__(self) -> str:
        return f"PreferredMemory({self.preferred_memory_type}, {self.preferred_device_id})"


class InferenceTrace:
    """A request's trace, as ``request.trace()`` returns it and a BLS request takes it
    (``InferenceRequest(..., trace=request.trace())``): a BLS request made with the trace of a
    traced request is traced as its child, as in Triton. In the server's OpenTelemetry trace mode
    ``get_context()`` is the request's span context as JSON (``{"traceparent": "00-..."}``), so
    that the model can continue it in its own spans; otherwise None, as in Triton.
    """

    __slots__ = ("_context", "_id")

    def __init__(self) -> None:
        self._id = 0  # the server's trace id of the request (0: not traced)
        self._context = ""

    @classmethod
    def _of(cls, trace_id: int, context: str = "") -> InferenceTrace:
        trace = cls()
        trace._id = trace_id
        trace._context = context
        return trace

    def get_context(self, mode: str = "opentelemetry") -> str | None:
        """The trace's OpenTelemetry context (JSON), or None when the request is not traced in
        that mode."""
        return self._context or None


_UNTRACED = InferenceTrace()


def _text(value: Any) -> Any:
    """A text argument as Triton's binding reads it: bytes become str (pybind11 converts them)."""
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _require(argument: str, value: Any, kind: type) -> None:
    """TypeError unless `value` is a `kind` (pybind11's refusal of a wrong argument type); a str
    is not a sequence of names or tensors here."""
    if not isinstance(value, kind) or (kind is Sequence and isinstance(value, (str, bytes))):
        raise TypeError(f"InferenceRequest(): incompatible constructor arguments: {argument} must be "
                        f"{getattr(kind, '__name__', kind)}, got {type(value).__name__}")


class InferenceRequest:
    """One inference request: inputs, requested outputs, id, correlation id, flags, parameters."""

    __slots__ = ("_inputs", "_requested_output_names", "_request_id", "_correlation_id", "_flags", "_destinations",
                 "_parameters", "_timeout", "_model_name", "_model_version", "_state", "_release_flags", "_preferred_memory",
                 "_trace")

    def __init__(self, model_name: str, inputs: Sequence[Tensor],
                 requested_output_names: Sequence[str], request_id: str = "",
                 correlation_id: int | str = 0, model_version: int = -1, flags: int = 0,
                 timeout: int = 0, parameters: dict[str, Any] | str | None = None,
                 preferred_memory: PreferredMemory | None = None, trace: InferenceTrace = _UNTRACED) -> None:
        # Argument types are checked as Triton's binding checks them: a wrong type (None
        # included) is a TypeError, a None in `inputs` and a correlation id that is neither an
        # int nor a str are TritonModelException. model_name, inputs and requested_output_names
        # have no default there either.
        model_name, request_id = _text(model_name), _text(request_id)
        _require("model_name", model_name, str)
        _require("request_id", request_id, str)
        _require("inputs", inputs, Sequence)
        _require("requested_output_names", requested_output_names, Sequence)
        requested_output_names = [_text(name) for name in requested_output_names]
        for tensor in inputs:
            if tensor is None:
                raise TritonModelException(f"Input tensor for request with id '{request_id}' and model name "
                                           f"'{model_name}' should not be empty.")
            _require("inputs", tensor, Tensor)
        for output_name in requested_output_names:
            _require("requested_output_names", output_name, str)
            if not output_name:
                raise TritonModelException(f"Requested output name for request with id '{request_id}' and model "
                                           f"name '{model_name}' should not be empty.")
        if correlation_id is None:
            raise TypeError("InferenceRequest(): incompatible constructor arguments: correlation_id cannot be None")
        if isinstance(correlation_id, bool) or not isinstance(correlation_id, (int, str)):
            raise TritonModelException("Correlation ID must be integer or string")
        self._inputs = list(inputs)
        self._requested_output_names = list(requested_output_names)
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._flags = int(flags)
        self._timeout = int(timeout)
        self._parameters = parameters_json(parameters)
        self._model_name = str(model_name)
        self._model_version = int(model_version)
        self._destinations: dict[str, tuple[int, int, int]] | None = None
        self._state: SenderState | None = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        if preferred_memory is not None and not isinstance(preferred_memory, PreferredMemory):
            raise TypeError("preferred_memory must be a pb_utils.PreferredMemory")
        if not isinstance(trace, InferenceTrace):
            raise TypeError("trace must be a pb_utils.InferenceTrace (a request's trace())")
        self._preferred_memory = preferred_memory
        self._trace = trace

    @classmethod
    def _from_stub(cls, inputs: list[Tensor], requested: list[str], request_id: str, correlation_id: int | str,
                   flags: int, timeout: int, parameters: str, model_name: str,
                   model_version: int, trace: InferenceTrace = _UNTRACED) -> InferenceRequest:
        """Builds a request read from the pool without re-validating it (the stub's fast path)."""
        r = cls.__new__(cls)
        r._inputs = inputs
        r._requested_output_names = requested
        r._request_id = request_id
        r._correlation_id = correlation_id
        r._flags = flags
        r._timeout = timeout
        r._parameters = parameters
        r._model_name = model_name
        r._model_version = model_version
        r._destinations = None  # outputs to write into clients' regions: name -> (region, offset, size)
        r._state = None  # set by the stub: the request's record handle and its sender's state
        r._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        r._preferred_memory = None
        r._trace = trace
        return r

    def inputs(self) -> list[Tensor]:
        """The input tensors."""
        return self._inputs

    def requested_output_names(self) -> list[str]:
        """Names of the outputs the caller asked for (empty: all of them)."""
        return self._requested_output_names

    def trace(self) -> InferenceTrace:
        """The request's trace, to pass on to BLS requests; it has no context (see InferenceTrace)."""
        return self._trace

    def request_id(self) -> str:
        """The caller's request id ("" when none was given)."""
        return self._request_id

    def correlation_id(self) -> int | str:
        """The sequence correlation id: an int, or a str when the caller used a string id."""
        return self._correlation_id

    def flags(self) -> int:
        """TRITONSERVER_REQUEST_FLAG_* bits (sequence start/end)."""
        return self._flags

    def set_flags(self, flags: int) -> None:
        """Sets the request's ``TRITONSERVER_REQUEST_FLAG_*`` bits, as Triton's ``set_flags``
        does: a BLS request sent by ``exec()`` afterwards carries them (``START | END`` opens or
        closes a sequence on a sequence-batching model). `flags` is an unsigned 32-bit integer;
        anything else raises ``TypeError``, as Triton's binding does."""
        try:
            value = operator.index(flags)
        except TypeError:
            value = -1
        if not 0 <= value <= 0xFFFFFFFF:
            raise TypeError(f"set_flags(): incompatible function arguments: flags must be an unsigned 32-bit int "
                            f"(TRITONSERVER_REQUEST_FLAG_* bits), got {flags!r}")
        self._flags = value

    def timeout(self) -> int:
        """The request's timeout in microseconds (0: none)."""
        return self._timeout

    def parameters(self) -> str:
        """The request's parameters as a JSON object text."""
        return self._parameters

    def model_name(self) -> str:
        """Name of the model the request is for."""
        return self._model_name

    def model_version(self) -> int:
        """Version of the model the request is for (-1: the policy's choice)."""
        return self._model_version

    def get_response_sender(self) -> InferenceResponseSender:
        """The sender that answers this request outside ``execute``'s return value (decoupled
        models; default-mode models for their one response)."""
        if self._state is None:
            raise TritonModelException(
                "Unable to get the response sender of a request that was not received by a model instance.")
        return InferenceResponseSender(self, self._state)

    def exec(self, decoupled: bool = False) -> Any:
        """Runs this request on the model it names (BLS) and returns the response; a failure is
        in ``response.error()``. With ``decoupled=True``: an iterator over the responses (the
        last one carries the final flag, and is empty when the flag came alone), with
        ``cancel()``. Only during ``execute``."""
        if decoupled:
            return bls.caller().stream(self)
        return bls.caller().infer(self)

    async def async_exec(self, decoupled: bool = False) -> Any:
        """``exec`` for ``async def execute``: the wait runs in a thread, so the event loop
        (and other requests on it) go on meanwhile."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, functools.partial(self.exec, decoupled))

    def set_release_flags(self, flags: int) -> None:
        """``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` hands the request back to run again in a
        later ``execute`` (iterative sequence batching); ``TRITONSERVER_REQUEST_RELEASE_ALL``
        (the default) releases it when ``execute`` returns."""
        if flags not in (TRITONSERVER_REQUEST_RELEASE_ALL, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE):
            raise TritonModelException(f"unknown request release flags {flags!r}: use "
                                       "TRITONSERVER_REQUEST_RELEASE_ALL or TRITONSERVER_REQUEST_RELEASE_RESCHEDULE")
        self._release_flags = int(flags)

    def is_cancelled(self) -> bool:
        """True once the caller has cancelled this request (the model may stop early)."""
        return self._state is not None and response_sender.transport().is_cancelled(self)

    def __repr__(self) -> str:
        return (f"InferenceRequest(request_id={self._request_id!r}, inputs={[t.name() for t in self._inputs]}, "
                f"requested_output_names={self._requested_output_names})")
