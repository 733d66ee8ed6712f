"""What waits in a model's queue: a request's ticket, its priority level and the level's queue
policy (``dynamic_batching.default_queue_policy`` / ``priority_queue_policy``). The scheduler
(scheduler.py) moves tickets through these states; this module holds no threads."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from stubhost._core import IPCMessage
from stubhost.config.model_config_pb2 import ModelQueuePolicy
from stubhost.host.answers import ExecuteResult
from stubhost.host.errors import InferenceError
from stubhost.host.instance import ModelInstance, RequestStream
from stubhost.host.regions import RegionDestination
from stubhost.host.stats import BACKEND
from stubhost.host.streams import ResponseStream
from stubhost.host.stub_process import StubProcess

# Ticket states
QUEUED, DISPATCHED, SETTLED, ABANDONED = range(4)


class QueuePolicy:
    """One priority level's queue policy, in nanoseconds."""

    __slots__ = ("timeout_ns", "delay", "allow_override", "max_size")

    def __init__(self, policy: ModelQueuePolicy | None = None) -> None:
        self.timeout_ns = int(policy.default_timeout_microseconds) * 1000 if policy is not None else 0
        self.delay = policy is not None and policy.timeout_action == ModelQueuePolicy.DELAY
        self.allow_override = policy is not None and bool(policy.allow_timeout_override)
        self.max_size = int(policy.max_queue_size) if policy is not None else 0

    def deadline(self, enqueued: int, request_timeout_us: int | None) -> int:
        """The instant the request's queue timeout runs out (0: never)."""
        timeout_ns = self.timeout_ns
        if self.allow_override and request_timeout_us:
            timeout_ns = request_timeout_us * 1000
        return enqueued + timeout_ns if timeout_ns else 0


class Level:
    """One priority level: its queue, the requests its DELAY policy moved back, its policy."""

    __slots__ = ("queue", "delayed", "policy")

    def __init__(self, policy: QueuePolicy) -> None:
        self.queue: deque[Ticket] = deque()
        self.delayed: deque[Ticket] = deque()
        self.policy = policy

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)


class Ticket:
    """One request from the moment it is queued until its caller has its outcome.

    ``outcome`` is an ExecuteResult, a ResponseStream (a default-mode model answers through the
    request's sender), a RequestStream (a decoupled model), or an InferenceError.
    """

    __slots__ = ("tensors", "requested", "request_id", "parameters", "correlation_id", "flags", "timeout_us",
                 "size", "priority", "begin", "enqueued", "deadline", "state", "instance", "process", "record",
                 "serial", "dispatched", "sent", "message", "batch_size", "first_in_batch", "outcome", "wake", "loop", "ordered", "failure")

    def __init__(self, tensors: list[tuple[str, Any, int]], requested: Sequence[str | RegionDestination],
                 request_id: str, parameters: str, correlation_id: int | str, flags: int,
                 timeout_us: int | None, size: int, priority: int, begin: int) -> None:
        self.tensors = tensors
        self.requested = requested
        self.request_id = request_id
        self.parameters = parameters
        self.correlation_id = correlation_id
        self.flags = flags
        self.timeout_us = timeout_us
        self.size = size            # the request's batch dimension (1 without batching)
        self.priority = priority
        self.begin = begin          # CLOCK_MONOTONIC ns: the caller made the call
        self.enqueued = 0
        self.deadline = 0           # ns: the queue timeout runs out (0: never)
        self.state = QUEUED
        self.instance: ModelInstance | None = None
        self.process: StubProcess | None = None
        self.record = 0
        self.serial = 0             # the request's number in its process (what a cancellation names)
        self.dispatched = 0         # ns: its batch started being written
        self.sent = 0               # ns: its batch was queued to the stub
        self.message: IPCMessage | None = None  # the Execute that carries its batch
        self.batch_size = 0         # the batch dimension of the whole batch it ran in
        self.first_in_batch = False  # counts the batch's execution in the statistics
        self.outcome: ExecuteResult | ResponseStream | RequestStream | InferenceError | None = None
        self.wake: Callable[[], None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the event loop its caller awaits in (None: a thread)
        self.ordered = False        # settled, waiting for earlier requests (preserve_ordering)
        self.failure = BACKEND      # the failure reason (stats.py) of an error this scheduler gives it

    def compute_input_end(self) -> int:
        """The instant that splits the request's time before its batch ran into compute_input
        (checking the request, writing it to the pool) and queue (everything else)."""
        return self.begin + max(self.enqueued - self.begin, 0) + max(self.sent - self.dispatched, 0)
