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

import atexit
import json
import logging
import math
import os
import signal
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from stubhost._core import CoreError
from stubhost.config.dtypes import config_dtype_to_triton
from stubhost.host.bls import BlsService
from stubhost.host.custom_metrics import CustomMetrics
from stubhost.host.errors import InferenceError
from stubhost.host.instance import RestartPolicy
from stubhost.host.model import LoadedModel, LoadOptions
from stubhost.host.repository import scan_repository
from stubhost.host.regions import RegionDestination
from stubhost.host.result import InferResponse

log = logging.getLogger("stubhost")

HEALTH_PERIOD_S = 0.05
SERVER_NAME = "stubhost"


class Server:
    """Hosts the models of a Triton model repository, each instance in its own stub process.

    ``models`` limits loading to those names. ``exit_on_error`` (Triton's default) makes a model
    that fails to load fail the constructor; otherwise it is logged and ``ready()`` stays False.
    ``restart`` controls automatic restarts of crashed or hung stubs. All methods are thread-safe.
    """

    def __init__(self, model_repository: str | os.PathLike[str], *, models: Iterable[str] | None = None,
                 exit_on_error: bool = True, python_executable: str | None = None,
                 env: Mapping[str, str] | None = None, auto_complete_config: bool = True,
                 restart: RestartPolicy | bool = True, init_timeout: float = 120.0,
                 finalize_timeout: float = 30.0) -> None:
        self.repository = Path(model_repository)
        policy = restart if isinstance(restart, RestartPolicy) else RestartPolicy(enabled=bool(restart))
        self._options = LoadOptions(python=python_executable, env=dict(env) if env is not None else None,
                                    auto_complete=auto_complete_config, init_timeout_s=init_timeout,
                                    finalize_timeout_s=finalize_timeout, restart=policy)
        self.custom_metrics = CustomMetrics()  # what models declare with pb_utils.MetricFamily
        self._bls = BlsService(self)
        self._options.on_call = self._bls.handler()
        # Whether models may load and unload models (pb_utils.load_model): `stubhost serve` turns
        # it off unless --model-control-mode is explicit, as Triton does.
        self.allow_model_control = True
        self._models: dict[str, LoadedModel] = {}
        self._expected: set[str] = set()
        self.load_errors: dict[str, str] = {}
        self._lock = threading.RLock()
        self._closed = threading.Event()
        _live_servers.add(self)
        _install_signal_handlers()
        self._monitor = threading.Thread(target=_watch, args=(weakref.ref(self), self._closed),
                                         name="stubhost-health", daemon=True)
        self._monitor.start()
        try:
            found = scan_repository(self.repository)
            names = list(found) if models is None else list(models)
            self._load_many(names, found, exit_on_error)
        except BaseException:
            self.close()
            raise

    # ---- context manager -------------------------------------------------------------------------
    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- model control ---------------------------------------------------------------------------
    def _load_many(self, names: Sequence[str], found: Mapping[str, Any], exit_on_error: bool) -> None:
        for name in names:
            if name not in found:
                raise InferenceError("NOT_FOUND", f"failed to load '{name}', failed to poll from model repository")
        self._expected.update(names)
        if not names:
            return
        with ThreadPoolExecutor(max_workers=min(8, len(names))) as pool:
            futures = {name: pool.submit(LoadedModel.load, found[name], self._options) for name in names}
        first_error: BaseException | None = None
        for name, future in futures.items():
            error = future.exception()
            if error is None:
                with self._lock:
                    self._models[name] = future.result()
                continue
            self.load_errors[name] = str(error)
            log.error("%s", error)
            first_error = first_error or error
        if first_error is not None and exit_on_error:
            raise first_error

    def load(self, name: str) -> None:
        """Loads (or reloads) a model from the repository; a reload swaps in the new one, then
        stops the old one, so requests in flight finish."""
        self._check_open()
        found = scan_repository(self.repository)
        if name not in found:
            raise InferenceError("NOT_FOUND", f"failed to load '{name}', failed to poll from model repository")
        try:
            model = LoadedModel.load(found[name], self._options)
        except InferenceError as e:
            self.load_errors[name] = e.message
            raise
        with self._lock:
            old = self._models.get(name)
            self._models[name] = model
            self._expected.add(name)
            self.load_errors.pop(name, None)
        if old is not None:
            old.stop()

    def unload(self, name: str) -> None:
        """Finalizes and stops a model."""
        with self._lock:
            model = self._models.pop(name, None)
            self._expected.discard(name)
            self.load_errors.pop(name, None)
        if model is None:
            raise InferenceError("NOT_FOUND", f"failed to unload '{name}': model is not loaded")
        model.stop()

    # ---- health and metadata ---------------------------------------------------------------------
    def _model(self, name: str) -> LoadedModel:
        model = self._models.get(name)
        if model is None:
            self._check_open()
            raise InferenceError("NOT_FOUND", f"Request for unknown model: '{name}' is not found")
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

        return {"name": name, "versions": [str(v) for v in sorted(model.versions)], "platform": "python",
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
                       flags: int = 0, priority: int = 0) -> InferResponse:
        """``infer``, returning the whole response: outputs, the model's response parameters and
        the version that answered."""
        model, params, timeout = self._prepare(name, inputs, outputs, parameters, timeout, correlation_id, flags)
        return model.infer(inputs, outputs, model_version, params, request_id, timeout, correlation_id, flags,
                           priority=priority)

    async def infer_response_async(self, name: str, inputs: Mapping[str, Any], *,
                                   outputs: Sequence[str | RegionDestination] | None = None,
                                   model_version: str | int = "",
                                   parameters: Mapping[str, Any] | None = None, request_id: str = "",
                                   timeout: float | None = None, correlation_id: int | str = 0,
                                   flags: int = 0, priority: int = 0,
                                   request_timeout_us: int | None = None) -> InferResponse:
        """``infer_response`` for asyncio callers. ``request_timeout_us`` (a client's request
        ``timeout`` parameter) is shown to the model as ``request.timeout()`` and, in a model
        whose queue policy allows it, bounds the request's wait in the queue: unlike ``timeout``
        it never ends a request that is executing nor marks the instance hung."""
        model, params, timeout = self._prepare(name, inputs, outputs, parameters, timeout, correlation_id, flags)
        return await model.infer_async(inputs, outputs, model_version, params, request_id, timeout,
                                       correlation_id, flags, timeout_us=request_timeout_us, priority=priority)

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
                               flags: int = 0, priority: int = 0,
                               request_timeout_us: int | None = None) -> AsyncGenerator[InferResponse, None]:
        """``stream_responses`` for asyncio callers."""
        model, params, timeout = self._prepare(name, inputs, outputs, parameters, timeout, correlation_id, flags)
        return model.stream_async(inputs, outputs, model_version, params, request_id, timeout, correlation_id, flags,
                                  timeout_us=request_timeout_us, priority=priority)

    def statistics(self, name: str = "", version: str | int = "") -> dict[str, Any]:
        """Triton's statistics-extension answer: ``{"model_stats": [...]}`` for one model (and
        version) or, with no name, for every loaded model."""
        if name:
            entries = self._model(name).statistics(version)
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
        if isinstance(correlation_id, bool) or not isinstance(correlation_id, (int, str)) or (
                isinstance(correlation_id, int) and not 0 <= correlation_id < 1 << 64):
            raise InferenceError("INVALID_ARG", f"correlation_id must be an unsigned 64-bit integer or a string, "
                                                f"got {correlation_id!r}")
        if not isinstance(flags, int) or not 0 <= flags < 1 << 32:
            raise InferenceError("INVALID_ARG", f"flags must be an unsigned 32-bit integer, got {flags!r}")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or math.isnan(timeout) or timeout <= 0:
                raise InferenceError("INVALID_ARG", f"timeout must be a positive number of seconds or None, "
                                                    f"got {timeout!r}")
            if math.isinf(timeout):
                timeout = None
        if outputs is not None and (isinstance(outputs, (str, bytes)) or not isinstance(outputs, Sequence)):
            raise InferenceError("INVALID_ARG", f"outputs must be a sequence of output names, got {outputs!r}")
        if not isinstance(inputs, Mapping):
            raise InferenceError("INVALID_ARG", f"inputs must map input names to arrays, got {type(inputs).__name__}")
        try:
            params = json.dumps(dict(parameters)) if parameters else "{}"
        except (TypeError, ValueError) as e:
            raise InferenceError("INVALID_ARG", f"parameters must be a JSON-serializable mapping: {e}") from None
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
        for model in models:
            model.stop()
        self._bls.close()
        if self._monitor is not threading.current_thread():
            self._monitor.join(timeout=1.0)
        _live_servers.discard(self)

    def __del__(self) -> None:
        if not getattr(self, "_closed", threading.Event()).is_set():
            log.warning("stubhost.Server was not closed; closing it now")
            self.close()


def _watch(server_ref: weakref.ref[Server], closed: threading.Event) -> None:
    """The health monitor; it holds the server weakly, so an unreferenced server can be collected."""
    while not closed.wait(HEALTH_PERIOD_S):
        server = server_ref()
        if server is None:
            return
        server._check_health()
        del server


# ---- process-wide clean-up -----------------------------------------------------------------------
_live_servers: weakref.WeakSet[Server] = weakref.WeakSet()
_handlers_installed = False


def close_all() -> None:
    """Closes every live Server (at exit and on SIGTERM)."""
    for server in list(_live_servers):
        server.close()


def _on_sigterm(signum: int, frame: Any) -> None:
    close_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_signal_handlers() -> None:
    """SIGTERM closes the servers, then terminates as before; SIGINT raises KeyboardInterrupt
    as usual, which leaves ``with`` blocks and so closes them."""
    global _handlers_installed
    if _handlers_installed or threading.current_thread() is not threading.main_thread():
        return
    _handlers_installed = True
    atexit.register(close_all)
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _on_sigterm)
