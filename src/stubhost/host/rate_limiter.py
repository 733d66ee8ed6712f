"""Triton's rate limiter (tritonserver ``--rate-limit execution_count``): resources and priorities
that decide, across every model of the server, when a model instance may start an execution.

    stubhost.Server(repo, rate_limit="execution_count", rate_limit_resources=["R1:4", "R2:2:0"])
    stubhost serve ... --rate-limit execution_count --rate-limit-resource R1:4

An instance group's ``rate_limiter { resources [...] priority }`` gives each of its instances the
resources one execution needs (``count`` copies of ``name``, per device or, ``global: true``, one
pool for the whole server) and a priority. Triton's rules (core src/rate_limiter.cc):

- An instance starts an execution only when every resource it needs is available; they are taken
  when the execution starts and given back when it ends (for every end: an answer, an error, a
  stub that dies, a send that fails). A decoupled model's execution ends when ``execute`` returns.
- The copies of a resource are the largest count any loaded instance needs (so each instance can
  always run alone), or what ``--rate-limit-resource <name>:<count>[:<device>]`` gives (no device:
  every device; a resource given twice for one device keeps the smaller count). Once any is given,
  a resource the flags do not name has no copies. A model whose instances need more than the copies
  given fails to load: ``Resource count for "<name>" is limited to <n> which will prevent
  scheduling of one or more model instances, the minimum required count is <m>``. A name that is
  global in one model and per device in another fails the load too.
- The instances waiting for resources start in the order of their executions so far times their
  ``priority`` (0 counts as 1), the one that has waited longest first among equals: an instance
  with priority 2 gets half the turns of one with priority 1. The first in that order that does
  not fit holds up those behind it, as in Triton.

"Device" is the instance's device as Triton counts it: 0 for KIND_CPU and KIND_MODEL instances,
the GPU id for KIND_GPU ones. So on the host every CPU instance shares device 0's copies.

How it is used (scheduler.py, sequence_batcher.py): a model with a ``rate_limiter`` in any group
goes through its version's queue also with one instance. The queue asks ``admit`` for a free
instance before it sends a batch; an instance that must wait is *staged*, its requests stay
queued, and when its resources are granted its queue is poked (its ``_release(None)``) to send the
batch. ``release`` gives the resources back when the batch's execution ended. A grant that its
queue did not use (the requests were withdrawn meanwhile) is taken back. With ``--rate-limit off``
(the default) there is no RateLimiter at all, and no queue ever asks.

Locks: a queue may call the limiter with its own lock held (``admit``, ``release``,
``give_back``), never the other way round: a queue is poked with no lock held, by the thread that
released resources after it let go of its queue's lock, or by a thread of its own.

Unlike Triton: models without any ``rate_limiter`` are left out (Triton stages every instance,
with no resources and priority 1); every waiting instance that fits is granted at once, in order
(Triton grants one per event); initialization and warmup run outside the limiter.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from stubhost.config.model_config_pb2 import ModelRateLimiter
from stubhost.host.errors import InferenceError
from stubhost.host.instance import InstanceState, ModelInstance
from stubhost.option_numbers import StoiError, stoi

log = logging.getLogger("stubhost")

__all__ = ["EXECUTION_COUNT", "OFF", "ModelLimits", "QueueLimits", "RateLimitFlagError", "RateLimiter",
           "parse_mode", "parse_resource"]

OFF = "off"
EXECUTION_COUNT = "execution_count"
GLOBAL = -2        # Triton's GLOBAL_RESOURCE_KEY: the device key of a global resource
EVERY_DEVICE = -1  # Triton's PER_DEVICE_RESOURCE_KEY: a --rate-limit-resource without a device

_IDLE, _STAGED, _GRANTED, _RUNNING, _GONE = range(5)
_RESOURCE = '"--rate-limit-resource"'

Resources = Mapping[str, int] | Iterable["str | tuple[str, int] | tuple[str, int, int]"]


class RateLimitFlagError(ValueError):
    """A malformed ``--rate-limit`` or ``--rate-limit-resource`` value (tritonserver's words)."""


# ---- the flags -------------------------------------------------------------------------------------
def parse_mode(text: str) -> str:
    """``--rate-limit``: ``off`` or ``execution_count``, in any case (tritonserver lowers it)."""
    mode = str(text).lower()
    if mode not in (OFF, EXECUTION_COUNT):
        raise RateLimitFlagError('Bad option: "--rate-limit". invalid argument for --rate-limit')
    return mode


def _stoi(text: str) -> int:
    """tritonserver's ParseOption<int> (std::stoi and its two failures)."""
    try:
        return stoi(text)
    except StoiError as e:
        raise RateLimitFlagError(f"Bad option: {_RESOURCE}. {e}") from None


def parse_resource(text: str) -> tuple[str, int, int]:
    """One ``--rate-limit-resource`` value, ``<name>:<count>[:<device>]``, as (name, count, device);
    device -1 (none given) means every device. Raises RateLimitFlagError."""
    parts = str(text).split(":")
    if len(parts) not in (2, 3):
        raise RateLimitFlagError(f"Bad option: {_RESOURCE}. --rate-limit-resource option format is "
                                 f"'<resource_name>:<count>:<device>' or '<resource_name>:<count>'. Got {text}")
    count = _stoi(parts[1])
    device = _stoi(parts[2]) if len(parts) == 3 else EVERY_DEVICE
    # tritonserver casts a negative count to size_t (a huge count) and reads device -2 as "global":
    # both are refused here.
    if count < 0:
        raise RateLimitFlagError(f"Bad option: {_RESOURCE}. the count must not be negative. Got {text}")
    if device < EVERY_DEVICE:
        raise RateLimitFlagError(f"Bad option: {_RESOURCE}. the device must be a device id, or -1 for every "
                                 f"device. Got {text}")
    return parts[0], count, device


def _explicit(resources: Resources) -> dict[int, dict[str, int]]:
    """The copies the server is given, device -> name -> count (a name given twice for one device
    keeps the smaller count, as Triton's AddRateLimiterResource)."""
    given: dict[int, dict[str, int]] = {}
    if isinstance(resources, Mapping):
        items: list[tuple[str, int, int]] = [(str(name), int(count), EVERY_DEVICE) for name, count in resources.items()]
    elif isinstance(resources, str | bytes):
        raise ValueError("rate_limit_resources must be a list of '<name>:<count>[:<device>]' values or a mapping")
    else:
        items = []
        for item in resources:
            if isinstance(item, str):
                items.append(parse_resource(item))
                continue
            name, count, *rest = item
            device = int(rest[0]) if rest else EVERY_DEVICE
            if isinstance(count, bool) or not isinstance(count, int) or count < 0 or device < EVERY_DEVICE:
                raise ValueError(f"rate limiter resource {item!r}: expected (name, count >= 0[, device >= -1])")
            items.append((str(name), count, device))
    for name, count, device in items:
        if count < 0:
            raise ValueError(f"rate limiter resource '{name}': the count must not be negative, got {count}")
        per = given.setdefault(device, {})
        per[name] = min(per.get(name, count), count)
    return given


# ---- the limiter -------------------------------------------------------------------------------------
class _Entry:
    """One instance as the rate limiter sees it."""

    __slots__ = ("instance", "needs", "priority", "executions", "state", "order", "grant", "queue")

    def __init__(self, instance: ModelInstance, needs: dict[tuple[int, str], int], priority: int) -> None:
        self.instance = instance
        self.needs = needs              # (device key, name) -> copies one execution takes
        self.priority = max(priority, 1)  # Triton: 0 is 1
        self.executions = 0             # executions ended (Triton's exec_count)
        self.state = _IDLE
        self.order = 0                  # when it was staged (the longest waiting first among equals)
        self.grant = 0                  # counts its grants, so that a stale one is never taken back
        self.queue: QueueLimits | None = None

    def rank(self) -> tuple[int, int]:
        return self.executions * self.priority, self.order


Grant = tuple[_Entry, int]


class RateLimiter:
    """The server's rate limiter, shared by every model (thread-safe). ``create`` gives None for
    ``off``: then nothing is limited and nothing asks."""

    def __init__(self, resources: Resources = ()) -> None:
        self._explicit = _explicit(resources)
        self._lock = threading.Lock()
        self._entries: list[_Entry] = []
        self._limits: dict[tuple[int, str], int] = {}  # the copies of each (device key, name)
        self._used: dict[tuple[int, str], int] = {}
        self._waiting: list[_Entry] = []
        self._order = itertools.count(1)

    @classmethod
    def create(cls, mode: str = OFF, resources: Resources = ()) -> RateLimiter | None:
        """The limiter for ``--rate-limit`` `mode` with the ``--rate-limit-resource`` values
        `resources` (checked even when off, as tritonserver parses them); None when off."""
        mode = parse_mode(mode)
        limiter = cls(resources)
        return limiter if mode == EXECUTION_COUNT else None

    # ---- models ----------------------------------------------------------------------------------------
    def register(self, model_name: str, instances: Sequence[tuple[ModelInstance, Any]]) -> ModelLimits | None:
        """Adds a loaded model's instances, each with its instance group (every version's); None
        when no group has a ``rate_limiter`` (the model is not limited). Raises InferenceError
        INVALID_ARG, with Triton's words, when the resources cannot let every instance run."""
        if not any(group.HasField("rate_limiter") for _, group in instances):
            return None
        entries = [_Entry(instance, _needs(instance, group.rate_limiter), int(group.rate_limiter.priority))
                   for instance, group in instances]
        with self._lock:
            try:
                limits = self._compute([*self._entries, *entries])
            except ValueError as e:
                raise InferenceError("INVALID_ARG", f"failed to load '{model_name}': {e}") from None
            self._entries.extend(entries)
            self._limits = limits
            grants = self._allocate()  # more copies may let waiting instances go
        self._settle(grants)
        return ModelLimits(self, entries)

    def _unregister(self, entries: list[_Entry]) -> None:
        with self._lock:
            for entry in entries:
                if entry.state == _STAGED:
                    self._waiting.remove(entry)
                elif entry.state in (_GRANTED, _RUNNING):
                    self._give(entry)
                entry.state = _GONE
            self._entries = [e for e in self._entries if e.state != _GONE]
            try:
                self._limits = self._compute(self._entries)
            except ValueError:  # (fewer needs than before: cannot happen)
                log.exception("rate limiter: recomputing the resources failed")
            grants = self._allocate()
        self._settle(grants)

    def _compute(self, entries: list[_Entry]) -> dict[tuple[int, str], int]:
        """Triton's UpdateResourceLimits: the copies of each resource; raises ValueError (its text)."""
        limits: dict[tuple[int, str], int] = {}
        for entry in entries:
            for key, count in entry.needs.items():
                limits[key] = max(limits.get(key, 0), count)
        if self._explicit:
            for key in sorted(limits):
                device, name = key
                if device == GLOBAL:  # any device's value counts for a global resource
                    given = max((per.get(name, 0) for per in self._explicit.values()), default=0)
                else:
                    given = max(self._explicit.get(device, {}).get(name, 0),
                                self._explicit.get(EVERY_DEVICE, {}).get(name, 0))
                if given < limits[key]:
                    raise ValueError(f'Resource count for "{name}" is limited to {given} which will prevent '
                                     f"scheduling of one or more model instances, the minimum required count is "
                                     f"{limits[key]}")
                limits[key] = given
        shared = {name for device, name in limits if device == GLOBAL}
        for device, name in sorted(limits):
            if device != GLOBAL and name in shared:
                raise ValueError(f'Resource "{name}" is present as both global and device-specific resource in '
                                 f"the model configuration.")
        return limits

    def resources(self) -> dict[str, dict[str, int]]:
        """``{"<device>|GLOBAL:<name>": {"count": copies, "in_use": taken}}``, for logs and tests."""
        with self._lock:
            return {f"{'GLOBAL' if d == GLOBAL else d}:{n}": {"count": c, "in_use": self._used.get((d, n), 0)}
                    for (d, n), c in sorted(self._limits.items())}

    # ---- grants (lock held) ----------------------------------------------------------------------------
    def _stage(self, entry: _Entry) -> None:
        entry.state, entry.order = _STAGED, next(self._order)
        self._waiting.append(entry)

    def _give(self, entry: _Entry) -> None:
        for key, count in entry.needs.items():
            self._used[key] -= count

    def _allocate(self) -> list[Grant]:
        """Grants resources to the waiting instances in Triton's order, as long as they fit: the first
        READY one that does not fit holds up the rest (one restarting is passed over)."""
        grants: list[Grant] = []
        if not self._waiting:
            return grants
        for entry in sorted(self._waiting, key=_Entry.rank):
            if entry.instance.state is not InstanceState.READY:
                continue
            if any(self._used.get(key, 0) + count > self._limits.get(key, 0) for key, count in entry.needs.items()):
                break
            for key, count in entry.needs.items():
                self._used[key] = self._used.get(key, 0) + count
            self._waiting.remove(entry)
            entry.state, entry.grant = _GRANTED, entry.grant + 1
            grants.append((entry, entry.grant))
        return grants

    # ---- grants (no lock held) -------------------------------------------------------------------------
    def _settle(self, grants: list[Grant], here: QueueLimits | None = None) -> None:
        """Pokes the queues whose instances were granted resources, so that they send a batch; a
        grant still unused afterwards is taken back (which may grant others). `here`: the queue
        that looks at its own grants itself (it is not poked, only its unused grants are taken)."""
        while grants:
            for queue in dict.fromkeys(entry.queue for entry, _ in grants if entry.queue is not here):
                if queue is not None:
                    try:
                        queue.poke()
                    except Exception:  # noqa: BLE001  (the releasing thread must go on)
                        log.exception("rate limiter: a queue failed to take its grant")
            here = None
            with self._lock:
                unused = [entry for entry, grant in grants if entry.state == _GRANTED and entry.grant == grant]
                for entry in unused:
                    self._give(entry)
                    entry.state = _IDLE
                grants = self._allocate() if unused else []

    def _later(self, grants: list[Grant]) -> None:
        """``_settle`` from a thread of its own: the caller holds a queue's lock."""
        if grants:
            threading.Thread(target=self._settle, args=(grants,), name="stubhost-rate-limiter", daemon=True).start()


class ModelLimits:
    """A loaded model's registration: its queues bind to it; ``unregister`` when it unloads."""

    def __init__(self, limiter: RateLimiter, entries: list[_Entry]) -> None:
        self.limiter = limiter
        self._entries = {id(entry.instance): entry for entry in entries}

    def bind(self, instances: Sequence[ModelInstance], poke: Callable[[], None]) -> QueueLimits:
        """The handle of the queue of `instances` (one version); `poke` makes it send what can go."""
        queue = QueueLimits(self.limiter, {id(i): self._entries[id(i)] for i in instances}, poke)
        for entry in queue.entries.values():
            entry.queue = queue
        return queue

    def unregister(self) -> None:
        """The model is gone (its stubs stopped): whatever its instances held or waited for is given up."""
        self.limiter._unregister(list(self._entries.values()))


class QueueLimits:
    """What one version's queue asks the rate limiter. ``admit``, ``release``, ``give_back`` and
    ``waiting`` run with the queue's lock held; ``settle`` after it is released."""

    def __init__(self, limiter: RateLimiter, entries: dict[int, _Entry], poke: Callable[[], None]) -> None:
        self.limiter = limiter
        self.entries = entries
        self.poke = poke

    def admit(self, free: Sequence[ModelInstance]) -> ModelInstance | None:
        """The free instance (of `free`, READY ones only, the one freed last first) that may start a
        batch now, its resources taken; None while the queue's staged instance waits for them. With
        none staged, the one with the fewest executions (times its priority) is staged."""
        limiter = self.limiter
        with limiter._lock:
            ready = [e for i in reversed(free)
                     if (e := self.entries.get(id(i))) is not None and i.state is InstanceState.READY]
            if not ready:
                return None
            if not any(entry.state in (_STAGED, _GRANTED) for entry in ready):
                limiter._stage(min(ready, key=lambda entry: entry.executions * entry.priority))
            grants = limiter._allocate()
            chosen = next((entry for entry in ready if entry.state == _GRANTED), None)
            if chosen is not None:
                chosen.state = _RUNNING
        limiter._later([(entry, grant) for entry, grant in grants if entry is not chosen])
        return None if chosen is None else chosen.instance

    def release(self, instance: ModelInstance | None, queued: int) -> list[Grant]:
        """`instance`'s execution ended: its resources go back, and (`queued`: its queue still holds
        requests) it is staged again first, as Triton does. Returns the grants for ``settle``."""
        entry = self.entries.get(id(instance)) if instance is not None else None
        if entry is None:
            return []
        limiter = self.limiter
        with limiter._lock:
            if entry.state != _RUNNING:
                return []
            limiter._give(entry)
            entry.executions += 1
            entry.state = _IDLE
            if queued:
                limiter._stage(entry)
            return limiter._allocate()

    def give_back(self, instance: ModelInstance) -> None:
        """`instance` was admitted but had nothing to send after all: its resources go back."""
        entry = self.entries.get(id(instance))
        limiter = self.limiter
        with limiter._lock:
            if entry is None or entry.state != _RUNNING:
                return
            limiter._give(entry)
            entry.state = _IDLE
            grants = limiter._allocate()
        limiter._later(grants)

    def waiting(self, free: Iterable[ModelInstance]) -> bool:
        """Whether an instance of `free` waits for (or was just granted) resources: then the queue
        need not wake for its delay, the grant pokes it."""
        return any((e := self.entries.get(id(i))) is not None and e.state in (_STAGED, _GRANTED) for i in free)

    def settle(self, grants: list[Grant]) -> None:
        """After ``release``, with the queue's lock released: the other queues granted resources are
        poked, and this queue's grants it did not use are taken back."""
        self.limiter._settle(grants, self)


def _needs(instance: ModelInstance, config: ModelRateLimiter) -> dict[tuple[int, str], int]:
    """(device key, name) -> count of one instance (a name listed twice: the last count, as Triton)."""
    needs: dict[tuple[int, str], int] = {}
    for resource in config.resources:
        device = GLOBAL if getattr(resource, "global") else instance.spec.device_id
        needs[(device, resource.name)] = int(resource.count)
    return needs
