"""Inputs that stay in a client's system shared-memory region: zero-copy into the stub.

The front end hands the host a :class:`RegionTensor` instead of an array for an input that lives
in a registered region. The request record then names the region and the offset instead of
carrying the bytes; each stub maps a region once (``REGION_MAP``, by the region's id, before the
first Execute that uses it) and drops the mapping when the client unregisters it
(``REGION_UNMAP``). The stub maps regions read-only: a model cannot write into a client's input.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from stubhost import _core
from stubhost.host.errors import InferenceError
from stubhost.protocol import encode_destination

if TYPE_CHECKING:
    from stubhost.host.stub_process import StubProcess


@dataclass(frozen=True)
class ClientRegion:
    """A registered region as a stub opens it: ``byte_size`` bytes at ``offset`` in the POSIX shm
    object ``key``; ``id`` is unique per registration. A CUDA region (``kind == "cuda"``) is
    instead the allocation its ``raw_handle`` (a cudaIpcMemHandle_t) names on ``device_id``."""

    id: int
    key: str
    offset: int
    byte_size: int
    kind: str = "system"
    raw_handle: bytes = b""
    device_id: int = 0

    def map_payload(self) -> dict[str, Any]:
        """What REGION_MAP tells a stub about this region."""
        if self.kind == "cuda":
            return {"id": self.id, "kind": "cuda", "raw_handle": base64.b64encode(self.raw_handle).decode(),
                    "device_id": self.device_id, "byte_size": self.byte_size}
        return {"id": self.id, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class RegionTensor:
    """An input tensor whose bytes are ``byte_size`` bytes at ``offset`` in ``region``.

    Duck-types the parts of an array that request checking reads (``dtype``, ``shape``,
    ``reshape``). The parent never sends the bytes: the stub reads them through its mapping.
    ``view``, when the front end has the region mapped, is its read-only view of those bytes:
    the response cache hashes them (host/response_cache.py).
    """

    __slots__ = ("region", "offset", "byte_size", "dtype", "shape", "view")

    def __init__(self, region: ClientRegion, offset: int, byte_size: int, dtype: Any,
                 shape: tuple[int, ...], view: memoryview | None = None) -> None:
        self.region = region
        self.offset = offset
        self.byte_size = byte_size
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(d) for d in shape)
        self.view = view

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    def reshape(self, shape: tuple[int, ...]) -> RegionTensor:
        """The same bytes seen with another shape of the same element count."""
        if math.prod(shape) != math.prod(self.shape):
            raise ValueError(f"cannot reshape {self.shape} to {tuple(shape)}")
        return RegionTensor(self.region, self.offset, self.byte_size, self.dtype, tuple(shape), self.view)

    def __repr__(self) -> str:
        return (f"RegionTensor(region={self.region.id}, offset={self.offset}, byte_size={self.byte_size}, "
                f"dtype={self.dtype}, shape={self.shape})")


@dataclass(frozen=True)
class RegionDestination:
    """A requested output the stub should write straight into ``byte_size`` bytes at ``offset``
    in ``region`` (its one copy), instead of returning it through the pool."""

    name: str
    region: ClientRegion
    offset: int
    byte_size: int


@dataclass(frozen=True)
class RegionOutput:
    """An output the stub wrote into a client's region: where, and what it holds."""

    region_id: int
    offset: int
    byte_size: int
    shape: tuple[int, ...]
    dtype: int


def region_entry(process: StubProcess, tensor: tuple[str, Any, int]) -> tuple[Any, ...]:
    """The record entry of an input in a client region: named, not copied, once the stub
    has been asked to map the region (ahead of this request in its queue)."""
    name, value, dtype = tensor
    try:
        process.map_region(value.region)
    except (TimeoutError, _core.CoreError) as e:
        raise InferenceError("UNAVAILABLE", f"cannot send input '{name}' to instance "
                                            f"'{process.instance_name}': {e}") from None
    region = value.region
    if region.kind == "cuda":  # a GPU tensor: the record names the region and the device
        return (name, value.shape, dtype, region.id, value.offset, value.byte_size, region.device_id)
    return (name, value.shape, dtype, region.id, value.offset, value.byte_size)


def destination_text(process: StubProcess, output: RegionDestination) -> str:
    """The requested-output string of an output the stub writes into a client region."""
    try:
        process.map_region(output.region)
    except (TimeoutError, _core.CoreError) as e:
        raise InferenceError("UNAVAILABLE", f"cannot send output '{output.name}' to instance "
                                            f"'{process.instance_name}': {e}") from None
    return encode_destination(output.name, output.region.id, output.offset, output.byte_size)
