"""A peer killed at the worst moment never deadlocks the survivor."""

from __future__ import annotations

import time

import pytest

from stubhost import _core
from tests.core import workers


def start_and_wait_ready(spawn, target, *args):
    ready = spawn.Event()
    proc = spawn.Process(target=target, args=(*args, ready))
    proc.start()
    assert ready.wait(20), f"{target.__name__} never became ready"
    return proc


def kill(proc) -> None:
    proc.kill()
    proc.join(10)
    assert proc.exitcode == -9


def test_pool_lock_holder_killed_is_recovered(pool, spawn):
    kept = pool.allocate(5000)
    proc = start_and_wait_ready(spawn, workers.hold_pool_lock, pool.name)
    kill(proc)
    start = time.monotonic()
    h = pool.allocate(100)  # takes the lock (EOWNERDEAD), rebuilds the free lists, goes on
    assert time.monotonic() - start < 2
    pool.check()
    assert pool.allocation_size(kept) == 5000
    pool.free(h)
    pool.free(kept)
    assert pool.used_bytes == 0


def test_live_pool_lock_holder_gives_a_timeout_error_not_a_hang(spawn):
    with _core.Pool.create(initial_size=1 << 20, lock_timeout=0.3) as pool:
        proc = start_and_wait_ready(spawn, workers.hold_pool_lock, pool.name)
        try:
            start = time.monotonic()
            with pytest.raises(_core.LockTimeoutError, match="pool lock"):
                pool.allocate(10)
            assert time.monotonic() - start < 3
        finally:
            kill(proc)
        pool.free(pool.allocate(10))


def test_robust_mutex_reports_a_dead_owner(pool, spawn):
    mutex = _core.RobustMutex.create(pool)
    proc = start_and_wait_ready(spawn, workers.hold_mutex, pool.name, mutex.handle)
    assert mutex.lock(timeout=0.1) == _core.LockResult.TIMED_OUT
    kill(proc)
    assert mutex.lock(timeout=5) == _core.LockResult.RECOVERED
    mutex.unlock()
    assert mutex.lock(timeout=1) == _core.LockResult.ACQUIRED
    mutex.unlock()


def test_consumer_killed_while_blocked_in_pop_leaves_queue_usable(pool, spawn):
    q = _core.MessageQueue.create(pool, 4)
    proc = start_and_wait_ready(spawn, workers.block_in_pop, pool.name, q.handle)
    time.sleep(0.1)  # let it reach the futex wait
    kill(proc)
    start = time.monotonic()
    assert q.push(1, timeout=2)
    assert q.pop(timeout=2) == 1
    assert time.monotonic() - start < 1


def test_producer_killed_while_blocked_in_push_leaves_queue_usable(pool, spawn):
    q = _core.MessageQueue.create(pool, 2)
    q.push(10, timeout=0)
    q.push(11, timeout=0)
    proc = start_and_wait_ready(spawn, workers.block_in_push, pool.name, q.handle)
    time.sleep(0.1)
    kill(proc)
    assert [q.pop(timeout=1), q.pop(timeout=1)] == [10, 11]
    assert q.pop(timeout=0.1) is None  # the dead producer's value never landed
    assert q.push(12, timeout=1) and q.pop(timeout=1) == 12


def test_dead_peer_segments_are_removed_by_unlink_all(spawn):
    pool = _core.Pool.create(initial_size=1 << 20, growth_size=1 << 20)
    q = _core.MessageQueue.create(pool, 2)
    proc = spawn.Process(target=workers.grow_and_report, args=(pool.name, 2 << 20, 1, q.handle))
    proc.start()
    proc.join(30)
    h = q.pop(timeout=5)
    assert pool.segment_count == 2 and h
    pool.close()  # the owner removes segments it never created itself, too
