"""The stub's GPU side: client CUDA regions it maps, GPU inputs it hands to the model, GPU
outputs it places.

Nothing here runs, and CUDA is never loaded, until the parent maps a CUDA region or a model
returns a GPU tensor, so CPU-only models pay nothing.

- **Regions.** ``REGION_MAP`` of a CUDA region opens the client's IPC handle (once per
  allocation, through the process's :class:`~stubhost.gpu.ipc_cache.IpcHandleCache`). The opening
  lives as long as the map entry and every GPU tensor a model still holds that views it.
- **Inputs.** A request tensor described as a :class:`~stubhost.gpu.layout.GpuRegionRef` becomes a
  ``pb_utils.Tensor`` over the region's device memory, with no copy, when the model's
  ``FORCE_CPU_ONLY_INPUT_TENSORS`` parameter is ``"no"``; by default (``"yes"``, as in Triton) the
  stub copies it to host memory once and the model sees a numpy array.
- **Outputs.** A GPU output bound for a client CUDA region is copied there device to device (its
  one copy); bound for a system region or returned through the pool, it is copied to the host once.
- **BLS.** GPU inputs of a BLS request are copied to the host once (the request travels through
  the pool); outputs a model asked for on the GPU (``preferred_memory``) are copied to a device
  allocation of the stub's, freed when the model's last view of them dies.
"""

from __future__ import annotations

import base64
import threading
import weakref
from typing import Any

import numpy as np

from stubhost import _core
from stubhost.backend_utils.errors import TritonModelException
from stubhost.gpu import cuda
from stubhost.backend_utils.tensor import Tensor
from stubhost.gpu.device_memory import upload
from stubhost.gpu.ipc_cache import shared_cache
from stubhost.gpu.layout import GpuBufferRef, GpuRegionRef, describe
from stubhost.tensor import storage_dtype

__all__ = ["CudaTarget", "StubGpu", "force_cpu_only_inputs", "host_entry", "on_gpu"]

_BYTES = int(_core.DataType.BYTES)


def force_cpu_only_inputs(config: dict[str, Any]) -> bool:
    """The model's ``FORCE_CPU_ONLY_INPUT_TENSORS`` parameter: True unless it says ``"no"``."""
    entry = (config.get("parameters") or {}).get("FORCE_CPU_ONLY_INPUT_TENSORS")
    value = str((entry or {}).get("string_value", "yes")).strip().lower()
    if value not in ("yes", "no"):
        raise TritonModelException(f"the model parameter FORCE_CPU_ONLY_INPUT_TENSORS must be 'yes' or 'no', "
                                   f"got '{value}'")
    return value == "yes"


def to_host(ptr: int, nbytes: int, dtype: int, shape: tuple[int, ...], device_id: int) -> np.ndarray:
    """A host copy of `nbytes` of device memory at `ptr`, as an array."""
    host = np.empty(nbytes, dtype=np.uint8)
    cuda.runtime().copy(host.ctypes.data, ptr, nbytes, device_id)
    return host.view(storage_dtype(_core.DataType(dtype))).reshape(shape)


def host_entry(tensor: Tensor) -> tuple[str, np.ndarray, int]:
    """The record entry of a GPU tensor that leaves through the pool: copied to the host once."""
    view = tensor._array
    return (tensor._name, to_host(view.ptr, view.byte_size, tensor._dtype, tuple(view.shape), view.device_id),
            tensor._dtype)


def on_gpu(tensors: list[Tensor], device_id: int) -> list[Tensor]:
    """BLS outputs a model asked to get on the GPU (``preferred_memory``): each numeric tensor is
    copied to a new device allocation that its view keeps alive. Without a usable GPU, or for
    BYTES, they stay on the CPU: the memory type is a preference, as in Triton."""
    if cuda.unavailable_reason() is not None:
        return tensors
    moved = []
    for t in tensors:
        if t._dtype == _BYTES or not t.is_cpu():
            moved.append(t)
            continue
        owner, ptr = upload(t._array, device_id)
        view = _core.gpu_view(owner, ptr, _core.DataType(t._dtype), list(t._array.shape), device_id)
        moved.append(Tensor._wrap(t._name, t._dtype, view))
    return moved


class _OpenedRegion:
    """One CUDA region this stub opened; the handle is released when the object dies (after the
    region is unmapped and the last tensor viewing it is gone)."""

    __slots__ = ("ptr", "byte_size", "device_id", "__weakref__")

    def __init__(self, raw: bytes, device_id: int, byte_size: int) -> None:
        cache = shared_cache()
        self.ptr = cache.acquire(raw, device_id)
        self.byte_size = byte_size
        self.device_id = device_id
        weakref.finalize(self, cache.release, raw, device_id)

    def address(self, offset: int, nbytes: int, name: str) -> int:
        if offset < 0 or nbytes < 0 or offset > self.byte_size or nbytes > self.byte_size - offset:
            raise _core.FormatError(f"tensor '{name}' runs past the end of its CUDA shared memory region")
        return self.ptr + offset


class CudaTarget:
    """A client CUDA region as an output destination (stands in the stub's ``targets`` beside
    the memoryviews of system regions)."""

    __slots__ = ("region",)

    def __init__(self, region: _OpenedRegion) -> None:
        self.region = region

    def __len__(self) -> int:
        return self.region.byte_size

    def write(self, offset: int, source: Any, nbytes: int, name: str) -> None:
        """Copies an output's bytes (a GPU view or a host array) to `offset`: device to device or
        host to device, once."""
        dst = self.region.address(offset, nbytes, name)
        if isinstance(source, _core.GpuView):
            src = source.ptr
        else:
            source = np.ascontiguousarray(source)
            src = source.ctypes.data
        cuda.runtime().copy(dst, src, nbytes, self.region.device_id)


class StubGpu:
    """The GPU state of one stub; made when first needed."""

    def __init__(self, force_cpu_inputs: bool = True) -> None:
        self.force_cpu_inputs = force_cpu_inputs
        self.regions: dict[int, _OpenedRegion] = {}
        self._lock = threading.Lock()

    def map_region(self, payload: dict[str, Any]) -> CudaTarget:
        """Opens the CUDA region a REGION_MAP payload names; returns it as an output target."""
        raw = base64.b64decode(str(payload["raw_handle"]), validate=True)
        region = _OpenedRegion(raw, int(payload["device_id"]), int(payload["byte_size"]))
        with self._lock:
            self.regions[int(payload["id"])] = region
        return CudaTarget(region)

    def unmap_region(self, region_id: int) -> None:
        """Forgets a region; tensors a model still holds keep the opening alive."""
        with self._lock:
            self.regions.pop(region_id, None)

    def input_tensor(self, name: str, dtype: int, description: tuple[Any, ...]) -> tuple[str, int, Any]:
        """(name, dtype, array or GPU view) of an input described as a GPU tensor."""
        ref = describe(description)
        if isinstance(ref, GpuBufferRef):
            raise _core.FormatError(f"input '{name}' names a GPU buffer; inputs come from CUDA regions only")
        assert isinstance(ref, GpuRegionRef)
        region = self.regions.get(ref.region)
        if region is None:
            raise _core.FormatError(f"tensor '{name}' names CUDA region {ref.region}, which is not mapped")
        ptr = region.address(ref.offset, ref.byte_size, name)
        if self.force_cpu_inputs:
            return name, dtype, to_host(ptr, ref.byte_size, dtype, ref.shape, ref.device_id)
        return name, dtype, _core.gpu_view(region, ptr, _core.DataType(dtype), list(ref.shape), ref.device_id)
