"""The KServe v2 operations, wire-neutral: what the HTTP and gRPC front ends both call.

An :class:`InferenceService` joins one :class:`stubhost.Server` (the models) and one
:class:`SharedMemoryRegistry` (the clients' regions). The front ends decode a request into
:mod:`stubhost.server.types` values, call a method here, and encode what it returns; errors are
:class:`InferenceError` with a Triton code name, which each front end maps to its own status.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import AsyncGenerator, Mapping
from typing import Any, NamedTuple

import numpy as np

from stubhost import _core, logs
from stubhost.gpu import cuda
from stubhost.host.errors import InferenceError
from stubhost.host.repository import FILE_PARAMETER_PREFIX
from stubhost.host.server import Server
from stubhost.host.trace import RequestTrace
from stubhost.host.regions import ClientRegion, RegionDestination, RegionOutput, RegionTensor
from stubhost.server.classification import classify
from stubhost.server.shm_registry import CudaRegion, RegionLease, SharedMemoryRegistry, SystemRegion
from stubhost.server.trace_settings import TraceManager, grpc_changes, http_changes
from stubhost.server.trace_tensors import trace_inputs, trace_outputs
from stubhost.server.types import InferRequest, InferResult, InputTensor, OutputTensor, RequestedOutput
from stubhost.protocol import output_too_large
from stubhost.tensor import numpy_to_triton_dtype, triton_to_numpy_dtype

# What the server metadata lists: only extensions that work end to end.
EXTENSIONS = ["classification", "binary_tensor_data", "model_repository", "model_repository(unload_dependents)", "statistics",
              "trace", "system_shared_memory",
              "cuda_shared_memory", "parameters", "logging"]

MAX_TENSORS = 1024  # default limit on inputs, and on requested outputs, of one request

# Request parameters that steer the server (as in Triton) rather than reach the model.
_SEQUENCE_ID = "sequence_id"
_SEQUENCE_START = "sequence_start"
_SEQUENCE_END = "sequence_end"
_PRIORITY = "priority"
_TIMEOUT = "timeout"
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"  # gRPC streams: send the final flag alone too
_RESERVED = {_SEQUENCE_ID, _SEQUENCE_START, _SEQUENCE_END, _PRIORITY, _TIMEOUT, "binary_data_output",
             EMPTY_FINAL_RESPONSE}
_FLAG_START = 1
_FLAG_END = 2


def _request_controls(request: InferRequest) -> tuple[dict[str, Any], int | str, int, int | None, int]:
    """Splits the request parameters into (model parameters, correlation id, flags, timeout µs,
    priority).

    The timeout is only shown to the model (``request.timeout()``): as in Triton, a client's
    request timeout never ends a request that is already executing.
    """
    params = request.parameters
    if not params:
        return dict(request.forwarded), 0, 0, None, 0
    correlation = params.get(_SEQUENCE_ID, 0)
    if isinstance(correlation, bool) or not isinstance(correlation, (int, str)):
        raise InferenceError("INVALID_ARG", f"parameter '{_SEQUENCE_ID}' must be an integer or a string")
    flags = 0
    for key, bit in ((_SEQUENCE_START, _FLAG_START), (_SEQUENCE_END, _FLAG_END)):
        value = params.get(key, False)
        if not isinstance(value, bool):
            raise InferenceError("INVALID_ARG", f"parameter '{key}' must be a boolean")
        flags |= bit if value else 0
    timeout = None
    timeout_us = params.get(_TIMEOUT)
    if timeout_us is not None:
        if isinstance(timeout_us, bool) or not isinstance(timeout_us, int) or timeout_us < 0:
            raise InferenceError("INVALID_ARG", f"parameter '{_TIMEOUT}' must be a non-negative integer of "
                                                "microseconds")
        timeout = timeout_us or None
    priority = params.get(_PRIORITY, 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
        raise InferenceError("INVALID_ARG", f"parameter '{_PRIORITY}' must be a non-negative integer")
    model_params = {k: v for k, v in params.items() if k not in _RESERVED}
    model_params.update(request.forwarded)  # after the controls: a forwarded header steers nothing
    return model_params, correlation, flags, timeout, priority


def _client_region(region: SystemRegion | CudaRegion) -> ClientRegion:
    """A registered region as the stubs are told of it."""
    if isinstance(region, CudaRegion):
        return ClientRegion(region.id, "", 0, region.byte_size, kind="cuda", raw_handle=region.raw_handle,
                            device_id=region.device_id)
    return ClientRegion(region.id, region.key, region.offset, region.byte_size)


class StreamEvent(NamedTuple):
    """One response of a streamed request: a result, or an error, or (both None) only the final
    flag; ``final`` says whether it is the request's last."""

    result: InferResult | None
    error: InferenceError | None
    final: bool


def _native_datatypes() -> dict[np.dtype, str]:
    """KServe datatype name of each native-order numpy dtype that has one."""
    names: dict[np.dtype, str] = {}
    for member in _core.DataType.__members__.values():
        try:
            dtype = triton_to_numpy_dtype(member)
        except (TypeError, KeyError):
            continue
        if numpy_to_triton_dtype(dtype) == member:
            names[dtype] = _core.dtype_name(member)
    return names


_NATIVE_DATATYPES = _native_datatypes()


def _datatype(array: np.ndarray) -> str:
    """An output's KServe datatype name; a table lookup for the native types models return."""
    name = _NATIVE_DATATYPES.get(array.dtype)
    return name if name is not None else _core.dtype_name(numpy_to_triton_dtype(array.dtype))


def load_overrides(name: str, parameters: Mapping[str, Any]) -> tuple[str | None, dict[str, bytes] | None]:
    """Splits a load request's parameters into the overriding config and the override files."""
    config: str | None = None
    files: dict[str, bytes] = {}
    for key, value in parameters.items():
        if key == "config":
            if not isinstance(value, str):
                raise InferenceError("INVALID_ARG", f"failed to load '{name}': the 'config' parameter must be a "
                                                    "string holding the model configuration as JSON")
            config = value
        elif key.startswith(FILE_PARAMETER_PREFIX):
            if not isinstance(value, bytes):
                raise InferenceError("INVALID_ARG", f"failed to load '{name}': the '{key}' parameter must hold "
                                                    "the file's bytes")
            files[key] = value
        else:
            raise InferenceError("INVALID_ARG", f"failed to load '{name}': unrecognized load parameter '{key}' "
                                                "(expected 'config' or 'file:<version>/<path>')")
    return config, files or None


class InferenceService:
    """KServe v2 health, metadata, inference, repository, statistics and shared-memory calls."""

    def __init__(self, server: Server, registry: SharedMemoryRegistry | None = None, *,
                 model_control: bool = False, max_tensors: int = MAX_TENSORS, strict_readiness: bool = True,
                 tracer: TraceManager | None = None, server_id: str = "") -> None:
        self.server = server
        self.server_id = server_id  # the name in the server metadata (tritonserver's --id); "": the default
        self.tracer = tracer if tracer is not None else TraceManager()  # trace settings; samples requests
        self.strict_readiness = strict_readiness  # False: ready whenever live (tritonserver's flag)
        self.registry = registry if registry is not None else SharedMemoryRegistry(
            cuda_opener=cuda.cuda_opener(), on_unregister=lambda region: server.forget_region(region.id),
            reserved_prefixes=[f"{server.stub_settings.prefix}_"])  # clients may not map the stubs' pools
        self.model_control = model_control  # explicit mode: clients may load and unload models
        self.max_tensors = max_tensors      # inputs, and requested outputs, per request
        self.inflight = 0                   # inference requests running now (for a graceful stop)

    # ---- health and metadata ---------------------------------------------------------------------
    def live(self) -> bool:
        """True while the server is open."""
        return not self.server.closed

    def ready(self) -> bool:
        """True when every model that should be loaded is ready (with strict readiness off:
        whenever the server is live)."""
        return self.server.ready() if self.strict_readiness else self.live()

    def metadata(self) -> dict[str, Any]:
        """Server metadata: name, version and the extensions that work."""
        meta = self.server.metadata()
        meta["name"] = self.server_id or meta["name"]
        # Like a Triton built without GPU support, no CUDA shared memory where no GPU is usable.
        meta["extensions"] = [e for e in EXTENSIONS if e != "cuda_shared_memory" or self.registry.cuda_supported]
        return meta

    def model_ready(self, name: str, version: str = "") -> bool:
        """True when the model (version) can serve."""
        return self.server.model_ready(name, version)

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        """KServe v2 model metadata."""
        return self.server.model_metadata(name, version)

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        """The model configuration in Triton's JSON form."""
        return self.server.model_config(name, version)

    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics extension answer."""
        return self.server.statistics(name, version)

    def log_settings(self, changes: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Triton's logging extension (both front ends): applies `changes` (setting name -> new
        value; None leaves a setting as it is) all or none, and answers every setting in force.
        Raises InferenceError with Triton's words for a bad name or value."""
        if changes:
            try:
                logs.update_settings(changes)
            except logs.LogSettingsError as e:
                raise InferenceError(e.code, e.message) from None
        return logs.current_settings().as_dict()

    def trace_settings(self, model_name: str = "", request: Any = None, *, grpc: bool = False) -> dict[str, Any]:
        """Triton's trace extension (both front ends): applies the settings a client sent
        (`request`: the HTTP JSON body, or gRPC's name -> values; None: only read) to the global
        settings or, with a name, to a ready model's, and answers the settings in force."""
        if model_name and not self.server.model_ready(model_name):
            raise InferenceError("INVALID_ARG", f"Request for unknown model : {model_name}")
        if request is not None:
            self.tracer.update(model_name, grpc_changes(request) if grpc else http_changes(request))
        return self.tracer.settings(model_name)

    # ---- model repository ------------------------------------------------------------------------
    def repository_index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Every model of the repository with its state, as Triton's repository index lists them."""
        loaded = set(self.server.models())
        entries: list[dict[str, Any]] = []
        found, duplicates = self.server.scan()
        for name in sorted({*found, *duplicates} | loaded):
            if name in loaded:
                metadata = self.server.model_metadata(name)
                for version in metadata["versions"]:
                    ready = self.server.model_ready(name, version)
                    if ready or not ready_only:
                        entries.append({"name": name, "version": version,
                                        "state": "READY" if ready else "UNAVAILABLE",
                                        **({} if ready else {"reason": "not ready"})})
            elif not ready_only:
                entries.extend(self.server.history.index_entries(name))
        return entries

    def _check_model_control(self) -> None:
        if not self.model_control:
            raise InferenceError("UNAVAILABLE", "explicit model load / unload is not allowed if polling is enabled")

    async def load(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        """Loads (or reloads) a model, in explicit model-control mode; loading runs off the loop.

        ``parameters`` are the load request's: "config" (the model configuration as JSON text)
        and "file:<version>/<path>" override files (bytes), as Triton's model-repository
        extension defines them.
        """
        self._check_model_control()
        config, files = load_overrides(name, parameters or {})
        await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self.server.load, name, config=config, files=files))

    async def unload(self, name: str, parameters: Mapping[str, Any] | None = None) -> None:
        """Unloads a model, in explicit model-control mode; other models' requests are untouched.
        The "unload_dependents" parameter also unloads an ensemble's composing models."""
        self._check_model_control()
        dependents = (parameters or {}).get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise InferenceError("INVALID_ARG", "the 'unload_dependents' parameter must be a boolean")
        await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(self.server.unload, name, unload_dependents=dependents))

    # ---- inference -------------------------------------------------------------------------------
    async def infer(self, request: InferRequest, *, endpoint: str = "HTTP end point",
                    trace: RequestTrace | None = None) -> InferResult:
        """Runs one decoded request: inputs in client regions are read in place, outputs bound
        for client regions are copied there once. A decoupled model is refused, in Triton's
        words naming the `endpoint`: its responses can only be streamed. `trace`: the front end
        sampled the request (host/trace.py)."""
        if self.server.is_decoupled(request.model_name):
            raise InferenceError("UNSUPPORTED", f"{endpoint} doesn't support models with decoupled transaction "
                                                "policy")
        self._check_request(request)
        leases: list[RegionLease] = []
        self.inflight += 1
        try:
            response = await self.server.infer_response_async(request.model_name, **self._call(request, leases, trace))
            if trace is not None:
                trace.timestamp("INFER_RESPONSE_COMPLETE")  # the front end has the response
                trace_outputs(trace, response.outputs)
            outputs = self._outputs(request, response.outputs, leases)
            return InferResult(request.model_name, str(response.model_version), request.id,
                               response.parameters, outputs)
        finally:
            self.inflight -= 1
            for lease in leases:
                lease.release()

    async def infer_stream(self, request: InferRequest,
                           trace: RequestTrace | None = None) -> AsyncGenerator[StreamEvent, None]:
        """Runs one decoded request and yields its responses as they come: any number from a
        decoupled model, one from a default-mode model. Errors the model sends are events (a
        decoupled model may go on after one); a failure before the model runs raises. Closing
        the iterator early cancels the request. `trace`: as ``infer``."""
        self._check_request(request)
        leases: list[RegionLease] = []
        self.inflight += 1
        try:
            responses = self.server.stream_responses_async(request.model_name, **self._call(request, leases, trace))
            try:
                async for response in responses:
                    if trace is not None and (response.error is not None or not response.empty):
                        trace.timestamp("INFER_RESPONSE_COMPLETE")  # each response the front end gets
                    if response.error is not None:
                        yield StreamEvent(None, response.error, response.final)
                    elif response.empty:
                        yield StreamEvent(None, None, response.final)
                    else:
                        if trace is not None:
                            trace_outputs(trace, response.outputs)
                        try:
                            outputs = self._outputs(request, response.outputs, leases)
                        except InferenceError as e:
                            yield StreamEvent(None, e, response.final)
                            continue
                        yield StreamEvent(InferResult(request.model_name, str(response.model_version), request.id,
                                                      response.parameters, outputs), None, response.final)
            finally:
                await responses.aclose()
        finally:
            self.inflight -= 1
            for lease in leases:
                lease.release()

    def _call(self, request: InferRequest, leases: list[RegionLease],
              trace: RequestTrace | None = None) -> dict[str, Any]:
        """The keyword arguments of the in-process call that runs `request` (regions it uses
        are leased into `leases`; a traced request's inputs are traced here)."""
        inputs = self._inputs(request, leases)
        params, correlation, flags, timeout, priority = _request_controls(request)
        names = [self._destination(o, leases) if o.shm is not None else o.name for o in request.outputs] or None
        call = {"inputs": inputs, "outputs": names, "model_version": request.model_version, "parameters": params,
                "request_id": request.id, "correlation_id": correlation, "flags": flags,
                "request_timeout_us": timeout, "priority": priority}
        if trace is not None:
            call["trace"] = trace
            trace_inputs(trace, request.inputs, inputs)
        return call

    def _check_request(self, request: InferRequest) -> None:
        """Limits and refusals that hold before anything runs."""
        limit = self.max_tensors
        if len(request.inputs) <= limit and len(request.outputs) <= limit:
            return
        for kind, count in (("inputs", len(request.inputs)), ("requested outputs", len(request.outputs))):
            if count > limit:
                raise InferenceError("INVALID_ARG", f"request has {count} {kind}, more than the limit of {limit}")

    async def drained(self, timeout: float) -> bool:
        """Waits (at most `timeout` s) until no inference request is running; True if none is."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.inflight and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        return not self.inflight

    def _inputs(self, request: InferRequest, leases: list[RegionLease]) -> dict[str, np.ndarray | RegionTensor]:
        inputs: dict[str, np.ndarray | RegionTensor] = {}
        for tensor in request.inputs:
            if tensor.name in inputs:
                raise InferenceError("INVALID_ARG", f"input '{tensor.name}' already exists in request")
            if tensor.shm is not None:
                inputs[tensor.name] = self._shm_input(tensor, request.model_name, leases)
            elif tensor.data is not None:
                inputs[tensor.name] = tensor.data
            else:
                raise InferenceError("INVALID_ARG", f"input '{tensor.name}' has no data")
        return inputs

    def _shm_input(self, tensor: InputTensor, model_name: str,
                   leases: list[RegionLease]) -> RegionTensor | np.ndarray:
        """An input in a client's region: a system region is read in place by the stub; a CUDA
        region is copied to the host here (GPU tensors reach models in a later step)."""
        assert tensor.shm is not None
        lease = self.registry.acquire(tensor.shm)
        leases.append(lease)
        try:
            dtype = triton_to_numpy_dtype(_core.dtype_from_name(tensor.datatype))
        except (TypeError, ValueError, _core.CoreError):
            raise InferenceError("INVALID_ARG", f"input '{tensor.name}' has a data type that cannot be read "
                                                f"from shared memory: {tensor.datatype}") from None
        if dtype.kind != "O":
            expected = math.prod(tensor.shape) * dtype.itemsize
            if expected != lease.byte_size:
                raise InferenceError("INVALID_ARG", f"input byte size mismatch for input '{tensor.name}' for model "
                                                    f"'{model_name}'. Expected {expected}, got {lease.byte_size}")
        region = lease.region
        if isinstance(region, CudaRegion) and dtype.kind == "O":
            return self._cuda_bytes_input(tensor, lease)
        # The lease's view of a system region lets the response cache hash the input in place.
        return RegionTensor(_client_region(region), lease.offset, lease.byte_size, dtype, tuple(tensor.shape),
                            lease.buffer)

    @staticmethod
    def _cuda_bytes_input(tensor: InputTensor, lease: RegionLease) -> np.ndarray:
        """A BYTES input in a CUDA region: GPU tensors cannot hold BYTES, so it is read to the
        host here and decoded (Triton's Python backend also hands models BYTES on the CPU)."""
        host = np.empty(lease.byte_size, dtype=np.uint8)
        region = lease.region
        assert isinstance(region, CudaRegion)
        try:
            region.handle.read(lease.offset, host)
        except Exception as e:  # a CUDA failure is the server's, not the client's
            raise InferenceError("INTERNAL", f"failed to read input '{tensor.name}' from CUDA shared memory "
                                             f"region '{lease.name}': {e}") from None
        try:
            return _core.decode_bytes(memoryview(host), math.prod(tensor.shape)).reshape(tensor.shape)
        except (_core.CoreError, ValueError) as e:
            raise InferenceError("INVALID_ARG", f"input '{tensor.name}': malformed BYTES data: {e}") from None

    def _destination(self, spec: RequestedOutput, leases: list[RegionLease]) -> RegionDestination | str:
        """Where the stub should write an output the client placed in a region: the stub writes
        it there itself (device to device when both the output and the region are on the GPU)."""
        assert spec.shm is not None
        lease = self.registry.acquire(spec.shm)
        leases.append(lease)
        return RegionDestination(spec.name, _client_region(lease.region), lease.offset, lease.byte_size)

    def _outputs(self, request: InferRequest, arrays: Mapping[str, np.ndarray | RegionOutput],
                 leases: list[RegionLease]) -> list[OutputTensor]:
        wanted: list[RequestedOutput] = request.outputs or [RequestedOutput(name) for name in arrays]
        outputs: list[OutputTensor] = []
        for spec in wanted:
            array = arrays.get(spec.name)
            if array is None:
                continue  # the model did not produce it (Triton leaves it out too)
            if isinstance(array, RegionOutput):  # the stub wrote it into the client's region
                outputs.append(OutputTensor(spec.name, _core.dtype_name(_core.DataType(array.dtype)),
                                            list(array.shape), None, spec.shm))
                continue
            datatype = _datatype(array)
            if spec.classification:
                classes = self.server.output_classes(request.model_name)
                array = classify(datatype, array, spec.classification, classes.batched,
                                 classes.labels.get(spec.name, ()))
                datatype = "BYTES"
            out = OutputTensor(spec.name, datatype, list(array.shape), array, None, spec.binary_data)
            if spec.shm is not None:
                self._write_shm_output(spec, array, leases)
                out.data, out.shm = None, spec.shm
            outputs.append(out)
        return outputs

    def _write_shm_output(self, spec: RequestedOutput, array: np.ndarray, leases: list[RegionLease]) -> None:
        """Copies an output into the client's region (the one copy an shm output costs)."""
        assert spec.shm is not None
        lease = self.registry.acquire(spec.shm)
        leases.append(lease)
        data: bytes | np.ndarray
        if array.dtype.kind == "O":
            data = _core.encode_bytes(array.ravel())
            size = len(data)
        else:
            data = np.ascontiguousarray(array)
            size = data.nbytes
        if size > lease.byte_size:
            raise InferenceError("INVALID_ARG", output_too_large(spec.name, lease.byte_size, size))
        if lease.buffer is not None:
            lease.buffer[:size] = memoryview(data).cast("B") if size else b""
            return
        region = lease.region
        assert isinstance(region, CudaRegion)
        try:  # a CUDA region: one host-to-device copy
            region.handle.write(lease.offset, memoryview(data).cast("B"))
        except Exception as e:
            raise InferenceError("INTERNAL", f"failed to write output '{spec.name}' to CUDA shared memory "
                                             f"region '{lease.name}': {e}") from None
