"""Ensembles (``platform: "ensemble"``): a graph of steps over the hosted models, run by the parent.

Each step names a model (``model_version: -1``: its latest), feeds it ensemble tensors
(``input_map``: model input -> ensemble tensor) and names what it produces (``output_map``: model
output -> ensemble tensor). A step runs as soon as every tensor it reads exists; steps that are
ready together run concurrently. The ensemble's inputs are the first tensors; its outputs are
read from the last ones.

Tensors travel between steps as the arrays the previous step returned (views of its stub's
pool): the next stub's request copies them into its own pool, the one copy a process boundary
needs. An ensemble output the client placed in a shared-memory region is written there by the
step that produces it.

A step whose model is decoupled may answer any number of times: each response continues the
rest of the graph on its own, so the ensemble streams one response per completed path (and is
itself decoupled), as Triton's ensemble scheduler does.

Composing models are looked up at each request, so reloading one takes effect at once; an
ensemble whose composing model is unloaded is not ready and fails its requests with a clear error.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from stubhost.config import ModelConfig, config_to_dict
from stubhost.host.background import iterate_in_background
from stubhost.host.ensemble_wiring import check_wiring
from stubhost.host.errors import InferenceError
from stubhost.host.model_finder import ModelFinder
from stubhost.host.versions import resolve_version
from stubhost.host.inputs import RequestChecker
from stubhost.host.labels import OutputClasses
from stubhost.host.regions import RegionDestination
from stubhost.host.repository import ModelDir
from stubhost.host.result import InferResponse
from stubhost.host.stats import BACKEND, CANCELED, OTHER, ModelStatistics
from stubhost.host.step_limiter import StepLimiter

log = logging.getLogger("stubhost")
_NO_LIMIT = contextlib.nullcontext()  # reusable, with and async with alike: a step without max_inflight_requests

ModelLookup = Callable[[str], Any]  # a loaded model by name (LoadedModel or EnsembleModel), or None


@dataclass(frozen=True)
class EnsembleStep:
    """One step: the model it runs, and its tensor maps (model tensor -> ensemble tensor)."""

    index: int
    model: str
    version: str  # "" for -1 (the latest)
    inputs: dict[str, str]
    outputs: dict[str, str]


def ensemble_steps(cfg: ModelConfig) -> list[EnsembleStep]:
    """The steps of an ensemble configuration, in their declared order."""
    return [EnsembleStep(i, s.model_name, "" if s.model_version in (-1, 0) else str(s.model_version),
                         dict(s.input_map), dict(s.output_map))
            for i, s in enumerate(cfg.ensemble_scheduling.step)]


@dataclass
class _Call:
    """What every step of one ensemble request shares."""

    parameters: str
    request_id: str
    correlation_id: int | str
    flags: int
    priority: int
    timeout_us: int | None
    deadline: float | None
    destinations: dict[str, RegionDestination]  # ensemble output -> client region it goes to
    requested: list[str]
    trace: Any = None  # the request's RequestTrace: each step's request is traced as its child

    def remaining(self) -> float | None:
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise InferenceError("UNAVAILABLE", f"Request timeout expired: the ensemble request "
                                                f"'{self.request_id or '<id_unknown>'}' ran out of time")
        return left


class EnsembleModel:
    """A loaded ensemble: the same serving interface as a LoadedModel, with no instances."""

    def __init__(self, name: str, model_dir: ModelDir, config: ModelConfig, versions: Sequence[int],
                 lookup: ModelLookup, decoupled: bool, *, classes: OutputClasses) -> None:
        self.name = name
        self.model_dir = model_dir
        self.config = config
        self.classes = classes
        self.config_dict = config_to_dict(config)
        self.versions: dict[int, list[Any]] = {v: [] for v in versions}
        self.latest = max(versions)
        self.checker = RequestChecker(name, self.config_dict)
        self.stats = ModelStatistics()
        self.steps = ensemble_steps(config)
        self.decoupled = decoupled
        self._lookup = lookup
        self._inputs = [i["name"] for i in self.config_dict.get("input", [])]
        self._outputs = [o["name"] for o in self.config_dict.get("output", [])]
        self._consumed = {t for s in self.steps for t in s.inputs.values()}
        limit = config.ensemble_scheduling.max_inflight_requests
        self._limiters = [StepLimiter(name, s.index, limit) for s in self.steps] if limit else None

    # ---- loading ---------------------------------------------------------------------------------
    @classmethod
    def load(cls, model_dir: ModelDir, cfg: ModelConfig, versions: Sequence[int], lookup: ModelFinder,
             classes: OutputClasses) -> EnsembleModel:
        """Checks the wiring against the composing models as loaded now; raises InferenceError."""
        name = cfg.name
        steps = ensemble_steps(cfg)
        # The data flow was checked with the configuration (config.ensemble_flow).
        decoupled = check_wiring(name, cfg, steps, lookup) or bool(cfg.model_transaction_policy.decoupled)
        if decoupled:  # as Triton shows it: an ensemble with a decoupled step streams
            cfg.model_transaction_policy.decoupled = True
        if cfg.ensemble_scheduling.max_inflight_requests:
            log.info("Ensemble model '%s' configured with max_inflight_requests: %d", name,
                     cfg.ensemble_scheduling.max_inflight_requests)
        return cls(name, model_dir, cfg, versions, lookup, decoupled, classes=classes)

    # ---- the serving interface LoadedModel also has ------------------------------------------------
    def instances(self) -> list[Any]:
        """An ensemble has no instances of its own."""
        return []

    def ready(self, version: int | None = None) -> bool:
        """True when every composing model is loaded and ready."""
        if version is not None and version not in self.versions:
            return False
        for step in self.steps:
            model = self._lookup(step.model)
            if model is None or not model.ready():
                return False
        return True

    def resolve_version(self, model_version: str | int) -> int:
        """The loaded version a request names ("" or -1: the latest)."""
        return resolve_version(self.name, self.versions, self.latest, model_version)

    def statistics(self, version: str | int = "") -> list[dict[str, Any]]:
        """Triton's ``model_stats`` entries of the ensemble itself."""
        versions = sorted(self.versions) if version in ("", None) else [self.resolve_version(version)]
        return self.stats.snapshot(self.name, versions)

    def pending(self, version: int) -> int:
        """Requests wait in the composing models' queues, not in the ensemble's."""
        return 0

    def check_health(self) -> None:
        """Nothing to watch: the composing models have their own stubs."""

    def stop(self) -> None:
        """Nothing to stop: requests in flight finish on the composing models."""

    # ---- inference -------------------------------------------------------------------------------
    def infer(self, inputs: Mapping[str, Any], outputs: Sequence[str | RegionDestination] | None,
              model_version: str | int, parameters: str, request_id: str, timeout: float | None,
              correlation_id: int | str, flags: int, *, timeout_us: int | None = None,
              priority: int = 0) -> InferResponse:
        """Runs the graph once and returns the ensemble's outputs. The caller's thread runs the
        steps itself (steps ready together: all but one in worker threads)."""
        self._refuse_decoupled()
        begin = time.monotonic_ns()
        version, call = self._accept(inputs, outputs, model_version, parameters, request_id, correlation_id, flags,
                                     priority, timeout_us, timeout, begin)
        try:
            produced = self._run_sync(dict(inputs), call)
        except InferenceError as e:
            self._failed(version, begin, BACKEND, e)
            raise
        self._succeeded(version, inputs, begin)
        return InferResponse(produced, {}, version)

    async def infer_async(self, inputs: Mapping[str, Any], outputs: Sequence[str | RegionDestination] | None,
                          model_version: str | int, parameters: str, request_id: str, timeout: float | None,
                          correlation_id: int | str, flags: int, *, timeout_us: int | None = None,
                          priority: int = 0, trace: Any = None) -> InferResponse:
        """``infer`` for asyncio callers; `trace` (a RequestTrace): the request is traced, each
        step's request as a child of it, as Triton traces an ensemble."""
        self._refuse_decoupled()
        begin = time.monotonic_ns()
        version, call = self._accept(inputs, outputs, model_version, parameters, request_id, correlation_id, flags,
                                     priority, timeout_us, timeout, begin, trace)
        paths = self._run(dict(inputs), frozenset(), call)
        try:
            produced = await paths.__anext__()
        except StopAsyncIteration:
            error = InferenceError("INTERNAL", f"ensemble '{self.name}' produced no response")
            self._failed(version, begin, BACKEND, error)
            raise error from None
        except (InferenceError, asyncio.CancelledError) as e:
            self._failed(version, begin, BACKEND, e)
            raise
        finally:
            await paths.aclose()
            if trace is not None:
                trace.timestamp("REQUEST_END")
        self._succeeded(version, inputs, begin)
        return InferResponse(produced, {}, version)

    def _refuse_decoupled(self) -> None:
        if self.decoupled:
            raise InferenceError("UNSUPPORTED", f"model '{self.name}' uses the decoupled transaction policy: its "
                                                "responses can only be streamed")

    def _accept(self, inputs: Mapping[str, Any], outputs: Sequence[str | RegionDestination] | None,
                model_version: str | int, parameters: str, request_id: str, correlation_id: int | str, flags: int,
                priority: int, timeout_us: int | None, timeout: float | None, begin: int,
                trace: Any = None) -> tuple[int, _Call]:
        """The version and the checked request; a refused request is counted (OTHER) and raised.
        A traced request's REQUEST_START and QUEUE_START are its arrival: an ensemble has no
        queue nor compute of its own."""
        version: int | None = None
        try:
            version = self.resolve_version(model_version)
            call = self._call(inputs, outputs, parameters, request_id, correlation_id, flags, priority, timeout_us,
                              timeout)
        except InferenceError as e:
            self._failed(version, begin, OTHER, e)
            raise
        if trace is not None:
            call.trace = trace
            trace.started(self.name, version, request_id, begin)
            trace.timestamp("QUEUE_START", begin)
        return version, call

    def stream(self, inputs: Mapping[str, Any], outputs: Sequence[str | RegionDestination] | None,
               model_version: str | int, parameters: str, request_id: str, timeout: float | None,
               correlation_id: int | str, flags: int, *, timeout_us: int | None = None,
               priority: int = 0) -> Generator[InferResponse, None, None]:
        """The ensemble's responses as they come; leaving early cancels what still runs."""
        yield from iterate_in_background(self.stream_async(inputs, outputs, model_version, parameters, request_id,
                                                           timeout, correlation_id, flags, timeout_us=timeout_us,
                                                           priority=priority))

    async def stream_async(self, inputs: Mapping[str, Any], outputs: Sequence[str | RegionDestination] | None,
                           model_version: str | int, parameters: str, request_id: str, timeout: float | None,
                           correlation_id: int | str, flags: int, *, timeout_us: int | None = None,
                           priority: int = 0, trace: Any = None) -> AsyncGenerator[InferResponse, None]:
        """``stream`` for asyncio callers: one response per finished path of a decoupled
        ensemble, then an empty final one; the one response of any other ensemble. `trace`:
        as ``infer_async``."""
        if not self.decoupled:
            yield await self.infer_async(inputs, outputs, model_version, parameters, request_id, timeout,
                                         correlation_id, flags, timeout_us=timeout_us, priority=priority, trace=trace)
            return
        begin = time.monotonic_ns()
        version, call = self._accept(inputs, outputs, model_version, parameters, request_id, correlation_id, flags,
                                     priority, timeout_us, timeout, begin, trace)
        try:
            # aclosing: a caller leaving early cancels the steps at once, not when the GC finds them.
            async with contextlib.aclosing(self._run(dict(inputs), frozenset(), call)) as paths:
                async for produced in paths:
                    yield InferResponse(produced, {}, version, final=False)
        except InferenceError as e:
            self._failed(version, begin, BACKEND, e)
            # A failed step ends the stream with an error response, as a decoupled model's does.
            yield InferResponse({}, {}, version, final=True, error=e)
            return
        except (asyncio.CancelledError, GeneratorExit) as e:
            self._failed(version, begin, BACKEND, e)
            raise
        finally:
            if trace is not None:
                trace.timestamp("REQUEST_END")
        self._succeeded(version, inputs, begin)
        yield InferResponse({}, {}, version, final=True, empty=True)

    def _failed(self, version: int | None, begin: int, reason: str, error: BaseException) -> None:
        """Counts a failed request: CANCELED when its caller gave up or its time ran out."""
        if version is None:
            return
        if not isinstance(error, InferenceError) or error.message.startswith("Request timeout expired"):
            reason = CANCELED
        self.stats.record_failure(version, begin, time.monotonic_ns(), reason)

    def _succeeded(self, version: int, inputs: Mapping[str, Any], begin: int) -> None:
        """Counts a success; its whole time is the ensemble's compute time (the composing models
        count their own queue and compute times)."""
        done = time.monotonic_ns()
        batch = _batch_size(inputs) if self.config.max_batch_size > 0 else 1
        self.stats.record_success(version, batch, begin, begin, begin, done, done)

    # ---- the graph -------------------------------------------------------------------------------
    def _call(self, inputs: Mapping[str, Any], outputs: Sequence[str | RegionDestination] | None, parameters: str,
              request_id: str, correlation_id: int | str, flags: int, priority: int, timeout_us: int | None,
              timeout: float | None) -> _Call:
        """Validates a request against the ensemble's configuration."""
        self.checker.check_inputs(inputs, request_id)
        requested = self.checker.check_outputs(outputs, request_id) or list(self._outputs)
        destinations: dict[str, RegionDestination] = {}
        names: list[str] = []
        for entry in requested:
            if isinstance(entry, RegionDestination):
                # The step that produces it writes it into the region, unless a later step reads
                # it too: then it comes back as an array, which the front end copies there.
                if entry.name not in self._consumed:
                    destinations[entry.name] = entry
                names.append(entry.name)
            else:
                names.append(entry)
        return _Call(parameters, request_id, correlation_id, flags, priority, timeout_us,
                     None if timeout is None else time.monotonic() + timeout, destinations, names)

    def _model(self, step: EnsembleStep) -> Any:
        model = self._lookup(step.model)
        if model is None:
            raise InferenceError("UNAVAILABLE", f"ensemble '{self.name}' depends on '{step.model}' which has no "
                                                "loaded version")
        return model

    async def _run(self, tensors: dict[str, Any], done: frozenset[int], call: _Call) -> AsyncIterator[dict[str, Any]]:
        """Runs every step once its inputs exist, each as soon as they do (a fast branch's next
        step never waits for a slow sibling); yields the requested outputs of each finished path
        (one, unless a decoupled step forks the graph)."""
        finished = set(done)
        running: dict[asyncio.Future[dict[str, Any]], EnsembleStep] = {}
        try:
            while True:
                ready = self._ready(tensors, finished, running.values())
                plain = [s for s in ready if not self._model(s).decoupled]
                if len(plain) < len(ready) and not self.decoupled:
                    raise self._became_decoupled(next(s for s in ready if s not in plain))
                if len(plain) == 1 and not running:  # a chain of steps: no task to make
                    finished.add(plain[0].index)
                    tensors.update(await self._run_step(plain[0], tensors, call))
                    continue
                for step in plain:
                    running[asyncio.ensure_future(self._run_step(step, tensors, call))] = step
                if running:
                    completed, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                    for future in completed:
                        finished.add(running.pop(future).index)
                        tensors.update(future.result())
                    continue
                if not ready:
                    break
                step = ready[0]  # a decoupled step: every response of it goes on separately
                finished.add(step.index)
                async with contextlib.aclosing(self._paths(step, tensors, frozenset(finished), call)) as paths:
                    async for result in paths:
                        yield result
                return
        finally:
            for future in running:
                future.cancel()
        yield self._outputs_of(tensors, call)

    async def _paths(self, step: EnsembleStep, tensors: Mapping[str, Any], done: frozenset[int],
                     call: _Call) -> AsyncIterator[dict[str, Any]]:
        """Runs decoupled `step` and, for each of its responses, the rest of the graph as a path of
        its own. Paths run concurrently, beside the step that keeps answering, as Triton starts the
        next steps of each response at once. Their results are yielded in the order of the step's
        responses: a path's results wait for the paths before it to end (Triton keeps that order
        when the next steps' models do; stubhost always keeps it). A failed path, or the step
        failing, fails the whole."""
        events: asyncio.Queue[tuple[str, int, Any]] = asyncio.Queue()
        paths: list[asyncio.Future[None]] = []  # in the order of the step's responses

        async def path(index: int, produced: dict[str, Any]) -> None:
            try:
                async with contextlib.aclosing(self._run({**tensors, **produced}, done, call)) as results:
                    async for result in results:
                        events.put_nowait(("result", index, result))
            except Exception as e:
                events.put_nowait(("error", index, e))
            finally:
                events.put_nowait(("path_end", index, None))

        async def produce() -> None:
            try:
                async with contextlib.aclosing(self._stream_step(step, tensors, call)) as responses:
                    async for produced in responses:
                        paths.append(asyncio.ensure_future(path(len(paths), produced)))
                events.put_nowait(("stream_end", -1, None))
            except Exception as e:
                events.put_nowait(("error", -1, e))

        producer = asyncio.ensure_future(produce())
        head, streaming = 0, True  # head: the path whose results go out as they come
        held: dict[int, list[dict[str, Any]]] = {}
        ended: set[int] = set()
        try:
            while streaming or head < len(paths):
                kind, index, value = await events.get()
                if kind == "error":
                    raise value
                if kind == "stream_end":
                    streaming = False
                elif kind == "result" and index == head:
                    yield value
                elif kind == "result":
                    held.setdefault(index, []).append(value)
                else:  # path_end: the next paths' held results go out
                    ended.add(index)
                    while head in ended:
                        ended.discard(head)
                        head += 1
                        for result in held.pop(head, []):
                            yield result
        finally:
            for task in (producer, *paths):
                task.cancel()
            await asyncio.gather(producer, *paths, return_exceptions=True)

    def _limit(self, step: EnsembleStep) -> Any:
        """The step's StepLimiter (max_inflight_requests), or a context that limits nothing."""
        return _NO_LIMIT if self._limiters is None else self._limiters[step.index]

    def _ready(self, tensors: Mapping[str, Any], finished: set[int], running: Any) -> list[EnsembleStep]:
        """Steps not run nor running whose inputs all exist."""
        busy = {s.index for s in running}
        return [s for s in self.steps
                if s.index not in finished and s.index not in busy and set(s.inputs.values()) <= tensors.keys()]

    def _became_decoupled(self, step: EnsembleStep) -> InferenceError:
        return InferenceError("UNAVAILABLE", f"ensemble '{self.name}' was loaded with no decoupled step, but "
                                             f"'{step.model}' is now decoupled: reload the ensemble")

    def _outputs_of(self, tensors: Mapping[str, Any], call: _Call) -> dict[str, Any]:
        missing = [name for name in call.requested if name not in tensors]
        if missing:
            raise InferenceError("INTERNAL", f"ensemble '{self.name}' did not produce output(s) {', '.join(missing)}")
        return {name: tensors[name] for name in call.requested}

    def _run_sync(self, tensors: dict[str, Any], call: _Call) -> dict[str, Any]:
        """The graph of an ensemble without decoupled steps for a synchronous caller: a lone
        ready step runs in the caller's thread, steps ready together in worker threads, each
        step as soon as its inputs exist."""
        finished: set[int] = set()
        running: dict[Future[dict[str, Any]], EnsembleStep] = {}
        try:
            while True:
                ready = self._ready(tensors, finished, running.values())
                for step in ready:
                    if self._model(step).decoupled:
                        raise self._became_decoupled(step)
                if len(ready) == 1 and not running:
                    finished.add(ready[0].index)
                    tensors.update(self._run_step_sync(ready[0], tensors, call))
                    continue
                for step in ready:
                    running[_workers().submit(self._run_step_sync, step, tensors, call)] = step
                if not running:
                    break
                completed, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in completed:
                    finished.add(running.pop(future).index)
                    tensors.update(future.result())
        finally:
            for future in running:
                future.cancel()
        return self._outputs_of(tensors, call)

    def _run_step_sync(self, step: EnsembleStep, tensors: Mapping[str, Any], call: _Call) -> dict[str, Any]:
        inputs, outputs = self._step_request(step, tensors, call)
        with self._limit(step):
            response = self._model(step).infer(
                inputs, outputs, step.version, call.parameters, call.request_id, call.remaining(),
                call.correlation_id, call.flags, timeout_us=call.timeout_us, priority=call.priority)
        return {step.outputs[name]: value for name, value in response.outputs.items() if name in step.outputs}

    def _step_request(self, step: EnsembleStep, tensors: Mapping[str, Any],
                      call: _Call) -> tuple[dict[str, Any], list[str | RegionDestination]]:
        inputs = {model_input: tensors[tensor] for model_input, tensor in step.inputs.items()}
        outputs: list[str | RegionDestination] = []
        for model_output, tensor in step.outputs.items():
            destination = call.destinations.get(tensor)
            outputs.append(model_output if destination is None else
                           dataclasses.replace(destination, name=model_output))
        return inputs, outputs

    async def _run_step(self, step: EnsembleStep, tensors: Mapping[str, Any], call: _Call) -> dict[str, Any]:
        inputs, outputs = self._step_request(step, tensors, call)
        async with self._limit(step):
            response = await self._model(step).infer_async(
                inputs, outputs, step.version, call.parameters, call.request_id, call.remaining(),
                call.correlation_id, call.flags, timeout_us=call.timeout_us, priority=call.priority,
                trace=None if call.trace is None else call.trace.child(step.model))
        return {step.outputs[name]: value for name, value in response.outputs.items() if name in step.outputs}

    async def _stream_step(self, step: EnsembleStep, tensors: Mapping[str, Any],
                           call: _Call) -> AsyncIterator[dict[str, Any]]:
        inputs, outputs = self._step_request(step, tensors, call)
        async with self._limit(step):  # held until the step's final response
            responses = self._model(step).stream_async(
                inputs, outputs, step.version, call.parameters, call.request_id, call.remaining(),
                call.correlation_id, call.flags, timeout_us=call.timeout_us, priority=call.priority,
                trace=None if call.trace is None else call.trace.child(step.model))
            try:
                async for response in responses:
                    if response.error is not None:
                        raise response.error
                    if not response.empty:
                        yield {step.outputs[n]: v for n, v in response.outputs.items() if n in step.outputs}
            finally:
                await responses.aclose()


def _batch_size(inputs: Mapping[str, Any]) -> int:
    for value in inputs.values():
        shape = getattr(value, "shape", None)
        if shape:
            return int(shape[0])
    return 1


# ---- the threads that run sync callers' steps ---------------------------------------------------
_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _workers() -> ThreadPoolExecutor:
    """Threads for the steps a sync caller's round runs beside its own (made on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="stubhost-ensemble-step")
        return _pool
