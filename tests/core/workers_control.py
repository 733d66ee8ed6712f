"""Code that runs in a second (spawned) process for tests/core/test_control.py.

Top-level functions only, so that a spawn context can import them by name. A failed check raises
(the process then exits non-zero and its traceback goes to stderr).
"""

from __future__ import annotations

import os
from typing import Any

from stubhost._core import Command, IPCControl, IPCMessage, MessageQueue, Pool


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)


def stub_side_of_control(pool_name: str, ctl_handle: int, expect: dict[str, Any], beats: int) -> None:
    """Attaches the control block as the stub would: checks what the parent set, then sets the
    stub's health, pid and queue handles and beats its heartbeat `beats` times."""
    pool = Pool.attach(pool_name)
    try:
        ctl = IPCControl.attach(pool, ctl_handle)
        _check(ctl.handle == ctl_handle, "handle")
        for field, value in expect.items():
            got = ctl.health(stub=False) if field == "parent_health" else getattr(ctl, field)
            _check(got == value, f"{field}: expected {value!r}, got {got!r}")
        _check(ctl.health(stub=True) is False, "stub health must start clear")
        ctl.set_health(stub=True, value=True)
        ctl.stub_pid = os.getpid()
        ctl.stub_to_parent_mq = 0x5151
        ctl.memory_manager_message_queue = 0x7777
        ctl.decoupled = True
        for _ in range(beats):
            ctl.beat(stub=True)
    finally:
        pool.close()


def reply_to_message(pool_name: str, queue_handle: int, expect: dict[str, Any], status: int,
                     reply_args: int) -> None:
    """Pops a message handle, attaches the message, checks it, replies inline and releases it."""
    pool = Pool.attach(pool_name)
    try:
        queue = MessageQueue.attach(pool, queue_handle)
        handle = queue.pop(timeout=30)
        _check(handle is not None, "no message arrived")
        msg = IPCMessage.attach(pool, handle)
        _check(msg.handle == handle, "handle")
        _check(msg.command == Command(expect["command"]), f"command {msg.command!r}")
        for field in ("args", "request_id", "inline_reply"):
            _check(getattr(msg, field) == expect[field], f"{field}: {getattr(msg, field)!r}")
        msg.reply(status, reply_args)
        msg.release()  # the responder's reference; the sender holds the other
    finally:
        pool.close()


def reply_and_notify(pool_name: str, inbox_handle: int, outbox_handle: int, count: int) -> None:
    """Answers `count` messages as the stub's command loop does: reply, then push the handle on
    the outbox only if the message asks for a notification *after* the reply."""
    pool = Pool.attach(pool_name)
    try:
        inbox = MessageQueue.attach(pool, inbox_handle)
        outbox = MessageQueue.attach(pool, outbox_handle)
        for _ in range(count):
            handle = inbox.pop(timeout=30)
            _check(handle is not None, "no message arrived")
            msg = IPCMessage.attach(pool, handle)
            msg.reply(0, msg.args)
            if msg.notify:
                _check(outbox.push(handle, timeout=30), "the outbox stayed full")
            msg.release()
    finally:
        pool.close()
