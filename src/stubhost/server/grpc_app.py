"""The KServe v2 gRPC front end (``inference.GRPCInferenceService``) on grpcio's asyncio server.

Every RPC is a coroutine over :class:`InferenceService`; an :class:`InferenceError` ends the call
with the gRPC status Triton uses for its code. ``ModelStreamInfer`` runs the requests of one
stream concurrently and answers each as it finishes (clients match answers by request id), with
a failed request reported in ``error_message`` while the stream goes on, as Triton does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import json_format

from stubhost.config import config_from_dict
from stubhost.host.errors import InferenceError
from stubhost.host.trace import RequestTrace
from stubhost.server import grpc_codec
from stubhost.server import grpc_service_pb2 as pb
from stubhost.server.grpc_health import health_handler
from stubhost.server.grpc_methods import generic_handler
from stubhost.server.grpc_options import GrpcOptions
from stubhost.server.header_forward import HeaderForward
from stubhost.server.restricted import Restrictions
from stubhost.server.service import EMPTY_FINAL_RESPONSE, InferenceService
from stubhost.server.types import InferResult

STATUS_OF_CODE = {
    "INVALID_ARG": grpc.StatusCode.INVALID_ARGUMENT, "NOT_FOUND": grpc.StatusCode.NOT_FOUND,
    "INTERNAL": grpc.StatusCode.INTERNAL, "UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,
    "UNSUPPORTED": grpc.StatusCode.UNIMPLEMENTED, "ALREADY_EXISTS": grpc.StatusCode.ALREADY_EXISTS,
    "CANCELLED": grpc.StatusCode.CANCELLED, "UNKNOWN": grpc.StatusCode.UNKNOWN,
}
_FINAL_RESPONSE = "triton_final_response"  # response parameter: the request's last response
# A stream's response (or, with the triton_grpc_error header, the error that ends the stream) and
# its request's trace.
_Sending = tuple[pb.ModelStreamInferResponse | InferenceError, RequestTrace | None]
GRPC_ERROR_HEADER = "triton_grpc_error"
MAX_MESSAGE_BYTES = (1 << 31) - 1  # grpcio's largest; tensors are bounded by the codec instead

Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


# The restricted-API category of each RPC (Triton's names for --grpc-restricted-protocol).
CATEGORY_OF_METHOD = {
    "ServerLive": "health", "ServerReady": "health", "ModelReady": "health",
    "ServerMetadata": "metadata", "ModelMetadata": "metadata",
    "ModelInfer": "inference", "ModelStreamInfer": "inference",
    "ModelConfig": "model-config", "ModelStatistics": "statistics",
    "RepositoryIndex": "model-repository", "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "SystemSharedMemoryStatus": "shared-memory", "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory", "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory", "CudaSharedMemoryUnregister": "shared-memory",
    "TraceSetting": "trace", "LogSettings": "logging",
}


def _refusal(restrictions: Restrictions, method: str, context: grpc.aio.ServicerContext) -> str | None:
    return restrictions.call_refusal(CATEGORY_OF_METHOD[method], context.invocation_metadata)


def _guarded(handler: Handler, method: str, restrictions: Restrictions) -> Handler:
    """Refuses restricted calls and turns InferenceError into the call's gRPC status."""
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        refusal = _refusal(restrictions, method, context)
        if refusal is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, refusal)
        try:
            return await handler(request, context)
        except InferenceError as e:
            await context.abort(STATUS_OF_CODE.get(e.code, grpc.StatusCode.UNKNOWN), e.message)
    return call


def _setting_value(value: pb.LogSettingsRequest.SettingValue) -> Any:
    choice = value.WhichOneof("parameter_choice")
    return None if choice is None else getattr(value, choice)


class GrpcFrontend:
    """The servicer: one coroutine per RPC of the service."""

    def __init__(self, service: InferenceService, restrictions: Restrictions | None = None,
                 header_forward: HeaderForward | None = None) -> None:
        self.service = service
        self.restrictions = restrictions or Restrictions()
        self.header_forward = header_forward  # --grpc-header-forward-pattern

    def _forwarded(self, context: Any) -> dict[str, str]:
        """The call's metadata that --grpc-header-forward-pattern makes request parameters."""
        if self.header_forward is None:
            return {}
        return self.header_forward.select(context.invocation_metadata() or ())

    def handler(self) -> grpc.GenericRpcHandler:
        """The generic handler to add to a ``grpc.aio`` server."""
        unary = {
            "ServerLive": self.server_live, "ServerReady": self.server_ready, "ModelReady": self.model_ready,
            "ServerMetadata": self.server_metadata, "ModelMetadata": self.model_metadata,
            "ModelConfig": self.model_config, "ModelStatistics": self.model_statistics,
            "ModelInfer": self.model_infer, "RepositoryIndex": self.repository_index,
            "RepositoryModelLoad": self.repository_model_load,
            "RepositoryModelUnload": self.repository_model_unload,
            "SystemSharedMemoryStatus": self.system_status, "SystemSharedMemoryRegister": self.system_register,
            "SystemSharedMemoryUnregister": self.system_unregister,
            "CudaSharedMemoryStatus": self.cuda_status, "CudaSharedMemoryRegister": self.cuda_register,
            "CudaSharedMemoryUnregister": self.cuda_unregister,
            "LogSettings": self.log_settings, "TraceSetting": self.trace_setting,
        }
        behaviors: dict[str, Callable[..., Any]] = {name: _guarded(fn, name, self.restrictions)
                                                    for name, fn in unary.items()}
        behaviors["ModelStreamInfer"] = self.model_stream_infer
        return generic_handler(behaviors)

    # ---- health and metadata ---------------------------------------------------------------------
    async def server_live(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.service.live())

    async def server_ready(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.service.ready())

    async def model_ready(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.service.model_ready(request.name, request.version))

    async def server_metadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        meta = self.service.metadata()
        return pb.ServerMetadataResponse(name=meta["name"], version=meta["version"], extensions=meta["extensions"])

    async def model_metadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        meta = self.service.model_metadata(request.name, request.version)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"],
            inputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in meta["inputs"]],
            outputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in meta["outputs"]])

    async def model_config(self, request: pb.ModelConfigRequest, context: Any) -> pb.ModelConfigResponse:
        config = config_from_dict(self.service.model_config(request.name, request.version), request.name)
        return pb.ModelConfigResponse(config=config)

    async def model_statistics(self, request: pb.ModelStatisticsRequest,
                               context: Any) -> pb.ModelStatisticsResponse:
        stats = self.service.statistics(request.name, request.version)
        return json_format.ParseDict(stats, pb.ModelStatisticsResponse())

    # ---- repository ------------------------------------------------------------------------------
    async def repository_index(self, request: pb.RepositoryIndexRequest,
                               context: Any) -> pb.RepositoryIndexResponse:
        index = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(models=[index(**entry) for entry in
                                                  self.service.repository_index(request.ready)])

    async def repository_model_load(self, request: pb.RepositoryModelLoadRequest,
                                    context: Any) -> pb.RepositoryModelLoadResponse:
        parameters = {key: getattr(value, value.WhichOneof("parameter_choice") or "string_param")
                      for key, value in request.parameters.items()}
        await self.service.load(request.model_name, parameters)
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(self, request: pb.RepositoryModelUnloadRequest,
                                      context: Any) -> pb.RepositoryModelUnloadResponse:
        parameters = {key: getattr(value, value.WhichOneof("parameter_choice") or "string_param")
                      for key, value in request.parameters.items()}
        await self.service.unload(request.model_name, parameters)
        return pb.RepositoryModelUnloadResponse()

    # ---- shared memory ---------------------------------------------------------------------------
    async def system_status(self, request: pb.SystemSharedMemoryStatusRequest,
                            context: Any) -> pb.SystemSharedMemoryStatusResponse:
        region = pb.SystemSharedMemoryStatusResponse.RegionStatus
        regions = self.service.registry.system_status(request.name or None)
        return pb.SystemSharedMemoryStatusResponse(regions={r["name"]: region(**r) for r in regions})

    async def system_register(self, request: pb.SystemSharedMemoryRegisterRequest,
                              context: Any) -> pb.SystemSharedMemoryRegisterResponse:
        self.service.registry.register_system(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    async def system_unregister(self, request: pb.SystemSharedMemoryUnregisterRequest,
                                context: Any) -> pb.SystemSharedMemoryUnregisterResponse:
        self.service.registry.unregister_system(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def cuda_status(self, request: pb.CudaSharedMemoryStatusRequest,
                          context: Any) -> pb.CudaSharedMemoryStatusResponse:
        region = pb.CudaSharedMemoryStatusResponse.RegionStatus
        regions = self.service.registry.cuda_status(request.name or None)
        return pb.CudaSharedMemoryStatusResponse(regions={r["name"]: region(**r) for r in regions})

    async def cuda_register(self, request: pb.CudaSharedMemoryRegisterRequest,
                            context: Any) -> pb.CudaSharedMemoryRegisterResponse:
        self.service.registry.register_cuda(request.name, request.raw_handle, request.device_id,
                                            request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    async def cuda_unregister(self, request: pb.CudaSharedMemoryUnregisterRequest,
                              context: Any) -> pb.CudaSharedMemoryUnregisterResponse:
        self.service.registry.unregister_cuda(request.name or None)
        return pb.CudaSharedMemoryUnregisterResponse()

    # ---- logging ---------------------------------------------------------------------------------
    async def log_settings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        """Triton's logging extension: each setting travels in the oneof member of its type (an
        unset one counts as not given, like a JSON null over HTTP)."""
        changes = {name: _setting_value(value) for name, value in request.settings.items()}
        response = pb.LogSettingsResponse()
        for name, value in self.service.log_settings(changes).items():
            entry = response.settings[name]
            if isinstance(value, bool):
                entry.bool_param = value
            elif isinstance(value, int):
                entry.uint32_param = value
            else:
                entry.string_param = value
        return response

    # ---- trace -----------------------------------------------------------------------------------
    async def trace_setting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        """Triton's trace extension: every setting travels as a list of strings; a request with
        settings changes them (an empty list clears one), then all are answered."""
        changes = {name: list(value.value) for name, value in request.settings.items()} or None
        response = pb.TraceSettingResponse()
        for name, value in self.service.trace_settings(request.model_name, changes, grpc=True).items():
            response.settings[name].value.extend(value if isinstance(value, list) else [value])
        return response

    def _sample(self, model_name: str, context: Any) -> RequestTrace | None:
        """The trace of a request, when its trace setting samples it, with GRPC_WAITREAD_START
        and GRPC_WAITREAD_END: both now, as grpcio hands a request over once it is read. In
        OpenTelemetry mode it continues the client's span named by the call's ``traceparent``."""
        tracer = self.service.tracer
        if tracer.propagates:
            metadata = dict(context.invocation_metadata() or ())
            trace = tracer.sample(model_name, metadata.get("traceparent"), metadata.get("tracestate"))
        else:
            trace = tracer.sample(model_name)
        if trace is not None:
            trace.timestamp("GRPC_WAITREAD_START")
            trace.timestamp("GRPC_WAITREAD_END")
        return trace

    # ---- inference -------------------------------------------------------------------------------
    @staticmethod
    def _encode(result: InferResult) -> pb.ModelInferResponse:
        try:
            return grpc_codec.encode_infer_response(result)
        except (TypeError, ValueError) as e:  # an output that cannot be sent: the server's fault
            raise InferenceError("INTERNAL", f"failed to encode the response of model '{result.model_name}': "
                                             f"{e}") from None

    async def model_infer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        trace = self._sample(request.model_name, context) if self.service.tracer.on else None
        if trace is not None:  # written once the call has ended (its response sent, or not)
            sending: list[RequestTrace] = []
            context.add_done_callback(lambda _: _sent(sending[0]) if sending else trace.release())
        decoded = grpc_codec.decode_infer_request(request)
        decoded.forwarded = self._forwarded(context)
        response = self._encode(await self.service.infer(decoded, endpoint="ModelInfer RPC", trace=trace))
        if trace is not None:
            trace.timestamp("GRPC_SEND_START")
            sending.append(trace)
        return response

    async def _stream_one(self, request: pb.ModelInferRequest, out: asyncio.Queue[_Sending | None],
                          forwarded: dict[str, str], context: Any, grpc_errors: bool = False) -> None:
        """Streams the responses of one request of a ModelStreamInfer call into `out`. Every
        response says whether it is the last (``triton_final_response``); with the request
        parameter ``triton_enable_empty_final_response`` a final flag sent alone is sent too, as
        in Triton; without it, it is not. A traced request's trace travels
        with each of its responses (GRPC_SEND_START/END around its sending)."""
        trace = self._sample(request.model_name, context) if self.service.tracer.on else None

        async def put(message: pb.ModelStreamInferResponse) -> None:
            if trace is not None:
                trace.hold()
                trace.timestamp("GRPC_SEND_START")
            await out.put((message, trace))

        def failed(error: InferenceError) -> pb.ModelStreamInferResponse | InferenceError:
            if grpc_errors:  # the stream ends with the error's status
                return error
            return pb.ModelStreamInferResponse(error_message=error.message, infer_response=pb.ModelInferResponse(
                id=request.id, model_name=request.model_name, model_version=request.model_version))

        try:
            decoded = grpc_codec.decode_infer_request(request)
            decoded.forwarded = forwarded  # the stream's metadata applies to each of its requests
        except InferenceError as e:
            await put(failed(e))
            if trace is not None:
                trace.release()
            return
        flag_final = decoded.parameters.get(EMPTY_FINAL_RESPONSE) is True
        events = self.service.infer_stream(decoded, trace)
        try:
            async for event in events:
                if event.error is not None:
                    await put(failed(event.error))
                    continue
                if event.result is None:
                    if not flag_final:
                        continue
                    response = pb.ModelInferResponse(id=request.id, model_name=request.model_name,
                                                     model_version=request.model_version)
                else:
                    try:
                        response = self._encode(event.result)
                    except InferenceError as e:
                        await put(failed(e))
                        continue
                # Every response says whether it is the last (Triton 2.51 does so with or without the
                # request's empty-final-response parameter, which only adds the empty final one).
                response.parameters[_FINAL_RESPONSE].bool_param = event.final
                await put(pb.ModelStreamInferResponse(infer_response=response))
        except InferenceError as e:
            await put(failed(e))
        finally:
            await events.aclose()
            if trace is not None:
                trace.release()

    async def model_stream_infer(self, requests: AsyncIterator[pb.ModelInferRequest],
                                 context: Any) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Answers each request of the stream as it finishes; the stream ends after the client's
        last request has been answered."""
        refusal = _refusal(self.restrictions, "ModelStreamInfer", context)
        if refusal is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, refusal)
        done: asyncio.Queue[_Sending | None] = asyncio.Queue()
        pending: set[asyncio.Task[None]] = set()

        forwarded = self._forwarded(context)
        # Triton's opt-in (24.08): the first error ends the stream with its gRPC status.
        grpc_errors = any(key.lower() == GRPC_ERROR_HEADER and str(value).lower() == "true"
                          for key, value in context.invocation_metadata() or ())

        async def run(request: pb.ModelInferRequest) -> None:
            await self._stream_one(request, done, forwarded, context, grpc_errors)

        async def read_all() -> None:
            try:
                async for request in requests:
                    task = asyncio.ensure_future(run(request))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                while pending:
                    await asyncio.gather(*list(pending), return_exceptions=True)
            finally:
                await done.put(None)

        reader = asyncio.ensure_future(read_all())
        try:
            while True:
                item = await done.get()
                if item is None:
                    break
                response, trace = item
                if isinstance(response, InferenceError):
                    if trace is not None:
                        trace.release()
                    await context.abort(STATUS_OF_CODE.get(response.code, grpc.StatusCode.UNKNOWN), response.message)
                yield response
                if trace is not None:  # grpcio asks for the next response once this one is written
                    _sent(trace)
        finally:
            reader.cancel()
            for task in list(pending):
                task.cancel()
            while not done.empty():  # responses never sent: their traces are written all the same
                item = done.get_nowait()
                if item is not None and item[1] is not None:
                    item[1].release()


def _sent(trace: RequestTrace) -> None:
    """A traced response was sent: GRPC_SEND_END, and one user of the trace fewer."""
    trace.timestamp("GRPC_SEND_END")
    trace.release()


def create_grpc_server(service: InferenceService, address: str, *, restrictions: Restrictions | None = None,
                       max_message: int = MAX_MESSAGE_BYTES, options: GrpcOptions | None = None,
                       header_forward: HeaderForward | None = None) -> tuple[grpc.aio.Server, int]:
    """A ``grpc.aio`` server bound to ``address`` (``host:port``, port 0: any free one), not yet
    started, and the port it is bound to. ``max_message`` bounds a message in bytes; ``options``
    (default: tritonserver's defaults, no TLS, no port reuse) sets keepalive, TLS and port reuse.
    Besides ``inference.GRPCInferenceService`` it serves ``grpc.health.v1.Health/Check``."""
    options = options or GrpcOptions()
    # Without --reuse-grpc-port a taken port must fail, not be shared with another server.
    server = grpc.aio.server(options=[("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                      ("grpc.max_receive_message_length", min(max_message, MAX_MESSAGE_BYTES)),
                                      *options.channel_args()])
    limits = restrictions or Restrictions()
    server.add_generic_rpc_handlers((GrpcFrontend(service, limits, header_forward).handler(),
                                     health_handler(lambda: service.ready(), limits)))
    try:
        port = (server.add_secure_port(address, options.tls.credentials()) if options.tls is not None
                else server.add_insecure_port(address))
    except RuntimeError:  # grpcio raises where older versions returned 0
        port = 0
    if port == 0:
        raise OSError(f"Socket '{address}' already in use")
    return server, port
