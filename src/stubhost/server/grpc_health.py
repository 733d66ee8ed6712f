"""The standard gRPC health service, ``grpc.health.v1.Health/Check``, as tritonserver serves it.

Kubernetes' gRPC probes, ``grpc_health_probe`` and load balancers ask it. tritonserver answers
``SERVING`` when the server is ready and ``NOT_SERVING`` otherwise, whatever service the request
names, and implements ``Check`` only (``Watch`` answers UNIMPLEMENTED); so does this. It belongs to
the ``health`` category of ``--grpc-restricted-protocol``.

The two messages are declared here, in stubhost's own descriptor pool, rather than generated:
the schema is four fields long, and the ``grpcio-health-checking`` package that ships it would be
one more dependency for one call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, message_factory

from stubhost.config._proto_pool import POOL
from stubhost.server.restricted import Restrictions

SERVICE_NAME = "grpc.health.v1.Health"
_FILE = "grpc/health/v1/health.proto"


def _declare() -> tuple[type[Any], type[Any]]:
    """The request and response classes, added to the pool once."""
    try:
        POOL.FindFileByName(_FILE)
    except KeyError:
        proto = descriptor_pb2.FileDescriptorProto(name=_FILE, package="grpc.health.v1", syntax="proto3")
        request = proto.message_type.add(name="HealthCheckRequest")
        request.field.add(name="service", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                          label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
        response = proto.message_type.add(name="HealthCheckResponse")
        status = response.enum_type.add(name="ServingStatus")
        for number, name in enumerate(("UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN")):
            status.value.add(name=name, number=number)
        response.field.add(name="status", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_ENUM,
                           type_name=".grpc.health.v1.HealthCheckResponse.ServingStatus",
                           label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
        POOL.Add(proto)
    return (message_factory.GetMessageClass(POOL.FindMessageTypeByName("grpc.health.v1.HealthCheckRequest")),
            message_factory.GetMessageClass(POOL.FindMessageTypeByName("grpc.health.v1.HealthCheckResponse")))


HealthCheckRequest, HealthCheckResponse = _declare()
SERVING = 1
NOT_SERVING = 2


def health_handler(ready: Callable[[], bool], restrictions: Restrictions) -> grpc.GenericRpcHandler:
    """``grpc.health.v1.Health`` with ``Check`` answering from `ready()`, for a ``grpc.aio`` server."""

    async def check(request: Any, context: grpc.aio.ServicerContext) -> Any:
        refusal = restrictions.call_refusal("health", context.invocation_metadata)
        if refusal is not None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, refusal)
        return HealthCheckResponse(status=SERVING if ready() else NOT_SERVING)

    return grpc.method_handlers_generic_handler(SERVICE_NAME, {
        "Check": grpc.unary_unary_rpc_method_handler(check, request_deserializer=HealthCheckRequest.FromString,
                                                     response_serializer=HealthCheckResponse.SerializeToString),
    })
