"""The in-process API: ``stubhost.Server``, what another Python server embeds.

    import stubhost

    with stubhost.Server(model_repository="examples/models") as server:   # loads every model
        out = server.infer("add_sub", {"INPUT0": a, "INPUT1": b})          # dict[str, np.ndarray]
        out = await server.infer_async("add_sub", {...})                   # the same, in asyncio
        server.model_ready("add_sub"); server.ready()
        server.load("identity"); server.unload("identity")
        server.metadata(); server.model_metadata("add_sub"); server.model_config("add_sub")

Outputs are zero-copy views of the stub's shared memory, freed when the last view goes away.
A failed call raises ``stubhost.InferenceError`` with ``.code`` (e.g. "INVALID_ARG").
"""

from __future__ import annotations

import json
import logging
import os
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stubhost._core import CoreError
from stubhost.config.dtypes import config_dtype_to_triton
from stubhost.host.bls import BlsService
from stubhost.host.call_args import check_call
from stubhost.host.custom_metrics import CustomMetrics
from stubhost.host.errors import InferenceError, UnknownModelError
from stubhost.host.load_history import LoadHistory
from stubhost.host.instance_spec import RestartPolicy
from stubhost.host.labels import OutputClasses
from stubhost.host.load_options import LoadOptions
from stubhost.host.python_based import DEFAULT_BACKEND_DIRECTORY
from stubhost.host.load_retry import load_model
from stubhost.host.rate_limiter import RateLimiter, Resources
from stubhost.host.model import LoadedModel
from stubhost.host.model_finder import ModelFinder
from stubhost.config import ModelConfig
from stubhost.host.repository import (
    ModelDir,
    ensemble_dependencies,
    fingerprint,
    override_directory,
    remove_override_directory,
    scan_repositories,
)
from stubhost.host.regions import RegionDestination
from stubhost.host.load_plan import ensemble_models, load_waves, override_config, with_dependencies
from stubhost.host.response_cache import ResponseCache
from stubhost.host.result import InferResponse
from stubhost.host.retirement import RetiringModels
from stubhost.host.server_threads import poll_repositories, track, untrack, watch
from stubhost.host.stub_process import StubSettings

if TYPE_CHECKING:  # the metrics layer's options; only read here (server -> host, never back)
    from stubhost.server.metrics_config import MetricsConfig

log = logging.getLogger("stubhost")

SERVER_NAME = "stubhost"


class Server:
    """Hosts the models of Triton model repositories, each instance in its own stub process.

    ``model_repository`` is one folder or a list of them (a model name may appear in only one).
    ``models`` limits loading to those names. ``exit_on_error`` (Triton's default) makes a model
    that fails to load fail the constructor; otherwise it is logged and ``ready()`` stays False.
    ``restart`` controls automatic restarts of crashed or hung stubs. ``poll_interval`` (seconds)
    turns on Triton's poll mode (see ``poll``); ``load_threads`` bounds how many models load at
    once; ``model_load_retry_count`` is how many more times a failed load is tried before it
    fails; ``stub_settings`` sizes each stub's shared memory; ``response_cache_bytes`` (None or 0:
    none) gives the server a response cache of that many bytes; ``metrics_config`` (a
    ``stubhost.server.metrics_config.MetricsConfig``, tritonserver's ``--metrics-config``) sets
    what ``render_metrics`` shows and whether latency summaries are kept; ``rate_limit`` and
    ``rate_limit_resources`` are tritonserver's ``--rate-limit`` and ``--rate-limit-resource``
    (rate_limiter.py). All methods are thread-safe.
    """

    def __init__(self, model_repository: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], *,
                 models: Iterable[str] | None = None, exit_on_error: bool = True,
                 python_executable: str | None = None, env: Mapping[str, str] | None = None,
                 auto_complete_config: bool = True, restart: RestartPolicy | bool = True,
                 init_timeout: float = 120.0, finalize_timeout: float = 30.0,
                 poll_interval: float | None = None, load_threads: int = 8,
                 stub_settings: StubSettings | None = None, response_cache_bytes: int | None = None,
                 model_load_retry_count: int = 0, metrics_config: MetricsConfig | None = None,
                 rate_limit: str = "off", rate_limit_resources: Resources = (),
                 backend_directory: str | os.PathLike[str] = DEFAULT_BACKEND_DIRECTORY) -> None:
        self.repositories = _paths(model_repository)
        self.repository = self.repositories[0]
        policy = restart if isinstance(restart, RestartPolicy) else RestartPolicy(enabled=bool(restart))
        self._options = LoadOptions(python=python_executable, env=dict(env) if env is not None else None,
                                    auto_complete=auto_complete_config, init_timeout_s=init_timeout,
                                    finalize_timeout_s=finalize_timeout, restart=policy,
                                    stub=stub_settings or StubSettings(),
                                    response_cache=ResponseCache.of(response_cache_bytes),
                                    load_retry_count=model_load_retry_count, backend_directory=str(backend_directory),
                                    rate_limiter=RateLimiter.create(rate_limit, rate_limit_resources),
                                    latency_summary=metrics_config.summary_factory() if metrics_config else None)
        self.metrics_config = metrics_config
        self.stub_settings = self._options.stub
        self.custom_metrics = CustomMetrics()  # what models declare with pb_utils.MetricFamily
        self._bls = BlsService(self)
        self._options.on_call = self._bls.handler()
        self._options.lookup = ModelFinder(self)
        # Whether models may load and unload models (pb_utils.load_model): `stubhost serve` turns
        # it off unless --model-control-mode is explicit, as Triton does.
        self.allow_model_control = True
        self._models: dict[str, LoadedModel] = {}
        self._retiring = RetiringModels(_stop)  # replaced by a reload, still finishing requests
        self._expected: set[str] = set()
        self.history = LoadHistory()  # failed loads and unloaded models (changed under self._lock)
        self.load_errors = self.history.errors  # model name -> its last load error
        # What each model was loaded from, as poll mode last saw it (None: an override load)
        self._fingerprints: dict[str, tuple[Any, ...] | None] = {}
        self._load_threads = max(1, int(load_threads))
        self._lock = threading.RLock()
        self._control_lock = threading.Lock()  # one load, unload or poll at a time
        self._closed = threading.Event()
        track(self)
        self._monitor = threading.Thread(target=watch, args=(weakref.ref(self), self._closed),
                                         name="stubhost-health", daemon=True)
        self._monitor.start()
        try:
            found, duplicates = self.scan()
            names = sorted({*found, *duplicates}) if models is None else with_dependencies(list(models), found)
            self._load_many(names, found, duplicates, exit_on_error)
        except BaseException:
            self.close()
            raise
        self._poller: threading.Thread | None = None
        if poll_interval is not None:
            if not poll_interval > 0:
                self.close()
                raise ValueError(f"poll_interval must be a positive number of seconds, got {poll_interval!r}")
            self._poller = threading.Thread(target=poll_repositories, args=(weakref.ref(self), self._closed, poll_interval),
                                            name="stubhost-poll", daemon=True)
            self._poller.start()

    # ---- context manager -------------------------------------------------------------------------
    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- model control ---------------------------------------------------------------------------
    def scan(self) -> tuple[dict[str, ModelDir], dict[str, str]]:
        """The models of every repository, and the names held by more than one (name -> error)."""
        return scan_repositories(self.repositories)

    def _load_many(self, names: Sequence[str], found: Mapping[str, ModelDir], duplicates: Mapping[str, str],
                   exit_on_error: bool) -> None:
        for name in names:
            if name not in found and name not in duplicates:
                raise InferenceError("NOT_FOUND", f"failed to load '{name}', failed to poll from model repository")
        self._expected.update(names)
        first_error: BaseException | None = None
        for name in names:
            if name in duplicates:
                first_error = first_error or InferenceError("INVALID_ARG", duplicates[name])
                self._record_load_error(name, duplicates[name], None)
        # Ensembles load after the models they run (and after ensembles they run).
        for wave in load_waves([name for name in names if name in found], found):
            with ThreadPoolExecutor(max_workers=min(self._load_threads, len(wave))) as pool:
                futures = {name: (pool.submit(fingerprint, found[name]),
                                  pool.submit(load_model, found[name], self._options)) for name in wave}
            for name, (seen, future) in futures.items():
                error = future.exception()
                if error is None:
                    with self._lock:
                        self._models[name] = future.result()
                        self._fingerprints[name] = seen.result()
                    continue
                self._record_load_error(name, error, seen.result())
                first_error = first_error or error
        if first_error is not None and exit_on_error:
            raise first_error

    def _record_load_error(self, name: str, error: BaseException | str, seen: tuple[Any, ...] | None,
                           expect: bool = False) -> None:
        """Logs a failed load and keeps what the repository index shows for it; with `expect`,
        the server is not ready until the model loads."""
        with self._lock:
            self.history.failed(name, error)
            self._fingerprints[name] = seen
            if expect:
                self._expected.add(name)

    def load(self, name: str, *, config: str | Mapping[str, Any] | None = None,
             files: Mapping[str, bytes] | None = None) -> None:
        """Loads (or reloads) a model; a reload swaps in the new one, then stops the old one, so
        requests in flight finish.

        ``config`` (the model configuration as JSON text or its dict) replaces the model's
        config.pbtxt; ``files`` (``{"file:1/model.py": b"..."}``, Triton's override parameters)
        replace its whole folder and need ``config``. A later load without them reloads from
        the repository.
        """
        self._check_open()
        override = override_config(name, config)
        if files and override is None:
            raise InferenceError("INVALID_ARG", f"failed to load '{name}': the 'config' parameter must be given "
                                                "with override files ('file:<version>/<path>')")
        with self._control_lock:
            if files:
                try:
                    model_dir = override_directory(name, files)
                except (ValueError, OSError) as e:
                    raise InferenceError("INVALID_ARG", f"failed to load '{name}': {e}") from None
                self._load_one(model_dir, override, None)
                return
            found, duplicates = self.scan()
            if name in duplicates:
                raise InferenceError("INVALID_ARG", duplicates[name])
            if name not in found:
                raise InferenceError("NOT_FOUND", f"failed to load '{name}', failed to poll from model repository")
            self._load_dependencies(name, override, found, set())
            self._load_one(found[name], override, fingerprint(found[name]))

    def _load_dependencies(self, name: str, config: ModelConfig | None, found: Mapping[str, ModelDir],
                           seen: set[str]) -> None:
        """Loads the models an ensemble runs that are not loaded yet, as Triton does when an
        ensemble is loaded (the caller holds the control lock)."""
        seen.add(name)
        for dependency in ensemble_dependencies(found[name], config) if name in found else []:
            if dependency in self._models or dependency in seen or dependency not in found:
                continue  # a missing one fails the ensemble's own load, with its name
            self._load_dependencies(dependency, None, found, seen)
            self._load_one(found[dependency], None, fingerprint(found[dependency]))

    def _load_one(self, model_dir: ModelDir, config: ModelConfig | None, seen: tuple[Any, ...] | None,
                  expect: bool = False) -> None:
        """Loads one model and swaps it in (the caller holds the control lock). A failed load
        leaves a loaded model serving; with `expect` (poll mode) it also keeps the server not
        ready, as a failure at start-up does."""
        name = model_dir.name
        try:
            model = load_model(model_dir, self._options, config, stopped=self._closed.is_set)
        except InferenceError as e:
            remove_override_directory(model_dir)
            self._record_load_error(name, e, seen, expect)
            raise
        with self._lock:
            # close() may have run while it loaded (a poll): then nothing may outlive the server.
            closed = self._closed.is_set()
            if not closed:
                old = self._models.get(name)
                self._models[name] = model
                self._expected.add(name)
            self.history.loaded(name)
            self._fingerprints[name] = seen if config is None else None
        if closed:
            _stop(model)
            raise InferenceError("UNAVAILABLE", "the server is closed")
        if old is not None:
            self._retiring.retire(old, model)

    def unload(self, name: str, *, unload_dependents: bool = False) -> None:
        """Finalizes and stops a model. With ``unload_dependents``, an ensemble's composing
        models (and theirs) are unloaded too, as Triton's unload parameter of that name does."""
        with self._control_lock:
            model = self._models.get(name)
            dependents = ensemble_models(model) if unload_dependents and model is not None else []
            self._unload(name)
            for dependent in dependents:
                if dependent in self._models:
                    self._unload(dependent)

    def _unload(self, name: str) -> None:
        """Unloads a model; one that is not loaded (or unknown) is no error, as in Triton."""
        with self._lock:
            model = self._models.pop(name, None)
            self._expected.discard(name)
            self.history.unloaded(name, list(model.versions) if model is not None else None)
            self._fingerprints.pop(name, None)
        if model is not None:
            _stop(model)

    def poll(self) -> None:
        """One look at the repositories, as Triton's poll mode takes: a new model loads, a model
        whose files changed reloads (its requests in flight finish on the old one), a removed
        model unloads. A model that fails to load is retried once its files change again."""
        if self._closed.is_set():
            return
        with self._control_lock:
            found, duplicates = self.scan()
            for name in [n for wave in load_waves(sorted(found), found) for n in wave]:
                if self._closed.is_set():
                    return
                seen = fingerprint(found[name])
                with self._lock:
                    known = name in self._fingerprints and self._fingerprints[name] == seen
                if known:
                    continue
                log.info("loading '%s' (%s)", name, "changed" if name in self._fingerprints else "new")
                try:
                    self._load_one(found[name], None, seen, expect=True)
                except InferenceError:
                    pass  # logged, and shown by the repository index
            for name, error in duplicates.items():
                if self.load_errors.get(name) != error:
                    self._record_load_error(name, error, None, expect=True)
            for name in sorted(set(self._models) | set(self.load_errors)):
                if name in found or name in duplicates:
                    continue
                log.info("unloading '%s': it is no longer in the model repository", name)
                with self._lock:
                    self.history.forget(name)
                    self._expected.discard(name)
                    self._fingerprints.pop(name, None)
                if name in self._models:
                    self._unload(name)

    # ---- health and metadata ---------------------------------------------------------------------
    def _model(self, name: str) -> LoadedModel:
        model = self._models.get(name)
        if model is None:
            self._check_open()
            raise UnknownModelError(name, known=self.history.known(name))
        return model

    def model_ready(self, name: str, version: str | int = "") -> bool:
        """True when the model (version) is loaded and has a READY instance."""
        model = self._models.get(name)
        if model is None or self._closed.is_set():
            return False
        try:
            return model.ready(model.resolve_version(version))
        except InferenceError:
            return False

    def ready(self) -> bool:
        """True when every model that should be loaded is loaded and ready."""
        if self._closed.is_set():
            return False
        with self._lock:
            return all(name in self._models and self._models[name].ready() for name in self._expected)

    def forget_region(self, region_id: int) -> None:
        """Tells every stub to drop its mapping of a client region (the client unregistered it);
        requests already queued still read it."""
        for model in list(self._models.values()):
            for instance in model.instances():
                try:
                    instance.process.unmap_region(region_id)
                except (TimeoutError, CoreError) as e:
                    log.warning("instance '%s' could not be told to unmap a client region: %s", instance.name, e)

    @property
    def closed(self) -> bool:
        """True once ``close()`` has begun."""
        return self._closed.is_set()

    def models(self) -> list[str]:
        """Names of the loaded models."""
        return sorted(self._models)

    def loaded(self) -> list[Any]:
        """The loaded models themselves (LoadedModel or EnsembleModel), by name: what the
        metrics endpoint reads its figures from."""
        models = dict(self._models)
        return [models[name] for name in sorted(models)]

    def metadata(self) -> dict[str, Any]:
        """Server metadata in the KServe v2 shape."""
        from stubhost import __version__
        return {"name": SERVER_NAME, "version": __version__, "extensions": []}

    def model_metadata(self, name: str, version: str | int = "") -> dict[str, Any]:
        """Model metadata in the KServe v2 shape (batch dimension shown as -1)."""
        model = self._model(name)
        model.resolve_version(version)
        batch = [-1] if model.config.max_batch_size > 0 else []

        def tensors(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{"name": e["name"], "datatype": config_dtype_to_triton(e["data_type"]),
                     "shape": batch + [int(d) for d in e.get("dims", [])]} for e in entries]

        return {"name": name, "versions": [str(v) for v in sorted(model.versions)], "platform": model.config.platform or "python",
                "inputs": tensors(model.config_dict.get("input", [])),
                "outputs": tensors(model.config_dict.get("output", []))}

    def model_config(self, name: str, version: str | int = "") -> dict[str, Any]:
        """The model's complete configuration, as Triton's model-config endpoint returns it."""
        model = self._model(name)
        model.resolve_version(version)
        return json.loads(json.dumps(model.config_dict))  # a copy the caller may change

    # ---- inference -------------------------------------------------------------------------------
    def infer(self, name: str, inputs: Mapping[str, Any], *, outputs: Sequence[str] | None = None,
              model_version: str | int = "", parameters: Mapping[str, Any] | None = None, request_id: str = "",
              timeout: float | None = None, correlation_id: int | str = 0, flags: int = 0,
              priority: int = 0) -> dict[str, np.ndarray]:
        """Runs one request and returns its outputs by name (BYTES as object arrays of bytes).

        ``timeout`` (seconds) bounds the wait; a request still running then fails with UNAVAILABLE
        and its instance, now considered hung, is replaced. ``priority`` picks the request's
        level in a model whose ``dynamic_batching`` has ``priority_levels`` (0: the default level).
        """
        model, params, timeout = self._prepare(name, inputs, outputs, parameters, timeout, correlation_id, flags)
        return model.infer(inputs, outputs, model_version, params, request_id, timeout, correlation_id,
                           flags, priority=priority).outputs

    async def infer_async(self, name: str, inputs: Mapping[str, Any], *, outputs: Sequence[str] | None = None,
                          model_version: str | int = "", parameters: Mapping[str, Any] | None = None,
                          request_id: str = "", timeout: float | None = None, correlation_id: int | str = 0,
                          flags: int = 0, priority: int = 0) -> dict[str, np.ndarray]:
        """``infer`` for asyncio callers: no thread waits for the reply (each stub's completion
        thread wakes the event loop), so thousands of requests may be awaited at once."""
        model, params, timeout = self._prepare(name, inputs, outputs, parameters, timeout, correlation_id, flags)
        response = await model.infer_async(inputs, outputs, model_version, params, request_id, timeout,
                                           correlation_id, flags, priority=priority)
        return response.outputs

    def infer_response(self, name: str, inputs: Mapping[str, Any], *,
                       outputs: Sequence[str | RegionDestination] | None = None, model_version: str | int = "", parameters: Mapping[str, Any] | None = None,
                       request_id: str = "", timeout: float | None = None, correlation_id: int | str = 0,
                       flags: int = 0, priority: int = 0, request_timeout_us: int | None = None) -> InferResponse:
        """``infer``, returning the whole response: outputs, the model's response parameters and
        the version that answered. ``request_timeout_us``: as for ``infer_response_async``."""
        model, params, timeout = self._prepare(name, inputs, outputs, parameters, timeout, correlation_id, flags)
        return model.infer(inputs, outputs, model_version, params, request_id, timeout, correlation_id, flags,
                           priority=priority, timeout_us=request_timeout_us)

    async def infer_response_async(self, name: str, inputs: Mapping[str, Any], *,
                                   outputs: Sequence[str | RegionDestination] | None = None,
                                   model_version: str | int = "",
                                   parameters: Mapping[str, Any] | None = None, request_id: str = "",
                                   timeout: float | None = None, correlation_id: int | str = 0,
                                   flags: int = 0, priority: int = 0,
                                   request_timeout_us: int | None = None, trace: Any = None) -> InferResponse:
        """``infer_response`` for asyncio callers. ``request_timeout_us`` (a client's request
        ``timeout`` parameter) is shown to the model as ``request.timeout()`` and, in a model
        whose queue policy allows it, bounds the request's wait in the queue (a sequence model's:
        its sequence's wait in the backlog): unlike ``timeout``
        it never ends a request that is executing nor marks the instance hung. ``trace`` (a
        host.trace.RequestTrace, or None) gets the request's timestamps."""
        model, params, timeout = self._prepare(name, inputs, outputs, parameters, timeout, correlation_id, flags)
        return await model.infer_async(inputs, outputs, model_version, params, request_id, timeout, correlation_id,
                                       flags, timeout_us=request_timeout_us, priority=priority, trace=trace)

    def submit_response(self, name: str, inputs: Mapping[str, Any], *, done: Callable[[InferResponse | InferenceError], None],
                        outputs: Sequence[str] | None = None, model_version: str | int = "",
                        parameters: Mapping[str, Any] | None = None, request_id: str = "",
                        correlation_id: int | str = 0, flags: int = 0, linger: float = 0.0) -> bool:
        """Starts ``infer_response`` with no thread waiting: `done` gets the response or error from
        the instance's completion thread, or from this thread before returning when it comes
        within `linger` seconds (a queued request: from whoever settles it). False, with nothing
        started, when the request needs a waiting thread (an ensemble, a sequence, a decoupled
        model...): call ``infer_response`` then."""
        model, params, _ = self._prepare(name, inputs, outputs, parameters, None, correlation_id, flags)
        return isinstance(model, LoadedModel) and model.submit(inputs, outputs, model_version, params, request_id,
                                                                correlation_id, flags, done=done, linger=linger)

    def output_classes(self, name: str) -> OutputClasses:
        """What classifying the model's outputs needs: its batching and its outputs' labels."""
        return self._model(name).classes

    def is_decoupled(self, name: str) -> bool:
        """True when the model uses the decoupled transaction policy (its responses are streamed)."""
        return self._model(name).decoupled

    def stream(self, name: str, inputs: Mapping[str, Any], *, outputs: Sequence[str] | None = None,
               model_version: str | int = "", parameters: Mapping[str, Any] | None = None, request_id: str = "",
               timeout: float | None = None, correlation_id: int | str = 0,
               flags: int = 0, priority: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """Runs one request and yields the outputs of each response as it comes: any number
        from a decoupled model, one from a default-mode model. An error response raises
        InferenceError. Closing the iterator early cancels the request (the model sees
        ``request.is_cancelled()``). ``timeout`` bounds the whole stream."""
        for response in self.stream_responses(name, inputs, outputs=outputs, model_version=model_version,
                                              parameters=parameters, request_id=request_id, timeout=timeout,
                                              correlation_id=correlation_id, flags=flags, priority=priority):
            if response.error is not None:
                raise response.error
            if not response.empty:
                yield response.outputs

    async def stream_async(self, name: str, inputs: Mapping[str, Any], *, outputs: Sequence[str] | None = None,
                           model_version: str | int = "", parameters: Mapping[str, Any] | None = None,
                           request_id: str = "", timeout: float | None = None, correlation_id: int | str = 0,
                           flags: int = 0, priority: int = 0) -> AsyncIterator[dict[str, np.ndarray]]:
        """``stream`` for asyncio callers; ``aclose()`` (or leaving ``async for``) cancels."""
        responses = self.stream_responses_async(name, inputs, outputs=outputs, model_version=model_version,
                                                parameters=parameters, request_id=request_id, timeout=timeout,
                                                correlation_id=correlation_id, flags=flags, priority=priority)
        try:
            async for response in responses:
                if response.error is not None:
                    raise response.error
                if not response.empty:
                    yield response.outputs
        finally:
            await responses.aclose()

    def stream_responses(self, name: str, inputs: Mapping[str, Any], *,
                         outputs: Sequence[str | RegionDestination] | None = None, model_version: str | int = "",
                         parameters: Mapping[str, Any] | None = None, request_id: str = "",
                         timeout: float | None = None, correlation_id: int | str = 0, flags: int = 0,
                         priority: int = 0,
                         request_timeout_us: int | None = None) -> Generator[InferResponse, None, None]:
        """``stream``, yielding whole responses: errors are responses with ``error`` set (a
        decoupled model may go on after one), and a final flag sent without a response is an
        ``empty`` response."""
        model, params, timeout = self._prepare(name, inputs, outputs, parameters, timeout, correlation_id, flags)
        return model.stream(inputs, outputs, model_version, params, request_id, timeout, correlation_id, flags,
                            timeout_us=request_timeout_us, priority=priority)

    def stream_responses_async(self, name: str, inputs: Mapping[str, Any], *,
                               outputs: Sequence[str | RegionDestination] | None = None,
                               model_version: str | int = "", parameters: Mapping[str, Any] | None = None,
                               request_id: str = "", timeout: float | None = None, correlation_id: int | str = 0,
                               flags: int = 0, priority: int = 0, request_timeout_us: int | None = None,
                               trace: Any = None) -> AsyncGenerator[InferResponse, None]:
        """``stream_responses`` for asyncio callers (``trace``: as ``infer_response_async``)."""
        model, params, timeout = self._prepare(name, inputs, outputs, parameters, timeout, correlation_id, flags)
        return model.stream_async(inputs, outputs, model_version, params, request_id, timeout, correlation_id, flags,
                                  timeout_us=request_timeout_us, priority=priority, trace=trace)

    def statistics(self, name: str = "", version: str | int = "") -> dict[str, Any]:
        """Triton's statistics-extension answer: ``{"model_stats": [...]}`` for one model (and
        version) or, with no name, for every loaded model."""
        if name:
            model = self._models.get(name)
            if model is None:
                self._check_open()
                raise InferenceError("INVALID_ARG", f"requested model '{name}' is not available")
            entries = model.statistics(version)
        else:
            entries = [e for model in list(self._models.values()) for e in model.statistics()]
        return {"model_stats": entries}

    def _prepare(self, name: str, inputs: Mapping[str, Any], outputs: Sequence[str | RegionDestination] | None,
                 parameters: Mapping[str, Any] | None, timeout: float | None, correlation_id: int | str,
                 flags: int) -> tuple[LoadedModel, str, float | None]:
        """Checks the arguments every request shares; returns the model, parameters JSON, timeout."""
        model = self._models.get(name)
        if model is None:
            model = self._model(name)
        params, timeout = check_call(inputs, outputs, parameters, timeout, correlation_id, flags)
        return model, params, timeout

    # ---- lifecycle -------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed.is_set():
            raise InferenceError("UNAVAILABLE", "the server is closed")

    def _check_health(self) -> None:
        for model in list(self._models.values()):
            model.check_health()

    def close(self) -> None:
        """Finalizes every model, stops every stub and removes every shared-memory segment."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            models, self._models = list(self._models.values()), {}
        self._retiring.stop_all()
        for model in models:
            _stop(model)
        self._bls.close()
        if self._monitor is not threading.current_thread():
            self._monitor.join(timeout=1.0)
        poller = getattr(self, "_poller", None)
        if poller is not None and poller is not threading.current_thread():
            # A poll may be loading a model: it stops what it loaded once it sees the close.
            poller.join(timeout=self._options.init_timeout_s + 5.0)
        self._options.envs.close()  # after the stubs that ran in its environments
        untrack(self)

    def __del__(self) -> None:
        closed = getattr(self, "_closed", None)  # None: __init__ failed before it was made
        if closed is not None and not closed.is_set():
            log.warning("stubhost.Server was not closed; closing it now")
            self.close()


def _paths(repositories: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    if isinstance(repositories, (str, os.PathLike)):
        return [Path(repositories)]
    paths = [Path(p) for p in repositories]
    if not paths:
        raise ValueError("at least one model repository is needed")
    return paths


def _stop(model: LoadedModel) -> None:
    """Stops a model, then removes the folder its override files were written to, if any."""
    model.stop()
    remove_override_directory(model.model_dir)
