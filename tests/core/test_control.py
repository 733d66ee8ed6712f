"""IPCControl (the block a parent and its stub share), layout-version refusal of every shared
structure, and IPCMessage inline replies across processes."""

from __future__ import annotations

import mmap
import os
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stubhost import _core
from stubhost._core import Command, IPCControl, IPCMessage, MessageQueue
from tests.core import workers_control
from tests.core.procs import join_peer

QUEUE_FIELDS = ["stub_message_queue", "parent_message_queue", "stub_to_parent_mq", "parent_to_stub_mq",
                "memory_manager_message_queue"]
LAYOUT = _core.LAYOUT_VERSION
U64 = st.integers(0, (1 << 64) - 1)
CONTROL_BYTES = 320



def poke_u32(pool: _core.Pool, handle: int, offset: int, value: int) -> int:
    """Writes a uint32 into pool memory at handle + offset; returns the old value."""
    words = np.frombuffer(pool.view(handle, offset + 4), np.uint8)[offset:].view(np.uint32)
    old = int(words[0])
    words[0] = value
    return old


# ---- the control block in one process -----------------------------------------------------------
def test_new_control_block_starts_clear(pool: _core.Pool) -> None:
    ctl = IPCControl.create(pool)
    assert pool.allocation_size(ctl.handle) == CONTROL_BYTES
    for field in QUEUE_FIELDS:
        assert getattr(ctl, field) == 0
    assert (ctl.uses_env, ctl.decoupled) == (False, False)
    assert (ctl.parent_pid, ctl.stub_pid, ctl.parent_heartbeat, ctl.stub_heartbeat) == (0, 0, 0, 0)
    assert ctl.health(stub=True) is False and ctl.health(stub=False) is False
    pool.free(ctl.handle)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(U64, min_size=5, max_size=5))
def test_queue_handle_fields_round_trip_through_a_second_attach(pool: _core.Pool, values: list[int]) -> None:
    ctl = IPCControl.create(pool)
    try:
        for field, value in zip(QUEUE_FIELDS, values):
            setattr(ctl, field, value)
        peer = IPCControl.attach(pool, ctl.handle)
        assert [getattr(peer, f) for f in QUEUE_FIELDS] == values
        assert [getattr(ctl, f) for f in QUEUE_FIELDS] == values
    finally:
        pool.free(ctl.handle)


@pytest.mark.parametrize("field", QUEUE_FIELDS)
def test_each_queue_handle_field_is_independent(pool: _core.Pool, field: str) -> None:
    ctl = IPCControl.create(pool)
    try:
        setattr(ctl, field, 0xDEAD_BEEF_0000_0001)
        peer = IPCControl.attach(pool, ctl.handle)
        for other in QUEUE_FIELDS:
            assert getattr(peer, other) == (0xDEAD_BEEF_0000_0001 if other == field else 0), other
        assert (peer.uses_env, peer.decoupled, peer.parent_pid, peer.stub_pid) == (False, False, 0, 0)
    finally:
        pool.free(ctl.handle)


def test_flags_pids_and_heartbeats_are_per_field(pool: _core.Pool) -> None:
    ctl = IPCControl.create(pool)
    try:
        peer = IPCControl.attach(pool, ctl.handle)
        ctl.uses_env = True
        assert (peer.uses_env, peer.decoupled) == (True, False)
        ctl.decoupled = True
        ctl.uses_env = False
        assert (peer.uses_env, peer.decoupled) == (False, True)
        ctl.parent_pid = os.getpid()
        ctl.stub_pid = -(1 << 63)  # int64 range, both ends
        peer.parent_pid = peer.parent_pid  # reading and writing back changes nothing
        assert (peer.parent_pid, peer.stub_pid) == (os.getpid(), -(1 << 63))
        ctl.stub_pid = (1 << 63) - 1
        assert peer.stub_pid == (1 << 63) - 1
        for _ in range(3):
            ctl.beat(stub=False)
        peer.beat(stub=True)
        assert (peer.parent_heartbeat, peer.stub_heartbeat) == (3, 1)
        assert (ctl.parent_heartbeat, ctl.stub_heartbeat) == (3, 1)
        ctl.set_health(stub=False, value=True)
        assert (peer.health(stub=False), peer.health(stub=True)) == (True, False)
        peer.set_health(stub=True, value=True)
        ctl.set_health(stub=False, value=False)
        assert (ctl.health(stub=False), ctl.health(stub=True)) == (False, True)
    finally:
        pool.free(ctl.handle)


# ---- the control block across processes ---------------------------------------------------------
def test_control_block_is_shared_with_a_second_process(pool: _core.Pool, spawn: Any) -> None:
    ctl = IPCControl.create(pool)
    ctl.parent_pid = os.getpid()
    ctl.uses_env = True
    ctl.stub_message_queue = 0x1111
    ctl.parent_message_queue = 0x2222
    ctl.parent_to_stub_mq = 0x3333
    ctl.set_health(stub=False, value=True)
    expect = dict(parent_pid=os.getpid(), uses_env=True, decoupled=False, parent_health=True,
                  stub_message_queue=0x1111, parent_message_queue=0x2222, parent_to_stub_mq=0x3333,
                  stub_to_parent_mq=0, memory_manager_message_queue=0, stub_pid=0, stub_heartbeat=0)
    proc = spawn.Process(target=workers_control.stub_side_of_control, args=(pool.name, ctl.handle, expect, 5))
    proc.start()
    join_peer(proc)
    # what the stub set ...
    assert ctl.health(stub=True) is True
    assert ctl.stub_pid == proc.pid
    assert ctl.stub_heartbeat == 5
    assert (ctl.stub_to_parent_mq, ctl.memory_manager_message_queue) == (0x5151, 0x7777)
    assert ctl.decoupled is True
    # ... and what the parent set is untouched
    assert ctl.health(stub=False) is True
    assert (ctl.parent_pid, ctl.uses_env, ctl.parent_heartbeat) == (os.getpid(), True, 0)
    assert (ctl.stub_message_queue, ctl.parent_message_queue, ctl.parent_to_stub_mq) == (0x1111, 0x2222, 0x3333)
    pool.free(ctl.handle)


# ---- layout versions ----------------------------------------------------------------------------
@pytest.mark.parametrize("version", [0, LAYOUT + 1, 0xFFFFFFFF])
def test_control_block_of_another_layout_version_is_refused_naming_both(pool: _core.Pool,
                                                                        version: int) -> None:
    ctl = IPCControl.create(pool)
    try:
        assert poke_u32(pool, ctl.handle, 4, version) == LAYOUT
        with pytest.raises(_core.LayoutVersionError) as err:
            IPCControl.attach(pool, ctl.handle)
        message = str(err.value)
        assert f"layout version {version} " in message
        assert f"speaks version {LAYOUT} " in message
        poke_u32(pool, ctl.handle, 4, LAYOUT)
        assert IPCControl.attach(pool, ctl.handle).handle == ctl.handle
    finally:
        pool.free(ctl.handle)


def test_control_block_of_another_size_is_refused(pool: _core.Pool) -> None:
    ctl = IPCControl.create(pool)
    try:
        np.frombuffer(pool.view(ctl.handle, 16), np.uint64)[1] = CONTROL_BYTES + 64  # struct_bytes
        with pytest.raises(_core.LayoutVersionError, match=f"\\({CONTROL_BYTES + 64} bytes\\)"):
            IPCControl.attach(pool, ctl.handle)
    finally:
        pool.free(ctl.handle)


@pytest.mark.parametrize("version", [0, LAYOUT + 1, 0xFFFFFFFF])
def test_message_queue_of_another_layout_version_is_refused_naming_both(pool: _core.Pool,
                                                                        version: int) -> None:
    queue = MessageQueue.create(pool, 8)
    try:
        assert poke_u32(pool, queue.handle, 8, version) == LAYOUT
        with pytest.raises(_core.LayoutVersionError) as err:
            MessageQueue.attach(pool, queue.handle)
        message = str(err.value)
        assert f"layout version {version}," in message
        assert f"speaks {LAYOUT}" in message
        poke_u32(pool, queue.handle, 8, LAYOUT)
        assert MessageQueue.attach(pool, queue.handle).capacity == 8
    finally:
        pool.free(queue.handle)


@pytest.mark.parametrize("version", [0, LAYOUT + 1, 0xFFFFFFFF])
def test_pool_of_another_layout_version_is_refused_naming_both(pool: _core.Pool, version: int) -> None:
    path = os.path.join("/dev/shm", pool.name.lstrip("/"))
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 8) as header:
        assert header[0:4] == b"SHPL"
        assert int.from_bytes(header[4:8], "little") == LAYOUT
        header[4:8] = version.to_bytes(4, "little")
        try:
            with pytest.raises(_core.LayoutVersionError) as err:
                _core.Pool.attach(pool.name)
            message = str(err.value)
            assert f"layout version {version} " in message
            assert f"speaks version {LAYOUT};" in message
            assert pool.name in message
        finally:
            header[4:8] = LAYOUT.to_bytes(4, "little")
    attached = _core.Pool.attach(pool.name)
    assert not attached.owner
    attached.close()


# ---- attach on the wrong thing ------------------------------------------------------------------
def test_attach_on_memory_that_is_not_a_control_block_raises_invalid_handle(pool: _core.Pool) -> None:
    zeroed = pool.allocate(CONTROL_BYTES)
    np.frombuffer(pool.view(zeroed, CONTROL_BYTES), np.uint8)[:] = 0
    queue = MessageQueue.create(pool, 16)
    msg = IPCMessage.create(pool, Command.PING)
    ctl = IPCControl.create(pool)
    try:
        for handle in (zeroed, queue.handle, msg.handle):
            with pytest.raises(_core.InvalidHandleError, match="not name an IPC control block"):
                IPCControl.attach(pool, handle)
        for handle in (0, _core.make_handle(0, (1 << 20) - 64), _core.make_handle(9, 4480)):
            with pytest.raises(_core.InvalidHandleError):  # outside the pool altogether
                IPCControl.attach(pool, handle)
        with pytest.raises(_core.InvalidHandleError, match="not name a message queue"):
            MessageQueue.attach(pool, ctl.handle)
        with pytest.raises(_core.InvalidHandleError, match="not name an IPC message"):
            IPCMessage.attach(pool, ctl.handle)
    finally:
        for handle in (zeroed, queue.handle, msg.handle, ctl.handle):
            pool.free(handle)


# ---- IPCMessage ---------------------------------------------------------------------------------
def test_message_fields_are_what_create_was_given(pool: _core.Pool) -> None:
    msg = IPCMessage.create(pool, Command.EXECUTE_REQUEST, args=0xABC, request_id=(1 << 64) - 1, inline_reply=True)
    try:
        peer = IPCMessage.attach(pool, msg.handle)
        for m in (msg, peer):
            assert (m.command, m.args, m.request_id, m.inline_reply) == (
                Command.EXECUTE_REQUEST, 0xABC, (1 << 64) - 1, True)
            assert (m.reply_status, m.reply_args) == (0, 0)
            assert (m.notify, m.ring) == (False, False)
    finally:
        pool.free(msg.handle)


@pytest.mark.parametrize("notify,ring", [(True, False), (False, True), (True, True)])
def test_message_answer_flags_are_seen_by_the_responder(pool: _core.Pool, notify: bool, ring: bool) -> None:
    msg = IPCMessage.create(pool, Command.EXECUTE_REQUEST, 0, 0, True, notify, ring)
    try:
        peer = IPCMessage.attach(pool, msg.handle)
        assert (peer.inline_reply, peer.notify, peer.ring) == (True, notify, ring)
    finally:
        pool.free(msg.handle)


def test_a_sender_turns_the_notification_on_and_off_in_flight_and_learns_if_it_was_answered(
        pool: _core.Pool) -> None:
    msg = IPCMessage.create(pool, Command.EXECUTE_REQUEST, 0, 0, True, False, False)
    try:
        peer = IPCMessage.attach(pool, msg.handle)
        assert msg.set_notify(True) is False and peer.notify is True
        assert msg.set_notify(False) is False and peer.notify is False
        peer.reply(0, 0)
        assert msg.set_notify(True) is True and peer.notify is True
        assert (peer.inline_reply, peer.ring) == (True, False), "the other flags stay"
    finally:
        pool.free(msg.handle)


def test_a_reply_racing_a_late_notification_request_is_never_lost(pool: _core.Pool, spawn: Any) -> None:
    """The sender waits a moment for each reply, then asks to be notified: either it sees the
    reply then (set_notify answers True) or the responder pushes the handle. Across thousands
    of races, none is lost."""
    count = 3000
    inbox, outbox = MessageQueue.create(pool, count), MessageQueue.create(pool, count)
    proc = spawn.Process(target=workers_control.reply_and_notify, args=(pool.name, inbox.handle, outbox.handle, count))
    proc.start()
    messages, taken_here, notified = [], 0, set()
    try:
        for i in range(count):
            msg = IPCMessage.create(pool, Command.EXECUTE_REQUEST, i + 1, 0, True, False, False)
            messages.append(msg)
            assert inbox.push(msg.handle, timeout=5)
            if msg.wait_reply(timeout=(i % 7) * 2e-6) or msg.set_notify(True):
                taken_here += 1
                continue
            while msg.handle not in notified:  # told to notify before the reply: it must come
                handle = outbox.pop(timeout=10)
                assert handle is not None, f"message {i + 1}: answered without a notification"
                notified.add(handle)
        assert all(m.answered for m in messages)
    finally:
        join_peer(proc)
        for msg in messages:
            msg.release()
        pool.free(inbox.handle)
        pool.free(outbox.handle)
    assert 0 < taken_here < count, "both sides of the race ran"


@pytest.mark.parametrize("command", [0, 24, 0xFFFFFFFF])
def test_message_with_an_unknown_command_is_refused(pool: _core.Pool, command: int) -> None:
    msg = IPCMessage.create(pool, Command.PING)
    try:
        poke_u32(pool, msg.handle, 4, command)
        with pytest.raises(_core.CorruptionError, match=f"unknown command {command}"):
            IPCMessage.attach(pool, msg.handle)
    finally:
        pool.free(msg.handle)


def test_second_process_replies_inline_and_the_sender_sees_it(pool: _core.Pool, spawn: Any) -> None:
    baseline = pool.used_bytes
    queue = MessageQueue.create(pool, 4)
    msg = IPCMessage.create(pool, Command.INFER_EXEC_REQUEST, args=0x4242, request_id=99, inline_reply=True)
    expect = dict(command=int(Command.INFER_EXEC_REQUEST), args=0x4242, request_id=99, inline_reply=True)
    proc = spawn.Process(target=workers_control.reply_to_message,
                         args=(pool.name, queue.handle, expect, 7, 0xFEED_FACE_CAFE))
    proc.start()
    try:
        assert queue.push(msg.handle, timeout=5)
        assert msg.wait_reply(timeout=60) is True
        assert (msg.reply_status, msg.reply_args) == (7, 0xFEED_FACE_CAFE)
    finally:
        join_peer(proc)
    assert msg.wait_reply(timeout=0.05) is False, "one reply wakes the sender once"
    pool.free(queue.handle)
    allocations = pool.allocations
    msg.release()  # the responder already released its reference: this one frees the message
    assert pool.allocations == allocations - 1
    assert pool.used_bytes == baseline


@pytest.mark.parametrize("timeout", [0.0, 0.2])
def test_wait_reply_times_out_when_no_reply_comes(pool: _core.Pool, timeout: float) -> None:
    msg = IPCMessage.create(pool, Command.PING, inline_reply=True)
    try:
        start = time.monotonic()
        assert msg.wait_reply(timeout=timeout) is False
        elapsed = time.monotonic() - start
        assert timeout * 0.9 <= elapsed < timeout + 2.0
        assert (msg.reply_status, msg.reply_args) == (0, 0)
    finally:
        pool.free(msg.handle)


def test_reply_in_the_same_process_wakes_the_waiter(pool: _core.Pool) -> None:
    msg = IPCMessage.create(pool, Command.LOG_REQUEST, inline_reply=True)
    try:
        IPCMessage.attach(pool, msg.handle).reply(status=3, args=0x10)
        assert msg.wait_reply(timeout=1) is True
        assert (msg.reply_status, msg.reply_args) == (3, 0x10)
    finally:
        pool.free(msg.handle)


def test_a_message_is_answered_only_once(pool: _core.Pool) -> None:
    msg = IPCMessage.create(pool, Command.PING, request_id=5, inline_reply=True)
    try:
        responder = IPCMessage.attach(pool, msg.handle)
        responder.reply(status=1, args=0x20)
        with pytest.raises(_core.CoreError, match="already answered"):
            responder.reply(status=2, args=0x30)
        assert msg.wait_reply(timeout=1) is True
        assert (msg.reply_status, msg.reply_args) == (1, 0x20), "a refused second reply must change nothing"
    finally:
        pool.free(msg.handle)


def test_sender_that_gave_up_leaves_the_message_to_the_responder(pool: _core.Pool) -> None:
    baseline = (pool.used_bytes, pool.allocations)
    msg = IPCMessage.create(pool, Command.EXECUTE_REQUEST, inline_reply=True)
    assert msg.wait_reply(timeout=0.01) is False
    msg.release()  # the sender stops waiting: the responder still holds the message
    assert (pool.used_bytes, pool.allocations) != baseline
    responder = IPCMessage.attach(pool, msg.handle)
    assert responder.command == Command.EXECUTE_REQUEST
    responder.reply(status=0, args=0)  # a late reply lands in memory that is still allocated
    responder.release()  # the last holder frees it
    assert (pool.used_bytes, pool.allocations) == baseline


def test_one_way_message_is_freed_by_its_receiver(pool: _core.Pool) -> None:
    baseline = (pool.used_bytes, pool.allocations)
    msg = IPCMessage.create(pool, Command.MEMORY_RELEASE, args=0x99)
    assert msg.inline_reply is False
    IPCMessage.attach(pool, msg.handle).release()
    assert (pool.used_bytes, pool.allocations) == baseline


def test_answered_tells_a_complete_reply_without_taking_the_wake_up(pool: _core.Pool) -> None:
    msg = IPCMessage.create(pool, Command.PING, inline_reply=True)
    try:
        assert not msg.answered
        msg.reply(0, 0)
        assert msg.answered and msg.answered  # any number of readers
        assert msg.wait_reply(0)              # the one wake-up is still there for the waiter
        assert not msg.wait_reply(0)          # and wait_reply took it
        assert msg.answered
    finally:
        msg.release()
        msg.release()
