"""Triton's sequence batcher, the scheduler of every sequence model (``sequence_batching``):
each instance runs at most one request of each of its sequences at a time, and (a model that
batches) requests of different sequences that share an instance run in one ``execute(requests)``.

It is the version's queue (scheduler.py) with other rules for what waits where and what a batch
takes; sending batches, waiting for them, cancellation, timeouts, restarts and statistics are the
queue's. With a rate limiter (rate_limiter.py) an instance with waiting requests starts a batch
only once it is admitted, and gives its resources back when its batch waits for a queue delay.

- **Slots.** Each instance has ``max(1, max_batch_size)`` slots (``direct``, the default), or
  ``oldest.max_candidate_sequences`` (default the same), as Triton counts them
  (SequenceBatchScheduler::Create): so without ``max_batch_size`` an instance runs one sequence
  at a time. A START takes the free slot with the lowest number (READY instances first, then the
  one with the fewest open sequences); the sequence keeps it until its END request is taken
  into a batch, or until it has had no request for ``max_sequence_idle_microseconds`` (its
  requests already waiting still run). With no slot free the sequence waits in the version's
  backlog, its requests gathered there in order; a slot that frees goes to the oldest sequence
  of the backlog.
- **Batches.** An instance runs one batch at a time, and a batch takes at most the oldest waiting
  request of each slot, so a sequence's requests run one after another, in order, and never two
  at once. Without ``max_batch_size`` a batch is one request (Triton's batchers then take at
  most 1: one slot, or ``oldest``'s dynamic batcher with a maximum of 1). ``direct``: the batch lists slots 0 to the highest slot with a request, each request at
  its slot's position; a slot with no request (or whose request's shapes differ from the first's,
  Triton's equal-shape rule) gets a filler, Triton's "null request": the first request's inputs
  zeroed, START, END and READY false, CORRID 0, correlation id 0, flags 0, no caller (its response
  is dropped; it counts in the batch size of ``batch_stats``, not in the inference count, as in
  Triton's Python backend). With ``max_queue_delay_microseconds`` and ``minimum_slot_utilization``
  both set, a batch waits until that share of the slots has a request or its oldest request has
  waited longer than the delay. ``oldest``: Triton's dynamic batcher over each slot's next
  request, oldest first (oldest: the instant it could run, its previous request's batch over),
  with ``preferred_batch_size``, ``max_queue_delay_microseconds`` (counted from that instant)
  and ``max_batch_size`` (scheduler.Scheduler._batch_count).
- **Cancellation and expiry**, Triton's rules: a cancelled waiting request ends its sequence (the
  requests queued after it are cancelled too; in the backlog, all of the sequence's), and a
  backlogged sequence is rejected once the earliest of its requests' own ``timeout`` ran out.
  A caller's in-process timeout only withdraws its own request.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from stubhost.config import ModelConfig
from stubhost.host.errors import InferenceError
from stubhost.host.instance import InstanceState, ModelInstance
from stubhost.host.rate_limiter import ModelLimits
from stubhost.host.scheduler import RESTART_POLL_S, Scheduler
from stubhost.host.sequence_controls import SequenceControls
from stubhost.host.sequences import (
    DEFAULT_IDLE_US,
    FLAG_SEQUENCE_END,
    FLAG_SEQUENCE_START,
    no_correlation_id,
    not_started,
    sequence_cancelled,
)
from stubhost.host.stats import OTHER
from stubhost.host.tickets import ABANDONED, DISPATCHED, Level, Ticket

log = logging.getLogger("stubhost")

_DOWN = (InstanceState.FAILED, InstanceState.STOPPED)
_RESTART_POLL_NS = int(RESTART_POLL_S * 1e9)


class _Slot:
    """A batch slot of an instance, or (``instance`` None) a sequence waiting in the backlog."""

    __slots__ = ("instance", "index", "key", "queue", "last", "closing", "running", "since", "expires")

    def __init__(self, instance: ModelInstance | None, index: int) -> None:
        self.instance = instance
        self.index = index
        self.key: Any = None        # the correlation id of the sequence that holds it (None: free)
        self.queue: deque[Ticket] = deque()  # that sequence's requests not yet in a batch, in order
        self.last = 0               # ns: the sequence's last request came (its idle time counts from it)
        self.closing = False        # the sequence ended (END, idle): the slot frees once its queue is empty
        self.running = False        # a request of it is in the instance's batch in flight
        self.since = 0              # ns: since when its next request can run (oldest: its place in line)
        self.expires = 0            # ns: a backlogged sequence's requests are rejected then (0: never)


class SequenceScheduler(Scheduler):
    """The sequence batcher of one version of a sequence model (see the module's text)."""

    EXPIRED = "timeout of the corresponding sequence has been expired"  # Triton's, for a backlogged sequence

    def __init__(self, model_name: str, version: int, instances: list[ModelInstance], config: ModelConfig,
                 decoupled: bool, controls: SequenceControls | None, limits: ModelLimits | None = None) -> None:
        super().__init__(model_name, version, instances, config, decoupled, limits)
        sequence = config.sequence_batching
        self.controls = controls
        self.oldest = sequence.HasField("oldest")
        strategy = sequence.oldest if self.oldest else sequence.direct
        self.delay_ns = int(strategy.max_queue_delay_microseconds) * 1000
        count = max(self.max_batch_size, 1)  # Triton: at least one slot, also without batching
        if self.oldest:  # _batch_count: Triton's dynamic batcher over the slots' next requests
            count = int(sequence.oldest.max_candidate_sequences) or count
            self.batching = True
            self.preferred = sorted(set(sequence.oldest.preferred_batch_size))
            self.max_preferred = self.preferred[-1] if self.preferred else self.max_batch_size
        self.utilization = 0.0 if self.oldest else float(sequence.direct.minimum_slot_utilization)
        self.idle_ns = (int(sequence.max_sequence_idle_microseconds) or DEFAULT_IDLE_US) * 1000
        self.iterative = bool(sequence.iterative_sequence)
        self._slots = {id(i): [_Slot(i, n) for n in range(count)] for i in instances}
        self._sequences: dict[Any, _Slot] = {}  # open sequences: their slot, or their place in the backlog
        self._backlog: deque[_Slot] = deque()
        self._wake_at: int | None = None  # when the timer has something to do (None: nothing)
        self._own_ids = itertools.count(1)  # iterative requests without a correlation id: a sequence each

    # ---- routing (lock held) -----------------------------------------------------------------------
    def _enqueue(self, ticket: Ticket, level: Level) -> None:
        """Routes a request to its sequence's slot or backlog place, opening or closing the
        sequence as its flags say; refuses it (INVALID_ARG, Triton's texts) when it has no
        correlation id or continues a sequence that is not open."""
        now = ticket.enqueued
        key, flags = ticket.correlation_id, ticket.flags
        if key == 0 or key == "":
            if not self.iterative:
                ticket.failure = OTHER
                raise no_correlation_id(self.model_name)
            # Triton's iterative sequencer makes it the START of a sequence of its own; its
            # reruns happen in the stub, so it ends once it has run (it holds a slot till then).
            key, flags = ("", next(self._own_ids)), FLAG_SEQUENCE_START | FLAG_SEQUENCE_END
        slot = self._sequences.get(key)
        if slot is not None and slot.instance is not None and now - slot.last > self.idle_ns:
            self._close(slot, now)  # idle for too long
            slot = None
        if flags & FLAG_SEQUENCE_START:
            if slot is None:
                slot = self._open(key, now)
            else:
                log.warning("sequence %s for model '%s' has a conflict. The previous sequence did not end before "
                            "this sequence start. Previous sequence will be terminated early.", key, self.model_name)
        elif slot is None:
            ticket.failure = OTHER
            raise not_started(self.model_name, key)
        slot.queue.append(ticket)
        slot.last = now
        if slot.instance is None and ticket.timeout_us:  # Triton: the backlog expires at its first deadline
            deadline = now + ticket.timeout_us * 1000
            slot.expires = min(slot.expires or deadline, deadline)
        if flags & FLAG_SEQUENCE_END:
            slot.closing = True
            del self._sequences[key]

    def _open(self, key: Any, now: int) -> _Slot:
        """A new sequence's slot, or its place at the end of the backlog."""
        self._reap(now)
        slot = self._free_slot()
        if slot is None:
            slot = _Slot(None, -1)
            self._backlog.append(slot)
        slot.key = key
        self._sequences[key] = slot
        return slot

    def _free_slot(self) -> _Slot | None:
        """The free slot with the lowest number (Triton's rule), on a READY instance if one has
        one, then on the instance with the fewest open sequences. Never one of an instance that is
        down for good, unless every instance is."""
        best: tuple[tuple[bool, int, int, int], _Slot] | None = None
        for instance in [i for i in self.instances if i.state not in _DOWN] or self.instances:
            slots = self._slots[id(instance)]
            free = next((slot for slot in slots if slot.key is None), None)
            if free is None:
                continue
            rank = (instance.state is not InstanceState.READY, free.index,
                    sum(slot.key is not None for slot in slots), instance.load_count())
            if best is None or rank < best[0]:
                best = (rank, free)
        return None if best is None else best[1]

    def _close(self, slot: _Slot, now: int) -> None:
        """The sequence in `slot` is over (idle): its waiting requests still run, then it frees."""
        if self._sequences.get(slot.key) is slot:
            del self._sequences[slot.key]
        slot.closing = True
        if not slot.queue:
            self._vacate(slot, now)

    def _reap(self, now: int) -> None:
        """Closes the sequences that have had no request for longer than the idle time."""
        for slots in self._slots.values():
            for slot in slots:
                if slot.key is not None and not slot.closing and now - slot.last > self.idle_ns:
                    self._close(slot, now)

    def _vacate(self, slot: _Slot, now: int) -> None:
        """Frees a slot: the oldest sequence of the backlog takes it, with its requests."""
        slot.key, slot.closing, slot.since = None, False, now
        if slot.instance is not None and slot.instance.state in _DOWN:
            return
        while self._backlog:
            waiting = self._backlog.popleft()
            if waiting.closing and not waiting.queue:
                continue  # it ended, and its requests were all withdrawn
            slot.key, slot.queue, slot.last, slot.closing = waiting.key, waiting.queue, waiting.last, waiting.closing
            if self._sequences.get(slot.key) is waiting:
                self._sequences[slot.key] = slot
            return

    def _every_slot(self) -> Iterator[_Slot]:
        for slots in self._slots.values():
            yield from slots
        yield from self._backlog

    # ---- batches (lock held) ------------------------------------------------------------------------
    def _take_batches(self, now: int) -> list[tuple[ModelInstance, list[Ticket]]]:
        """The batch of each free READY instance that has one to go now; notes when the timer
        must look again (a queue delay, a restart, an idle sequence holding up the backlog)."""
        if self._backlog:
            self._reap(now)
        batches = []
        wake: int | None = None
        for instance in list(self._free):
            slots = self._slots[id(instance)]
            at: int | None = None
            if instance.state is not InstanceState.READY:
                if any(slot.queue for slot in slots):  # back from a restart soon, or never (_fail_if_down)
                    at = now if instance.state in _DOWN else now + _RESTART_POLL_NS
            else:
                for slot in slots:
                    if slot.running:  # the instance is free: that request's batch is over
                        slot.running, slot.since = False, now
                if (self.limits is not None and any(slot.queue for slot in slots)
                        and self.limits.admit([instance]) is None):
                    continue  # it waits for the rate limiter's resources: their grant pokes the queue
                batch, at = self._oldest_batch(slots, now) if self.oldest else self._direct_batch(slots, now)
                if batch:
                    self._free.remove(instance)
                    batches.append((instance, batch))
                elif self.limits is not None:
                    self.limits.give_back(instance)  # admitted, but its batch waits (a queue delay)
            if at is not None:
                wake = at if wake is None else min(wake, at)
        if self._backlog:
            if all(i.state in _DOWN for i in self.instances):
                wake = now if any(waiting.queue for waiting in self._backlog) else wake
            else:
                idle = [slot.last + self.idle_ns + 1 for slots in self._slots.values() for slot in slots
                        if slot.key is not None and not slot.closing]
                wake = min([*idle, *([] if wake is None else [wake])], default=None)
            expiring = [waiting.expires for waiting in self._backlog if waiting.expires]
            wake = min([*expiring, *([] if wake is None else [wake])], default=None)
        self._wake_at = wake
        if wake is not None:
            self._wake_timer()
        return batches

    def _direct_batch(self, slots: list[_Slot], now: int) -> tuple[list[Ticket], int | None]:
        """Triton's direct strategy: the next request of each slot, at the slot's position, and
        fillers in between; or nothing yet, and when to look again."""
        top, ready, oldest = -1, 0, now
        first: Ticket | None = None
        for slot in slots:
            if slot.queue:
                top, ready = slot.index, ready + 1
                first = first or slot.queue[0]
                oldest = min(oldest, slot.queue[0].enqueued)
        if first is None:
            return [], None
        if (self.delay_ns and self.utilization and now - oldest <= self.delay_ns
                and ready / max(self.max_batch_size, 1) < self.utilization):
            return [], oldest + self.delay_ns + 1
        batch = []
        for slot in slots[:top + 1]:
            if slot.queue and (self.equal_inputs is None or slot.queue[0].batch_key == first.batch_key):
                batch.append(self._take(slot, now))
            else:
                batch.append(self._filler(first, now))
        return batch, None

    def _oldest_batch(self, slots: list[_Slot], now: int) -> tuple[list[Ticket], int | None]:
        """Triton's oldest strategy: the dynamic batcher's rule over each slot's next request,
        taken in the order they could run; or nothing yet, and when to look again."""
        lined = sorted((max(slot.since, slot.queue[0].enqueued), slot.queue[0].enqueued, slot.index, slot)
                       for slot in slots if slot.queue)
        if not lined:
            return [], None
        since = lined[0][0]
        count = self._batch_count(now, [entry[3].queue[0] for entry in lined], since)
        if not count:
            return [], since + self.delay_ns
        return [self._take(entry[3], now) for entry in lined[:count]], None

    def _take(self, slot: _Slot, now: int) -> Ticket:
        """The slot's next request, into a batch; an ended sequence's slot frees once empty."""
        ticket = slot.queue.popleft()
        ticket.state = DISPATCHED
        self._queued -= 1
        slot.running = True
        if slot.closing and not slot.queue:
            self._vacate(slot, now)
        return ticket

    def _filler(self, like: Ticket, now: int) -> Ticket:
        """Triton's null request for a slot with no request: `like`'s inputs zeroed, the controls
        of a slot that is not ready, no caller."""
        names = self.controls.names if self.controls is not None else frozenset()
        tensors = [(name, _zeros(array), dtype) for name, array, dtype in like.tensors if name not in names]
        if self.controls is not None:
            tensors += self.controls.not_ready()
        filler = Ticket(tensors, [], "", "{}", 0, 0, None, like.size, 0, now)
        filler.state = ABANDONED  # nobody waits: its outcome is dropped
        filler.batch_key, filler.loop = like.batch_key, like.loop  # (the loop: scheduler.Scheduler._dispatch)
        return filler

    # ---- the rest of the queue's hooks (lock held) ---------------------------------------------------
    def _remove(self, ticket: Ticket, cancelled: bool = False) -> list[tuple[Ticket, InferenceError]]:
        """A waiting request whose caller gave up leaves its slot (or the backlog); if it was its
        sequence's END, the slot frees once the requests before it have gone. A `cancelled` one
        ends its sequence, as in Triton: the requests of the sequence queued after it (in the
        backlog: all of them) are cancelled with it, and the slot frees once those before it ran."""
        now = time.monotonic_ns()
        for slot in self._every_slot():
            if ticket not in slot.queue:
                continue
            dropped: list[tuple[Ticket, InferenceError]] = []
            if cancelled:
                waiting = list(slot.queue)
                cut = 0 if slot.instance is None else waiting.index(ticket)
                error = sequence_cancelled(self.model_name, ticket.correlation_id)
                dropped = [(other, error) for other in waiting[cut:] if other is not ticket]
                slot.queue = deque(waiting[:cut])
                if self._sequences.get(slot.key) is slot:
                    del self._sequences[slot.key]  # its later requests need a START, as in Triton
                slot.closing = True
            else:
                slot.queue.remove(ticket)
            self._queued -= 1 + len(dropped)
            if slot.closing and not slot.queue:
                if slot.instance is None:
                    self._backlog.remove(slot)
                else:
                    self._vacate(slot, now)
            self._wake_at = now  # a slot may have gone to the backlog: look again
            self._wake_timer()
            return dropped
        return []

    def _expire(self, now: int) -> list[Ticket]:
        """The backlogged sequences whose deadline passed (the first of their requests' own
        ``timeout``, as Triton counts it) leave the backlog; their requests are returned, to be
        rejected (a sequence that holds a slot never expires)."""
        rejected: list[Ticket] = []
        for waiting in [w for w in self._backlog if w.expires and w.expires <= now]:
            self._backlog.remove(waiting)
            if self._sequences.get(waiting.key) is waiting:
                del self._sequences[waiting.key]  # its later requests need a START, as in Triton
            rejected.extend(waiting.queue)
            waiting.queue.clear()
        self._queued -= len(rejected)
        return rejected

    def _next_wake(self, now: int) -> float | None:
        return None if self._wake_at is None else max(self._wake_at - now, 0) / 1e9

    def _fail_if_down(self) -> list[Ticket]:
        """The waiting requests of instances that are down for good, and the backlog's when
        every instance is."""
        failed: list[Ticket] = []
        if not self._queued:
            return failed
        for instance in self.instances:
            if instance.state not in _DOWN:
                continue
            for slot in self._slots[id(instance)]:
                for ticket in slot.queue:
                    ticket.instance = instance  # the error names it
                failed.extend(slot.queue)
                slot.queue.clear()
                if slot.closing:
                    slot.key, slot.closing = None, False
        if all(i.state in _DOWN for i in self.instances):
            for waiting in self._backlog:
                failed.extend(waiting.queue)
                waiting.queue.clear()
        self._queued -= len(failed)
        return failed

    def _take_all(self) -> list[Ticket]:
        failed = [ticket for slot in self._every_slot() for ticket in slot.queue]
        for slot in self._every_slot():
            slot.queue.clear()
        self._queued = 0
        return failed


def _zeros(array: Any) -> np.ndarray:
    """Zeros in `array`'s shape and dtype (empty strings for BYTES); `array` may be a RegionTensor."""
    if array.dtype.kind == "O":
        return np.full(array.shape, b"", np.object_)
    return np.zeros(array.shape, array.dtype)
