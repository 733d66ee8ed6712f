"""The message queue: order, blocking with timeouts, cross-process wake-ups, many producers."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from stubhost import _core
from tests.core import workers


def test_fifo_order_and_length(pool):
    q = _core.MessageQueue.create(pool, 8)
    for v in (5, 0, 2**64 - 1, 42):
        assert q.push(v, timeout=0)
    assert len(q) == 4
    assert [q.pop(timeout=0) for _ in range(4)] == [5, 0, 2**64 - 1, 42]
    assert len(q) == 0


def test_full_queue_blocks_then_times_out(pool):
    q = _core.MessageQueue.create(pool, 3)
    for v in range(3):
        assert q.push(v, timeout=0)
    start = time.monotonic()
    assert q.push(99, timeout=0.2) is False
    assert time.monotonic() - start >= 0.19
    assert [q.pop(timeout=0) for _ in range(3)] == [0, 1, 2]


def test_empty_pop_times_out_with_none(pool):
    q = _core.MessageQueue.create(pool, 4)
    start = time.monotonic()
    assert q.pop(timeout=0.2) is None
    assert time.monotonic() - start >= 0.19
    assert q.pop(timeout=0) is None


def test_blocked_pop_is_woken_by_another_process(pool, spawn):
    q = _core.MessageQueue.create(pool, 4)
    proc = spawn.Process(target=workers.push_after, args=(pool.name, q.handle, 0.3, 77))
    proc.start()
    try:
        assert q.pop(timeout=20) == 77
    finally:
        proc.join(10)
    assert proc.exitcode == 0


def test_blocked_push_is_woken_when_a_slot_frees(pool):
    q = _core.MessageQueue.create(pool, 1)
    q.push(1, timeout=0)
    t = threading.Timer(0.2, lambda: q.pop(timeout=0))
    t.start()
    start = time.monotonic()
    assert q.push(2, timeout=10)
    assert 0.15 < time.monotonic() - start < 5
    t.join()
    assert q.pop(timeout=0) == 2


def test_waiting_releases_the_gil(pool):
    q = _core.MessageQueue.create(pool, 1)
    counter = 0
    stop = threading.Event()

    def spin():
        nonlocal counter
        while not stop.is_set():
            counter += 1

    t = threading.Thread(target=spin)
    t.start()
    q.pop(timeout=0.3)
    before = counter
    q.pop(timeout=0.3)
    stop.set()
    t.join()
    assert counter - before > 1000  # the other thread ran while we were blocked


def test_two_producer_processes_lose_nothing_and_keep_order(pool, spawn):
    count = 50_000
    q = _core.MessageQueue.create(pool, 64)
    result = pool.allocate(16)
    procs = [spawn.Process(target=workers.consume, args=(pool.name, q.handle, 2 * count, result))]
    procs += [spawn.Process(target=workers.produce, args=(pool.name, q.handle, pid, count)) for pid in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    received, errors = np.frombuffer(pool.view(result, 16), dtype=np.uint64).tolist()
    assert received == 2 * count, "messages lost"
    assert errors == 0, "messages duplicated or out of per-producer order"
    assert len(q) == 0
    pool.free(result)


def test_attach_validates_the_handle(pool):
    h = pool.allocate(1024)
    with pytest.raises(_core.InvalidHandleError, match="message queue"):
        _core.MessageQueue.attach(pool, h)
    with pytest.raises(_core.InvalidHandleError):
        _core.MessageQueue.attach(pool, _core.make_handle(9, 64))
    pool.free(h)


def test_capacity_limits(pool):
    with pytest.raises(_core.CoreError, match="capacity"):
        _core.MessageQueue.create(pool, 0)
    with pytest.raises(_core.CoreError, match="capacity"):
        _core.MessageQueue.create(pool, 1 << 21)


def test_semaphore_across_processes(pool, spawn):
    sem = _core.Semaphore.create(pool, initial=0)
    assert sem.wait(timeout=0.05) is False
    proc = spawn.Process(target=workers.post_semaphore, args=(pool.name, sem.handle, 3))
    proc.start()
    try:
        assert all(sem.wait(timeout=20) for _ in range(3))
    finally:
        proc.join(10)
    assert sem.wait(timeout=0) is False


def test_spin_budget_is_settable_and_waits_still_work_without_spinning(pool):
    old = _core.spin_budget()
    try:
        _core.set_spin_budget(0)
        assert _core.spin_budget() == 0
        q = _core.MessageQueue.create(pool, 2)
        threading.Timer(0.1, lambda: q.push(3, timeout=1)).start()
        assert q.pop(timeout=5) == 3
    finally:
        _core.set_spin_budget(old)


def test_message_reply_is_once_and_release_frees_after_both_holders(pool):
    base = pool.used_bytes
    msg = _core.IPCMessage.create(pool, _core.Command.PING, args=0, request_id=5, inline_reply=True)
    responder = _core.IPCMessage.attach(pool, msg.handle)
    assert msg.wait_reply(timeout=0.05) is False  # no reply yet
    msg.release()  # the sender gives up; the responder still holds the message
    responder.reply(3, 99)
    with pytest.raises(_core.CoreError, match="already answered"):
        responder.reply(0, 0)
    assert pool.used_bytes > base
    responder.release()
    assert pool.used_bytes == base


def test_a_reply_that_wait_reply_lets_through_is_already_answered(pool, spawn):
    # The parent hands an answer over from whichever thread sees it first and treats a message
    # that is not `answered` as someone else's; a waiter woken before `answered` turned true left
    # BLS replies to the completion thread's 0.1 s poll. Sleeping waits (no spin) widen the window
    # in which the wake-up and the flag could disagree.
    count = 3000
    queue = _core.MessageQueue.create(pool, 8)
    proc = spawn.Process(target=workers.answer_messages, args=(pool.name, queue.handle, count))
    proc.start()
    old = _core.spin_budget()
    _core.set_spin_budget(0)
    try:
        for i in range(count):
            message = _core.IPCMessage.create(pool, _core.Command.PING, 0, i, True)
            assert queue.push(message.handle, timeout=20)
            assert message.wait_reply(timeout=20)
            assert message.answered, f"message {i} woke its waiter before it was answered"
            assert message.reply_args == i
            message.release()
    finally:
        _core.set_spin_budget(old)
        proc.join(20)
    assert proc.exitcode == 0
