"""Opened CUDA IPC handles, each opened once per process and closed when its last user lets go.

CUDA lets a process open a given ``cudaIpcMemHandle_t`` only once per device: opening the same
handle again fails. Clients do register one allocation under several region names, and a stub
sees the same allocation in many requests, so every opening goes through an :class:`IpcHandleCache`
keyed by (device, handle bytes): the first :meth:`acquire` opens, later ones share the pointer,
and the :meth:`release` that drops the count to zero closes it. :meth:`close_all` closes what is
left (the peer that owns the memory is gone, or this process is shutting down).

The cache does its bookkeeping in plain Python; the CUDA calls go through a runtime object with
``open_ipc(raw_handle, device_id) -> ptr`` and ``close_ipc(ptr, device_id)`` (by default the one
:func:`stubhost.gpu.cuda.runtime` loads), so the bookkeeping is testable without a GPU.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from stubhost.gpu.cuda import CUDA_IPC_HANDLE_SIZE

__all__ = ["IpcHandleCache", "IpcRuntime", "OpenedHandle", "shared_cache"]

_log = logging.getLogger("stubhost.gpu")


class IpcRuntime(Protocol):
    """The two CUDA calls the cache needs."""

    def open_ipc(self, raw_handle: bytes, device_id: int) -> int: ...

    def close_ipc(self, ptr: int, device_id: int) -> None: ...


@dataclass
class OpenedHandle:
    """One opened allocation: its base pointer in this process and how many users hold it."""

    device_id: int
    raw_handle: bytes
    ptr: int
    users: int = field(default=0)


class IpcHandleCache:
    """Reference-counted openings of CUDA IPC handles; thread-safe."""

    def __init__(self, runtime: IpcRuntime | None = None) -> None:
        self._runtime = runtime
        self._opened: dict[tuple[int, bytes], OpenedHandle] = {}
        self._lock = threading.Lock()

    def _rt(self) -> Any:
        if self._runtime is None:
            from stubhost.gpu import cuda

            self._runtime = cuda.runtime()
        return self._runtime

    def acquire(self, raw_handle: bytes, device_id: int) -> int:
        """The base pointer of the allocation `raw_handle` names, opening it on first use."""
        raw = bytes(raw_handle)
        if len(raw) != CUDA_IPC_HANDLE_SIZE:
            raise ValueError(f"a CUDA IPC handle has {CUDA_IPC_HANDLE_SIZE} bytes, got {len(raw)}")
        if device_id < 0:
            raise ValueError(f"device id {device_id} is negative")
        key = (device_id, raw)
        with self._lock:  # SYNC: two first users must not both open (the second open would fail)
            entry = self._opened.get(key)
            if entry is None:
                entry = OpenedHandle(device_id, raw, self._rt().open_ipc(raw, device_id))
                self._opened[key] = entry
            entry.users += 1
            return entry.ptr

    def release(self, raw_handle: bytes, device_id: int) -> bool:
        """Drops one use; closes the handle when it was the last. False when it was not held
        (a second release of the same use is reported, never a second close)."""
        key = (device_id, bytes(raw_handle))
        with self._lock:
            entry = self._opened.get(key)
            if entry is None:
                _log.warning("a CUDA IPC handle on device %d was released more often than it was opened", device_id)
                return False
            entry.users -= 1
            if entry.users > 0:
                return True
            del self._opened[key]
        self._close(entry)
        return True

    def close_all(self) -> int:
        """Closes every handle still open, whoever holds it; returns how many were closed."""
        with self._lock:
            entries = list(self._opened.values())
            self._opened.clear()
        for entry in entries:
            self._close(entry)
        return len(entries)

    def _close(self, entry: OpenedHandle) -> None:
        try:
            self._rt().close_ipc(entry.ptr, entry.device_id)
        except Exception:  # the owner may already be gone; the mapping is lost either way
            _log.exception("closing a CUDA IPC handle on device %d failed", entry.device_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._opened)

    def users(self, raw_handle: bytes, device_id: int) -> int:
        """How many users hold this handle open (0 when it is closed)."""
        with self._lock:
            entry = self._opened.get((device_id, bytes(raw_handle)))
            return entry.users if entry is not None else 0


_shared: IpcHandleCache | None = None
_shared_lock = threading.Lock()


def shared_cache() -> IpcHandleCache:
    """The process's cache (CUDA allows one opening of a handle per process and device)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = IpcHandleCache()
        return _shared
