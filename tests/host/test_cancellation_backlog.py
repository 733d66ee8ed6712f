"""Cancellations that find the stub's ``parent_to_stub_mq`` full: they are kept and sent once
there is room (the health monitor retries them), so the model still sees ``is_cancelled()``;
one whose request ended meanwhile is dropped and never reaches a later request in its record."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import stubhost
from stubhost import _core
from stubhost._core import Command, IPCMessage
from stubhost.host import stub_process
from stubhost.host.stub_process import StubProcess, StubSettings
from tests.host.repo_factory import config_pbtxt, instance, io, wait_until, write_model

TIMEOUT = 10.0
CAPACITY = 4     # the stubs' queues: a handful of cancellations fills parent_to_stub_mq
STREAMS = 3 * CAPACITY

# Decoupled: each request sends one response, then polls is_cancelled() (touching "cancelled"
# when it sees it) and ends with Triton's CANCELLED error and the final flag.
POLLER_PY = """
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.answer, args=(request,), daemon=True).start()
        return None

    def answer(self, request):
        params = json.loads(request.parameters())
        sender = request.get_response_sender()
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))]))
        deadline = time.monotonic() + float(params["wait"])
        while not request.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.005)
        if request.is_cancelled():
            open(params["cancelled"], "w").close()
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "the request was cancelled", pb_utils.TritonError.CANCELLED)), flags=FINAL)
        else:
            sender.send(flags=FINAL)
"""


def stop(pid: int) -> None:
    """SIGSTOPs a process and waits until every thread of it is stopped (the signal is not
    synchronous: a thread woken meanwhile could still read a queue)."""
    def stopped() -> bool:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                pass  # a thread that ended
        return all(state in ("T", "t") for state in states)

    os.kill(pid, signal.SIGSTOP)
    assert wait_until(stopped, TIMEOUT, period=0.001)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[stubhost.Server]:
    repo = tmp_path / "models"
    write_model(repo, "poller", POLLER_PY, config_pbtxt(
        "poller", [io("IN", "TYPE_INT32", [1])], [io("OUT", "TYPE_INT32", [1])],
        extra="model_transaction_policy { decoupled: true }"))
    with stubhost.Server(repo, stub_settings=StubSettings(queue_capacity=CAPACITY)) as s:
        yield s


def test_cancellations_that_find_the_stubs_queue_full_still_reach_the_model(
        server: stubhost.Server, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """More streams are closed than the stub's queue holds while the stub is stopped (so it
    cannot read the queue) for longer than a cancellation waits for room: once it runs again,
    every request sees is_cancelled() and ends."""
    process = instance(server, "poller").process
    streams, flags = [], [tmp_path / f"cancelled{i}" for i in range(STREAMS)]
    for flag in flags:
        stream = server.stream("poller", {"IN": np.array([0], np.int32)},
                               parameters={"wait": 4 * TIMEOUT, "cancelled": str(flag)}, timeout=8 * TIMEOUT)
        np.testing.assert_array_equal(next(stream)["OUT"], [1])  # the model polls is_cancelled() now
        streams.append(stream)
    assert len(process.streams) == STREAMS
    stop(process.pid)
    try:
        for stream in streams:
            stream.close()  # cancels: CAPACITY of them fill parent_to_stub_mq
        time.sleep(0.3)  # well past the 0.1 s a cancellation waits for room
        assert process.alive()
    finally:
        os.kill(process.pid, signal.SIGCONT)

    def missed() -> list[str]:
        return [f.name for f in flags if not f.exists()]

    assert wait_until(lambda: not missed(), TIMEOUT), f"requests never saw their cancellation: {missed()}"
    # Each request ended (its final response came, CANCELLED, and its record was freed).
    assert wait_until(lambda: not process.streams, TIMEOUT)
    assert not [r for r in caplog.records if "could not be told" in r.getMessage()]
    assert not process._cancels


def read_queue(process: StubProcess) -> list[tuple[Command, int, int]]:
    """Takes every message off the stub's parent_to_stub_mq (as the stub would): (command, args,
    request_id) of each."""
    taken = []
    while handle := process.answers.pop(timeout=0):
        message = IPCMessage.attach(process.pool, handle)
        taken.append((message.command, message.args, message.request_id))
        message.release()
    return taken


def request(process: StubProcess) -> tuple[int, int]:
    """Writes a request record (as the parent does for each request); returns (record, serial)."""
    serial = process.next_serial()
    return _core.write_record(process.pool, int(_core.RecordKind.REQUEST), serial, (0, 0, 0)), serial


@pytest.fixture
def stopped() -> Iterator[StubProcess]:
    """A stub with queues of two messages, stopped: it reads none of them."""
    process = StubProcess("backlog", settings=StubSettings(queue_capacity=2))
    try:
        process.call(Command.PING, 0, TIMEOUT)  # it runs its loops (and holds no lock)
        stop(process.pid)
        yield process
    finally:
        process.close()  # SIGKILL ends a stopped process too


def test_a_kept_cancellation_is_sent_once_there_is_room(stopped: StubProcess) -> None:
    process = stopped
    first, second, third = request(process), request(process), request(process)
    process.cancel(*first)
    process.cancel(*second)
    process.cancel(*third)  # the queue is full: kept
    process.retry_cancels()  # still full: kept, nothing waits
    assert [(r, s) for _, s, r in read_queue(process)] == [first, second]
    process.retry_cancels()
    assert read_queue(process) == [(Command.CANCEL_REQUEST, third[1], third[0])]
    assert not process._cancels


def test_a_kept_cancellation_of_a_request_that_ended_is_dropped(stopped: StubProcess,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """The request ends (its record is freed) and a later one is written into the same record
    before there is room: the kept cancellation goes unsent, so it cannot reach the later one."""
    process = stopped
    process.cancel(*request(process))
    process.cancel(*request(process))
    one, two = request(process), request(process)
    process.cancel(*one)  # the queue is full: kept
    process.cancel(*two)
    process.pool.free(one[0])  # both requests end
    process.pool.free(two[0])
    later = request(process)
    assert later[0] in (one[0], two[0])  # one record holds a later request, the other is free
    assert len(read_queue(process)) == 2  # room now
    with caplog.at_level(logging.WARNING, logger="stubhost"):
        process.retry_cancels()
    assert read_queue(process) == []
    assert not process._cancels
    assert not [r for r in caplog.records if "could not be told" in r.getMessage()]


def test_kept_cancellations_are_bounded(stopped: StubProcess, monkeypatch: pytest.MonkeyPatch,
                                        caplog: pytest.LogCaptureFixture) -> None:
    """Past KEPT_CANCELS, those whose request ended go first, then the oldest, with a warning."""
    monkeypatch.setattr(stub_process, "KEPT_CANCELS", 2)
    process = stopped
    process.cancel(*request(process))
    process.cancel(*request(process))  # the queue is full
    ended, old, newer, newest = (request(process) for _ in range(4))
    process.cancel(*ended)  # kept
    process.cancel(*old)
    process.pool.free(ended[0])
    with caplog.at_level(logging.WARNING, logger="stubhost"):
        process.cancel(*newer)  # 3 kept: the ended one goes, silently
        assert process._cancels == [old, newer]
        assert not caplog.records
        process.cancel(*newest)  # 3 kept: the oldest goes
    assert process._cancels == [newer, newest]
    assert [r.getMessage() for r in caplog.records if "could not be told" in r.getMessage()] == [
        "stub 'backlog' could not be told of 1 cancellations"]
