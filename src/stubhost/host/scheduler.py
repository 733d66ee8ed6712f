"""The model scheduler: a queue per model version from which free instances take their batches.

This is Triton's dynamic batcher, and its default scheduler for a model with several instances.
Requests wait in the queue (one per priority level, each with its queue policy); whenever an
instance has no Execute in flight, the requests at the front that fit form its next batch: one
Execute, whose requests the model gets as one list (never concatenated, as in Triton's Python
backend). So a request always goes to a free instance, and a slow one never holds up the others.

How a batch is formed (dynamic batching; without it every batch is one request):
- requests are taken in priority order, oldest first, while their batch dimensions add up to at
  most ``max_batch_size`` (``max_batch_size: 0``: one request per batch);
- a batch that reached a preferred size goes at once, cut at the largest preferred size it
  reached (or where it outgrew the largest one), unless its oldest request has waited
  ``max_queue_delay_microseconds``: then it goes whole;
- a batch that reached no preferred size goes whole once it outgrew the largest preferred size
  or ``max_batch_size``, or once the delay ran out (at once when there is no delay);
- Triton's equal-shape rule (tickets.EqualInputs): a request whose variable-size inputs (not
  ``allow_ragged_batch``) differ in shape from the first request's, or that carries other inputs
  (a model with optional inputs), ends the batch before it, and the batch goes at once.

Queue policies: ``max_queue_size`` rejects with UNAVAILABLE "Exceeds maximum queue size"; a
request whose queue timeout (``default_timeout_microseconds``, or its own ``timeout`` with
``allow_timeout_override``) runs out while queued is rejected (UNAVAILABLE "Request timeout
expired") or, with ``timeout_action: DELAY``, moved behind its level's live requests.
``preserve_ordering`` hands back responses in arrival order. A failed request's reason (stats.py)
is in ``Ticket.failure``: REJECTED (policies), CANCELED (its caller's timeout), OTHER (unload), BACKEND.

Threads: whoever submits a request or completes a batch dispatches what can go now; one timer
thread per scheduler wakes for queue delays, queue timeouts and restarts. With a rate limiter
(rate_limiter.py) a free instance must also be admitted by ``limits``; a grant calls ``_release(None)``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from stubhost import _core
from stubhost._core import Command, IPCMessage
from stubhost.config import ModelConfig
from stubhost.host.answers import ExecuteResult
from stubhost.host.doorbell import AnswerSpin, wake
from stubhost.host.errors import AnsweredError, InferenceError
from stubhost.host.instance import START_SLACK_S, InstanceState, ModelInstance, RequestStream
from stubhost.host.rate_limiter import ModelLimits
from stubhost.host.stats import BACKEND, CANCELED, OTHER, REJECTED
from stubhost.host.streams import ResponseStream
from stubhost.host.stub_process import StubProcess
from stubhost.host.tickets import (ABANDONED, DISPATCHED, QUEUED, SETTLED, EqualInputs, Flight, Level, QueuePolicy,
                                   Ticket)

log = logging.getLogger("stubhost")

RESTART_POLL_S = 0.05  # how often queued requests look for an instance that came back

class Scheduler:
    """The queue and the dispatcher of one model version's instances."""

    EXPIRED = "Request timeout expired"  # the error of a request whose queue timeout ran out

    def __init__(self, model_name: str, version: int, instances: list[ModelInstance], config: ModelConfig,
                 decoupled: bool, limits: ModelLimits | None = None) -> None:
        self.model_name = model_name
        self.version = version
        self.instances = instances
        self.decoupled = decoupled
        self._spin = AnswerSpin()  # keeps an asyncio caller's loop awake for a quick answer
        self.max_batch_size = int(config.max_batch_size)
        self.batching = config.HasField("dynamic_batching")
        batching = config.dynamic_batching
        self.delay_ns = int(batching.max_queue_delay_microseconds) * 1000 if self.batching else 0
        self.preferred = sorted(set(batching.preferred_batch_size)) if self.batching else []
        self.max_preferred = self.preferred[-1] if self.preferred else self.max_batch_size
        self.preserve_ordering = self.batching and bool(batching.preserve_ordering)
        levels = int(batching.priority_levels) if self.batching else 0
        self.default_level = int(batching.default_priority_level) if levels else 1
        default_policy = QueuePolicy(batching.default_queue_policy if self.batching else None)
        self.levels = [Level(QueuePolicy(batching.priority_queue_policy[level])
                              if level in batching.priority_queue_policy else default_policy)
                       for level in range(1, max(levels, 1) + 1)]
        self.timeouts = any(level.policy.timeout_ns or level.policy.allow_override for level in self.levels)
        self.equal_inputs = EqualInputs.of(config)  # None: requests' inputs never split a batch
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._free: list[ModelInstance] = list(instances)
        self._queued = 0
        self._order: deque[Ticket] = deque()  # preserve_ordering: every unsettled request, in order
        self._stopped = False
        self._timer: threading.Thread | None = None
        self.limits = limits.bind(instances, functools.partial(self._release, None)) if limits is not None else None

    # ---- the callers' side -----------------------------------------------------------------------
    def submit(self, ticket: Ticket, own: bool = False, linger: float = 0.0) -> Flight | None:
        """Queues a request (its ``wake`` set already) and dispatches what can go now. Raises
        InferenceError UNAVAILABLE when its level's queue is full or the model is unloading.

        With `own`, a batch that takes the request at once is sent without a completion
        callback and returned: the calling thread waits for its reply itself and hands it to
        ``_executed`` (one thread wake-up less than going through the completion thread).
        With `linger` (seconds), the calling thread waits that long for the reply of a batch
        that takes the request at once, and settles it itself when it comes (StubProcess.submit)."""
        level = self.levels[self._level_index(ticket.priority)]
        if self.equal_inputs is not None:
            ticket.batch_key = self.equal_inputs.key(ticket.tensors)
        with self._lock:
            if self._stopped:
                ticket.failure = OTHER
                raise InferenceError("UNAVAILABLE", f"model '{self.model_name}' is unloading")
            if level.policy.max_size and len(level) >= level.policy.max_size:
                ticket.failure = REJECTED
                raise InferenceError("UNAVAILABLE", "Exceeds maximum queue size")
            ticket.enqueued = now = time.monotonic_ns()
            expired: list[Ticket] = []
            if self.timeouts:
                # From the request's arrival: a timeout shorter than the checks before the queue
                # has run out at once, and the request is rejected without running, as in Triton.
                ticket.deadline = level.policy.deadline(ticket.begin, ticket.timeout_us)
            self._enqueue(ticket, level)
            self._queued += 1
            if self.preserve_ordering:
                self._order.append(ticket)
            if ticket.deadline and ticket.deadline <= now:
                expired = self._expire(now)
            batches = self._take_batches(now)
        for late in expired:
            self._settle(late, InferenceError("UNAVAILABLE", self.EXPIRED), REJECTED)
        return self._send(batches, ticket if own else None, ticket if linger > 0 else None, linger)

    def start(self, ticket: Ticket, done: Callable[[ExecuteResult | InferenceError], None],
              linger: float = 0.0) -> None:
        """Queues a request that no thread waits for: `done` gets its outcome from whoever
        settles it (the instance's completion thread, the queue's timer, an unload), or from this
        thread when it comes within `linger` seconds. A model that answers through the request's
        sender is waited for on a thread of its own. Raises as ``submit`` does, and then `done`
        is never called."""
        def settled() -> None:
            outcome = ticket.outcome
            if isinstance(outcome, ResponseStream):
                assert ticket.instance is not None and ticket.process is not None
                ticket.instance.answer_later(ticket.process, ticket.record, outcome, ticket.sent, done)
            else:
                done(outcome)  # type: ignore[arg-type]  (a RequestStream only for decoupled models)

        ticket.wake = settled
        self.submit(ticket, linger=linger)

    def withdraw(self, ticket: Ticket, keep_settled: bool = False, cancelled: bool = False) -> int:
        """The caller gave up on a request (it timed out, or was `cancelled`); returns the state it
        was in. A QUEUED one never runs (if cancelled, it may take others along: ``_remove``);
        otherwise its outcome, when it comes, is dropped, and a request already running is seen as
        cancelled by the model. With `keep_settled`, a settled request is left as it is."""
        dropped: list[tuple[Ticket, InferenceError]] = []
        with self._lock:
            state = ticket.state
            if state == ABANDONED or (state == SETTLED and keep_settled):
                return state
            ticket.state = ABANDONED
            if state == QUEUED:
                dropped = self._remove(ticket, cancelled)
        for other, error in dropped:
            self._settle(other, error, CANCELED)
        if state == DISPATCHED and ticket.process is not None and ticket.record:
            ticket.process.cancel(ticket.record, ticket.serial)
        elif state == SETTLED:
            self._drop(ticket)
        return state

    # ---- batches ---------------------------------------------------------------------------------
    def _enqueue(self, ticket: Ticket, level: Level) -> None:
        """Puts a request in its queue (lock held; a sequence batcher routes it: sequence_batcher.py)."""
        level.queue.append(ticket)

    def _level_index(self, priority: int) -> int:
        """Triton's rule: priority 0, or one beyond the levels, means the default level."""
        if priority <= 0 or priority > len(self.levels):
            return self.default_level - 1
        return priority - 1

    def _ordered(self) -> Iterator[Ticket]:
        for level in self.levels:
            yield from level.queue
            yield from level.delayed

    def _take_batches(self, now: int) -> list[tuple[ModelInstance, list[Ticket]]]:
        """The batches that go now, each with the free instance it goes to (lock held)."""
        batches = []
        while self._queued and self._free:
            # The instance freed last: its stub is the most likely to be awake still.
            instance = next((i for i in reversed(self._free) if i.state is InstanceState.READY), None)
            if instance is None:
                break
            count = self._batch_count(now)
            if not count or (self.limits is not None and (instance := self.limits.admit(self._free)) is None):
                break
            self._free.remove(instance)
            batch = []
            for level in self.levels:
                for queue in (level.queue, level.delayed):
                    while queue and len(batch) < count:
                        ticket = queue.popleft()
                        ticket.state = DISPATCHED
                        batch.append(ticket)
            self._queued -= len(batch)
            batches.append((instance, batch))
        if self._queued and (self.delay_ns or self.timeouts or self._free):
            self._wake_timer()
        return batches

    def _batch_count(self, now: int, tickets: Iterable[Ticket] | None = None, since: int = 0) -> int:
        """How many queued requests form the next batch now (0: it should wait). Triton's rule:
        a batch that reached a preferred size goes at once, cut at the largest one it reached
        (or where it outgrew the largest), unless the queue delay ran out; otherwise it goes
        whole once it outgrew the largest preferred size or ``max_batch_size``, or once the
        delay ran out (at once without a delay). A request whose inputs differ from the first
        one's (``EqualInputs``) ends the batch as ``max_batch_size`` does. `tickets`: the candidates
        in order (default: the queue), `since`: when the delay started (default: the oldest's queuing)."""
        if not self.batching or self.max_batch_size == 0:
            return 1
        total = count = best = oldest = 0
        full, key = False, None
        check = self.equal_inputs is not None
        for ticket in self._ordered() if tickets is None else tickets:
            if not count:
                key = ticket.batch_key  # the first request fixes the batch's shapes
            else:
                if not best and total + ticket.size > self.max_preferred:
                    best = count  # it outgrows every preferred size here
                if total + ticket.size > self.max_batch_size:
                    full = True
                    break
                if check and ticket.batch_key != key:
                    full = True  # Triton sends such a batch now, as a full one
                    break
            oldest = min(oldest, ticket.enqueued) if oldest else ticket.enqueued
            total += ticket.size
            count += 1
            if total in self.preferred:
                best = count
        delay_over = bool(self.delay_ns) and now - (since or oldest) >= self.delay_ns
        if best and not delay_over:
            return best
        if full or total >= self.max_preferred or delay_over or not self.delay_ns:
            return count
        return 0

    def _send(self, batches: list[tuple[ModelInstance, list[Ticket]]], own: Ticket | None = None,
              lingering: Ticket | None = None, linger: float = 0.0) -> Flight | None:
        flight = None
        for index, (instance, batch) in enumerate(batches):
            waited = own is not None and not self.decoupled and any(t is own for t in batch)
            # Only the last batch may linger: one sent after it would wait for its reply.
            wait = (linger if lingering is not None and index == len(batches) - 1
                    and any(t is lingering for t in batch) else 0.0)
            sent = self._dispatch(instance, batch, waited, wait)
            flight = sent if waited else flight
        return flight

    def _dispatch(self, instance: ModelInstance, batch: list[Ticket], waited: bool = False,
                  linger: float = 0.0) -> Flight | None:
        """Writes a batch into its instance's pool as one chain and sends its Execute; with
        `waited`, without a completion callback, returning what the caller needs to wait; with
        `linger`, waiting that long for a quick reply (see StubProcess.submit)."""
        process = instance.process
        pool = process.pool
        dispatched = time.monotonic_ns()
        live: list[Ticket] = []
        for ticket in batch:
            try:
                ticket.serial = process.next_serial()
                ticket.record = instance.write_request(process, ticket.tensors, ticket.requested, ticket.request_id,
                                                       ticket.parameters, ticket.correlation_id, ticket.flags, None,
                                                       ticket.timeout_us, ticket.serial, ticket.trace)
            except InferenceError as e:
                self._settle(ticket, e)
                continue
            ticket.instance, ticket.process, ticket.dispatched = instance, process, dispatched
            live.append(ticket)
        if not live:
            self._release(instance)
            return None
        records = [t.record for t in live]
        size = sum(t.size for t in live)
        streams: list[tuple[int, ResponseStream]] | None = None
        try:
            for record, following in zip(records, records[1:]):
                _core.set_record_next(pool, record, following)
            streams = ([(t.record, process.stream_for(t.record, t.serial)) for t in live] if self.decoupled
                       else None)
            on_reply = None if waited else functools.partial(self._executed, instance, process, live, streams)
            # The answer is read in the event loop that sends the batch when all its requests are
            # that loop's: anyone else's must not wait for a loop that may be busy or gone.
            loop = asyncio._get_running_loop()
            if loop is not None and any(t.loop is not loop for t in live):
                loop = None
            message = process.submit(Command.EXECUTE_REQUEST, records[0], None, on_reply, True, loop, linger)
        except (TimeoutError, _core.CoreError) as e:
            for record, stream in streams or ():
                process.forget_stream(record, stream)
            for ticket in live:
                pool.free(ticket.record)
                self._settle(ticket, InferenceError("UNAVAILABLE", f"cannot send the request to instance "
                                                                   f"'{instance.name}': {e}"))
            self._release(instance)
            return None
        sent = time.monotonic_ns()
        for ticket in live:
            ticket.sent, ticket.batch_size, ticket.message = sent, size, message
        if streams is not None:  # the caller reads a decoupled request's responses as they come
            for ticket, (record, stream) in zip(live, streams):
                self._settle(ticket, RequestStream(instance, process, record, stream, sent))
        return Flight(instance, process, live, message) if waited else None

    def _executed(self, instance: ModelInstance, process: StubProcess, batch: list[Ticket],
                  streams: list[tuple[int, ResponseStream]] | None, message: IPCMessage) -> None:
        """A batch's Execute was answered (completion thread): its requests get their outcomes
        and the instance takes the next batch."""
        try:
            if streams is not None:
                instance.streams_executed(process, message, streams)
            else:
                outcomes = instance.outcomes(process, message, [t.record for t in batch], batch[0].sent)
                # The batch's execution is counted with its first request that did not fail.
                for ticket, outcome in zip(batch, outcomes):
                    # (a filler has no caller; an error the model answered with is a success)
                    if ticket.wake is not None and (not isinstance(outcome, InferenceError)
                                                    or isinstance(outcome, AnsweredError)):
                        ticket.first_in_batch = True
                        break
                for ticket, outcome in zip(batch, outcomes):
                    self._settle(ticket, outcome)
        except Exception:  # noqa: BLE001  (a completion thread must survive, and the batch needs an end)
            log.exception("instance '%s': reading the answer of a batch failed", instance.name)
            for ticket in batch:
                self._settle(ticket, InferenceError("INTERNAL", f"instance '{instance.name}' sent an answer that "
                                                                "could not be read"))
        self._release(instance)

    def _release(self, instance: ModelInstance | None) -> None:
        """The instance is free (None: the rate limiter granted resources): it takes the next batch."""
        with self._lock:
            if instance is not None:
                self._free.append(instance)
            grants = self.limits.release(instance, self._queued) if self.limits is not None else None
            batches = self._take_batches(time.monotonic_ns())
        self._send(batches)
        if grants:  # (there is a limiter)
            self.limits.settle(grants)  # type: ignore[union-attr]

    # ---- outcomes --------------------------------------------------------------------------------
    def _settle(self, ticket: Ticket, outcome: ExecuteResult | ResponseStream | RequestStream | InferenceError,
                reason: str = BACKEND) -> None:
        """Hands a request its outcome (after the earlier ones, with preserve_ordering); the
        outcome of a request its caller gave up on is dropped. `reason` is the failure reason
        of an error outcome."""
        with self._lock:
            if ticket.state == SETTLED:
                return
            abandoned = ticket.state == ABANDONED
            ticket.outcome = outcome
            if not abandoned:  # (an abandoned one keeps the reason its caller gave it)
                ticket.state = SETTLED
                if isinstance(outcome, InferenceError):
                    ticket.failure = reason
            if self.preserve_ordering:
                ticket.ordered = True
                ready = self._in_order()
            else:
                ready = [] if abandoned else [ticket]
        if abandoned:
            self._drop(ticket)
        for done in ready:
            if done.state == SETTLED and done.wake is not None:
                done.wake()

    def _in_order(self) -> list[Ticket]:
        """The settled requests at the front of the order (lock held)."""
        ready = []
        order = self._order
        while order and order[0].ordered:
            ready.append(order.popleft())
        return ready

    def _remove(self, ticket: Ticket, cancelled: bool = False) -> list[tuple[Ticket, InferenceError]]:
        """Takes a queued request out of its queue; returns the queued requests its cancellation
        took out along with it, with their errors (none here; lock held)."""
        for level in self.levels:
            for queue in (level.queue, level.delayed):
                if ticket in queue:
                    queue.remove(ticket)
                    self._queued -= 1
                    ticket.ordered = ticket.ordered or self.preserve_ordering
                    return []
        return []

    @staticmethod
    def _drop(ticket: Ticket) -> None:
        """Frees what an outcome nobody waits for holds."""
        outcome = ticket.outcome
        if isinstance(outcome, ResponseStream) and ticket.process is not None:
            ModelInstance._leave(ticket.process, ticket.record, outcome)
        elif isinstance(outcome, RequestStream):
            outcome.close()

    # ---- the timer -------------------------------------------------------------------------------
    def _wake_timer(self) -> None:
        """Makes sure the timer thread watches the queue (lock held)."""
        if self._timer is None:
            self._timer = threading.Thread(target=self._tick, name=f"stubhost-sched-{self.model_name}", daemon=True)
            self._timer.start()
        else:
            self._wakeup.notify()

    def _next_wake(self, now: int) -> float | None:
        """Seconds until the timer has something to do (None: nothing queued; lock held)."""
        if not self._queued:
            return None
        instants = []
        if self._free:
            if not any(i.state is InstanceState.READY for i in self._free):
                instants.append(now + int(RESTART_POLL_S * 1e9))
            elif self.delay_ns and not (self.limits is not None and self.limits.waiting(self._free)):
                oldest = min((t.enqueued for t in self._ordered()), default=now)
                instants.append(oldest + self.delay_ns)
        if self.timeouts:
            instants.extend(t.deadline for t in self._ordered() if t.deadline)
        if not instants:
            return None
        return max(min(instants) - now, 0) / 1e9

    def _tick(self) -> None:
        """Timer thread: expires queue timeouts, ends queue delays, retries after restarts."""
        while True:
            with self._lock:
                if self._stopped:
                    return
                wait = self._next_wake(time.monotonic_ns())
                if wait is None or wait > 0:
                    self._wakeup.wait(wait)
                if self._stopped:
                    return
                now = time.monotonic_ns()
                expired = self._expire(now)
                failed = self._fail_if_down()
                batches = self._take_batches(now)
            for ticket in expired:
                self._settle(ticket, InferenceError("UNAVAILABLE", self.EXPIRED), REJECTED)
            for ticket in failed:
                self._settle(ticket, InferenceError("UNAVAILABLE", f"Stub process "
                                                                   f"'{(ticket.instance or self.instances[0]).name}' "
                                                                   "is not healthy."))
            self._send(batches)

    def _expire(self, now: int) -> list[Ticket]:
        """Queued requests whose queue timeout ran out: rejected ones are returned (their
        outcome is for the caller to set), delayed ones move behind their level (lock held)."""
        rejected: list[Ticket] = []
        if not self.timeouts:
            return rejected
        for level in self.levels:
            queue = level.queue
            if not any(t.deadline and t.deadline <= now for t in queue):
                continue
            keep: deque[Ticket] = deque()
            for ticket in queue:
                if ticket.deadline and ticket.deadline <= now:
                    ticket.deadline = 0
                    if level.policy.delay:
                        level.delayed.append(ticket)
                    else:
                        rejected.append(ticket)
                        self._queued -= 1
                else:
                    keep.append(ticket)
            level.queue = keep
        return rejected

    def _fail_if_down(self) -> list[Ticket]:
        """Every queued request, when no instance can ever run them again (lock held)."""
        if not self._queued or any(i.state in (InstanceState.READY, InstanceState.RESTARTING, InstanceState.STARTING)
                                   for i in self.instances):
            return []
        return self._take_all()

    def _take_all(self) -> list[Ticket]:
        """Empties the queue; returns what it held (lock held)."""
        failed = list(self._ordered())
        for level in self.levels:
            level.queue.clear()
            level.delayed.clear()
        self._queued = 0
        return failed

    def stop(self) -> None:
        """Refuses new requests and fails the queued ones (the model is unloading)."""
        with self._lock:
            self._stopped = True
            failed = self._take_all()
            self._wakeup.notify_all()
            timer = self._timer
        for ticket in failed:
            self._settle(ticket, InferenceError("UNAVAILABLE", f"model '{self.model_name}' is unloading"), OTHER)
        if timer is not None and timer is not threading.current_thread():
            timer.join()

    def queued(self) -> int:
        """Requests waiting in the queue."""
        return self._queued

    # ---- waiting for an outcome --------------------------------------------------------------------
    def wait(self, ticket: Ticket, timeout: float | None) -> ExecuteResult | RequestStream:
        """Blocks until the request's outcome is in (raises its error); `timeout` bounds the wait,
        and a request still running then is taken for a hung instance, as without a queue."""
        done = threading.Event()
        ticket.wake = done.set
        deadline = None if timeout is None else time.monotonic() + timeout
        flight = self.submit(ticket, own=True)
        if flight is not None:
            self._wait_flight(flight, ticket, timeout)
        if not done.wait(None if deadline is None else max(deadline - time.monotonic(), 0.0)):
            self._gave_up(ticket, timeout)
        outcome = ticket.outcome
        if isinstance(outcome, ResponseStream):
            assert ticket.instance is not None and ticket.process is not None
            return ticket.instance.await_sender(ticket.process, ticket.record, outcome, ticket.sent, timeout, deadline)
        return self._result(outcome)

    async def wait_async(self, ticket: Ticket, timeout: float | None) -> ExecuteResult | RequestStream:
        """``wait`` for a coroutine: no thread waits; cancelling it withdraws the request."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        ticket.wake = functools.partial(wake, loop, done)  # called by whoever settles the request
        ticket.loop = loop
        deadline = None if timeout is None else time.monotonic() + timeout
        self.submit(ticket)
        try:
            await self._spin.wait(done, timeout)
            if not done.done():  # else no timer, and no trip through the loop
                await asyncio.wait_for(done, timeout)
        except asyncio.TimeoutError:
            self._gave_up(ticket, timeout)
        except asyncio.CancelledError:
            self.withdraw(ticket, cancelled=True)
            raise
        outcome = ticket.outcome
        if isinstance(outcome, ResponseStream):
            assert ticket.instance is not None and ticket.process is not None
            return await ticket.instance.await_sender_async(ticket.process, ticket.record, outcome, ticket.sent,
                                                            timeout, deadline)
        return self._result(outcome)

    def _wait_flight(self, flight: Flight, ticket: Ticket, timeout: float | None) -> None:
        """Waits for the reply of a batch this thread sent and settles the batch. When `timeout`
        runs out first, the timeout error is raised: a batch that ran that long means a hung
        instance, replaced (so the reply comes, as a failure); else the completion thread
        settles the batch when it ends (``_gave_up``'s rule)."""
        instance, process, message = flight.instance, flight.process, flight.message
        if process.wait(message, timeout):
            self._executed(instance, process, flight.batch, None, message)
            return
        self.withdraw(ticket)
        running = ticket.running_for()
        if timeout is not None and running + START_SLACK_S >= timeout:
            instance.mark_hung()
            process.wait(message, None)  # the dead stub's messages are failed at once
            self._executed(instance, process, flight.batch, None, message)
        else:
            process.hand_over(message, functools.partial(self._executed, instance, process, flight.batch, None, message))
            instance.judge_overrun(process, message, running, timeout)
        ticket.failure = CANCELED  # its caller gave up on it
        raise InferenceError("UNAVAILABLE", f"Request timeout expired: model '{self.model_name}' did not answer "
                                            f"within {timeout} s")

    def _gave_up(self, ticket: Ticket, timeout: float | None) -> None:
        """The caller's timeout ran out: a queued request never runs; a running one is left to
        finish (the model sees it cancelled), unless its batch ran for the whole timeout: then
        the instance is hung and replaced (ModelInstance.judge_overrun). Time in the queue is
        not the instance's. Raises the timeout error."""
        state = self.withdraw(ticket, keep_settled=True)
        if state == SETTLED:
            return  # it came in just now
        instance, message = ticket.instance, ticket.message
        if state == DISPATCHED and instance is not None and message is not None and ticket.process is instance.process:
            instance.judge_overrun(ticket.process, message, ticket.running_for(), timeout)
        ticket.failure = CANCELED  # its caller gave up on it
        raise InferenceError("UNAVAILABLE", f"Request timeout expired: model '{self.model_name}' did not answer "
                                            f"within {timeout} s")

    @staticmethod
    def _result(outcome: Any) -> ExecuteResult | RequestStream:
        if isinstance(outcome, InferenceError):
            raise outcome
        return outcome

