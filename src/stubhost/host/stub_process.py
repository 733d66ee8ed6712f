"""One stub process and the shared memory it talks through: start, call, log, stop.

Each stub gets a pool of its own, so a crashed or hostile stub can only damage its own memory,
and a restart starts from a fresh pool. The stub's stdout and stderr come back through one pipe:
each record the stub sends (a ``pb_utils.Logger`` line, one ``print()``) keeps its level and the
model's file and line, and any other output is logged with the instance's name.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
from dataclasses import dataclass
import logging
import os
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import IO, Any

from stubhost import _core
from stubhost._core import Command, IPCControl, IPCMessage, MessageQueue, Pool
from stubhost.host.doorbell import Doorbell
from stubhost.host.errors import InferenceError
from stubhost.host.regions import ClientRegion
from stubhost.host.streams import ResponseStream, is_deferred, request_serial, stream_item
from stubhost.logs import decode_model_line
from stubhost.protocol import REPLY_ERROR, REPLY_OK, REPLY_STUB_GONE, read_payload, write_payload

log = logging.getLogger("stubhost")

QUEUE_CAPACITY = 1024
DEATH_CHECK_S = 0.1      # how often a waiting caller checks that its stub still lives
COMPLETION_POLL_S = 0.1  # how often the completion thread also polls for replies it was not told of
PUSH_TIMEOUT_S = 5.0     # how long a command that nobody waits for may wait for room in the queue
KEPT_CANCELS = 1024      # cancellations kept while parent_to_stub_mq is full (StubProcess.cancel)

# What the stub asks of the server (BLS): served by `on_call`.
_CALLS = (Command.INFER_EXEC_REQUEST, Command.INFER_STREAM_EXEC_REQUEST, Command.CANCEL_REQUEST,
          Command.MODEL_CONTROL_REQUEST, Command.METRIC_REQUEST)


class StubCallError(Exception):
    """A command the stub answered with an error (its text is the model's traceback)."""


class StubGoneError(Exception):
    """The stub died (or was stopped) before answering."""


@dataclass(frozen=True)
class StubSettings:
    """The shared memory of each stub: its pool's first size, growth step and ceiling, its
    queues' capacity in messages, and its segments' name prefix (the Python backend's
    ``shm-default-byte-size``, ``shm-growth-byte-size``, ``shm-message-queue-size`` and
    ``shm-region-prefix-name``)."""

    pool_size: int = 8 << 20
    pool_growth: int = 32 << 20
    pool_max: int = 8 << 30
    queue_capacity: int = QUEUE_CAPACITY
    prefix: str = "stubhost"


class StubProcess:
    """A started stub: its pool, control block, queues and process.

    Thread safety: ``call`` and ``submit``/``finish`` may be used from any thread at once;
    ``fail_inflight`` and ``kill`` are for the health monitor.
    """

    def __init__(self, instance_name: str, *, python: str | None = None, env: Mapping[str, str] | None = None,
                 settings: StubSettings | None = None,
                 on_call: Callable[[StubProcess, IPCMessage], None] | None = None) -> None:
        self.instance_name = instance_name
        self.on_call = on_call  # serves the stub's BLS calls: must release the message (and answer it)
        settings = settings or StubSettings()
        self.pool = Pool.create(prefix=settings.prefix, initial_size=settings.pool_size,
                                growth_size=settings.pool_growth, max_size=settings.pool_max)
        try:
            self.doorbell = Doorbell(self._rung)  # wakes the event loop that awaits this stub's answers
        except BaseException:
            self.pool.close()
            raise
        self.inflight: dict[int, IPCMessage] = {}
        self.dead = False  # set once the stub is known to be gone; never cleared
        self.abandoned: list[tuple[IPCMessage, int]] = []  # (message, request record) nobody waits for
        self.waiters: dict[int, Callable[[], None]] = {}    # message handle -> on_reply, for async callers
        # Messages given up on before the stub answered them: (message, request record, timeout, deadline)
        self.overruns: list[tuple[IPCMessage, int, float, float | None]] = []
        self._overruns_lock = threading.Lock()  # SYNC: callers that give up append, the monitor prunes
        self._completer: threading.Thread | None = None
        self._completer_lock, self._closing = threading.Lock(), False
        self._regions: set[int] = set()  # ids of the client regions this stub was asked to map
        self._regions_lock = threading.Lock()
        self.streams: dict[int, ResponseStream] = {}  # request record -> responses its sender sends
        self._streams_lock = threading.Lock()
        # Numbers the requests written into this pool (in a record's status), so that a
        # cancellation names one request, not whichever request uses its record now.
        self._serials = itertools.count()
        self.traces: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()  # traced, by id
        self._cancels: list[tuple[int, int]] = []  # (record, serial) not queued yet (queue full), oldest first
        self._cancels_lock = threading.Lock()  # SYNC: cancellers append, one retrier at a time queues
        try:
            self.control = IPCControl.create(self.pool)
            self.inbox = MessageQueue.create(self.pool, settings.queue_capacity)
            self.outbox = MessageQueue.create(self.pool, settings.queue_capacity)
            self.calls = MessageQueue.create(self.pool, settings.queue_capacity)    # stub -> parent (responses, ...)
            self.answers = MessageQueue.create(self.pool, settings.queue_capacity)  # parent -> stub (cancellations)
            self.control.stub_message_queue = self.inbox.handle
            self.control.parent_message_queue = self.outbox.handle
            self.control.stub_to_parent_mq = self.calls.handle
            self.control.parent_to_stub_mq = self.answers.handle
            self.control.parent_pid = os.getpid()
            self.control.set_health(stub=False, value=True)
            spec = json.dumps({"pool": self.pool.name, "control": self.control.handle, "instance": instance_name,
                               "doorbell": self.doorbell.fd})
            self.process = subprocess.Popen(
                [python or sys.executable, "-m", "stubhost.stub", spec],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None, close_fds=True, pass_fds=(self.doorbell.fd,),
                start_new_session=True)  # a terminal's Ctrl-C is for the server, which stops its stubs
        except BaseException:
            self.doorbell.close()
            self.pool.close()
            raise
        self._pump = threading.Thread(target=self._pump_logs, args=(self.process.stdout,),
                                      name=f"stubhost-log-{instance_name}", daemon=True)
        self._pump.start()
        self._caller = threading.Thread(target=self._serve_calls, name=f"stubhost-calls-{instance_name}", daemon=True)
        self._caller.start()

    # ---- logging ---------------------------------------------------------------------------------
    def _pump_logs(self, stream: IO[bytes] | None) -> None:
        """Log thread: each record the stub sends (a Logger line, one print) becomes one record
        of the "stubhost" logger, located at the model's file and line, at its level (as in
        Triton, the parent decides what is shown: a verbose line only at verbose level >= 1);
        any other output line is logged at INFO as ``<instance>: <line>``."""
        if stream is None:
            return
        with stream:
            for raw in stream:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                sent = decode_model_line(line)
                if sent is None:
                    log.info("%s: %s", self.instance_name, line, extra={"model_instance": self.instance_name})
                elif log.isEnabledFor(sent[0]):
                    level, path, lineno, text = sent
                    log.handle(log.makeRecord(log.name, level, path, lineno, text, (), None,
                                              extra={"model_instance": self.instance_name}))

    # ---- state -----------------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        """The stub's process id."""
        return self.process.pid

    def alive(self) -> bool:
        """True while the stub process runs."""
        return self.process.poll() is None

    # ---- commands --------------------------------------------------------------------------------
    def submit(self, command: Command, args: int, timeout: float | None,
               on_reply: Callable[..., None] | None = None, pass_message: bool = False,
               loop: asyncio.AbstractEventLoop | None = None, linger: float = 0.0) -> IPCMessage:
        """Sends one inline-reply command; the caller waits on it and then calls ``finish``.

        With `on_reply`, the caller does not wait in a thread: `on_reply` is called once the
        message is answered, with the message as its argument when `pass_message` is set. It is
        called from `loop`'s thread when `loop` (the event loop running in the calling thread)
        listens to this stub's doorbell (or from the completion thread's poll, within
        COMPLETION_POLL_S, if that loop stops); otherwise from the completion thread; and from
        whoever fails the message when the stub dies. With `linger` (seconds) and no doorbell,
        the calling thread first waits that long and, if the answer came, calls `on_reply`
        itself before returning: a quick answer then costs no other thread's wake-up.
        """
        ring = on_reply is not None and loop is not None and self.doorbell.listen(loop)
        lingering = linger > 0 and on_reply is not None and not ring
        # Positional arguments: pybind11's keyword path costs about a microsecond a call.
        message = IPCMessage.create(self.pool, command, args, 0, True, on_reply is not None and not (ring or lingering),
                                    ring)
        if on_reply is not None:
            self.waiters[message.handle] = functools.partial(on_reply, message) if pass_message else on_reply
            if ring:
                self.doorbell.expect(message.handle)
            # Even for a doorbell's message: its poll answers it if the loop stops reading the bell.
            self._start_completer()
        self.inflight[message.handle] = message
        # SYNC with fail_inflight(): it sets `dead` before it walks `inflight`, so a message either
        # is in the walk or sees the flag here (both under the GIL).
        if self.dead:
            self.fail_message(message)
        elif not self.inbox.push(message.handle, timeout):
            self.inflight.pop(message.handle, None)
            self.waiters.pop(message.handle, None)
            message.release()
            message.release()  # never delivered: the stub's reference is ours to drop
            raise TimeoutError(f"the queue of stub '{self.instance_name}' stayed full")
        elif lingering:
            self._linger(message, linger)
        return message

    def _linger(self, message: IPCMessage, within: float) -> None:
        """Waits up to `within` for the answer to a message sent without notification, and
        hands it over here; past that, the stub is told to notify (the completion thread then
        hands it over), unless the answer came meanwhile."""
        if message.wait_reply(within) or message.set_notify(True):
            self._notify(message.handle)  # a second hand-over (the health monitor's) finds no waiter

    def hand_over(self, message: IPCMessage, on_reply: Callable[[], None]) -> None:
        """Lets the completion thread call `on_reply` once a message sent without notification
        is answered: its sender no longer waits for it."""
        self.waiters[message.handle] = on_reply
        self._start_completer()
        if message.set_notify(True):  # answered meanwhile: nobody will be notified
            self._notify(message.handle)

    def finish(self, message: IPCMessage) -> tuple[int, int]:
        """(status, reply_args) of an answered message, which is then released."""
        self.inflight.pop(message.handle, None)
        status, reply = message.reply_status, message.reply_args
        message.release()
        return status, reply

    def call(self, command: Command, args: int, timeout: float | None) -> Any:
        """Sends a control command and returns its JSON payload (None when it has none).

        Raises StubCallError with the stub's text, StubGoneError if it died, TimeoutError.
        """
        try:
            message = self.submit(command, args, timeout)
        except BaseException:
            if args:
                self.pool.free(args)
            raise
        if not self.wait(message, timeout):
            self.abandon(message, 0)
            raise TimeoutError(f"stub '{self.instance_name}' did not answer {command.name} within {timeout} s")
        status, reply = self.finish(message)
        if status == REPLY_STUB_GONE:
            raise StubGoneError(f"stub '{self.instance_name}' exited with code {self.process.poll()}")
        payload = read_payload(self.pool, reply) if reply else None
        if status == REPLY_ERROR:
            raise StubCallError(payload.get("message", "") if isinstance(payload, dict) else str(payload))
        if status != REPLY_OK:
            raise StubCallError(f"stub '{self.instance_name}' answered with unknown status {status}")
        return payload

    def wait(self, message: IPCMessage, timeout: float | None) -> bool:
        """Waits for the reply; a stub that dies meanwhile answers at once (REPLY_STUB_GONE),
        even before a health monitor watches it (during loading). False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = DEATH_CHECK_S if deadline is None else min(DEATH_CHECK_S, deadline - time.monotonic())
            if message.wait_reply(max(remaining, 0.0)):
                return True
            if not self.alive():
                self.fail_inflight()
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def map_region(self, region: ClientRegion) -> None:
        """Asks the stub to map a client's region, once. Not waited for: the command is queued
        ahead of every Execute that names the region, and a stub that cannot map it fails those."""
        if region.id in self._regions:
            return
        with self._regions_lock:  # SYNC: a second caller must not queue its Execute before this map
            if region.id in self._regions:
                return
            self._send_unwaited(Command.REGION_MAP, region.map_payload())
            self._regions.add(region.id)

    def unmap_region(self, region_id: int) -> None:
        """Tells the stub to drop a region's mapping (requests already queued still see it)."""
        with self._regions_lock:
            if region_id not in self._regions:
                return
            self._regions.discard(region_id)
            if not self.dead:
                self._send_unwaited(Command.REGION_UNMAP, {"id": region_id})

    def _send_unwaited(self, command: Command, payload: dict[str, Any]) -> None:
        args = write_payload(self.pool, payload)
        try:
            message = self.submit(command, args, PUSH_TIMEOUT_S)
        except BaseException:
            self.pool.free(args)
            raise
        self.abandon(message, 0)  # the stub frees the payload when it reads it; reap() frees the answer

    def abandon(self, message: IPCMessage, record: int) -> None:
        """Gives up on a message the stub may still answer: the caller is told, and ``reap``
        frees its request record and the reply once the stub is done with them."""
        self.inflight.pop(message.handle, None)
        self.waiters.pop(message.handle, None)
        self.abandoned.append((message, record))

    def running_for(self, record: int) -> float | None:
        """Seconds the stub has been executing the request (or batch) in `record`, which must
        still be held; None when it has not started it (the stub stamps it as it starts)."""
        try:
            ms = _core.record_running_ms(self.pool, record)
        except (_core.CoreError, ValueError):  # ValueError: the pool is closed (the stub is gone)
            return None
        return None if ms < 0 else ms / 1000

    def watch_overrun(self, message: IPCMessage, *, deadline: float | None = None, record: int = 0,
                      timeout: float = 0.0) -> None:
        """Notes a message given up on before its answer: ``overrun`` reports the stub once the
        message, still unanswered, passes `deadline` (monotonic), or, without one, once the stub
        has run the abandoned request in `record` (stamped as it starts) for `timeout` seconds."""
        with self._overruns_lock:
            self.overruns.append((message, record, timeout, deadline))

    def overrun(self) -> bool:
        """True when a message passed to ``watch_overrun`` is still unanswered past its limit
        (health monitor, after ``reap``, which frees an abandoned record only once answered: so
        the records read here are alive). Answered ones are forgotten without touching them:
        they may be released already."""
        if not self.overruns or self.dead:  # (a dead stub's pool may be closed already)
            return False
        now, late, pending = time.monotonic(), False, []
        with self._overruns_lock:
            entries, self.overruns = self.overruns, []
        for entry in entries:
            message, record, timeout, deadline = entry
            abandoned = any(a is message for a, _ in self.abandoned)
            if not abandoned and self.inflight.get(message.handle) is not message:
                continue  # answered
            pending.append(entry)
            if deadline is not None:
                late = late or now >= deadline
            elif abandoned and record:
                running = self.running_for(record)
                late = late or (running is not None and running >= timeout)
        with self._overruns_lock:
            self.overruns.extend(pending)
        return late

    def reap(self) -> None:
        """Frees what abandoned messages left behind once they are answered (health monitor)."""
        pending = []
        for message, record in self.abandoned:
            if not message.wait_reply(0):
                pending.append((message, record))
                continue
            status, reply = message.reply_status, message.reply_args
            message.release()
            if status == REPLY_STUB_GONE:
                continue  # the pool goes with the stub
            if status == REPLY_ERROR and reply:
                try:
                    payload = read_payload(self.pool, reply)  # frees the reply
                    log.warning("stub '%s' failed a command nobody waited for: %s", self.instance_name,
                                payload.get("message", "") if isinstance(payload, dict) else payload)
                except (_core.CoreError, ValueError):
                    pass
                reply = 0
            try:
                if record and reply and status == REPLY_OK and is_deferred(self.pool, reply):
                    # Its sender still answers it: the record lives until the final response.
                    stream = self.stream_for(record)
                    self.abandon_stream(record, stream)
                    stream.executed(record)
                    record = 0
                if record:
                    self.pool.free(record)
                if reply:
                    _core.free_record_chain(self.pool, reply)
            except _core.CoreError as e:
                log.warning("stub '%s' answered an abandoned request with a bad reply: %s", self.instance_name, e)
        self.abandoned = pending

    def fail_message(self, message: IPCMessage) -> None:
        """Answers a message for a stub that can no longer do so."""
        try:
            message.reply(REPLY_STUB_GONE, 0)
        except _core.CoreError:
            pass  # the stub answered it after all
        self._notify(message.handle)

    def _notify(self, handle: int) -> None:
        message = self.inflight.get(handle)
        if message is not None and not message.answered:
            # A stale notification: its message was finished without it (by the safety-net poll
            # below, when the stub's push came late), and the handle now names a newer message
            # that is not answered yet. (`answered` consumes nothing: a waiter may still need
            # the wake-up that wait_reply takes.)
            return
        on_reply = self.waiters.pop(handle, None)  # atomic: whoever pops it calls it, once
        if on_reply is not None:
            on_reply()

    def _rung(self, pending: set[int]) -> None:
        """The doorbell rang (in its loop's thread): the answered messages in `pending` are
        handed to their callers, and those that are no longer in flight are forgotten."""
        for handle in list(pending):
            message = self.inflight.get(handle)
            if message is None:  # failed, or given up on
                pending.discard(handle)
            elif message.answered:
                pending.discard(handle)
                self._notify(handle)

    def _start_completer(self) -> None:
        if self._completer is None:
            with self._completer_lock:
                if self._completer is None:
                    self._completer = threading.Thread(target=self._complete, name=f"stubhost-done-{self.instance_name}",
                                                       daemon=True)
                    self._completer.start()

    def _complete(self) -> None:
        """Completion thread: turns the stub's notifications into ``on_reply`` calls."""
        late: set[int] = set()  # the doorbell's messages found answered by the last poll
        while not self._closing:
            handle = self.outbox.pop(timeout=COMPLETION_POLL_S)
            if handle:
                self._notify(handle)
                continue
            # Safety net: a notification the stub could not push (full queue) is found by polling;
            # so is a doorbell's answer that its loop left unread for a whole poll (it stopped).
            answered = set()
            for pending in list(self.waiters):
                message = self.inflight.get(pending)
                if message is not None and message.answered:
                    answered.add(pending)
            rung = self.doorbell.pending
            for pending in answered:
                if pending not in rung or pending in late:
                    self._notify(pending)
            late = answered & rung

    # ---- calls from the stub ----------------------------------------------------------------------
    def _serve_calls(self) -> None:
        """Calls thread: reads the stub's one-way messages (responses its senders send)."""
        while not self._closing:
            handle = self.calls.pop(timeout=COMPLETION_POLL_S)
            if not handle:
                continue
            try:
                message = IPCMessage.attach(self.pool, handle)
            except _core.CoreError as e:
                log.warning("stub '%s' sent a malformed message: %s", self.instance_name, e)
                continue
            command = message.command
            if command in _CALLS and self.on_call is not None:
                self.on_call(self, message)  # answers and releases it (from a thread of its own)
                continue
            args, request = message.args, message.request_id
            if command == Command.RESPONSE_SEND:
                message.release()
                self._on_response(request, args)
                continue
            log.warning("stub '%s' sent an unexpected %s", self.instance_name, command.name)
            if message.inline_reply:
                try:
                    message.reply(REPLY_ERROR, 0)
                except _core.CoreError:
                    pass
            message.release()

    def _on_response(self, record: int, response: int) -> None:
        item = stream_item(self.pool, response, self.instance_name)
        stream = self.stream_for(record)
        stream.put(item)
        if item.final and stream.abandoned:
            self.forget_stream(record, stream)

    def next_serial(self) -> int:
        """The serial of the next request written into this pool: 32 bits (a record's status),
        never 0 (the status of a record no parent numbered, such as a BLS request)."""
        return next(self._serials) % 0xFFFFFFFF + 1

    def stream_for(self, record: int, serial: int | None = None) -> ResponseStream:
        """The stream of responses to the request whose record is `record` (made on first use:
        a response may come before the Execute reply that says to expect it). `serial` is the
        request's; None reads it from the record, which must still be the request's."""
        stream = self.streams.get(record)
        if stream is None:
            with self._streams_lock:
                stream = self.streams.get(record)
                if stream is None:
                    if serial is None:
                        serial = request_serial(self.pool, record)
                    stream = ResponseStream(self.pool, serial, functools.partial(self.forget_stream, record))
                    self.streams[record] = stream
                    if self.dead:
                        stream.fail(InferenceError("INTERNAL", f"Stub process '{self.instance_name}' is not healthy."))
        return stream

    def forget_stream(self, record: int, stream: ResponseStream) -> None:
        """Drops `stream` from the streams found by record (its consumer is done with it, or its
        record is being freed). Only that very stream: once the record is freed, the same
        offset may already name a newer request's stream."""
        with self._streams_lock:
            if self.streams.get(record) is stream:
                del self.streams[record]

    def abandon_stream(self, record: int, stream: ResponseStream) -> None:
        """The consumer left early: the model is told the request is cancelled, and what it
        still sends is dropped (the stream goes once its final response is in)."""
        if stream.abandon():
            self.cancel(record, stream.serial)
            if stream.final:  # it ended meanwhile
                self.forget_stream(record, stream)
        else:
            self.forget_stream(record, stream)

    def cancel(self, record: int, serial: int) -> None:
        """Tells the stub that the caller of a request (its record, still held, and serial) cancelled it
        (``is_cancelled()``). One that finds the queue full for 0.1 s, or older ones kept, is kept for
        ``retry_cancels``; past KEPT_CANCELS, those whose request is over go, then the oldest (warned)."""
        if self.dead or (not self._cancels and self.post(Command.CANCEL_REQUEST, serial, record, timeout=0.1)):
            return  # a dead stub's requests fail anyway
        with self._cancels_lock:
            self._cancels.append((record, serial))
            if len(self._cancels) > KEPT_CANCELS:
                self._cancels = [kept for kept in self._cancels if self._holds(*kept)]
                if (lost := len(self._cancels) - KEPT_CANCELS) > 0:
                    del self._cancels[:lost]
                    log.warning("stub '%s' could not be told of %d cancellations", self.instance_name, lost)
        self.retry_cancels()

    def retry_cancels(self) -> None:
        """Queues the cancellations ``cancel`` kept, oldest first, while the queue has room, without
        waiting (the health monitor, each pass; each later ``cancel``). One whose request is over (its
        record freed or reused) is dropped unsent; all are, once the stub is gone."""
        if not self._cancels or not self._cancels_lock.acquire(blocking=False):
            return  # nothing kept, or another thread is at it
        try:
            kept = self._cancels
            while kept and (self.dead or len(self.answers) < self.answers.capacity):
                record, serial = kept[0]
                if self._holds(record, serial) and not self.post(Command.CANCEL_REQUEST, serial, record, timeout=0):
                    break  # no room after all (or in the pool): next time
                del kept[0]  # queued, or its request is over, or the stub is gone
        finally:
            self._cancels_lock.release()

    def _holds(self, record: int, serial: int) -> bool:
        """The stub lives and `record` holds the request numbered `serial` (a freed one may read so)."""
        try:
            return not self.dead and request_serial(self.pool, record) == serial and self.pool.allocation_size(record) > 0
        except (_core.CoreError, ValueError):  # ValueError: the pool is closed (the stub is gone)
            return False

    def post(self, command: Command, args: int, request_id: int, timeout: float = PUSH_TIMEOUT_S) -> bool:
        """Queues a one-way message on ``parent_to_stub_mq``; False (and `args` is left to the
        caller) when the stub is gone, the pool is full or the queue stayed full."""
        if self.dead:
            return False
        try:
            message = IPCMessage.create(self.pool, command, args=args, request_id=request_id)
        except _core.CoreError:
            return False
        if not self.answers.push(message.handle, timeout=timeout):
            message.release()
            return False
        return True

    def fail_inflight(self) -> None:
        """Wakes every caller still waiting on this stub (it died or is being replaced)."""
        self.dead = True
        for message in list(self.inflight.values()):
            self.fail_message(message)
        with self._streams_lock:
            streams = list(self.streams.values())
        for stream in streams:
            stream.fail(InferenceError("INTERNAL", f"Stub process '{self.instance_name}' is not healthy."))

    # ---- stopping --------------------------------------------------------------------------------
    def kill(self) -> None:
        """Kills the stub at once and fails what it had in flight."""
        if self.alive():
            self.process.kill()
        self.process.wait()
        self.fail_inflight()

    def close(self) -> None:
        """Kills the stub if it still runs and removes the pool's segments.

        Views handed out earlier stay valid: the mapping lives until its last user goes.
        """
        self.kill()
        self._closing = True
        if self._completer is not None:
            self.outbox.push(0, timeout=0.1)  # wakes the completion thread, which sees _closing
            self._completer.join(timeout=1.0)
        self.calls.push(0, timeout=0.1)  # the same for the calls thread
        self._caller.join(timeout=1.0)
        self._pump.join(timeout=1.0)
        self.doorbell.close()
        self.pool.close()
