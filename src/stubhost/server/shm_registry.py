"""The registry of clients' shared-memory regions: Triton's system and CUDA shared-memory extensions.

One :class:`SharedMemoryRegistry` per server. Clients register regions by name (the KServe v2
``systemsharedmemory`` / ``cudasharedmemory`` endpoints) and then name them in inference requests
(``shared_memory_region``, ``shared_memory_offset``, ``shared_memory_byte_size``); the front ends
turn those into :class:`~stubhost.server.types.ShmRef` values and call :meth:`acquire`.

Semantics follow Triton's ``SharedMemoryManager`` (triton-inference-server/server,
``src/shared_memory_manager.cc``), including its error codes and wording:

- System and CUDA regions share one namespace of names; registering a taken name fails with
  ALREADY_EXISTS whatever the kind.
- A system region is opened like Triton does: ``shm_open(key, O_RDWR)`` (glibc drops the leading
  slashes, so "/input_data" and "input_data" name the same object, refuses a '/' inside the name and
  does not follow symbolic links), then ``offset + byte_size`` is checked against the object's size
  and the window is mapped shared, read-write.
- Offsets in a :class:`ShmRef` are relative to the registered region (registration offset + ref
  offset in the object). As in Triton, ``offset`` must be below the region's size even for an empty
  window, and the arithmetic is checked without overflow, values beyond uint64 included.
- Unregistering a name that is not registered (or is registered as the other kind) is a no-op
  success, as in Triton; status of an unknown name is NOT_FOUND.
- Keys of stubhost's own pool segments (basename starting with ``stubhost_``, plus any prefix the
  server adds) are refused before anything is opened, and so is an object that is a hard link to
  such a segment; the message never repeats the key (ARCHITECTURE §5).

In-flight safety (a deliberate difference from Triton): :meth:`acquire` returns a
:class:`RegionLease` and counts it on the region. Unregistering removes the *name* at once: status
no longer lists it, new acquires fail NOT_FOUND and the name can be registered again, while the
*mapping* (or the opened CUDA handle) is closed only when the last lease on it is released. Triton
instead keeps the name registered (status lists it, re-registering fails) until its in-flight
requests finish. Unmapping is deterministic when callers release their leases and keep no views
derived from ``lease.buffer``; if they do keep some, Python's buffer protocol keeps the mapping alive
until those views die, so memory safety never depends on callers. A lease that is garbage collected
without being released is released then.

Not defended here (nor in Triton): a client that shrinks its shm object after registering makes
accesses beyond the new end raise SIGBUS in this process.
"""

from __future__ import annotations

import _posixshmem  # CPython's shm_open binding (what multiprocessing.shared_memory uses)
import logging
import mmap
import operator
import os
import stat
import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Literal

from stubhost.host.errors import InferenceError
from stubhost.server.types import ShmRef

__all__ = [
    "CUDA_IPC_HANDLE_SIZE",
    "RESERVED_KEY_PREFIX",
    "CudaOpener",
    "CudaRegion",
    "RegionLease",
    "SharedMemoryRegistry",
    "SystemRegion",
]

_log = logging.getLogger(__name__)

RESERVED_KEY_PREFIX = "stubhost_"
"""Basename prefix of stubhost's own pool segments: never registrable."""

CUDA_IPC_HANDLE_SIZE = 64
"""sizeof(cudaIpcMemHandle_t)."""

_U64_MAX = 2**64 - 1  # Triton's offsets and sizes are uint64 (size_t): its SIZE_MAX
_SHM_DIR = "/dev/shm"

Kind = Literal["system", "cuda"]

CudaOpener = Callable[[bytes, int, int], Any]
"""``opener(raw_handle, device_id, byte_size) -> handle``: opens a cudaIpcMemHandle_t on a device.

It must raise if the handle cannot be opened or its allocation holds fewer than ``byte_size``
bytes; an :class:`InferenceError` it raises reaches the client as is (e.g. UNAVAILABLE "no CUDA
device available"), any other exception becomes Triton's generic "invalid args" error. The handle's
``close()``, if it has one, is called once no request uses the region any more.
"""


def _err(code: str, message: str) -> InferenceError:
    return InferenceError(code, message)


def _register_failed(name: str) -> InferenceError:
    return _err("INVALID_ARG", f"failed to register shared memory region '{name}': invalid args")


def _as_int(value: object) -> int | None:
    """``value`` as an int (anything with ``__index__``, bool excluded), or None."""
    if type(value) is int:  # the common case, kept cheap
        return value
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def _wrong_kind(name: str, actual: str) -> InferenceError:
    if actual == "cuda":
        text = "is registered as CUDA shared memory, not system shared memory"
    else:
        text = "is registered as system shared memory, not CUDA shared memory"
    return _err("NOT_FOUND", f"The region named '{name}' {text}")


class _Region:
    """What both kinds of region record; the lease count and closing are the registry's business."""

    __slots__ = ("id", "name", "byte_size", "_leases", "_registered", "_closed")
    kind: Kind
    _ids = itertools.count(1)

    def __init__(self, name: str, byte_size: int) -> None:
        self.id = next(_Region._ids)  # unique per registration: stubs cache mappings by it
        self.name = name
        self.byte_size = byte_size
        self._leases = 0
        self._registered = True
        self._closed = False

    def _close(self) -> None:
        raise NotImplementedError

    def status(self) -> dict[str, Any]:
        raise NotImplementedError


class SystemRegion(_Region):
    """A registered system (POSIX) shared-memory region: ``byte_size`` bytes at ``offset`` in ``key``."""

    __slots__ = ("key", "offset", "_mmap", "_view")
    kind: Kind = "system"

    def __init__(self, name: str, key: str, offset: int, byte_size: int, mm: mmap.mmap, delta: int) -> None:
        super().__init__(name, byte_size)
        self.key = key
        self.offset = offset
        self._mmap: mmap.mmap | None = mm
        # The registered window inside the page-aligned mapping; leases slice this view.
        self._view = memoryview(mm)[delta : delta + byte_size]

    def _close(self) -> None:
        self._view.release()
        if self._mmap is None:
            return
        try:
            self._mmap.close()
        except BufferError:
            # A caller still holds a view derived from a lease's buffer: the mapping is unmapped
            # when the last such view dies (the buffer protocol keeps the mmap object alive) ...
            pass
        self._mmap = None  # ... so hold no reference that would outlive those views

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class CudaRegion(_Region):
    """A registered CUDA shared-memory region: ``byte_size`` bytes on ``device_id`` of the
    allocation ``raw_handle`` names, opened here as ``handle``."""

    __slots__ = ("device_id", "handle", "raw_handle")
    kind: Kind = "cuda"

    def __init__(self, name: str, device_id: int, byte_size: int, handle: Any, raw_handle: bytes = b"") -> None:
        super().__init__(name, byte_size)
        self.device_id = device_id
        self.handle = handle
        self.raw_handle = raw_handle

    def _close(self) -> None:
        close = getattr(self.handle, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # the name is gone already; nothing a caller could do about it
                _log.exception("closing CUDA shared memory region '%s' failed", self.name)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}


class RegionLease:
    """A window of a registered region held by one request; release it (or use ``with``) when done.

    ``buffer`` is a writable memoryview of exactly the window for a system region (None for CUDA,
    whose memory is reached through ``region.handle`` at ``offset``). After :meth:`release` the
    buffer is released too; views derived from it keep the memory mapped but should not be kept.
    """

    __slots__ = ("_registry", "region", "kind", "offset", "byte_size", "buffer", "_released")

    def __init__(self, registry: SharedMemoryRegistry, region: _Region, offset: int, byte_size: int) -> None:
        self._registry = registry
        self.region: SystemRegion | CudaRegion = region  # type: ignore[assignment]
        self.kind: Kind = region.kind
        self.offset = offset
        self.byte_size = byte_size
        self.buffer: memoryview | None = (
            region._view[offset : offset + byte_size] if isinstance(region, SystemRegion) else None
        )
        self._released = False

    @property
    def name(self) -> str:
        """The region's name."""
        return self.region.name

    @property
    def device_id(self) -> int:
        """The CUDA device of a CUDA region; 0 for system memory (Triton's memory_type_id)."""
        return self.region.device_id if isinstance(self.region, CudaRegion) else 0

    def release(self) -> None:
        """Gives the window back; idempotent and thread-safe."""
        self._registry._release(self)

    def __enter__(self) -> RegionLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        # Never block in a finalizer: it may run inside the registry's own critical section.
        if not getattr(self, "_released", True):
            self._registry._release(self, blocking=False)

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return (
            f"RegionLease({self.region.name!r}, kind={self.kind!r}, offset={self.offset}, "
            f"byte_size={self.byte_size}, {state})"
        )


class SharedMemoryRegistry:
    """Clients' registered system and CUDA shared-memory regions, by name (one namespace); thread-safe.

    ``cuda_opener`` opens CUDA IPC handles (see :data:`CudaOpener`); without one, CUDA registration
    fails as on a Triton built without GPU support. ``reserved_prefixes`` adds key basename prefixes
    that are never registrable (the pool's prefix when the server configures another one);
    ``stubhost_`` is always reserved. ``on_unregister`` is called with each region whose name is
    unregistered (after the registry's lock is released), so stubs can drop their mappings.
    """

    def __init__(
        self,
        cuda_opener: CudaOpener | None = None,
        *,
        reserved_prefixes: Iterable[str] = (),
        on_unregister: Callable[[_Region], None] | None = None,
    ) -> None:
        self._cuda_opener = cuda_opener
        self._on_unregister = on_unregister  # told of each region whose name goes away
        self._reserved = tuple(dict.fromkeys([RESERVED_KEY_PREFIX, *reserved_prefixes]))
        self._regions: dict[str, _Region] = {}
        self._lock = threading.Lock()
        # Leases finalized while the lock was busy; released by the next operation.
        self._orphans: deque[RegionLease] = deque()

    # ---------------------------------------------------------------- registration

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Registers ``byte_size`` bytes at ``offset`` of the POSIX shm object ``key`` as ``name``."""
        self._drain_orphans()
        if not isinstance(name, str) or not name:
            raise _err("INVALID_ARG", "'region name' is necessary to register system shared memory region")
        off, size = _as_int(offset), _as_int(byte_size)
        if not isinstance(key, str) or off is None or size is None:
            raise _register_failed(name)
        # Triton takes uint64s; a mapping of 0 bytes fails there too (mmap: EINVAL).
        if off < 0 or size <= 0 or off > _U64_MAX or size > _U64_MAX:
            raise _register_failed(name)
        if self._is_reserved_key(key):
            # Before opening anything, so that the answer says nothing about what exists; the key
            # is not repeated (it may be one of our segment names).
            raise _err(
                "INVALID_ARG",
                f"cannot register shared memory region '{name}' as the key contains a reserved prefix",
            )
        with self._lock:
            if name in self._regions:
                raise self._already(name)
        region = self._open_system(name, key, off, size)
        with self._lock:
            duplicate = name in self._regions  # registered by another thread meanwhile
            if not duplicate:
                self._regions[name] = region
        if duplicate:
            region._close()
            raise self._already(name)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Registers a CUDA IPC handle (a 64-byte cudaIpcMemHandle_t) of ``byte_size`` bytes as ``name``."""
        self._drain_orphans()
        if not isinstance(name, str) or not name:
            raise _err("INVALID_ARG", "'region name' is necessary to register cuda shared memory region")
        if not isinstance(raw_handle, (bytes, bytearray, memoryview)):
            raise _err("INVALID_ARG", "'raw_handle' must be a valid cudaIpcMemHandle_t")
        raw = bytes(raw_handle)
        if len(raw) != CUDA_IPC_HANDLE_SIZE:
            raise _err("INVALID_ARG", "'raw_handle' must be a valid cudaIpcMemHandle_t")
        dev, size = _as_int(device_id), _as_int(byte_size)
        if dev is None or size is None or dev < 0 or size <= 0 or dev > _U64_MAX or size > _U64_MAX:
            raise _register_failed(name)
        if self._cuda_opener is None:
            raise _err(
                "INVALID_ARG", f"failed to register CUDA shared memory region: '{name}', GPUs not supported"
            )
        with self._lock:
            if name in self._regions:
                raise self._already(name)
        try:
            handle = self._cuda_opener(raw, dev, size)
        except InferenceError:
            raise
        except Exception as e:
            # Triton logs the CUDA error and answers with a generic message; so do we (chained).
            raise _register_failed(name) from e
        region = CudaRegion(name, dev, size, handle, raw)
        with self._lock:
            duplicate = name in self._regions
            if not duplicate:
                self._regions[name] = region
        if duplicate:
            region._close()
            raise self._already(name)

    # ---------------------------------------------------------------- unregistration and status

    @property
    def cuda_supported(self) -> bool:
        """Whether CUDA regions can be registered here (a CUDA opener was given)."""
        return self._cuda_opener is not None

    def unregister_system(self, name: str | None = None) -> None:
        """Unregisters the system region ``name``, or every system region when ``name`` is None/empty.

        A name that is not registered as a system region is ignored, as in Triton.
        """
        self._unregister("system", name)

    def unregister_cuda(self, name: str | None = None) -> None:
        """Unregisters the CUDA region ``name``, or every CUDA region when ``name`` is None/empty."""
        self._unregister("cuda", name)

    def system_status(self, name: str | None = None) -> list[dict[str, Any]]:
        """``[{"name", "key", "offset", "byte_size"}]`` of one system region, or of all by name."""
        return self._status("system", name)

    def cuda_status(self, name: str | None = None) -> list[dict[str, Any]]:
        """``[{"name", "device_id", "byte_size"}]`` of one CUDA region, or of all by name."""
        return self._status("cuda", name)

    def close(self) -> None:
        """Unregisters every region; mappings close as their last leases are released."""
        self._unregister("system", None)
        self._unregister("cuda", None)

    def __enter__(self) -> SharedMemoryRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self._regions)

    # ---------------------------------------------------------------- the request path

    def acquire(self, ref: ShmRef, *, kind_hint: Kind | None = None) -> RegionLease:
        """Checks ``ref`` against its region and returns a lease on that window.

        ``kind_hint``, when given, requires the region to be of that kind (NOT_FOUND otherwise).
        Errors are Triton's: NOT_FOUND for an unknown region, INVALID_ARG for a window outside it.
        """
        if self._orphans:
            self._drain_orphans()
        name = ref.region
        offset, size = _as_int(ref.offset), _as_int(ref.byte_size)
        with self._lock:
            region = self._regions.get(name)
            if region is None:
                raise _err("NOT_FOUND", f"Unable to find shared memory region: '{name}'")
            if kind_hint is not None and region.kind != kind_hint:
                raise _wrong_kind(name, region.kind)
            self._check_window(name, offset, size, region.byte_size)
            lease = RegionLease(self, region, offset, size)  # type: ignore[arg-type]
            region._leases += 1  # only once the lease exists: its release is what decrements
        return lease

    @staticmethod
    def _check_window(name: str, offset: int | None, size: int | None, region_size: int) -> None:
        # Triton's order and wording (SharedMemoryManager::GetMemoryInfo); no sum is formed before
        # both operands are known to be in range, so nothing can wrap or blow up.
        if offset is None or offset < 0 or offset >= region_size:
            raise _err("INVALID_ARG", f"Invalid offset for shared memory region: '{name}'")
        if size is None or size < 0 or size > _U64_MAX:
            raise _err("INVALID_ARG", f"Invalid offset + byte size for shared memory region: '{name}'")
        if size > _U64_MAX - offset:
            raise _err(
                "INVALID_ARG",
                f"Integer overflow detected: byte_size ({size}) + offset ({offset}) exceeds maximum "
                f"value ({_U64_MAX}) for region '{name}'",
            )
        if size > region_size - offset:
            raise _err("INVALID_ARG", f"Invalid offset + byte size for shared memory region: '{name}'")

    # ---------------------------------------------------------------- internals

    @staticmethod
    def _already(name: str) -> InferenceError:
        return _err("ALREADY_EXISTS", f"shared memory region '{name}' already in manager")

    def _is_reserved_key(self, key: str) -> bool:
        # glibc strips leading '/' and refuses any other '/', so the basename is what names the
        # object; checking every component also covers keys shm_open would refuse anyway.
        return any(part.startswith(self._reserved) for part in key.split("/"))

    def _is_reserved_object(self, st: os.stat_result) -> bool:
        """Whether ``st`` is one of our pool segments reached through another name (a hard link)."""
        if st.st_nlink <= 1:
            return False
        try:
            if os.stat(_SHM_DIR).st_dev != st.st_dev:
                return False
            with os.scandir(_SHM_DIR) as entries:
                return any(e.name.startswith(self._reserved) and e.inode() == st.st_ino for e in entries)
        except OSError:
            return True  # cannot tell: refuse rather than risk mapping a pool segment

    def _open_system(self, name: str, key: str, offset: int, byte_size: int) -> SystemRegion:
        try:
            fd = _posixshmem.shm_open(key, os.O_RDWR, 0o600)
        except (OSError, ValueError):  # missing, permissions, bad name, NUL, unencodable
            raise _err("INTERNAL", f"Unable to open shared memory region: '{key}'") from None
        try:
            try:
                st = os.fstat(fd)
            except OSError:
                raise _err("INTERNAL", f"Invalid shared memory region: '{key}'") from None
            if not stat.S_ISREG(st.st_mode) or st.st_size < 0:
                raise _err("INTERNAL", f"Invalid shared memory region: '{key}'")
            if self._is_reserved_object(st):
                raise _err(
                    "INVALID_ARG",
                    f"cannot register shared memory region '{name}' as the key contains a reserved prefix",
                )
            if offset > st.st_size or byte_size > st.st_size - offset:
                raise _register_failed(name)
            # mmap offsets must be page aligned: map from the page holding `offset`.
            delta = offset % mmap.ALLOCATIONGRANULARITY
            try:
                mm = mmap.mmap(
                    fd,
                    delta + byte_size,
                    flags=mmap.MAP_SHARED,
                    prot=mmap.PROT_READ | mmap.PROT_WRITE,
                    offset=offset - delta,
                )
            except (OSError, ValueError, OverflowError) as e:
                raise _err("INVALID_ARG", f"failed to register shared memory region '{name}': {e}") from None
        finally:
            os.close(fd)  # the mapping keeps its own reference to the object
        return SystemRegion(name, key, offset, byte_size, mm, delta)

    def _unregister(self, kind: Kind, name: str | None) -> None:
        self._drain_orphans()
        to_close: list[_Region] = []
        removed: list[_Region] = []
        with self._lock:
            if name:
                region = self._regions.get(name)
                names = [name] if region is not None and region.kind == kind else []
            else:
                names = [n for n, r in self._regions.items() if r.kind == kind]
            for n in names:
                region = self._regions.pop(n)
                removed.append(region)
                region._registered = False
                if region._leases == 0 and not region._closed:
                    region._closed = True
                    to_close.append(region)
        for region in to_close:  # outside the lock: closing a CUDA handle may be slow
            region._close()
        if self._on_unregister is not None:
            for region in removed:
                self._on_unregister(region)

    def _status(self, kind: Kind, name: str | None) -> list[dict[str, Any]]:
        self._drain_orphans()
        with self._lock:
            if not name:
                # Triton's map is ordered by name; so is this listing.
                return [r.status() for n, r in sorted(self._regions.items()) if r.kind == kind]
            region = self._regions.get(name)
            if region is None:
                label = "system" if kind == "system" else "cuda"
                raise _err("NOT_FOUND", f"Unable to find {label} shared memory region: '{name}'")
            if region.kind != kind:
                raise _wrong_kind(name, region.kind)
            return [region.status()]

    def _release(self, lease: RegionLease, *, blocking: bool = True) -> None:
        if not self._lock.acquire(blocking):
            self._orphans.append(lease)  # finalizer while the lock is busy: later
            return
        close = False
        try:
            if lease._released:
                return
            lease._released = True
            if lease.buffer is not None:
                try:
                    lease.buffer.release()
                except BufferError:
                    pass  # views derived from it keep the mapping alive; see _close
                lease.buffer = None
            region = lease.region
            region._leases -= 1
            if region._leases == 0 and not region._registered and not region._closed:
                region._closed = True
                close = True
        finally:
            self._lock.release()
        if close:
            region._close()

    def _drain_orphans(self) -> None:
        while self._orphans:
            try:
                lease = self._orphans.popleft()
            except IndexError:
                return
            self._release(lease)
