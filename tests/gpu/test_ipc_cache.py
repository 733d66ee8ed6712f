"""IpcHandleCache: each CUDA IPC handle opened once per process, closed with its last user.

The bookkeeping runs everywhere against a recording runtime; the test marked ``gpu`` opens a real
handle exported by another process."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from stubhost.gpu import cuda
from stubhost.gpu.ipc_cache import IpcHandleCache


class RecordingRuntime:
    """Stands in for CUDA: hands out fake pointers and records every open and close."""

    def __init__(self, fail_close: bool = False) -> None:
        self.opened: list[tuple[bytes, int]] = []
        self.closed: list[tuple[int, int]] = []
        self.fail_close = fail_close
        self._next = 0x7000_0000

    def open_ipc(self, raw_handle: bytes, device_id: int) -> int:
        self.opened.append((raw_handle, device_id))
        self._next += 0x1000
        return self._next

    def close_ipc(self, ptr: int, device_id: int) -> None:
        self.closed.append((ptr, device_id))
        if self.fail_close:
            raise cuda.CudaError("cudaIpcCloseMemHandle failed: invalid argument (1)")


HANDLE_A = bytes(range(64))
HANDLE_B = bytes(reversed(range(64)))


def test_a_handle_is_opened_once_and_closed_by_its_last_user():
    rt = RecordingRuntime()
    cache = IpcHandleCache(rt)
    first = cache.acquire(HANDLE_A, 0)
    second = cache.acquire(HANDLE_A, 0)
    assert first == second and rt.opened == [(HANDLE_A, 0)]
    assert cache.users(HANDLE_A, 0) == 2
    assert cache.release(HANDLE_A, 0) and rt.closed == []
    assert cache.release(HANDLE_A, 0) and rt.closed == [(first, 0)]
    assert len(cache) == 0 and cache.users(HANDLE_A, 0) == 0


def test_handles_are_told_apart_by_bytes_and_device():
    rt = RecordingRuntime()
    cache = IpcHandleCache(rt)
    pointers = {cache.acquire(HANDLE_A, 0), cache.acquire(HANDLE_B, 0), cache.acquire(HANDLE_A, 1)}
    assert len(pointers) == 3 and len(rt.opened) == 3 and len(cache) == 3


def test_a_release_too_many_never_closes_twice(caplog):
    rt = RecordingRuntime()
    cache = IpcHandleCache(rt)
    cache.acquire(HANDLE_A, 0)
    assert cache.release(HANDLE_A, 0)
    assert not cache.release(HANDLE_A, 0)
    assert len(rt.closed) == 1
    assert "released more often than it was opened" in caplog.text


def test_reopening_after_the_last_release_opens_again():
    rt = RecordingRuntime()
    cache = IpcHandleCache(rt)
    cache.acquire(HANDLE_A, 0)
    cache.release(HANDLE_A, 0)
    cache.acquire(HANDLE_A, 0)
    assert len(rt.opened) == 2


def test_close_all_closes_every_open_handle_whatever_its_count():
    rt = RecordingRuntime()
    cache = IpcHandleCache(rt)
    for _ in range(3):
        cache.acquire(HANDLE_A, 0)
    cache.acquire(HANDLE_B, 2)
    assert cache.close_all() == 2
    assert sorted(d for _, d in rt.closed) == [0, 2] and len(cache) == 0
    assert not cache.release(HANDLE_A, 0)  # a late user's release is harmless
    assert len(rt.closed) == 2


def test_a_failing_close_is_logged_and_forgotten(caplog):
    rt = RecordingRuntime(fail_close=True)
    cache = IpcHandleCache(rt)
    cache.acquire(HANDLE_A, 0)
    assert cache.release(HANDLE_A, 0)
    assert len(cache) == 0 and "closing a CUDA IPC handle on device 0 failed" in caplog.text


def test_malformed_handles_and_devices_are_refused_before_cuda_is_touched():
    rt = RecordingRuntime()
    cache = IpcHandleCache(rt)
    with pytest.raises(ValueError, match="64 bytes, got 3"):
        cache.acquire(b"abc", 0)
    with pytest.raises(ValueError, match="negative"):
        cache.acquire(HANDLE_A, -1)
    assert rt.opened == []


def test_concurrent_first_users_open_once():
    rt = RecordingRuntime()
    cache = IpcHandleCache(rt)
    barrier = threading.Barrier(8)
    got: list[int] = []

    def use() -> None:
        barrier.wait()
        got.append(cache.acquire(HANDLE_A, 0))

    threads = [threading.Thread(target=use) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 1 and len(rt.opened) == 1 and cache.users(HANDLE_A, 0) == 8


def _open_and_read(raw: bytes, nbytes: int, queue) -> None:
    from stubhost.gpu import cuda as child_cuda
    from stubhost.gpu.ipc_cache import IpcHandleCache as Cache

    cache = Cache()
    ptr = cache.acquire(raw, 0)
    again = cache.acquire(raw, 0)  # a second user: CUDA would refuse a second real open
    host = np.empty(nbytes, dtype=np.uint8)
    child_cuda.runtime().copy(host.ctypes.data, again, nbytes, 0)
    cache.release(raw, 0)
    cache.release(raw, 0)
    queue.put((ptr == again, host.tobytes()))


@pytest.mark.gpu
def test_a_handle_exported_by_one_process_is_read_by_another(spawn):
    rt = cuda.runtime()
    data = np.arange(4096, dtype=np.uint8)
    ptr = rt.malloc(data.nbytes, 0)
    try:
        rt.copy(ptr, data.ctypes.data, data.nbytes, 0)
        raw = rt.ipc_handle(ptr, 0)
        queue = spawn.Queue()
        child = spawn.Process(target=_open_and_read, args=(raw, data.nbytes, queue))
        child.start()
        same, seen = queue.get(timeout=60)
        child.join(30)
        assert child.exitcode == 0 and same and seen == data.tobytes()
    finally:
        rt.free(ptr, 0)
