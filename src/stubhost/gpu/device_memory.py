"""A device allocation owned by Python objects: freed exactly once, when its last user is gone.

Used where the stub itself makes GPU memory for a model, e.g. BLS outputs a model asked to get
on the GPU (``preferred_memory``): the tensors handed to the model are views that keep their
:class:`DeviceAllocation` alive, and the allocation goes back to CUDA when the last view dies or
when :meth:`DeviceAllocation.free` is called, whichever comes first, and never twice.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Protocol

__all__ = ["AllocRuntime", "DeviceAllocation", "upload"]


class AllocRuntime(Protocol):
    """The CUDA calls an allocation needs."""

    def malloc(self, nbytes: int, device_id: int) -> int: ...

    def free(self, ptr: int, device_id: int) -> None: ...


def _free_once(runtime: AllocRuntime, ptr: int, device_id: int, state: list[bool], lock: threading.Lock) -> None:
    with lock:
        if state[0]:
            return
        state[0] = True
    runtime.free(ptr, device_id)


class DeviceAllocation:
    """``nbytes`` of device memory on ``device_id`` at ``ptr``."""

    __slots__ = ("ptr", "nbytes", "device_id", "_finalizer", "__weakref__")

    def __init__(self, nbytes: int, device_id: int, runtime: AllocRuntime | None = None) -> None:
        if runtime is None:
            from stubhost.gpu import cuda

            runtime = cuda.runtime()
        self.nbytes = nbytes
        self.device_id = device_id
        self.ptr = runtime.malloc(max(nbytes, 1), device_id)  # a 0-byte tensor still needs an address
        self._finalizer = weakref.finalize(self, _free_once, runtime, self.ptr, device_id, [False],
                                           threading.Lock())

    @property
    def alive(self) -> bool:
        """False once the memory went back to CUDA."""
        return self._finalizer.alive

    def free(self) -> None:
        """Gives the memory back now (a later call, or the object's death, frees nothing more)."""
        self._finalizer()

    def __repr__(self) -> str:
        state = "live" if self.alive else "freed"
        return f"DeviceAllocation({self.nbytes} bytes on device {self.device_id} at {self.ptr:#x}, {state})"


def upload(array: Any, device_id: int, runtime: Any = None) -> tuple[DeviceAllocation, int]:
    """A new allocation holding a copy of the host array (one host-to-device copy): (owner, ptr)."""
    import numpy as np

    if runtime is None:
        from stubhost.gpu import cuda

        runtime = cuda.runtime()
    host = np.ascontiguousarray(array)
    owner = DeviceAllocation(host.nbytes, device_id, runtime)
    try:
        runtime.copy(owner.ptr, host.ctypes.data, host.nbytes, device_id)
    except BaseException:
        owner.free()
        raise
    return owner, owner.ptr
