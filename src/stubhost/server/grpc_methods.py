"""The gRPC service's method table, read from the generated descriptor so that it cannot drift.

We generate no ``*_pb2_grpc`` stubs: a server registers its implementations through
:func:`generic_handler`, which works with ``grpc.server`` and ``grpc.aio.server`` alike (grpc.aio
accepts coroutine functions as the behaviours of the same handler objects).

    server.add_generic_rpc_handlers((generic_handler({"ServerLive": live, ...}),))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.message import Message

from stubhost.server import grpc_service_pb2

__all__ = ["METHODS", "SERVICE_NAME", "Method", "generic_handler"]

_SERVICE = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]

SERVICE_NAME: str = _SERVICE.full_name
"""``"inference.GRPCInferenceService"``: the name clients put in each call's path."""


@dataclass(frozen=True)
class Method:
    """One RPC of the service."""

    name: str
    request_streaming: bool
    response_streaming: bool
    request_type: type[Message]
    response_type: type[Message]

    @property
    def path(self) -> str:
        """The HTTP/2 path of the call, ``/inference.GRPCInferenceService/<name>``."""
        return f"/{SERVICE_NAME}/{self.name}"


METHODS: dict[str, Method] = {
    m.name: Method(
        name=m.name,
        request_streaming=m.client_streaming,
        response_streaming=m.server_streaming,
        # The classes protoc generated (GetMessageClass returns the cached class of a descriptor).
        request_type=message_factory.GetMessageClass(m.input_type),
        response_type=message_factory.GetMessageClass(m.output_type),
    )
    for m in _SERVICE.methods
}
"""Every RPC by name, in the order the .proto declares them."""


def generic_handler(behaviors: Mapping[str, Callable[..., Any]]) -> grpc.GenericRpcHandler:
    """A handler serving the given RPCs by name; each behaviour is called as gRPC's method
    handlers call theirs (``(request, context)``, or ``(request_iterator, context)`` for a
    client stream). RPCs left out answer UNIMPLEMENTED. Raises KeyError for a name that is not an
    RPC of the service."""
    factories = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    handlers = {}
    for name, behavior in behaviors.items():
        if name not in METHODS:
            raise KeyError(f"'{name}' is not a method of {SERVICE_NAME}")
        method = METHODS[name]
        factory = factories[(method.request_streaming, method.response_streaming)]
        handlers[name] = factory(behavior, request_deserializer=method.request_type.FromString,
                                 response_serializer=method.response_type.SerializeToString)
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)
