"""Sequence batching control inputs: the tensors Triton's sequence batcher adds to every request of
a sequence model (``sequence_batching { control_input [...] }``).

Each configured control becomes an input of the request, which the model reads like any other
(``pb_utils.get_input_tensor_by_name(request, "START")``):

- ``CONTROL_SEQUENCE_START``, ``_END``, ``_READY``: one value, the false or the true entry of
  ``int32_false_true`` (INT32), ``fp32_false_true`` (FP32) or ``bool_false_true`` (BOOL). START is
  true on a request with the START flag, END on one with the END flag, READY on every request from
  a client (false only in the fillers of empty batch slots, ``not_ready``).
- ``CONTROL_SEQUENCE_CORRID``: the request's correlation id in the control's ``data_type``
  (UINT64, INT64, UINT32, INT32 as Triton copies it: the id's low bytes; STRING: the id's text).

Shape ``[1]``, or ``[1, 1]`` when ``max_batch_size > 0`` (Triton's shape with the batch dimension).
The START/END/READY tensors are built once per model, four variants (START and END, each on or
off), and shared by every request (each is copied into the stub's pool with the request).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stubhost import _core
from stubhost.config import ModelConfig, config_dtype_to_triton
from stubhost.config.model_config_pb2 import DataType, ModelSequenceBatching
from stubhost.host.errors import InferenceError
from stubhost.host.sequences import FLAG_SEQUENCE_END, FLAG_SEQUENCE_START
from stubhost.tensor import triton_to_numpy_dtype

Control = ModelSequenceBatching.Control
Entry = tuple[str, Any, int]  # (name, array, Triton dtype): the request tensors' form (RequestChecker)

# Triton adds the overrides in this order, a later one replacing an earlier one of the same name.
_ORDER = (Control.CONTROL_SEQUENCE_START, Control.CONTROL_SEQUENCE_END, Control.CONTROL_SEQUENCE_READY,
          Control.CONTROL_SEQUENCE_CORRID)


def _dtype(config_type: str) -> tuple[np.dtype, int]:
    """numpy dtype and Triton dtype of a config ``TYPE_*`` name (config/dtypes.py, tensor.py)."""
    triton = _core.dtype_from_name(config_dtype_to_triton(config_type))
    return triton_to_numpy_dtype(triton), int(triton)


def _false_true(control: Control) -> tuple[np.dtype, int, tuple[Any, Any]]:
    """The dtype and (false, true) values of a START/END/READY control (validated: one two-entry list)."""
    if control.int32_false_true:
        return (*_dtype("TYPE_INT32"), tuple(control.int32_false_true))
    if control.fp32_false_true:
        return (*_dtype("TYPE_FP32"), tuple(control.fp32_false_true))
    return (*_dtype("TYPE_BOOL"), tuple(control.bool_false_true))


class SequenceControls:
    """The control tensors of one sequence model, made for each request from its correlation id
    and flags. Build it with ``of``, which gives None for a model without control inputs."""

    def __init__(self, model_name: str, config: ModelConfig) -> None:
        self.model_name = model_name
        self.shape = (1, 1) if config.max_batch_size > 0 else (1,)
        self.iterative = bool(config.sequence_batching.iterative_sequence)
        by_kind: dict[int, tuple[str, Control]] = {}
        for control_input in config.sequence_batching.control_input:
            for control in control_input.control:
                by_kind[control.kind] = (control_input.name, control)
        # Four variants, indexed by flags & (START | END): START and END each false or true.
        variants: list[dict[str, Entry]] = [{} for _ in range(4)]
        not_ready: dict[str, Entry] = {}  # a batch slot without a request: every control false
        self._corrid: tuple[str, np.dtype, int, str] | None = None  # name, dtypes, config type name
        for kind in _ORDER:
            if kind not in by_kind:
                continue
            name, control = by_kind[kind]
            if kind == Control.CONTROL_SEQUENCE_CORRID:
                type_name = DataType.Name(control.data_type)
                self._corrid = (name, *_dtype(type_name), type_name)
                for variant in (*variants, not_ready):  # its value is the request's own; its name takes the slot now
                    variant.pop(name, None)
                continue
            dtype, triton, (false, true) = _false_true(control)
            values = [_constant(value, dtype, self.shape) for value in (false, true)]
            for flags, variant in enumerate(variants):
                on = (kind == Control.CONTROL_SEQUENCE_READY or
                      (kind == Control.CONTROL_SEQUENCE_START and flags & FLAG_SEQUENCE_START) or
                      (kind == Control.CONTROL_SEQUENCE_END and flags & FLAG_SEQUENCE_END))
                variant[name] = (name, values[bool(on)], triton)
            not_ready[name] = (name, values[0], triton)
        self._variants = [tuple(v.values()) for v in variants]
        self._not_ready = tuple(not_ready.values())
        self.names = frozenset(name for name, _ in by_kind.values())
        # A control that is also a declared input replaces the client's tensor of that name, as
        # Triton's override inputs do; any other name the client cannot send (the request
        # checker refuses it: "unexpected inference input").
        declared = {i.name for i in config.input}
        self._replaces = self.names & declared

    @classmethod
    def of(cls, model_name: str, config: ModelConfig) -> SequenceControls | None:
        """The controls of a sequence model; None when it configures none (so that its requests
        pay nothing for them)."""
        if not any(ci.control for ci in config.sequence_batching.control_input):
            return None
        return cls(model_name, config)

    def add(self, tensors: list[Entry], correlation_id: int | str, flags: int) -> list[Entry]:
        """The request's checked tensors followed by its control tensors. Raises INVALID_ARG for a
        string correlation id when the CORRID control is numeric."""
        if self._replaces:
            tensors = [t for t in tensors if t[0] not in self._replaces]
        if self.iterative and (correlation_id == 0 or correlation_id == ""):
            # Triton gives a request of an iterative model that has no correlation id a sequence of
            # its own and marks it START (only).
            flags = FLAG_SEQUENCE_START
        controls = self._variants[flags & (FLAG_SEQUENCE_START | FLAG_SEQUENCE_END)]
        if self._corrid is None:
            return [*tensors, *controls]
        return [*tensors, *controls, self._correlation_tensor(correlation_id)]

    def not_ready(self) -> list[Entry]:
        """The controls of a batch slot that has no request (Triton's null request, which the
        sequence batcher's direct strategy adds: sequence_batcher.py): START, END and READY
        false, CORRID 0 (``b""`` for TYPE_STRING)."""
        if self._corrid is None:
            return list(self._not_ready)
        return [*self._not_ready, self._correlation_tensor(0)]

    def _correlation_tensor(self, correlation_id: int | str) -> Entry:
        name, dtype, triton, type_name = self._corrid  # type: ignore[misc]
        if dtype.kind == "O":  # TYPE_STRING: the id's text (an integer id in decimal)
            text = "" if correlation_id == 0 else str(correlation_id)
            return name, np.array([text.encode()], dtype=np.object_).reshape(self.shape), triton
        if isinstance(correlation_id, str):
            if correlation_id:
                raise InferenceError("INVALID_ARG", f"inference request to model '{self.model_name}' must specify an "
                                                    f"integer correlation ID: its control input '{name}' "
                                                    f"(CONTROL_SEQUENCE_CORRID) is {type_name}, got the "
                                                    f"string '{correlation_id}'")
            correlation_id = 0
        # Triton copies the first bytes of the uint64 id (little-endian): the low 32 bits for a
        # 32-bit type, the bits as they are for a signed one.
        unsigned = np.dtype(f"<u{dtype.itemsize}")
        value = np.array([correlation_id & ((1 << 8 * dtype.itemsize) - 1)], unsigned).view(dtype)
        return name, value.reshape(self.shape), triton


def _constant(value: Any, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A one-value array shared by many requests, so read-only."""
    array = np.full(shape, value, dtype)
    array.setflags(write=False)
    return array

