"""A loaded model: its configuration, its versions and their instances, and request routing.

Loading follows Triton: parse config.pbtxt (if any) -> let the model's ``auto_complete_config``
complete it (in the first stub, which then becomes instance 0) -> fill defaults -> validate ->
start and initialize every instance of every version the version policy selects.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable, Generator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from stubhost import _core
from stubhost._core import Command
from stubhost.config import (
    ConfigError,
    ModelConfig,
    config_from_dict,
    config_to_dict,
    fill_defaults,
    load_config_file,
    select_versions,
    validate_config,
)
from stubhost.config.defaults import ENSEMBLE_PLATFORM
from stubhost.host.answers import ExecuteResult
from stubhost.host.cache_use import install as install_cache
from stubhost.host.ensemble import EnsembleModel
from stubhost.gpu.cuda import device_ids
from stubhost.host.instance_groups import instance_placements, with_groups
from stubhost.host.errors import AnsweredError, InferenceError, VersionLoadError
from stubhost.host.versions import resolve_version
from stubhost.host.inputs import RequestChecker
from stubhost.host.instance import InstanceState, ModelInstance, RequestStream
from stubhost.host.instance_spec import InstanceSpec, failed_version, load_error, load_payload
from stubhost.host.load_options import LoadOptions
from stubhost.host.labels import LabelFileError, OutputClasses, read_output_classes
from stubhost.host.rate_limiter import ModelLimits, RateLimiter
from stubhost.host.streams import StreamItem
from stubhost.host.stream_tally import StreamTally
from stubhost.host.python_based import backend_model_file
from stubhost.host.repository import ModelDir, model_file
from stubhost.host.regions import RegionDestination
from stubhost.host.retirement import Retirable
from stubhost.host.result import InferResponse
from stubhost.host.scheduler import Scheduler
from stubhost.host.tickets import Ticket, failure_reason
from stubhost.host.trace import RequestTrace
from stubhost.host.sequence_batcher import SequenceScheduler
from stubhost.host.sequence_controls import SequenceControls
from stubhost.host.stats import BACKEND, OTHER, ModelStatistics
from stubhost.host.stub_process import StubCallError, StubGoneError, StubProcess
from stubhost.protocol import write_payload

log = logging.getLogger("stubhost")

def _load_ensemble(model_dir: ModelDir, cfg: ModelConfig, source: str, options: LoadOptions) -> EnsembleModel:
    """An ensemble: no stub of its own; its steps run the server's loaded models."""
    fill_defaults(cfg, model_dir.name)
    validate_config(cfg, model_dir_name=model_dir.name, source=source)
    versions = select_versions(cfg, model_dir.versions)
    if not versions:
        raise ConfigError(source, f"at least one version must be available under the version policy of "
                                  f"model '{model_dir.name}'")
    if options.lookup is None:
        raise InferenceError("INVALID_ARG", f"ensemble '{model_dir.name}' can only be loaded by a server")
    try:
        classes = read_output_classes(model_dir.path, cfg, source)
    except LabelFileError as e:
        raise VersionLoadError(model_dir.name, versions[-1], str(e)) from None
    ensemble = EnsembleModel.load(model_dir, cfg, versions, options.lookup, classes)
    ensemble.cache_use = install_cache(ensemble, options.response_cache, source)  # top-level requests, as Triton
    return ensemble


def _auto_complete(process: StubProcess, cfg: ModelConfig, file: Path, version: int, python_based: bool,
                   model_dir: ModelDir, source: str, timeout: float) -> ModelConfig:
    payload = {**load_payload(str(file), str(model_dir.path), version, python_based), "config": config_to_dict(cfg)}
    reply = process.call(Command.AUTO_COMPLETE_REQUEST, write_payload(process.pool, payload), timeout)
    if not isinstance(reply, dict) or "config" not in reply:
        raise StubCallError("auto_complete_config answered without a configuration")
    return config_from_dict(reply["config"], source)


class LoadedModel(Retirable):
    """A model with all its versions' instances running (a reload retires it: see Retirable)."""

    def __init__(self, name: str, model_dir: ModelDir, config: ModelConfig,
                 versions: dict[int, list[ModelInstance]], *, classes: OutputClasses, cache: Any = None,
                 limits: ModelLimits | None = None) -> None:
        Retirable.__init__(self)
        self.name = name
        self.model_dir = model_dir
        self.config = config
        self.classes = classes
        self.config_dict = config_to_dict(config)
        self.versions = versions
        self.latest = max(versions)
        self.checker = RequestChecker(name, self.config_dict)
        self.stats = ModelStatistics()
        for inst in self.instances():
            inst.warmup.count_into(self.stats)  # warmup requests count, as in Triton
        self.decoupled = bool(config.model_transaction_policy.decoupled)
        # Sequences go through the sequence batcher (one slot per instance without batching, as in
        # Triton); other requests wait in a version's queue when the model batches, has several
        # instances to choose from, or is rate limited (`limits`: every execution starts in the
        # queue, rate_limiter.py). So a version without a queue has one instance.
        self.sequence = config.HasField("sequence_batching")
        self.controls = SequenceControls.of(name, config) if self.sequence else None
        self.limits = limits
        self.schedulers: dict[int, Scheduler] = {}
        for version, group in versions.items():
            if self.sequence:
                self.schedulers[version] = SequenceScheduler(name, version, group, config, self.decoupled,
                                                             self.controls, limits)
            elif config.HasField("dynamic_batching") or len(group) > 1 or limits is not None:
                self.schedulers[version] = Scheduler(name, version, group, config, self.decoupled, limits)
        self.cache_use = install_cache(self, cache)  # the server's response cache (None: not used)

    # ---- loading ---------------------------------------------------------------------------------
    @classmethod
    def load(cls, model_dir: ModelDir, options: LoadOptions,
             config: ModelConfig | None = None) -> LoadedModel | EnsembleModel:
        """Loads every selected version; raises InferenceError naming what failed. ``config``
        replaces the folder's config.pbtxt (a load request's "config" override)."""
        name = model_dir.name
        source = "the overriding config" if config is not None else str(model_dir.config_path or
                                                                           model_dir.path / "config.pbtxt")
        try:
            if config is not None:
                cfg = ModelConfig()
                cfg.CopyFrom(config)
            else:
                cfg = load_config_file(model_dir.config_path) if model_dir.config_path else ModelConfig()
            versions = select_versions(cfg, model_dir.versions)
            if not versions:
                raise ConfigError(source, f"at least one version must be available under the version policy of "
                                          f"model '{name}'")
            if cfg.platform == ENSEMBLE_PLATFORM:
                return _load_ensemble(model_dir, cfg, source, options)
            backend_file = backend_model_file(cfg, name, options.backend_directory, source)
            first_file = backend_file or model_file(model_dir, versions[-1], cfg)
        except (ConfigError, ValueError) as e:  # a config.pbtxt that does not parse is Triton's INTERNAL
            raise InferenceError("INTERNAL" if getattr(e, "parse_error", False) else "INVALID_ARG", str(e)) from None
        python, env = options.stub_launch(cfg, model_dir.path)
        try:
            first = StubProcess(f"{name}_0_0", python=python, env=env, settings=options.stub,
                                on_call=options.on_call)
        except OSError as e:
            raise InferenceError("INTERNAL", f"failed to load '{name}': cannot start its stub: {e}") from None
        try:
            auto_completed = versions[-1]
            if options.auto_complete:
                cfg = _auto_complete(first, cfg, first_file, auto_completed, backend_file is not None, model_dir,
                                     source, options.init_timeout_s)
            fill_defaults(cfg, name, available_gpus=device_ids())
            validate_config(cfg, model_dir_name=name, source=source)
            versions = select_versions(cfg, model_dir.versions)
            if not versions:
                raise ConfigError(source, f"at least one version must be available under the version policy of "
                                          f"model '{name}'")
            specs = cls._instance_specs(name, model_dir, cfg, versions, options, python, env, backend_file)
            classes = read_output_classes(model_dir.path, cfg, source)
        except LabelFileError as e:
            first.close()
            raise VersionLoadError(name, versions[-1], str(e)) from None
        except (ConfigError, ValueError) as e:
            first.close()
            raise InferenceError("INVALID_ARG", str(e)) from None
        except (StubCallError, StubGoneError, TimeoutError, _core.CoreError) as e:  # auto_complete_config failed
            first.close()
            raise failed_version(name, auto_completed, first.instance_name, e) from None
        except BaseException:
            first.close()
            raise
        return cls._start(name, model_dir, cfg, specs, first, classes, options.response_cache, options.rate_limiter)

    @staticmethod
    def _instance_specs(name: str, model_dir: ModelDir, cfg: ModelConfig, versions: Sequence[int],
                        options: LoadOptions, python: str | None, env: dict[str, str],
                        backend_file: Path | None = None) -> list[InstanceSpec]:
        """`backend_file`: the model.py of the Python-based backend that serves every version."""
        config_dict = config_to_dict(cfg)
        specs = []
        for version in versions:
            file = str(backend_file or model_file(model_dir, version, cfg))
            for group in cfg.instance_group:
                for kind, device_id, index in instance_placements(group, model_dir):
                    specs.append(InstanceSpec(
                        model_name=name, version=version, instance_name=f"{group.name}_{index}", kind=kind,
                        device_id=device_id, model_file=file, model_dir=str(model_dir.path), config=config_dict,
                        python=python, env=env, init_timeout_s=options.init_timeout_s,
                        finalize_timeout_s=options.finalize_timeout_s, restart=options.restart,
                        on_call=options.on_call, stub=options.stub, python_based=backend_file is not None))
        return specs

    @classmethod
    def _start(cls, name: str, model_dir: ModelDir, cfg: ModelConfig, specs: list[InstanceSpec],
               first: StubProcess, classes: OutputClasses, cache: Any = None,
               limiter: RateLimiter | None = None) -> LoadedModel:
        """Starts every stub at once (their interpreters boot in parallel), then initializes them,
        then registers them with the server's rate limiter (which may refuse them, as Triton's)."""
        instances: list[ModelInstance] = []
        limits = None
        try:
            # The latest version's first instance reuses the stub that ran auto-complete.
            first_index = max(range(len(specs)), key=lambda i: (specs[i].version, -i))
            for i, spec in enumerate(specs):
                instances.append(ModelInstance(spec, first if i == first_index else None))
            first.instance_name = specs[first_index].instance_name
            with ThreadPoolExecutor(max_workers=min(16, len(instances))) as pool:
                errors = [f.exception() for f in [pool.submit(inst.initialize) for inst in instances]]
            failed = next((e for e in errors if e is not None), None)
            if failed is not None:
                raise failed
            if limiter is not None:
                limits = limiter.register(name, with_groups(cfg, model_dir, instances))
        except BaseException as e:
            for inst in instances:
                inst.stop()
            if not any(inst.process is first for inst in instances):
                first.close()
            if isinstance(e, InferenceError):
                raise
            raise load_error(specs[0], e) from e
        versions: dict[int, list[ModelInstance]] = {}
        for inst in instances:
            versions.setdefault(inst.spec.version, []).append(inst)
        log.info("successfully loaded '%s' version(s) %s with %d instance(s)", name,
                 ",".join(map(str, sorted(versions))), len(instances))
        return cls(name, model_dir, cfg, versions, classes=classes, cache=cache, limits=limits)

    # ---- serving ---------------------------------------------------------------------------------
    def instances(self) -> list[ModelInstance]:
        """Every instance of every version."""
        return [inst for group in self.versions.values() for inst in group]

    def ready(self, version: int | None = None) -> bool:
        """True when the version (default: every loaded one) has a READY instance."""
        groups = [self.versions.get(version, [])] if version is not None else list(self.versions.values())
        return bool(groups) and all(any(i.probe_ready() for i in g) for g in groups)

    def resolve_version(self, model_version: str | int) -> int:
        """The loaded version a request names ("" or -1: the latest)."""
        return resolve_version(self.name, self.versions, self.latest, model_version)

    def _route(self, inputs: Mapping[str, Any], outputs: Sequence[str | RegionDestination] | None, version: int,
               request_id: str) -> tuple[ModelInstance, list[tuple[str, Any, int]], list[str | RegionDestination]]:
        """Validates a request for a version without a queue, and gives its one instance."""
        tensors = self.checker.check_inputs(inputs, request_id)
        requested = self.checker.check_outputs(outputs, request_id)
        return self.versions[version][0], tensors, requested

    def _ticket(self, inputs: Mapping[str, Any], outputs: Sequence[str | RegionDestination] | None,
                parameters: str, request_id: str, correlation_id: int | str, flags: int, timeout_us: int | None,
                priority: int, begin: int) -> Ticket:
        """Validates a request for a version's queue."""
        tensors = self.checker.check_inputs(inputs, request_id)
        requested = self.checker.check_outputs(outputs, request_id)
        size = self._batch_size(tensors)
        if self.sequence:
            tensors = self._sequence_tensors(tensors, size, correlation_id, flags)
        return Ticket(tensors, requested, request_id, parameters, correlation_id, flags, timeout_us, size, priority,
                      begin)

    def _sequence_tensors(self, tensors: list[tuple[str, Any, int]], size: int, correlation_id: int | str,
                          flags: int) -> list[tuple[str, Any, int]]:
        """A sequence request's tensors and its control inputs; refuses a batch above 1 (Triton's
        words). Runs before routing: a request refused here opens no sequence."""
        if size > 1:
            raise InferenceError("INVALID_ARG", f"inference request to model '{self.name}' must specify batch-size 1 "
                                                "due to requirements of sequence batcher")
        return self.controls.add(tensors, correlation_id, flags) if self.controls is not None else tensors

    def _batch_size(self, tensors: list[tuple[str, Any, int]]) -> int:
        """A checked request's batch dimension (1 for a model that does not batch)."""
        return int(tensors[0][1].shape[0]) if self.config.max_batch_size > 0 and tensors else 1

    def _parameters(self, text: str, request_id: str) -> dict[str, Any]:
        """A response's parameters, which must be a JSON object."""
        if text == "{}":
            return {}
        try:
            parameters = json.loads(text)
        except ValueError:
            parameters = None
        if not isinstance(parameters, dict):
            raise InferenceError("INTERNAL", f"[request id: {request_id or '<id_unknown>'}] model "
                                             f"'{self.name}' sent response parameters that are not a JSON object")
        return parameters

    def _response(self, version: int, tensors: list[tuple[str, Any, int]], result: ExecuteResult,
                  begin: int, request_id: str, ticket: Ticket | None = None,
                  trace: RequestTrace | None = None) -> InferResponse:
        """Checks a response, records its statistics (and `trace`'s timestamps, from the same
        instants), and wraps it for the caller (`ticket`: the request came through a queue,
        and ran in a batch)."""
        outputs = self.checker.check_result(result.outputs, request_id)
        parameters = self._parameters(result.parameters, request_id)
        done = time.monotonic_ns()
        if ticket is None:
            batch = self._batch_size(tensors)
            self.stats.record_success(version, batch, begin, result.sent, result.exec_start, result.exec_end, done)
        else:
            self.stats.record_success(version, ticket.size, begin, ticket.compute_input_end(), result.exec_start,
                                      result.exec_end, done,
                                      execution=ticket.batch_size if ticket.first_in_batch else 0)
        if trace is not None:
            trace.executed(self.name, version, request_id, begin, result.sent, result.exec_start, result.exec_end,
                           done, None if ticket is None else (ticket.enqueued, ticket.dispatched))
        return InferResponse(outputs, parameters, version)

    def _infer(self, inputs: Mapping[str, Any], outputs: Sequence[str | RegionDestination] | None, model_version: str | int,
              parameters: str, request_id: str, timeout: float | None, correlation_id: int | str,
              flags: int, *, timeout_us: int | None = None, priority: int = 0) -> InferResponse:
        """Validates, routes to an instance (through the version's queue, if it has one), and
        returns the response."""
        if self.decoupled:
            raise self._unsupported_decoupled()
        begin = time.monotonic_ns()
        version: int | None = None
        stage: Ticket | str = OTHER  # where it is, for the reason of a failure
        tensors: list[tuple[str, Any, int]] | None = None
        try:
            version = self.resolve_version(model_version)
            scheduler = self.schedulers.get(version)
            if scheduler is not None:
                ticket = stage = self._ticket(inputs, outputs, parameters, request_id, correlation_id, flags,
                                              timeout_us, priority, begin)
                queued = scheduler.wait(ticket, timeout)
                return self._response(version, ticket.tensors, queued, begin, request_id,  # type: ignore[arg-type]
                                      ticket)
            instance, tensors, requested = self._route(inputs, outputs, version, request_id)
            stage = BACKEND
            result = instance.execute(tensors, requested, request_id, parameters, correlation_id, flags, timeout,
                                      timeout_us=timeout_us)
            return self._response(version, tensors, result, begin, request_id)
        except InferenceError as e:
            self._count_error(version, begin, stage, e, tensors)
            raise

    async def _infer_async(self, inputs: Mapping[str, Any], outputs: Sequence[str | RegionDestination] | None, model_version: str | int,
                          parameters: str, request_id: str, timeout: float | None, correlation_id: int | str,
                          flags: int, *, timeout_us: int | None = None, priority: int = 0,
                          trace: RequestTrace | None = None) -> InferResponse:
        """``infer`` for asyncio callers (no thread waits for the reply); `trace`: the request
        is traced (host/trace.py)."""
        if self.decoupled:
            raise self._unsupported_decoupled()
        begin = time.monotonic_ns()
        version: int | None = None
        stage: Ticket | str = OTHER  # where it is, for the reason of a failure
        tensors: list[tuple[str, Any, int]] | None = None
        try:
            version = self.resolve_version(model_version)
            scheduler = self.schedulers.get(version)
            if scheduler is not None:
                ticket = stage = self._ticket(inputs, outputs, parameters, request_id, correlation_id, flags,
                                              timeout_us, priority, begin)
                ticket.trace = trace
                queued = await scheduler.wait_async(ticket, timeout)
                return self._response(version, ticket.tensors, queued, begin, request_id,  # type: ignore[arg-type]
                                      ticket, trace)
            instance, tensors, requested = self._route(inputs, outputs, version, request_id)
            stage = BACKEND
            result = await instance.execute_async(tensors, requested, request_id, parameters, correlation_id, flags,
                                                  timeout, timeout_us=timeout_us, trace=trace)
            return self._response(version, tensors, result, begin, request_id, None, trace)
        except (InferenceError, asyncio.CancelledError) as e:
            self._count_error(version, begin, stage, e, tensors)
            raise

    def _submit(self, inputs: Mapping[str, Any], outputs: Sequence[str | RegionDestination] | None,
                model_version: str | int, parameters: str, request_id: str, correlation_id: int | str, flags: int, *,
                done: Callable[[InferResponse | InferenceError], None], linger: float = 0.0) -> bool:
        """Starts one request with no thread waiting for it: `done` gets its response or error,
        once, from the instance's completion thread or whoever settles it in the version's queue
        (or from this thread, when the answer comes within `linger` seconds: see
        StubProcess.submit). False, with nothing started, when the request needs a waiting
        thread: a sequence, a decoupled model, no READY instance (without a queue). Raises
        InferenceError for a request refused before it started."""
        if self.decoupled or self.sequence:
            return False
        begin = time.monotonic_ns()
        version: int | None = None
        stage: Ticket | str = OTHER  # where it is, for the reason of a failure
        try:
            version = self.resolve_version(model_version)
            scheduler = self.schedulers.get(version)
            if scheduler is not None:
                ticket = stage = self._ticket(inputs, outputs, parameters, request_id, correlation_id, flags, None, 0,
                                              begin)
                scheduler.start(ticket, functools.partial(self._submitted, version, ticket.tensors, begin, request_id,
                                                          done, ticket=ticket), linger)
                return True
            instance, tensors, requested = self._route(inputs, outputs, version, request_id)
            if instance.state is not InstanceState.READY:
                return False
        except InferenceError as e:
            self._count_error(version, begin, stage, e)
            raise
        answered = functools.partial(self._submitted, version, tensors, begin, request_id, done)
        try:
            instance.submit(tensors, requested, request_id, parameters, correlation_id, flags, answered, linger)
        except InferenceError as e:
            self._count_error(version, begin, BACKEND, e)
            raise
        return True

    def _submitted(self, version: int, tensors: list[tuple[str, Any, int]], begin: int, request_id: str,
                   done: Callable[[InferResponse | InferenceError], None],
                   outcome: ExecuteResult | InferenceError, ticket: Ticket | None = None) -> None:
        """A submitted request was answered (completion thread); `ticket`: through the queue."""
        try:
            if isinstance(outcome, InferenceError):
                raise outcome
            response: InferResponse | InferenceError = self._response(version, tensors, outcome, begin, request_id,
                                                                      ticket)
        except InferenceError as e:
            self._count_error(version, begin, ticket or BACKEND, e, tensors)
            response = e
        done(response)

    def _count_error(self, version: int | None, begin: int, stage: Ticket | str, error: BaseException,
                     tensors: Any = None) -> None:
        """Counts a request that ended with `error`: a failure, with its reason
        (``failure_reason``), or, for an error response the model answered with (AnsweredError),
        a success, as Triton 2.51 counts it (`tensors`: the checked inputs of a request sent
        without a queue, for its batch size). A request for an unknown version has no statistics
        to count in; one the model's checks refused counts (as in Triton)."""
        if stage == OTHER and isinstance(error, InferenceError):
            error.refused = True  # refused before it reached a queue or an instance (BLS words it so)
        if version is None:
            return
        if isinstance(error, AnsweredError):
            done = time.monotonic_ns()
            if isinstance(stage, Ticket):
                self.stats.record_success(version, stage.size, begin, stage.compute_input_end(), error.exec_start,
                                          error.exec_end, done,
                                          execution=stage.batch_size if stage.first_in_batch else 0)
            else:
                size = self._batch_size(tensors) if isinstance(tensors, list) else 1
                self.stats.record_success(version, size, begin, error.sent, error.exec_start, error.exec_end, done)
            return
        self.stats.record_failure(version, begin, time.monotonic_ns(), failure_reason(stage, error))

    # ---- streams ---------------------------------------------------------------------------------
    def _unsupported_decoupled(self) -> InferenceError:
        return InferenceError("UNSUPPORTED", f"model '{self.name}' uses the decoupled transaction policy: its "
                                             "responses can only be streamed")

    def _stream_response(self, version: int, item: StreamItem, request_id: str) -> InferResponse:
        """One streamed response for the caller (an error becomes the response's ``error``)."""
        if item.error is not None:
            return InferResponse({}, {}, version, final=item.final, error=item.error)
        if item.outputs is None:
            return InferResponse({}, {}, version, final=item.final, empty=True)
        try:
            outputs = self.checker.check_result(item.outputs, request_id)
            parameters = self._parameters(item.parameters, request_id)
        except InferenceError as e:
            return InferResponse({}, {}, version, final=item.final, error=e)
        return InferResponse(outputs, parameters, version, final=item.final)

    def _record_stream(self, version: int, tensors: list[tuple[str, Any, int]], begin: int, sent: int,
                       first: StreamItem | None, last: StreamItem | None, failed: bool, reason: str) -> None:
        now = time.monotonic_ns()
        if failed or first is None or last is None:
            self.stats.record_failure(version, begin, now, reason if failed else BACKEND)
            return
        batch = self._batch_size(tensors)
        self.stats.record_success(version, batch, begin, sent, first.exec_start, last.exec_end, now)

    def _stream(self, inputs: Mapping[str, Any], outputs: Sequence[str | RegionDestination] | None,
               model_version: str | int, parameters: str, request_id: str, timeout: float | None,
               correlation_id: int | str, flags: int, *, timeout_us: int | None = None,
               priority: int = 0) -> Generator[InferResponse, None, None]:
        """The responses of one request, as they come (a default-mode model gives one). Leaving
        the iteration early cancels the request."""
        if not self.decoupled:
            try:
                response = self.infer(inputs, outputs, model_version, parameters, request_id, timeout, correlation_id,
                                      flags, timeout_us=timeout_us, priority=priority)
            except AnsweredError as e:  # the model's one response is an error: a response, as a stream has it
                response = InferResponse({}, {}, self.resolve_version(model_version), final=True, error=e)
            yield response
            return
        begin = time.monotonic_ns()
        version = self.resolve_version(model_version)
        stage: Ticket | str = OTHER  # where it is, for the reason of a failure
        try:
            scheduler = self.schedulers.get(version)
            if scheduler is not None:
                ticket = stage = self._ticket(inputs, outputs, parameters, request_id, correlation_id, flags,
                                              timeout_us, priority, begin)
                tally = StreamTally(self, version, ticket.tensors, begin, request_id, timeout)
                stream: RequestStream = scheduler.wait(ticket, tally.remaining())  # type: ignore[assignment]
            else:
                instance, tensors, requested = self._route(inputs, outputs, version, request_id)
                tally = StreamTally(self, version, tensors, begin, request_id, timeout)
                stage = BACKEND
                stream = instance.open_stream(tensors, requested, request_id, parameters, correlation_id, flags,
                                              timeout_us)
        except InferenceError as e:
            self._count_error(version, begin, stage, e)
            raise
        try:
            while not tally.done:
                yield tally.take(stream.next(tally.remaining()))
        finally:
            tally.close(stream)

    async def _stream_async(self, inputs: Mapping[str, Any], outputs: Sequence[str | RegionDestination] | None,
                           model_version: str | int, parameters: str, request_id: str, timeout: float | None,
                           correlation_id: int | str, flags: int, *, timeout_us: int | None = None,
                           priority: int = 0, trace: RequestTrace | None = None) -> AsyncGenerator[InferResponse, None]:
        """``stream`` for asyncio callers; `trace`: the request is traced (host/trace.py)."""
        if not self.decoupled:
            try:
                response = await self.infer_async(inputs, outputs, model_version, parameters, request_id, timeout,
                                                  correlation_id, flags, timeout_us=timeout_us, priority=priority,
                                                  trace=trace)
            except AnsweredError as e:  # as in ``stream``
                response = InferResponse({}, {}, self.resolve_version(model_version), final=True, error=e)
            yield response
            return
        begin = time.monotonic_ns()
        version = self.resolve_version(model_version)
        stage: Ticket | str = OTHER  # where it is, for the reason of a failure
        try:
            scheduler = self.schedulers.get(version)
            if scheduler is not None:
                ticket = stage = self._ticket(inputs, outputs, parameters, request_id, correlation_id, flags,
                                              timeout_us, priority, begin)
                ticket.trace = trace
                tally = StreamTally(self, version, ticket.tensors, begin, request_id, timeout, trace)
                stream: RequestStream = await scheduler.wait_async(ticket, tally.remaining())  # type: ignore[assignment]
            else:
                instance, tensors, requested = self._route(inputs, outputs, version, request_id)
                tally = StreamTally(self, version, tensors, begin, request_id, timeout, trace)
                stage = BACKEND
                process = instance.process
                if instance.state is not InstanceState.READY:
                    process = await asyncio.get_running_loop().run_in_executor(None, instance._wait_ready, timeout)
                stream = instance.open_stream(tensors, requested, request_id, parameters, correlation_id, flags,
                                              timeout_us, process, trace)
        except (InferenceError, asyncio.CancelledError) as e:
            self._count_error(version, begin, stage, e)
            raise
        try:
            while not tally.done:
                yield tally.take(await stream.next_async(tally.remaining()))
        finally:
            tally.close(stream)

    def statistics(self, version: str | int = "") -> list[dict[str, Any]]:
        """Triton's ``model_stats`` entries: one per loaded version, or the one asked for."""
        versions = sorted(self.versions) if version in ("", None) else [self.resolve_version(version)]
        return self.stats.snapshot(self.name, versions)

    def pending(self, version: int) -> int:
        """Triton's pending request count of a version: requests it received that no instance
        runs yet. Read when asked, so that requests pay nothing for it: the requests in the
        version's queue, or (no queue) the Executes each stub holds beyond the one it runs."""
        scheduler = self.schedulers.get(version)
        if scheduler is not None:
            return scheduler.queued()
        return sum(max(len(inst.process.inflight) - 1, 0) for inst in self.versions.get(version, ()))

    def check_health(self) -> None:
        """One health-monitor pass over the instances."""
        for inst in self.instances():
            inst.check_health()
            inst.process.reap()
            inst.process.retry_cancels()  # after reap(), which frees records: their kept cancellations go
            if inst.process.overrun():
                inst.mark_hung()

    def stop(self) -> None:
        """Fails what still waits in the queues, then finalizes and stops every instance (in
        parallel)."""
        for scheduler in self.schedulers.values():
            scheduler.stop()
        # Plain threads, not an executor: this also runs from atexit, when executors refuse work.
        threads = [threading.Thread(target=inst.stop, name=f"stubhost-stop-{inst.name}") for inst in self.instances()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if self.limits is not None:  # after the last execution ended: what its instances held goes back
            self.limits.unregister()
