"""The few CUDA runtime calls stubhost needs: devices, IPC handles, allocations and copies.

Two backends, tried in order: cupy (``cupy.cuda.runtime``) and a cffi ABI binding to
``libcudart``; the driver (``libcuda``) answers which allocation a pointer lies in. Nothing is
loaded until first use, and a machine without a GPU gets :func:`unavailable_reason` instead of an
import error.
"""

from __future__ import annotations

import threading
from typing import Any

CUDA_IPC_HANDLE_SIZE = 64
_IPC_LAZY_ENABLE_PEER_ACCESS = 1
_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the direction follows from the pointers (unified addressing)

_CDEF = """
typedef struct { char reserved[64]; } cudaIpcMemHandle_t;
int cudaGetDeviceCount(int* count);
int cudaSetDevice(int device);
int cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* devPtr);
int cudaIpcOpenMemHandle(void** devPtr, cudaIpcMemHandle_t handle, unsigned int flags);
int cudaIpcCloseMemHandle(void* devPtr);
int cudaMalloc(void** devPtr, size_t size);
int cudaFree(void* devPtr);
int cudaMemcpy(void* dst, const void* src, size_t count, int kind);
int cudaMemset(void* devPtr, int value, size_t count);
int cudaDeviceSynchronize(void);
int cudaMemGetInfo(size_t* free, size_t* total);
const char* cudaGetErrorString(int error);
"""
_DRIVER_CDEF = "int cuMemGetAddressRange_v2(unsigned long long* pbase, size_t* psize, unsigned long long dptr);"
_RUNTIME_NAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0")


class CudaError(RuntimeError):
    """A CUDA call failed (the message names the call and CUDA's reason)."""


class _Runtime:
    """The loaded backend: the same operations whichever library provides them."""

    def __init__(self) -> None:
        self.backend = ""
        self._cupy: Any = None
        self._ffi: Any = None
        self._lib: Any = None
        self._driver: Any = None
        import cffi

        try:
            driver_ffi = cffi.FFI()
            driver_ffi.cdef(_DRIVER_CDEF)
            self._driver = (driver_ffi, driver_ffi.dlopen("libcuda.so.1"))
        except OSError:
            self._driver = None
        try:
            import cupy  # the [gpu] extra

            self._cupy = cupy
            self.backend = "cupy"
            return
        except ImportError:
            pass
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

    def _check(self, call: str, status: int) -> None:
        if status != 0:
            reason = self._ffi.string(self._lib.cudaGetErrorString(status)).decode()
            raise CudaError(f"{call} failed: {reason} ({status})")

    def _device(self, device_id: int) -> None:
        self._check("cudaSetDevice", self._lib.cudaSetDevice(device_id))

    def device_count(self) -> int:
        """Number of CUDA devices this process can use."""
        if self._cupy is not None:
            return int(self._cupy.cuda.runtime.getDeviceCount())
        count = self._ffi.new("int*")
        self._check("cudaGetDeviceCount", self._lib.cudaGetDeviceCount(count))
        return int(count[0])

    def ipc_handle(self, base: int, device_id: int) -> bytes:
        """The cudaIpcMemHandle_t of the allocation starting at `base`."""
        if self._cupy is not None:
            with self._cupy.cuda.Device(device_id):
                return bytes(self._cupy.cuda.runtime.ipcGetMemHandle(base))
        self._device(device_id)
        handle = self._ffi.new("cudaIpcMemHandle_t*")
        self._check("cudaIpcGetMemHandle", self._lib.cudaIpcGetMemHandle(handle, self._ffi.cast("void*", base)))
        return bytes(self._ffi.buffer(handle, CUDA_IPC_HANDLE_SIZE))

    def open_ipc(self, raw_handle: bytes, device_id: int) -> int:
        """Opens another process's allocation; returns its base pointer here."""
        if self._cupy is not None:
            with self._cupy.cuda.Device(device_id):
                return int(self._cupy.cuda.runtime.ipcOpenMemHandle(raw_handle, _IPC_LAZY_ENABLE_PEER_ACCESS))
        self._device(device_id)
        handle = self._ffi.new("cudaIpcMemHandle_t*")
        self._ffi.memmove(handle, raw_handle, CUDA_IPC_HANDLE_SIZE)
        ptr = self._ffi.new("void**")
        self._check("cudaIpcOpenMemHandle", self._lib.cudaIpcOpenMemHandle(ptr, handle[0], _IPC_LAZY_ENABLE_PEER_ACCESS))
        return int(self._ffi.cast("unsigned long long", ptr[0]))

    def close_ipc(self, ptr: int, device_id: int) -> None:
        """Closes what open_ipc opened."""
        if self._cupy is not None:
            with self._cupy.cuda.Device(device_id):
                self._cupy.cuda.runtime.ipcCloseMemHandle(ptr)
            return
        self._device(device_id)
        self._check("cudaIpcCloseMemHandle", self._lib.cudaIpcCloseMemHandle(self._ffi.cast("void*", ptr)))

    def address_range(self, ptr: int, device_id: int) -> tuple[int, int]:
        """(base, size) of the allocation `ptr` lies in."""
        if self._driver is None:
            raise CudaError("the CUDA driver library (libcuda.so.1) is not available")
        self.use(device_id)  # the driver call needs the device's context current
        ffi, lib = self._driver
        base, size = ffi.new("unsigned long long*"), ffi.new("size_t*")
        status = lib.cuMemGetAddressRange_v2(base, size, ptr)
        if status != 0:
            raise CudaError(f"cuMemGetAddressRange failed for pointer {ptr:#x} ({status})")
        return int(base[0]), int(size[0])

    def allocation_size(self, ptr: int, device_id: int = 0) -> int | None:
        """Bytes from `ptr` to the end of its allocation, or None when the driver cannot tell."""
        try:
            base, size = self.address_range(ptr, device_id)
        except CudaError:
            return None
        return base + size - ptr

    def copy(self, dst: int, src: int, nbytes: int, device_id: int) -> None:
        """Copies `nbytes` between any two of host and device memory and waits until it is done
        (a device-to-device cudaMemcpy returns before the copy ends; the peer reads right after)."""
        if nbytes <= 0:
            return
        if self._cupy is not None:
            with self._cupy.cuda.Device(device_id):
                self._cupy.cuda.runtime.memcpy(dst, src, nbytes, _MEMCPY_DEFAULT)
                self._cupy.cuda.runtime.deviceSynchronize()
            return
        self._device(device_id)
        self._check("cudaMemcpy", self._lib.cudaMemcpy(self._ffi.cast("void*", dst), self._ffi.cast("void*", src),
                                                       nbytes, _MEMCPY_DEFAULT))
        self._check("cudaDeviceSynchronize", self._lib.cudaDeviceSynchronize())

    def use(self, device_id: int) -> None:
        """Makes the device (and its primary context) current for this thread."""
        if self._cupy is not None:
            self._cupy.cuda.runtime.setDevice(device_id)
            return
        self._device(device_id)

    def malloc(self, nbytes: int, device_id: int) -> int:
        """A new device allocation of `nbytes` (free it with :meth:`free`)."""
        if self._cupy is not None:
            with self._cupy.cuda.Device(device_id):
                return int(self._cupy.cuda.runtime.malloc(nbytes))
        self._device(device_id)
        ptr = self._ffi.new("void**")
        self._check("cudaMalloc", self._lib.cudaMalloc(ptr, nbytes))
        return int(self._ffi.cast("unsigned long long", ptr[0]))

    def free(self, ptr: int, device_id: int) -> None:
        """Frees what :meth:`malloc` allocated."""
        if self._cupy is not None:
            with self._cupy.cuda.Device(device_id):
                self._cupy.cuda.runtime.free(ptr)
            return
        self._device(device_id)
        self._check("cudaFree", self._lib.cudaFree(self._ffi.cast("void*", ptr)))

    def mem_get_info(self, device_id: int) -> tuple[int, int]:
        """(free, total) bytes of device memory."""
        if self._cupy is not None:
            with self._cupy.cuda.Device(device_id):
                free, total = self._cupy.cuda.runtime.memGetInfo()
                return int(free), int(total)
        self._device(device_id)
        free, total = self._ffi.new("size_t*"), self._ffi.new("size_t*")
        self._check("cudaMemGetInfo", self._lib.cudaMemGetInfo(free, total))
        return int(free[0]), int(total[0])


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
    """A client's CUDA region as the parent holds it: opened from its cudaIpcMemHandle_t at
    registration (through the process's shared :class:`~stubhost.gpu.ipc_cache.IpcHandleCache`,
    so one allocation registered under two names is opened once), checked against the
    allocation's real size, and closed once by :meth:`close`."""

    def __init__(self, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        if len(raw_handle) != CUDA_IPC_HANDLE_SIZE:
            raise ValueError(f"a CUDA IPC handle has {CUDA_IPC_HANDLE_SIZE} bytes, got {len(raw_handle)}")
        rt = runtime()
        count = rt.device_count()
        if not 0 <= device_id < count:
            raise ValueError(f"device {device_id} does not exist (this machine has {count} CUDA devices)")
        from stubhost.gpu.ipc_cache import shared_cache

        self.raw_handle = bytes(raw_handle)
        self.device_id = device_id
        self.byte_size = byte_size
        self.ptr = shared_cache().acquire(self.raw_handle, device_id)
        self._open = True
        available = rt.allocation_size(self.ptr, device_id)
        if available is not None and available < byte_size:
            self.close()
            raise ValueError(f"the allocation behind the handle holds {available} bytes, fewer than {byte_size}")

    def read(self, offset: int, out: Any) -> None:
        """Copies bytes at `offset` into the writable host buffer `out` (device to host)."""
        import numpy as np
        host = np.frombuffer(memoryview(out).cast("B"), dtype=np.uint8)
        self._bounds(offset, host.nbytes)
        runtime().copy(host.ctypes.data, self.ptr + offset, host.nbytes, self.device_id)

    def write(self, offset: int, data: Any) -> None:
        """Copies the host bytes `data` to `offset` (host to device)."""
        import numpy as np
        host = np.ascontiguousarray(np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8))
        self._bounds(offset, host.nbytes)
        runtime().copy(self.ptr + offset, host.ctypes.data, host.nbytes, self.device_id)

    def _bounds(self, offset: int, nbytes: int) -> None:
        if offset < 0 or nbytes < 0 or offset > self.byte_size or nbytes > self.byte_size - offset:
            raise ValueError(f"[{offset}, +{nbytes}) lies outside the region of {self.byte_size} bytes")

    def close(self) -> None:
        """Gives up this registration's opening (the handle closes with its last user)."""
        if self._open:
            self._open = False
            from stubhost.gpu.ipc_cache import shared_cache

            shared_cache().release(self.raw_handle, self.device_id)


def cuda_opener() -> Any:
    """The registry's CUDA opener when a GPU is usable here, else None (registration then fails
    with Triton's "GPUs not supported")."""
    if unavailable_reason() is not None:
        return None
    return IpcMemory


def device_ids() -> list[int]:
    """The CUDA devices usable here (empty without a GPU)."""
    try:
        return list(range(runtime().device_count()))
    except CudaError:
        return []
