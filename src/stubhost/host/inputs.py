"""Checks a caller's inputs and requested outputs against the model configuration.

Error texts follow Triton's core (``[request id: ...] unexpected inference input ...``) so that
users who grep logs find what they know.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stubhost import _core
from stubhost.config.dtypes import config_dtype_to_triton
from stubhost.config.validate_io import BATCH_NOTE, dims_text, input_count_text
from stubhost.host.errors import InferenceError
from stubhost.host.regions import RegionDestination, RegionOutput, RegionTensor
from stubhost.tensor import numpy_to_triton_dtype

_BYTES = int(_core.DataType.BYTES)
_STRING_KINDS = ("O", "S", "U")


@dataclass(frozen=True)
class TensorSpec:
    """One configured input or output."""

    name: str
    dtype: int
    dtype_name: str
    dims: tuple[int, ...]
    optional: bool
    reshape: tuple[int, ...] | None


def _spec(entry: Mapping[str, Any]) -> TensorSpec:
    name = config_dtype_to_triton(str(entry.get("data_type", "TYPE_INVALID")))
    reshape = entry.get("reshape")
    reshape_dims = tuple(int(d) for d in reshape.get("shape", [])) if isinstance(reshape, Mapping) else None
    return TensorSpec(str(entry["name"]), int(_core.dtype_from_name(name)), name,
                      tuple(int(d) for d in entry.get("dims", [])), bool(entry.get("optional", False)),
                      reshape_dims)


class CheckedInputs(Mapping[str, Any]):
    """A request's inputs as the caller gave them, with what ``checker.check_inputs`` returned
    for them: handed on to the model's own path (the response cache checks a request before its
    lookup), they are not checked a second time by that checker."""

    __slots__ = ("_inputs", "checker", "tensors")

    def __init__(self, inputs: Mapping[str, Any], checker: RequestChecker, tensors: list[tuple[str, Any, int]]) -> None:
        self._inputs = inputs
        self.checker = checker
        self.tensors = tensors

    def __getitem__(self, name: str) -> Any:
        return self._inputs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._inputs)

    def __len__(self) -> int:
        return len(self._inputs)


class CheckedOutputs(list[str | RegionDestination]):
    """Requested outputs ``checker.check_outputs`` has passed (its result), handed on like
    CheckedInputs."""

    def __init__(self, requested: Sequence[str | RegionDestination], checker: RequestChecker) -> None:
        super().__init__(requested)
        self.checker = checker


class RequestChecker:
    """Validates requests for one model; built once per loaded configuration."""

    def __init__(self, model_name: str, config: Mapping[str, Any]) -> None:
        self.model_name = model_name
        self.max_batch_size = int(config.get("max_batch_size", 0))
        self.inputs = {s.name: s for s in map(_spec, config.get("input", []))}
        self.outputs = {s.name: s for s in map(_spec, config.get("output", []))}
        self.required = [s.name for s in self.inputs.values() if not s.optional]
        # The last (dtype, shape) each input passed with: repeated requests of one shape skip the checks.
        self._passed: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}

    def _error(self, request_id: str, text: str) -> InferenceError:
        return InferenceError("INVALID_ARG", f"[request id: {request_id or '<id_unknown>'}] {text}")

    def check_inputs(self, inputs: Mapping[str, Any], request_id: str) -> list[tuple[str, Any, int]]:
        """(name, array, dtype) for each input, validated; raises InferenceError(INVALID_ARG)."""
        if type(inputs) is CheckedInputs and inputs.checker is self:
            return inputs.tensors
        tensors: list[tuple[str, Any, int]] = []
        batch: int | None = None
        batching = self.max_batch_size > 0
        if len(inputs) > len(self.inputs) or len(inputs) < len(self.required):
            raise self._error(request_id, self._count_text(inputs))
        for name, value in inputs.items():
            spec = self.inputs.get(name)
            if spec is None:
                raise self._error(request_id, f"unexpected inference input '{name}' for model '{self.model_name}'")
            array = value if isinstance(value, (np.ndarray, RegionTensor)) else np.asarray(value)
            signature = (array.dtype, array.shape)
            if self._passed.get(name) == signature and spec.reshape is None:
                if batching:
                    batch = self._batch(name, array.shape, batch, request_id)
                tensors.append((name, array, spec.dtype))
                continue
            if spec.dtype == _BYTES:
                if array.dtype.kind not in _STRING_KINDS:
                    raise self._error(request_id, f"inference input '{name}' data-type is "
                                                  f"'{_core.dtype_name(_core.DataType(_dtype_of(array)))}', but model "
                                                  f"'{self.model_name}' expects 'BYTES'")
            elif _dtype_of(array) != spec.dtype:
                raise self._error(request_id, f"inference input '{name}' data-type is "
                                              f"'{_core.dtype_name(_core.DataType(_dtype_of(array)))}', but model "
                                              f"'{self.model_name}' expects '{spec.dtype_name}'")
            shape = array.shape
            dims = shape
            if self.max_batch_size > 0:
                batch = self._batch(name, shape, batch, request_id)
                dims = shape[1:]
            if len(dims) != len(spec.dims) or any(d != -1 and d != s for d, s in zip(spec.dims, dims)):
                expected = ([-1] if self.max_batch_size > 0 else []) + list(spec.dims)
                raise self._error(request_id, f"unexpected shape for input '{name}' for model "
                                              f"'{self.model_name}'. Expected {dims_text(expected)}, got "
                                              f"{dims_text(shape)}. {BATCH_NOTE if batching else ''}")
            if spec.reshape is not None:
                array = array.reshape(tuple(shape[:1] if self.max_batch_size > 0 else ()) + spec.reshape)
            else:
                self._passed[name] = signature
            tensors.append((name, array, spec.dtype))
        if batch is not None and batch > self.max_batch_size:
            raise self._error(request_id, f"inference request batch-size must be <= {self.max_batch_size} for "
                                          f"'{self.model_name}'")
        # Every input was found among the configured ones, so as many inputs as configured means
        # none is missing; only a shorter request needs the search.
        missing = [n for n in self.required if n not in inputs] if len(inputs) < len(self.inputs) else []
        if missing:
            raise self._error(request_id, self._count_text(inputs))
        return tensors

    def _count_text(self, inputs: Mapping[str, Any]) -> str:
        """Triton's words for a request whose inputs do not add up. Its list of the request's
        inputs comes from a hash map, which lists a few names newest first: so does this one."""
        missing = [n for n in self.required if n not in inputs]
        return input_count_text(self.model_name, len(self.inputs), len(self.required), list(reversed(list(inputs))),
                                missing)

    def _batch(self, name: str, shape: tuple[int, ...], batch: int | None, request_id: str) -> int | None:
        """The request's batch size so far, checked against this input's first dimension."""
        if self.max_batch_size <= 0:
            return batch
        if not shape:
            raise self._error(request_id, f"input '{name}' for model '{self.model_name}' has no batch dimension")
        if batch is not None and shape[0] != batch:
            raise self._error(request_id, f"input '{name}' batch size {shape[0]} does not match other inputs' "
                                          f"batch size {batch} for model '{self.model_name}'")
        return shape[0]

    def check_outputs(self, outputs: Sequence[str | RegionDestination] | None,
                      request_id: str) -> list[str | RegionDestination]:
        """The requested outputs (names, or destinations in client regions), each known to the model."""
        if type(outputs) is CheckedOutputs and outputs.checker is self:
            return outputs
        if not outputs:
            return []
        requested = [o if isinstance(o, RegionDestination) else str(o) for o in outputs]
        for entry in requested:
            name = entry.name if isinstance(entry, RegionDestination) else entry
            if name not in self.outputs:
                raise self._error(request_id, f"unexpected inference output '{name}' for model "
                                              f"'{self.model_name}'")
        return requested

    def check_result(self, result: list[tuple[str, int, Any]],
                     request_id: str) -> dict[str, np.ndarray | RegionOutput]:
        """The outputs as a dict. An output the stub placed in a client region comes as a
        RegionOutput. Types are the model's: Triton does not check them against the config."""
        out: dict[str, np.ndarray | RegionOutput] = {}
        for name, dtype, array in result:
            if type(array) is tuple:  # described, not viewed: it lies in a client region
                region, offset, size, shape = array
                array = RegionOutput(region, offset, size, tuple(shape), dtype)
            out[name] = array
        return out


def _dtype_of(array: Any) -> int:
    try:
        return int(numpy_to_triton_dtype(array.dtype))
    except TypeError:
        return int(_core.DataType.INVALID)
