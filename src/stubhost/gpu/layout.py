"""How a GPU tensor is named in an inference record, on the Python side.

A record never carries GPU bytes, only where they are (see docs/design/protocol.md):

- :class:`GpuRegionRef`: bytes at ``offset`` in a client's CUDA shared-memory region, which the
  reader opened when the parent mapped the region (by the region's id);
- :class:`GpuBufferRef`: bytes at ``offset`` in an allocation of the writer's, named by its
  64-byte ``cudaIpcMemHandle_t``; ``buffer_id`` is the owner's name for it, sent back when the
  reader is done so that the owner frees it exactly once (see :mod:`stubhost.gpu.exported`).

``_core.read_record`` describes both as tagged tuples; :func:`describe` turns those into these
classes. Only the region form is written today (by the parent, for inputs in CUDA regions); the
exported form is read and refused until GPU tensors pass between stubs (docs/gpu.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stubhost.gpu.cuda import CUDA_IPC_HANDLE_SIZE

__all__ = ["GpuBufferRef", "GpuRegionRef", "describe", "is_gpu_description"]

_REGION_TAG = "cuda_region"
_BUFFER_TAG = "cuda_ipc"


@dataclass(frozen=True, slots=True)
class GpuRegionRef:
    """A GPU tensor in a client's CUDA region: ``byte_size`` bytes at ``offset`` of region ``region``."""

    region: int
    offset: int
    byte_size: int
    shape: tuple[int, ...]
    device_id: int


@dataclass(frozen=True, slots=True)
class GpuBufferRef:
    """A GPU tensor in an allocation its writer exported: ``byte_size`` bytes at ``offset`` past
    the base the IPC handle names; ``buffer_id`` is returned to the owner when the reader is done."""

    raw_handle: bytes
    offset: int
    byte_size: int
    shape: tuple[int, ...]
    device_id: int
    buffer_id: int

    def __post_init__(self) -> None:
        if len(self.raw_handle) != CUDA_IPC_HANDLE_SIZE:
            raise ValueError(f"a CUDA IPC handle has {CUDA_IPC_HANDLE_SIZE} bytes, got {len(self.raw_handle)}")


def is_gpu_description(value: Any) -> bool:
    """True for what read_record gives in place of an array for a GPU tensor."""
    return type(value) is tuple and bool(value) and value[0] in (_REGION_TAG, _BUFFER_TAG)


def describe(value: tuple[Any, ...]) -> GpuRegionRef | GpuBufferRef:
    """The reference a read_record description of a GPU tensor stands for."""
    tag = value[0]
    if tag == _REGION_TAG:
        _, region, offset, byte_size, shape, device_id = value
        return GpuRegionRef(int(region), int(offset), int(byte_size), tuple(shape), int(device_id))
    if tag == _BUFFER_TAG:
        _, raw, offset, byte_size, shape, device_id, buffer_id = value
        return GpuBufferRef(bytes(raw), int(offset), int(byte_size), tuple(shape), int(device_id), int(buffer_id))
    raise ValueError(f"not a GPU tensor description: {tag!r}")
