"""Wire-neutral request and response values shared by the HTTP and gRPC front ends.

A codec (``http_codec``, ``grpc_codec``) turns a wire request into an :class:`InferRequest`
and an :class:`InferResult` back into wire bytes; neither knows about models or stubs.
Datatypes are KServe v2 names ("FP32", "BYTES", ...).

The classes have slots: a request builds several of them, and a slotted dataclass is built in
about half the time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class ShmRef:
    """Where a tensor lives in a registered shared-memory region (system or CUDA)."""

    region: str
    byte_size: int
    offset: int = 0


@dataclass(slots=True)
class InputTensor:
    """One input of a request: decoded ``data``, or an ``shm`` reference (never both)."""

    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray | None = None
    shm: ShmRef | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with how it wants it back.

    ``binary_data`` is None when the client did not say (the front end's default applies).
    """

    name: str
    binary_data: bool | None = None
    shm: ShmRef | None = None
    classification: int = 0
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    """A decoded inference request; ``outputs`` empty means every output of the model."""

    model_name: str
    model_version: str = ""
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    inputs: list[InputTensor] = field(default_factory=list)
    outputs: list[RequestedOutput] = field(default_factory=list)
    forwarded: dict[str, str] = field(default_factory=dict)  # headers forwarded as string parameters


@dataclass(slots=True)
class OutputTensor:
    """One output of a result: ``data`` to send, or None when it was written to ``shm``.
    ``binary_data`` None: the client did not say how it wants it (the front end's default)."""

    name: str
    datatype: str
    shape: list[int]
    data: np.ndarray | None = None
    shm: ShmRef | None = None
    binary_data: bool | None = None


@dataclass(slots=True)
class InferResult:
    """A finished inference, ready to be encoded for the wire."""

    model_name: str
    model_version: str
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: list[OutputTensor] = field(default_factory=list)
