"""Our grpc_service.proto against tritonclient's compiled descriptors, which are the specification:
every RPC and every message reachable from the service must match on the wire."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as tc_grpc
import tritonclient.grpc.service_pb2 as tc_pb2
from google.protobuf import descriptor as d
from google.protobuf import json_format

from stubhost.config import _proto_pool
from stubhost.server import grpc_methods
from stubhost.server import grpc_service_pb2 as pb2

SERVICE = "inference.GRPCInferenceService"
THEIRS = tc_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
OURS = pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]


def reachable(service: d.ServiceDescriptor) -> tuple[dict[str, d.Descriptor], dict[str, d.EnumDescriptor]]:
    """Every message and enum type a call of the service can carry, by full name."""
    messages: dict[str, d.Descriptor] = {}
    enums: dict[str, d.EnumDescriptor] = {}
    pending = [t for m in service.methods for t in (m.input_type, m.output_type)]
    while pending:
        msg = pending.pop()
        if msg.full_name in messages:
            continue
        messages[msg.full_name] = msg
        for f in msg.fields:
            if f.message_type is not None:
                pending.append(f.message_type)
            if f.enum_type is not None:
                enums[f.enum_type.full_name] = f.enum_type
    return messages, enums


THEIR_MESSAGES, THEIR_ENUMS = reachable(THEIRS)


def field_signature(f: d.FieldDescriptor) -> dict[str, object]:
    oneof = f.containing_oneof
    return {
        "number": f.number,
        "type": f.type,
        "repeated": f.is_repeated,
        "message": f.message_type.full_name if f.message_type else None,
        "enum": f.enum_type.full_name if f.enum_type else None,
        # A proto3 `optional` makes a synthetic oneof; either way the name must match.
        "oneof": oneof.name if oneof is not None else None,
        "map": bool(f.message_type and f.message_type.GetOptions().map_entry),
        "presence": f.has_presence,
    }


def test_the_service_covers_every_rpc_of_tritonclient() -> None:
    assert OURS.full_name == SERVICE
    assert [m.name for m in OURS.methods] == [m.name for m in THEIRS.methods]
    for theirs in THEIRS.methods:
        ours = OURS.methods_by_name[theirs.name]
        assert ours.input_type.full_name == theirs.input_type.full_name, theirs.name
        assert ours.output_type.full_name == theirs.output_type.full_name, theirs.name
        assert ours.client_streaming == theirs.client_streaming, theirs.name
        assert ours.server_streaming == theirs.server_streaming, theirs.name


def test_model_stream_infer_is_bidirectional() -> None:
    method = OURS.methods_by_name["ModelStreamInfer"]
    assert method.client_streaming and method.server_streaming
    assert method.input_type.full_name == "inference.ModelInferRequest"
    assert method.output_type.full_name == "inference.ModelStreamInferResponse"


def test_model_config_response_carries_our_model_config() -> None:
    config = pb2.ModelConfigResponse.DESCRIPTOR.fields_by_name["config"].message_type
    assert config.full_name == "inference.ModelConfig"
    assert config.file.name == "stubhost/config/model_config.proto"


@pytest.mark.parametrize("name", sorted(THEIR_MESSAGES))
def test_every_reachable_message_matches(name: str) -> None:
    theirs = THEIR_MESSAGES[name]
    ours = _proto_pool.POOL.FindMessageTypeByName(name)
    assert {f.name: field_signature(f) for f in ours.fields} == {
        f.name: field_signature(f) for f in theirs.fields}
    assert sorted(o.name for o in ours.oneofs) == sorted(o.name for o in theirs.oneofs)


@pytest.mark.parametrize("name", sorted(THEIR_ENUMS))
def test_every_reachable_enum_matches(name: str) -> None:
    theirs = THEIR_ENUMS[name]
    ours = _proto_pool.POOL.FindEnumTypeByName(name)
    assert {v.name: v.number for v in ours.values} == {v.name: v.number for v in theirs.values}


def test_reachable_set_is_not_trivially_small() -> None:
    """Guards the walk itself: the service reaches the statistics, shared-memory and model-config
    messages (ModelConfig's own tree included)."""
    assert {"inference.ModelConfig", "inference.ModelInstanceGroup", "inference.InferStatistics",
            "inference.CudaSharedMemoryStatusResponse.RegionStatus"} <= set(THEIR_MESSAGES)
    assert "inference.DataType" in THEIR_ENUMS


def populated_request() -> tc_pb2.ModelInferRequest:
    """A request as tritonclient builds it: raw tensors, a shared-memory input, outputs with
    parameters, request parameters of every kind."""
    a = tc_grpc.InferInput("A", [2, 3], "FP32").set_data_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3))
    b = tc_grpc.InferInput("B", [2], "BYTES").set_data_from_numpy(np.array([b"x", b"yz"], dtype=object))
    c = tc_grpc.InferInput("C", [4], "INT64")
    c.set_shared_memory("region", 32, offset=8)
    out0 = tc_grpc.InferRequestedOutput("OUT0", class_count=3)
    out1 = tc_grpc.InferRequestedOutput("OUT1")
    out1.set_shared_memory("outregion", 64)
    request = tc_grpc._utils._get_inference_request(
        model_name="m", inputs=[a, b, c], model_version="2", request_id="rid", outputs=[out0, out1],
        sequence_id=7, sequence_start=True, sequence_end=False, priority=3, timeout=100,
        parameters={"s": "v", "f": 1.5, "i": -4, "b": True})
    c_tensor = request.inputs[2]
    assert c_tensor.parameters["shared_memory_offset"].int64_param == 8
    return request


def populated_response() -> tc_pb2.ModelInferResponse:
    response = tc_pb2.ModelInferResponse(model_name="m", model_version="1", id="rid")
    response.parameters["sequence_id"].uint64_param = 1 << 63
    response.parameters["d"].double_param = 0.25
    out = response.outputs.add(name="OUT0", datatype="INT32", shape=[2, 2])
    out.parameters["shared_memory_region"].string_param = "r"
    response.outputs.add(name="OUT1", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"typed")
    response.raw_output_contents.extend([np.arange(4, dtype=np.int32).tobytes(), b""])
    return response


@pytest.mark.parametrize(("build", "ours_cls"), [(populated_request, pb2.ModelInferRequest),
                                                 (populated_response, pb2.ModelInferResponse)])
def test_bytes_from_tritonclient_parse_to_an_equal_message(build, ours_cls) -> None:
    theirs = build()
    wire = theirs.SerializeToString(deterministic=True)
    ours = ours_cls.FromString(wire)
    assert ours.SerializeToString(deterministic=True) == wire
    # And back: tritonclient parses ours to the message it started from.
    assert type(theirs).FromString(ours.SerializeToString()) == theirs
    # Every field was known to ours (unknown fields would survive re-serialization but not this).
    assert json_format.MessageToDict(ours) == json_format.MessageToDict(theirs) != {}


def test_stream_response_round_trips() -> None:
    theirs = tc_pb2.ModelStreamInferResponse(error_message="boom", infer_response=populated_response())
    ours = pb2.ModelStreamInferResponse.FromString(theirs.SerializeToString())
    assert ours.error_message == "boom"
    assert ours.infer_response.outputs[0].name == "OUT0"
    assert tc_pb2.ModelStreamInferResponse.FromString(ours.SerializeToString()) == theirs


def test_both_generated_modules_live_in_one_process() -> None:
    """Ours registers in stubhost's pool, tritonclient's in the default pool: same names, no clash."""
    assert pb2.ModelInferRequest is not tc_pb2.ModelInferRequest
    assert pb2.ModelInferRequest.DESCRIPTOR.full_name == tc_pb2.ModelInferRequest.DESCRIPTOR.full_name
    assert pb2.DESCRIPTOR.pool is _proto_pool.POOL
    assert tc_pb2.DESCRIPTOR.pool is not _proto_pool.POOL
    import tritonclient.grpc.model_config_pb2 as tc_config  # imported after ours, still fine

    assert tc_config.ModelConfig.DESCRIPTOR.full_name == "inference.ModelConfig"


def test_method_table_follows_the_descriptor() -> None:
    assert grpc_methods.SERVICE_NAME == SERVICE
    assert list(grpc_methods.METHODS) == [m.name for m in THEIRS.methods]
    for name, method in grpc_methods.METHODS.items():
        theirs = THEIRS.methods_by_name[name]
        assert method.path == f"/{SERVICE}/{name}"
        assert method.request_streaming == theirs.client_streaming
        assert method.response_streaming == theirs.server_streaming
        assert method.request_type.DESCRIPTOR.full_name == theirs.input_type.full_name
        assert method.response_type.DESCRIPTOR.full_name == theirs.output_type.full_name
    assert grpc_methods.METHODS["ModelInfer"].request_type is pb2.ModelInferRequest
    assert grpc_methods.METHODS["ModelStreamInfer"].response_type is pb2.ModelStreamInferResponse


def test_generic_handler_serves_tritonclient() -> None:
    """A real server built from the table answers tritonclient's stub, unary and streaming."""
    import queue
    from concurrent import futures

    import grpc

    def live(request, context):
        return pb2.ServerLiveResponse(live=True)

    def stream(requests, context):
        for r in requests:
            yield pb2.ModelStreamInferResponse(infer_response=pb2.ModelInferResponse(id=r.id))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((grpc_methods.generic_handler({"ServerLive": live, "ModelStreamInfer": stream}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        client = tc_grpc.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            assert client.is_server_live()
            with pytest.raises(tc_grpc.InferenceServerException, match="UNIMPLEMENTED|nimplemented"):
                client.is_server_ready()
            results: queue.Queue = queue.Queue()
            client.start_stream(callback=lambda result, error: results.put((result, error)))
            x = tc_grpc.InferInput("X", [1], "INT32").set_data_from_numpy(np.array([1], dtype=np.int32))
            client.async_stream_infer("m", [x], request_id="r1")
            result, error = results.get(timeout=10)
            assert error is None and result.get_response().id == "r1"
            client.stop_stream()
        finally:
            client.close()
    finally:
        server.stop(None)


def test_generic_handler_serves_grpc_aio_coroutines() -> None:
    """The same handler runs on grpc.aio with coroutine and async-generator behaviours."""
    import asyncio

    import grpc
    import tritonclient.grpc.aio as tc_aio

    async def ready(request, context):
        return pb2.ModelReadyResponse(ready=request.name == "m")

    async def stream(requests, context):
        async for r in requests:
            yield pb2.ModelStreamInferResponse(error_message=f"no {r.model_name}")

    async def main() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (grpc_methods.generic_handler({"ModelReady": ready, "ModelStreamInfer": stream}),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            client = tc_aio.InferenceServerClient(f"127.0.0.1:{port}")
            try:
                assert await client.is_model_ready("m")
                assert not await client.is_model_ready("other")

                async def requests():
                    yield {"model_name": "m2", "inputs": [tc_grpc.InferInput("X", [1], "INT32").set_data_from_numpy(
                        np.array([1], dtype=np.int32))]}

                async for result, error in client.stream_infer(requests()):
                    assert result is None and "no m2" in str(error)
                    break
            finally:
                await client.close()
        finally:
            await server.stop(None)

    asyncio.run(main())


def test_generic_handler_rejects_unknown_names() -> None:
    with pytest.raises(KeyError, match="NoSuchRpc"):
        grpc_methods.generic_handler({"NoSuchRpc": lambda r, c: None})
