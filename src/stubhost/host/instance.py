"""One model instance: a stub process that is initialized, serves Execute, and is restarted.

States: STARTING -> READY -> (RESTARTING -> READY)* -> STOPPED, or FAILED once the restart
budget is spent. Execute never runs on a stub that is not READY; a caller that arrives while its
instance restarts waits for it (bounded by its timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from stubhost import _core
from stubhost._core import Command, IPCMessage, RecordKind
from stubhost.host.answers import ExecuteResult, SenderAnswer, request_timeout
from stubhost.host.doorbell import AnswerSpin, wake
from stubhost.host.errors import AnsweredError, InferenceError
from stubhost.host.instance_spec import InstanceSpec, initialize_stub, load_error
from stubhost.host.regions import RegionDestination, RegionTensor, destination_text, region_entry
from stubhost.host.streams import ResponseStream, StreamItem, request_serial
from stubhost.host.stub_process import StubCallError, StubGoneError, StubProcess
from stubhost.host.trace import RequestTrace
from stubhost.host.warmup import Warmup
from stubhost.protocol import (
    REPLY_ERROR,
    REPLY_OK,
    REPLY_STUB_GONE,
    RESPONSE_DEFERRED,
    RESPONSE_FAILED,
    error_code_name,
    read_payload,
)

log = logging.getLogger("stubhost")

_REQUEST = int(RecordKind.REQUEST)
_RESPONSE = int(RecordKind.RESPONSE)


def _tell_cancelled(process: StubProcess, record: int) -> None:
    """Tells the stub its caller gave up the request in `record` (still held): ``is_cancelled()``."""
    with contextlib.suppress(_core.CoreError):
        if not process.dead:
            process.cancel(record, request_serial(process.pool, record))


class RequestStream:
    """A request sent to a decoupled model: its responses, in order, until the final one.

    Iterate with ``next``/``next_async``; ``close`` when leaving early (the model sees the
    request cancelled).
    """

    __slots__ = ("instance", "process", "record", "stream", "sent")

    def __init__(self, instance: ModelInstance, process: StubProcess, record: int, stream: ResponseStream,
                 sent: int) -> None:
        self.instance = instance
        self.process = process
        self.record = record
        self.stream = stream
        self.sent = sent

    def next(self, timeout: float | None) -> StreamItem | None:
        """The next response (None when `timeout` ran out)."""
        return self.stream.next(timeout)

    async def next_async(self, timeout: float | None = None) -> StreamItem | None:
        """The next response, for a coroutine (None when `timeout` ran out)."""
        return await self.stream.next_async(timeout)

    def close(self) -> None:
        """Done with the stream; a request still open is cancelled."""
        ModelInstance._leave(self.process, self.record, self.stream)


IS_READY_TIMEOUT_S = 5.0
# A request its stub began within this long of its call has run its whole timeout when that ends:
# the send and the stub's wake-up are no queue time (and the stub's stamp counts whole ms).
START_SLACK_S = 0.02


class InstanceState(enum.Enum):
    """Where an instance is in its life."""

    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


class ModelInstance:
    """A running instance. ``execute`` may be called from any number of threads."""

    def __init__(self, spec: InstanceSpec, process: StubProcess | None = None) -> None:
        self.spec = spec
        self.name = spec.instance_name
        self.state = InstanceState.STARTING
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._spin = AnswerSpin()  # keeps an asyncio caller's loop awake for a quick answer
        self._crashes: deque[float] = deque()
        self.restarts = 0
        self.has_is_ready = False
        self._restarter: threading.Thread | None = None
        self._starting: StubProcess | None = None
        self._stopping = threading.Event()
        self.warmup = Warmup(spec)  # model_warmup: run on each new stub before it is READY
        try:
            self.process = process if process is not None else StubProcess(spec.instance_name, python=spec.python,
                                                                             env=spec.env, settings=spec.stub,
                                                                             on_call=spec.on_call)
        except OSError as e:
            raise load_error(spec, e) from None

    # ---- lifecycle -------------------------------------------------------------------------------
    def initialize(self) -> None:
        """Initializes the model in the stub; READY on success, raises InferenceError otherwise."""
        self.has_is_ready = initialize_stub(self.process, self.spec)
        self.warmup.run(self, self.process)  # closes the stub on failure
        self.state = InstanceState.READY
        self._ready.set()

    def probe_ready(self) -> bool:
        """READY, and the model's own ``is_ready()`` (when it has one) returned True."""
        if self.state is not InstanceState.READY:
            return False
        if not self.has_is_ready:
            return True
        try:
            reply = self.process.call(Command.PING, 0, IS_READY_TIMEOUT_S)
        except (StubCallError, StubGoneError, TimeoutError, _core.CoreError) as e:
            log.warning("is_ready() of instance '%s' failed: %s", self.name, e)
            return False
        return isinstance(reply, dict) and reply.get("ready") is True

    def load_count(self) -> int:
        """Requests in flight on this instance (for picking the least busy one)."""
        return len(self.process.inflight) + len(self.process.streams)

    def check_health(self) -> None:
        """Called by the health monitor: notices a dead stub and starts its replacement."""
        with self._lock:
            if self.state is not InstanceState.READY or self.process.alive():
                return
            self._ready.clear()
            log.error("Stub process '%s' is not healthy (exit code %s).", self.name, self.process.process.poll())
            self.process.fail_inflight()
            delay = self._next_restart_delay()
            if delay is None:
                return
            self.state = InstanceState.RESTARTING
            self._restarter = threading.Thread(target=self._restart, args=(delay,),
                                               name=f"stubhost-restart-{self.name}", daemon=True)
            self._restarter.start()

    def _next_restart_delay(self) -> float | None:
        """Records a crash; the backoff before the next start, or None (and FAILED) when the
        restart budget is spent. Called with the lock held."""
        now = time.monotonic()
        self._crashes.append(now)
        policy = self.spec.restart
        while self._crashes and now - self._crashes[0] > policy.window_s:
            self._crashes.popleft()
        if not policy.enabled or len(self._crashes) > policy.max_restarts:
            self.state = InstanceState.FAILED
            self._ready.set()  # wake waiters: they fail fast now
            log.error("Instance '%s' stays down after %d crash(es) in %.0f s.", self.name, len(self._crashes),
                      policy.window_s)
            return None
        return min(policy.backoff_s * 2 ** (len(self._crashes) - 1), policy.max_backoff_s)

    def _restart(self, delay: float | None) -> None:
        self.process.close()
        while delay is not None:
            if self._stopping.wait(delay) or self.state is not InstanceState.RESTARTING:
                return
            try:
                process = StubProcess(self.name, python=self.spec.python, env=self.spec.env,
                                      settings=self.spec.stub, on_call=self.spec.on_call)
                self._starting = process  # stop() kills it, so a hanging initialize cannot hold stop up
                if self.state is not InstanceState.RESTARTING:
                    process.kill()
                has_is_ready = initialize_stub(process, self.spec)  # closes the process on failure
                self.warmup.run(self, process)  # warmed up again before READY; closes it on failure
            except Exception as e:
                log.error("Restart of instance '%s' failed: %s", self.name, e)
                with self._lock:
                    if self.state is not InstanceState.RESTARTING:
                        return
                    delay = self._next_restart_delay()
                continue
            finally:
                self._starting = None
            with self._lock:
                if self.state is not InstanceState.RESTARTING:  # stopped meanwhile
                    process.close()
                    return
                self.process = process
                self.has_is_ready = has_is_ready
                self.restarts += 1
                self.state = InstanceState.READY
                self._ready.set()
            log.info("Instance '%s' restarted (pid %d).", self.name, process.pid)
            return

    def mark_hung(self) -> None:
        """The stub ran one request for longer than its timeout: replace the stub."""
        log.error("Stub process '%s' did not answer in time; replacing it.", self.name)
        self.process.kill()
        self.check_health()  # now, not at the monitor's next pass: the next caller waits for the new stub

    def stop(self) -> None:
        """Finalizes the model (if READY) and stops the stub; idempotent."""
        with self._lock:
            state, self.state = self.state, InstanceState.STOPPED
            self._ready.set()
            self._stopping.set()  # cuts a restart's backoff short
            restarter = self._restarter
        starting = self._starting
        if starting is not None:
            starting.kill()
        if restarter is not None and restarter is not threading.current_thread():
            restarter.join()  # it sees STOPPED and closes what it started: nothing outlives stop()
        process = self.process
        if state is InstanceState.READY and process.alive():
            try:
                process.call(Command.FINALIZE_REQUEST, 0, self.spec.finalize_timeout_s)
                process.process.wait(timeout=self.spec.finalize_timeout_s)
            except (StubCallError, StubGoneError, TimeoutError, _core.CoreError) as e:
                log.error("Finalize of instance '%s' failed: %s", self.name, e)
            except Exception as e:  # subprocess.TimeoutExpired
                log.error("Instance '%s' did not exit after finalize: %s", self.name, e)
        process.close()

    # ---- the hot path ----------------------------------------------------------------------------
    def _wait_ready(self, timeout: float | None) -> StubProcess:
        if self.state is not InstanceState.READY:
            self._ready.wait(timeout if timeout is not None else self.spec.init_timeout_s)
            if self.state is not InstanceState.READY:
                raise InferenceError("UNAVAILABLE", f"Stub process '{self.name}' is not healthy.")
        return self.process

    def execute(self, tensors: list[tuple[str, Any, int]], outputs: Sequence[str | RegionDestination], request_id: str,
                parameters: str, correlation_id: int | str, flags: int,
                timeout: float | None, *, timeout_us: int | None = None) -> ExecuteResult:
        """Runs one request; its output arrays are views of the pool. ``timeout`` bounds the
        wait (a request still running then is taken for a hung stub); ``timeout_us`` is what the
        model sees as ``request.timeout()`` (default: ``timeout``)."""
        process = self._wait_ready(timeout)
        message, record = self._send(process, tensors, outputs, request_id, parameters, correlation_id, flags,
                                     timeout, None, timeout_us)
        sent = time.monotonic_ns()
        deadline = None if timeout is None else time.monotonic() + timeout
        if not process.wait(message, timeout):
            raise self._timed_out(process, message, record, timeout)
        outcome = self._finish(process, message, record, sent)
        if not isinstance(outcome, ResponseStream):
            return outcome
        return self.await_sender(process, record, outcome, sent, timeout, deadline)

    def await_sender(self, process: StubProcess, record: int, stream: ResponseStream, sent: int,
                     timeout: float | None, deadline: float | None) -> ExecuteResult:
        """The one response a default-mode model sends through a request's sender (by
        `deadline`, a time.monotonic() instant; None: no limit)."""
        answer = SenderAnswer(self.name, sent, timeout, deadline)
        try:
            while (result := answer.take(stream.next(answer.remaining()))) is None:
                pass
            return result
        finally:
            self._leave(process, record, stream)

    async def await_sender_async(self, process: StubProcess, record: int, stream: ResponseStream, sent: int,
                                 timeout: float | None, deadline: float | None) -> ExecuteResult:
        """``await_sender`` for a coroutine."""
        answer = SenderAnswer(self.name, sent, timeout, deadline)
        try:
            while (result := answer.take(await stream.next_async(answer.remaining()))) is None:
                pass
            return result
        finally:
            self._leave(process, record, stream)

    async def execute_async(self, tensors: list[tuple[str, Any, int]], outputs: Sequence[str | RegionDestination], request_id: str,
                            parameters: str, correlation_id: int | str, flags: int,
                            timeout: float | None, *, timeout_us: int | None = None,
                            trace: RequestTrace | None = None) -> ExecuteResult:
        """``execute`` for asyncio: no thread waits; the stub rings the doorbell of the caller's
        event loop when the reply is in (or its completion thread wakes the loop: StubProcess.submit).
        `trace`: the request is traced (the model's BLS requests are its children)."""
        loop = asyncio.get_running_loop()
        process = self.process
        if self.state is not InstanceState.READY:
            process = await loop.run_in_executor(None, self._wait_ready, timeout)
        done = loop.create_future()
        message, record = self._send(process, tensors, outputs, request_id, parameters, correlation_id, flags,
                                     timeout, functools.partial(wake, loop, done), timeout_us, loop=loop,
                                     trace=trace)
        sent = time.monotonic_ns()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            await self._spin.wait(done, timeout)
            if not done.done():  # else no timer, and no trip through the loop
                await asyncio.wait_for(done, timeout)
        except asyncio.TimeoutError:
            raise self._timed_out(process, message, record, timeout) from None
        except asyncio.CancelledError:
            # The caller went away: the model sees the request cancelled (it may stop early), and
            # the stub's answer is reaped later.
            _tell_cancelled(process, record)
            process.abandon(message, record)
            raise
        outcome = self._finish(process, message, record, sent)
        if not isinstance(outcome, ResponseStream):
            return outcome
        return await self.await_sender_async(process, record, outcome, sent, timeout, deadline)

    def submit(self, tensors: list[tuple[str, Any, int]], outputs: Sequence[str | RegionDestination], request_id: str,
               parameters: str, correlation_id: int | str, flags: int,
               done: Callable[[ExecuteResult | InferenceError], None], linger: float = 0.0) -> None:
        """Sends one request to this READY instance with no thread waiting for it: `done` gets
        its outcome from the stub process's completion thread, or from whoever fails the message
        when the stub dies (a response the model sends through its sender is waited for on a
        thread of its own); or from this thread, when it comes within `linger` seconds (see
        StubProcess.submit). Raises InferenceError when it cannot be sent."""
        process = self.process
        sent = time.monotonic_ns()

        def replied(message: IPCMessage, record: int) -> None:
            if message.reply_status == REPLY_STUB_GONE:
                # Whoever failed the message (the health monitor, holding this instance's lock)
                # restarts the stub: ``outcomes`` would check health again, from under that lock.
                process.finish(message)
                done(InferenceError("INTERNAL", f"Stub process '{self.name}' is not healthy."))
                return
            outcome = self.outcomes(process, message, [record], sent)[0]
            if isinstance(outcome, ResponseStream):
                self.answer_later(process, record, outcome, sent, done)
                return
            done(outcome)

        self._send(process, tensors, outputs, request_id, parameters, correlation_id, flags, None, replied, None, True,
                   linger=linger)

    def answer_later(self, process: StubProcess, record: int, stream: ResponseStream, sent: int,
                     done: Callable[[ExecuteResult | InferenceError], None]) -> None:
        """Hands `done`, from a thread of its own, the response a request's sender sends."""
        threading.Thread(target=self._deferred, args=(process, record, stream, sent, done),
                         name=f"stubhost-sender-{self.name}", daemon=True).start()

    def _deferred(self, process: StubProcess, record: int, stream: ResponseStream, sent: int,
                  done: Callable[[ExecuteResult | InferenceError], None]) -> None:
        """Waits for the response a submitted request's sender sends, and hands it to `done`."""
        try:
            outcome: ExecuteResult | InferenceError = self.await_sender(process, record, stream, sent, None, None)
        except InferenceError as e:
            outcome = e
        done(outcome)

    @staticmethod
    def _leave(process: StubProcess, record: int, stream: ResponseStream) -> None:
        """The consumer of a stream is done (or gave up: then the model sees it cancelled)."""
        if stream.final:
            process.forget_stream(record, stream)
        else:
            process.abandon_stream(record, stream)

    # ---- streams (decoupled models) ----------------------------------------------------------------
    def open_stream(self, tensors: list[tuple[str, Any, int]], outputs: Sequence[str | RegionDestination],
                    request_id: str, parameters: str, correlation_id: int | str, flags: int,
                    timeout_us: int | None, process: StubProcess | None = None,
                    trace: RequestTrace | None = None) -> RequestStream:
        """Sends one request whose responses come through its sender; returns the stream that
        gathers them. `process` skips the wait for READY (an async caller waited already);
        `trace`: the request is traced."""
        process = process or self._wait_ready(None)
        serial = process.next_serial()
        record = self.write_request(process, tensors, outputs, request_id, parameters, correlation_id, flags,
                                     None, timeout_us, serial, trace)
        stream = process.stream_for(record, serial)
        try:
            process.submit(Command.EXECUTE_REQUEST, record, None, functools.partial(self._stream_replied, process,
                                                                                     record, stream), True)
        except (TimeoutError, _core.CoreError) as e:
            process.forget_stream(record, stream)
            process.pool.free(record)
            raise InferenceError("UNAVAILABLE", f"cannot send the request to instance '{self.name}': {e}") from None
        return RequestStream(self, process, record, stream, time.monotonic_ns())

    def _stream_replied(self, process: StubProcess, record: int, stream: ResponseStream, message: IPCMessage) -> None:
        """The Execute of a streamed request was answered (completion thread)."""
        self.streams_executed(process, message, [(record, stream)])

    def streams_executed(self, process: StubProcess, message: IPCMessage,
                         streams: Sequence[tuple[int, ResponseStream]]) -> None:
        """The Execute of streamed requests, (record, stream) in batch order, was answered: a
        failed one ends each stream with the error (completion thread)."""
        status, reply = process.finish(message)
        error: InferenceError | None = None
        if status == REPLY_STUB_GONE:
            for _, stream in streams:
                stream.fail(InferenceError("INTERNAL", f"Stub process '{self.name}' is not healthy."))
            return
        if status == REPLY_ERROR:
            try:
                payload = read_payload(process.pool, reply) if reply else {}
            except (_core.CoreError, ValueError):
                payload = {}
            text = str(payload.get("message", "")) if isinstance(payload, dict) else ""
            error = InferenceError("INTERNAL", text or f"instance '{self.name}' failed the request")
        elif reply:
            try:
                _core.free_record_chain(process.pool, reply)  # a decoupled Execute answers nothing in its reply
            except _core.CoreError:
                pass
        for record, stream in streams:
            if error is not None:
                stream.put(StreamItem(None, "{}", error, True))
            stream.executed(record)

    def _send(self, process: StubProcess, tensors: list[tuple[str, Any, int]],
              outputs: Sequence[str | RegionDestination],
              request_id: str, parameters: str, correlation_id: int | str, flags: int, timeout: float | None,
              on_reply: Callable[..., None] | None, timeout_us: int | None = None,
              with_record: bool = False, loop: asyncio.AbstractEventLoop | None = None,
              linger: float = 0.0, trace: RequestTrace | None = None) -> tuple[IPCMessage, int]:
        """Writes the request record and queues its Execute message; `on_reply` is called as
        StubProcess.submit says (`loop` and `linger` too), or as ``on_reply(message, record)``
        with `with_record`."""
        record = self.write_request(process, tensors, outputs, request_id, parameters, correlation_id, flags,
                                     timeout, timeout_us, process.next_serial(), trace)
        if with_record and on_reply is not None:
            on_reply = functools.partial(on_reply, record=record)  # known before the stub can answer
        try:
            return process.submit(Command.EXECUTE_REQUEST, record, timeout, on_reply, with_record, loop, linger), record
        except (TimeoutError, _core.CoreError) as e:
            process.pool.free(record)
            raise InferenceError("UNAVAILABLE", f"cannot send the request to instance '{self.name}': {e}") from None

    def write_request(self, process: StubProcess, tensors: list[tuple[str, Any, int]],
                       outputs: Sequence[str | RegionDestination], request_id: str, parameters: str,
                       correlation_id: int | str, flags: int, timeout: float | None, timeout_us: int | None,
                       serial: int, trace: RequestTrace | None = None) -> int:
        """Writes a request record into the stub's pool; returns its handle. `serial` (from the
        process's ``next_serial``) names this request in a cancellation; a `trace`d request's
        trace id goes with it (the model's BLS requests are traced as its children: bls.py), and
        its OpenTelemetry context after a space, in that mode (``request.trace().get_context()``)."""
        pool = process.pool
        trace_id = ""
        if trace is not None:
            process.traces[trace.id] = trace
            trace_id = f"{trace.id} {trace.context()}" if trace.spans is not None else str(trace.id)
        corr_int, corr_text = (correlation_id, "") if isinstance(correlation_id, int) else (0, correlation_id)
        if timeout_us is None:
            timeout_us = int(timeout * 1e6) if timeout is not None else 0
        entries: list[tuple[Any, ...]] = tensors  # type: ignore[assignment]
        if any(type(t[1]) is RegionTensor for t in tensors):
            entries = [region_entry(process, t) if type(t[1]) is RegionTensor else t for t in tensors]
        names: Sequence[str | RegionDestination] = outputs
        if any(type(o) is RegionDestination for o in outputs):
            names = [destination_text(process, o) if type(o) is RegionDestination else o for o in outputs]
        try:
            return _core.write_record(pool, _REQUEST, serial, (flags, corr_int, timeout_us),
                                      (request_id, parameters, corr_text, trace_id, *names), entries)
        except (_core.PoolFullError, _core.LockTimeoutError, _core.ShmError, _core.ShmSpaceError) as e:
            # The core's text names segments, which clients must never see (ARCHITECTURE §5): it
            # goes to the log only.
            log.warning("instance '%s': no room for a request: %s", self.name, e)
            raise InferenceError("UNAVAILABLE", f"no room for the request in the shared memory of instance "
                                                f"'{self.name}'") from None
        except (_core.CoreError, TypeError, ValueError) as e:
            raise InferenceError("INVALID_ARG", f"[request id: {request_id or '<id_unknown>'}] {e}") from None

    def _timed_out(self, process: StubProcess, message: IPCMessage, record: int,
                   timeout: float | None) -> InferenceError:
        """Gives up on a request; a stub that ran it for the whole timeout is replaced."""
        running = process.running_for(record)
        if running is None or not timeout or running + START_SLACK_S < timeout:  # the model sees it cancelled
            _tell_cancelled(process, record)
        process.abandon(message, record)
        self.judge_overrun(process, message, running, timeout, record)
        return request_timeout(self.name, timeout)

    def judge_overrun(self, process: StubProcess, message: IPCMessage, running: float | None,
                      timeout: float | None, record: int = 0) -> None:
        """A request's `timeout` ran out after the stub had run it `running` seconds (None: not
        started; then `record`, the abandoned request's, tells when it starts). The stub is hung
        once it has run that one request for the whole timeout: now, or later (the health
        monitor watches). Time spent queued does not count: that is busy."""
        if not timeout:
            return
        if running is None:  # not started yet: watched from its start (it stays in `abandoned`)
            if record:
                process.watch_overrun(message, record=record, timeout=timeout)
        elif running + START_SLACK_S >= timeout:
            self.mark_hung()
        else:
            process.watch_overrun(message, deadline=time.monotonic() + timeout - running)

    def _finish(self, process: StubProcess, message: IPCMessage, record: int,
                sent: int) -> ExecuteResult | ResponseStream:
        """Reads an answered request's outcome and frees what it no longer needs. A request the
        model answers through its response sender gives the stream to wait on."""
        outcome = self.outcomes(process, message, [record], sent)[0]
        if isinstance(outcome, InferenceError):
            raise outcome
        return outcome

    def outcomes(self, process: StubProcess, message: IPCMessage, records: Sequence[int],
                 sent: int) -> list[ExecuteResult | ResponseStream | InferenceError]:
        """The outcome of each request of an answered Execute, in batch order: its response, the
        stream its response sender answers through, or its error. Frees the request records
        the model no longer needs; a reply that does not match the batch fails what it lacks."""
        pool = process.pool
        status, reply = process.finish(message)
        if status == REPLY_STUB_GONE:
            # The stub may have died while reading the records; its pool is discarded with it.
            self.check_health()
            return [InferenceError("INTERNAL", f"Stub process '{self.name}' is not healthy.")] * len(records)
        if status != REPLY_OK:
            for record in records:
                pool.free(record)
            if status != REPLY_ERROR:
                text = f"instance '{self.name}' answered with unknown status {status}"
            else:
                try:
                    payload = read_payload(pool, reply) if reply else {}
                    text = str(payload.get("message", "")) if isinstance(payload, dict) else ""
                except (_core.CoreError, ValueError) as e:
                    text = f"instance '{self.name}' failed the request and sent an unreadable reason ({e})"
            return [InferenceError("INTERNAL", text)] * len(records)
        out: list[ExecuteResult | ResponseStream | InferenceError] = []
        handle = reply
        for record in records:
            if not handle:
                pool.free(record)
                out.append(InferenceError("INTERNAL", f"instance '{self.name}' sent fewer responses than the batch "
                                                      "had requests"))
                continue
            try:
                kind, code, times, handle, strings, result = _core.read_record(pool, handle, True)
                if kind != _RESPONSE:
                    raise _core.FormatError("the reply is not a response record")
            except _core.CoreError as e:
                # The rest of the chain cannot be trusted: what it holds is lost with it.
                handle = 0
                pool.free(record)
                out.append(InferenceError("INTERNAL", f"instance '{self.name}' sent a malformed response: {e}"))
                continue
            if times[2] & RESPONSE_DEFERRED:
                stream = process.stream_for(record)
                stream.executed(record)  # the model may read the request until it answers
                out.append(stream)
                continue
            pool.free(record)
            if code and times[2] & RESPONSE_FAILED:
                out.append(InferenceError(error_code_name(code - 1), strings[0] if strings else ""))
            elif code:  # the model's own answer
                out.append(AnsweredError(error_code_name(code - 1), strings[0] if strings else "", sent, times[0],
                                         times[1]))
            else:
                out.append(ExecuteResult(result, strings[1] if len(strings) > 1 else "{}", sent, times[0], times[1]))
        if handle:
            try:
                _core.free_record_chain(pool, handle)  # more responses than requests: not ours to read
            except _core.CoreError:
                pass
        return out
