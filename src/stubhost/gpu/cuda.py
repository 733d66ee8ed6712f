"""The few CUDA runtime calls stubhost needs: device count, IPC handles and copies.

Two backends, tried in order: cupy (``cupy.cuda.runtime``) and a cffi ABI binding to
``libcudart`` (plus ``libcuda`` for the size of an allocation). Nothing is loaded until first
use, and a machine without a GPU gets :func:`unavailable_reason` instead of an import error.
"""

from __future__ import annotations

import threading
from typing import Any

CUDA_IPC_HANDLE_SIZE = 64
_IPC_LAZY_ENABLE_PEER_ACCESS = 1
_MEMCPY_HOST_TO_DEVICE = 1
_MEMCPY_DEVICE_TO_HOST = 2

_CDEF = """
typedef struct { char reserved[64]; } cudaIpcMemHandle_t;
int cudaGetDeviceCount(int* count);
int cudaSetDevice(int device);
int cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle, unsigned int flags);
int cudaIpcCloseMemHandle(void* devPtr);
int cudaMemcpy(void* dst, const void* src, size_t count, int kind);
const char* cudaGetErrorString(int error);
"""
_DRIVER_CDEF = "int cuMemGetAddressRange_v2(unsigned long long* pbase, size_t* psize, unsigned long long dptr);"
_RUNTIME_NAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0")


class CudaError(RuntimeError):
    """A CUDA call failed (the message names the call and CUDA's reason)."""


class _Runtime:
    """The loaded backend: the same five operations whichever library provides them."""

    def __init__(self) -> None:
        self.backend = ""
        self._cupy: Any = None
        self._ffi: Any = None
        self._lib: Any = None
        self._driver: Any = None
        try:
            import cupy  # the [gpu] extra

            self._cupy = cupy
            self.backend = "cupy"
            return
        except ImportError:
            pass
        import cffi

        ffi = cffi.FFI()
        ffi.cdef(_CDEF)
        errors = []
        for name in _RUNTIME_NAMES:
            try:
                self._lib = ffi.dlopen(name)
                break
            except OSError as e:
                errors.append(str(e))
        if self._lib is None:
            raise CudaError("no CUDA runtime library found (" + "; ".join(errors[:1]) + ")")
        self._ffi = ffi
        self.backend = "cffi"
        try:
            driver_ffi = cffi.FFI()
            driver_ffi.cdef(_DRIVER_CDEF)
            self._driver = (driver_ffi, driver_ffi.dlopen("libcuda.so.1"))
        except OSError:
            self._driver = None

    def _check(self, call: str, status: int) -> None:
        if status != 0:
            reason = self._ffi.string(self._lib.cudaGetErrorString(status)).decode()
            raise CudaError(f"{call} failed: {reason} ({status})")

    def device_count(self) -> int:
        if self._cupy is not None:
            return int(self._cupy.cuda.runtime.getDeviceCount())
        count = self._ffi.new("int*")
        self._check("cudaGetDeviceCount", self._lib.cudaGetDeviceCount(count))
        return int(count[0])

    def open_ipc(self, raw_handle: bytes, device_id: int) -> int:
        if self._cupy is not None:
            with self._cupy.cuda.Device(device_id):
                return int(self._cupy.cuda.runtime.ipcOpenMemHandle(raw_handle, _IPC_LAZY_ENABLE_PEER_ACCESS))
        self._check("cudaSetDevice", self._lib.cudaSetDevice(device_id))
        handle = self._ffi.new("cudaIpcMemHandle_t*")
        self._ffi.memmove(handle, raw_handle, CUDA_IPC_HANDLE_SIZE)
        ptr = self._ffi.new("void**")
        self._check("cudaIpcOpenMemHandle", self._lib.cudaIpcOpenMemHandle(ptr, handle[0], _IPC_LAZY_ENABLE_PEER_ACCESS))
        return int(self._ffi.cast("unsigned long long", ptr[0]))

    def close_ipc(self, ptr: int, device_id: int) -> None:
        if self._cupy is not None:
            with self._cupy.cuda.Device(device_id):
                self._cupy.cuda.runtime.ipcCloseMemHandle(ptr)
            return
        self._check("cudaSetDevice", self._lib.cudaSetDevice(device_id))
        self._check("cudaIpcCloseMemHandle", self._lib.cudaIpcCloseMemHandle(self._ffi.cast("void*", ptr)))

    def allocation_size(self, ptr: int) -> int | None:
        """Bytes from `ptr` to the end of its allocation, or None when the driver cannot tell."""
        if self._cupy is not None:
            base, size = self._cupy.cuda.driver.memGetAddressRange(ptr)
            return int(base + size - ptr)
        if self._driver is None:
            return None
        ffi, lib = self._driver
        base, size = ffi.new("unsigned long long*"), ffi.new("size_t*")
        if lib.cuMemGetAddressRange_v2(base, size, ptr) != 0:
            return None
        return int(base[0] + size[0] - ptr)

    def copy(self, dst: int, src: int, nbytes: int, to_device: bool, device_id: int) -> None:
        kind = _MEMCPY_HOST_TO_DEVICE if to_device else _MEMCPY_DEVICE_TO_HOST
        if self._cupy is not None:
            with self._cupy.cuda.Device(device_id):
                self._cupy.cuda.runtime.memcpy(dst, src, nbytes, kind)
            return
        self._check("cudaSetDevice", self._lib.cudaSetDevice(device_id))
        self._check("cudaMemcpy", self._lib.cudaMemcpy(self._ffi.cast("void*", dst), self._ffi.cast("void*", src),
                                                       nbytes, kind))


_runtime: _Runtime | None = None
_failure: str | None = None
_lock = threading.Lock()


def runtime() -> _Runtime:
    """The loaded CUDA runtime; raises CudaError (with the reason) where there is none."""
    global _runtime, _failure
    with _lock:
        if _runtime is None and _failure is None:
            try:
                loaded = _Runtime()
                if loaded.device_count() < 1:
                    raise CudaError("no CUDA device found")
                _runtime = loaded
            except Exception as e:  # any failure to load means: no usable GPU here
                _failure = str(e) or type(e).__name__
        if _runtime is None:
            raise CudaError(_failure or "CUDA is not available")
        return _runtime


def unavailable_reason() -> str | None:
    """Why no GPU can be used here, or None when one can."""
    try:
        runtime()
    except CudaError as e:
        return str(e)
    return None


class IpcMemory:
    """Device memory of another process, opened from its cudaIpcMemHandle_t; close() once."""

    def __init__(self, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        if len(raw_handle) != CUDA_IPC_HANDLE_SIZE:
            raise ValueError(f"a CUDA IPC handle has {CUDA_IPC_HANDLE_SIZE} bytes, got {len(raw_handle)}")
        rt = runtime()
        count = rt.device_count()
        if not 0 <= device_id < count:
            raise ValueError(f"device {device_id} does not exist (this machine has {count} CUDA devices)")
        self.device_id = device_id
        self.byte_size = byte_size
        self.ptr = rt.open_ipc(raw_handle, device_id)
        self._open = True
        available = rt.allocation_size(self.ptr)
        if available is not None and available < byte_size:
            self.close()
            raise ValueError(f"the allocation behind the handle holds {available} bytes, fewer than {byte_size}")

    def read(self, offset: int, out: Any) -> None:
        """Copies bytes at `offset` into the writable host buffer `out` (device to host)."""
        view = memoryview(out).cast("B")
        self._bounds(offset, len(view))
        import numpy as np
        host = np.frombuffer(view, dtype=np.uint8)
        runtime().copy(host.ctypes.data, self.ptr + offset, len(view), False, self.device_id)

    def write(self, offset: int, data: Any) -> None:
        """Copies the host bytes `data` to `offset` (host to device)."""
        import numpy as np
        host = np.ascontiguousarray(np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8))
        self._bounds(offset, host.nbytes)
        runtime().copy(self.ptr + offset, host.ctypes.data, host.nbytes, True, self.device_id)

    def _bounds(self, offset: int, nbytes: int) -> None:
        if offset < 0 or nbytes < 0 or offset > self.byte_size or nbytes > self.byte_size - offset:
            raise ValueError(f"[{offset}, +{nbytes}) lies outside the region of {self.byte_size} bytes")

    def close(self) -> None:
        """Closes the IPC mapping (once)."""
        if self._open:
            self._open = False
            runtime().close_ipc(self.ptr, self.device_id)


def cuda_opener() -> Any:
    """The registry's CUDA opener when a GPU is usable here, else None (registration then fails
    with Triton's "GPUs not supported")."""
    if unavailable_reason() is not None:
        return None
    return IpcMemory
