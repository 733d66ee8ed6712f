"""What waits in a model's queue: a request's ticket, its priority level, the level's queue
policy (``dynamic_batching.default_queue_policy`` / ``priority_queue_policy``), and the inputs
that must agree among the requests of one batch (``EqualInputs``). The scheduler (scheduler.py)
moves tickets through these states; this module holds no threads."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from stubhost._core import IPCMessage
from stubhost.config import ModelConfig
from stubhost.config.model_config_pb2 import ModelQueuePolicy
from stubhost.host.answers import ExecuteResult
from stubhost.host.errors import InferenceError
from stubhost.host.instance import ModelInstance, RequestStream
from stubhost.host.regions import RegionDestination
from stubhost.host.stats import BACKEND, CANCELED
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


class EqualInputs:
    """Triton's equal-shape rule of the dynamic batcher (``RequiredEqualInputs`` in Triton's core).

    Requests share a batch only if they agree on the shape, without the batch dimension, of every
    input with a variable dimension (-1 in ``dims``) that is not ``allow_ragged_batch``; when the
    model has ``optional`` inputs, also on which inputs they carry. ``is_shape_tensor`` inputs,
    whose contents Triton compares too, are refused for Python models at validation."""

    __slots__ = ("names", "optional")

    def __init__(self, names: frozenset[str], optional: bool) -> None:
        self.names = names        # the inputs whose shapes must be equal
        self.optional = optional  # the set of inputs present must be equal too

    @classmethod
    def of(cls, config: ModelConfig) -> EqualInputs | None:
        """The rule of a model, or None when it never splits a batch (every input of fixed
        dims or ragged, none optional; or no batching): then requests are never looked at. The
        sequence batcher applies it too (sequence_batcher.py)."""
        batches = config.HasField("dynamic_batching") or config.HasField("sequence_batching")
        if not batches or config.max_batch_size <= 0:
            return None
        names = frozenset(i.name for i in config.input if not i.allow_ragged_batch and -1 in i.dims)
        optional = any(i.optional for i in config.input)
        return cls(names, optional) if names or optional else None

    def key(self, tensors: list[tuple[str, Any, int]]) -> frozenset[tuple[str, tuple[int, ...] | None]]:
        """What two requests (their checked tensors) must have equal to share a batch: the name
        and shape past the batch dimension of each equal-shape input, and (with optional inputs)
        the name of every other input. Shapes are the ones the model gets (after ``reshape``),
        as in Triton."""
        names, optional = self.names, self.optional
        return frozenset((name, tuple(array.shape[1:]) if name in names else None)
                         for name, array, _ in tensors if optional or name in names)


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
                 "serial", "dispatched", "sent", "message", "batch_size", "first_in_batch", "outcome", "wake", "loop",
                 "ordered", "failure", "batch_key", "trace")

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
        self.batch_key: frozenset[Any] | None = None  # EqualInputs.key: requests of a batch share it
        self.trace: Any = None      # the request's RequestTrace (host/trace.py), told to its stub

    def compute_input_end(self) -> int:
        """The instant that splits the request's time before its batch ran into compute_input
        (checking the request, writing it to the pool) and queue (everything else)."""
        return self.begin + max(self.enqueued - self.begin, 0) + max(self.sent - self.dispatched, 0)

    def running_for(self) -> float:
        """Seconds the batch of a dispatched request has run: from its send, since an instance
        takes a batch only when it has answered the one before."""
        return (time.monotonic_ns() - self.sent) / 1e9


class Flight(NamedTuple):
    """A batch whose sender waits for its reply itself (Scheduler.submit's `own`)."""

    instance: ModelInstance
    process: StubProcess
    batch: list[Ticket]
    message: IPCMessage


_CALLER_TIMEOUT = "Request timeout expired:"  # how instance.py and StreamTally word a caller's timeout


def failure_reason(stage: Ticket | str, error: BaseException) -> str:
    """The failure reason (stats.py) of a request that failed with `error` at `stage`: OTHER
    before it reached a queue or an instance, the reason its queue gave it (a Ticket), BACKEND
    once an instance had it. A cancelled call, or one whose caller's own timeout ran out while
    an instance had it, is CANCELED."""
    if isinstance(error, asyncio.CancelledError):
        return CANCELED
    reason = stage.failure if isinstance(stage, Ticket) else stage
    if reason == BACKEND and isinstance(error, InferenceError) and error.message.startswith(_CALLER_TIMEOUT):
        return CANCELED
    return reason
