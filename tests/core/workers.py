"""Child-process bodies for the core tests (top-level functions, so spawn can import them)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np

from stubhost import _core


def write_pattern(pool_name: str, handle: int, nbytes: int, value: int) -> None:
    """Attach the pool and fill [handle, handle + nbytes) with `value`."""
    pool = _core.Pool.attach(pool_name)
    np.frombuffer(pool.view(handle, nbytes), dtype=np.uint8)[:] = value


def grow_and_report(pool_name: str, nbytes: int, value: int, queue_handle: int) -> None:
    """Allocate (growing the pool from this side), fill, and push the handle back."""
    pool = _core.Pool.attach(pool_name)
    h = pool.allocate(nbytes)
    np.frombuffer(pool.view(h, nbytes), dtype=np.uint8)[:] = value
    _core.MessageQueue.attach(pool, queue_handle).push(h, timeout=10)


def echo_sum(pool_name: str, handle: int, nbytes: int, queue_handle: int) -> None:
    """Read a buffer (possibly in a segment this process has never mapped) and report its sum."""
    pool = _core.Pool.attach(pool_name)
    total = int(np.frombuffer(pool.view(handle, nbytes), dtype=np.uint8).sum(dtype=np.uint64))
    _core.MessageQueue.attach(pool, queue_handle).push(total, timeout=10)


def produce(pool_name: str, queue_handle: int, producer_id: int, count: int) -> None:
    """Push `count` values tagged with the producer id and a sequence number."""
    pool = _core.Pool.attach(pool_name)
    q = _core.MessageQueue.attach(pool, queue_handle)
    tag = producer_id << 32
    for seq in range(count):
        if not q.push(tag | seq, timeout=30):
            raise SystemExit(f"producer {producer_id} timed out at {seq}")


def consume(pool_name: str, queue_handle: int, total: int, result_handle: int) -> None:
    """Pop `total` values, check per-producer order, and write (received, errors) to result."""
    pool = _core.Pool.attach(pool_name)
    q = _core.MessageQueue.attach(pool, queue_handle)
    next_seq: dict[int, int] = {}
    errors = 0
    received = 0
    for _ in range(total):
        v = q.pop(timeout=30)
        if v is None:
            break
        received += 1
        producer, seq = v >> 32, v & 0xFFFFFFFF
        if seq != next_seq.get(producer, 0):
            errors += 1
        next_seq[producer] = seq + 1
    result = np.frombuffer(pool.view(result_handle, 16), dtype=np.uint64)
    result[0] = received
    result[1] = errors


def hold_pool_lock(pool_name: str, ready) -> None:
    """Take the pool lock and never release it (the test kills us)."""
    pool = _core.Pool.attach(pool_name)
    pool._debug_lock()
    ready.set()
    time.sleep(60)


def hold_mutex(pool_name: str, handle: int, ready) -> None:
    """Lock a RobustMutex and never release it (the test kills us)."""
    pool = _core.Pool.attach(pool_name)
    mutex = _core.RobustMutex.attach(pool, handle)
    mutex.lock()
    ready.set()
    time.sleep(60)


def block_in_pop(pool_name: str, queue_handle: int, ready) -> None:
    """Block in pop() on an empty queue (the test kills us while we wait)."""
    pool = _core.Pool.attach(pool_name)
    q = _core.MessageQueue.attach(pool, queue_handle)
    ready.set()
    q.pop()


def block_in_push(pool_name: str, queue_handle: int, ready) -> None:
    """Block in push() on a full queue (the test kills us while we wait)."""
    pool = _core.Pool.attach(pool_name)
    q = _core.MessageQueue.attach(pool, queue_handle)
    ready.set()
    q.push(12345)


def push_after(pool_name: str, queue_handle: int, delay: float, value: int) -> None:
    """Sleep, then push one value."""
    pool = _core.Pool.attach(pool_name)
    q = _core.MessageQueue.attach(pool, queue_handle)
    time.sleep(delay)
    q.push(value, timeout=10)


def post_semaphore(pool_name: str, handle: int, times: int) -> None:
    """Post a semaphore `times` times."""
    pool = _core.Pool.attach(pool_name)
    sem = _core.Semaphore.attach(pool, handle)
    for _ in range(times):
        sem.post()


def kill_self() -> None:
    """Die by SIGKILL (no cleanup of any kind)."""
    os.kill(os.getpid(), signal.SIGKILL)


def answer_messages(pool_name: str, queue_handle: int, count: int) -> None:
    """Answer `count` inline-reply messages whose handles arrive on a queue, as a stub does."""
    pool = _core.Pool.attach(pool_name)
    queue = _core.MessageQueue.attach(pool, queue_handle)
    for i in range(count):
        message = _core.IPCMessage.attach(pool, queue.pop(timeout=20))
        message.reply(0, i)
        message.release()
