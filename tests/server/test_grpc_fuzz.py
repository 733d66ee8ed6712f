"""A fuzz pass over the gRPC API: whatever a client sends (inference requests, streams, shared
memory registrations, metadata look-ups), the answer is a status with a message, never an
unexpected exception (UNKNOWN) or a broken server, and the server keeps serving."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2 as pb
import tritonclient.grpc.service_pb2_grpc as pb_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.host.repo_factory import EXAMPLES
from tests.server.serve_process import ServeProcess

DATATYPES = ["BOOL", "UINT8", "INT8", "INT16", "UINT32", "INT32", "INT64", "UINT64", "FP16", "FP32", "FP64",
             "BYTES", "BF16", "", "fp32", "X"]
NAMES = ["INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1", "", "x" * 300, "\u00e9", "../../etc"]
MODELS = ["add_sub", "identity", "string_upper", "repeat", "nope", "", "..", "%00"]
VERSIONS = ["", "1", "0", "-1", "2", "x", "99999999999999999999"]
# What a server may answer a bad request with. UNKNOWN means an exception escaped a handler.
# INTERNAL is Triton's code for some refusals too (a shared-memory key that cannot be opened).
ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INTERNAL,
           grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.UNIMPLEMENTED,
           grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.OUT_OF_RANGE}

u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-2**63, 2**63 - 1)
parameters = st.dictionaries(
    st.sampled_from(["binary_data_size", "shared_memory_region", "shared_memory_byte_size", "shared_memory_offset",
                     "classification", "sequence_id", "sequence_start", "sequence_end", "timeout", "priority",
                     "binary_data_output", "x"]),
    st.one_of(st.builds(pb.InferParameter, bool_param=st.booleans()),
              st.builds(pb.InferParameter, int64_param=i64),
              st.builds(pb.InferParameter, uint64_param=u64),
              st.builds(pb.InferParameter, double_param=st.floats()),
              st.builds(pb.InferParameter, string_param=st.text(max_size=12))),
    max_size=3)
contents = st.builds(
    pb.InferTensorContents,
    bool_contents=st.lists(st.booleans(), max_size=6), int_contents=st.lists(st.integers(-2**31, 2**31 - 1), max_size=6),
    int64_contents=st.lists(i64, max_size=6), uint_contents=st.lists(st.integers(0, 2**32 - 1), max_size=6),
    uint64_contents=st.lists(u64, max_size=6), fp32_contents=st.lists(st.floats(width=32), max_size=6),
    fp64_contents=st.lists(st.floats(), max_size=6), bytes_contents=st.lists(st.binary(max_size=8), max_size=6))
inputs = st.builds(
    pb.ModelInferRequest.InferInputTensor,
    name=st.sampled_from(NAMES), datatype=st.sampled_from(DATATYPES),
    shape=st.one_of(st.lists(st.integers(-3, 8), max_size=4), st.lists(i64, max_size=3)),
    parameters=parameters, contents=st.one_of(st.none(), contents))
outputs = st.builds(pb.ModelInferRequest.InferRequestedOutputTensor, name=st.sampled_from(NAMES),
                    parameters=parameters)
requests = st.builds(
    pb.ModelInferRequest, model_name=st.sampled_from(MODELS), model_version=st.sampled_from(VERSIONS),
    id=st.text(max_size=10), parameters=parameters, inputs=st.lists(inputs, max_size=3),
    outputs=st.lists(outputs, max_size=2), raw_input_contents=st.lists(st.binary(max_size=40), max_size=3))


@pytest.fixture(scope="module")
def server():
    with ServeProcess(EXAMPLES) as srv:
        yield srv


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(server.grpc_url)
    yield pb_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def _check(call) -> None:
    """Runs one RPC; a refusal must carry an allowed status and a message."""
    try:
        call()
    except grpc.RpcError as e:
        code, details = e.code(), e.details() or ""
        assert code in ALLOWED, (code, details[:500])
        assert details and "Traceback" not in details and "Unexpected <class" not in details, (code, details[:500])


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(request=requests)
def test_model_infer_requests_never_get_an_unexpected_status(stub, request):
    _check(lambda: stub.ModelInfer(request, timeout=30))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(requests, min_size=1, max_size=4))
def test_stream_requests_never_get_an_unexpected_status(stub, batch):
    def run() -> None:
        for reply in stub.ModelStreamInfer(iter(batch), timeout=30):
            # A stream reports a request's error in its reply, and goes on.
            assert reply.error_message or reply.infer_response is not None
    _check(run)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.text(max_size=20), key=st.text(max_size=30), offset=u64, byte_size=u64)
def test_system_shared_memory_registrations_never_get_an_unexpected_status(stub, name, key, offset, byte_size):
    def run() -> None:
        stub.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(
            name=name, key=key, offset=offset, byte_size=byte_size), timeout=30)
        stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name=name), timeout=30)
    _check(run)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.text(max_size=20), handle=st.binary(max_size=80), device=st.integers(-2**63, 2**63 - 1),
       byte_size=u64)
def test_cuda_shared_memory_registrations_never_get_an_unexpected_status(stub, name, handle, device, byte_size):
    _check(lambda: stub.CudaSharedMemoryRegister(pb.CudaSharedMemoryRegisterRequest(
        name=name, raw_handle=handle, device_id=device, byte_size=byte_size), timeout=30))


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(rpc=st.sampled_from(["ModelMetadata", "ModelReady", "ModelConfig", "ModelStatistics"]),
       name=st.one_of(st.sampled_from(MODELS), st.text(max_size=20)), version=st.sampled_from(VERSIONS))
def test_model_look_ups_never_get_an_unexpected_status(stub, rpc, name, version):
    message = getattr(pb, f"{rpc}Request")(name=name, version=version)
    _check(lambda: getattr(stub, rpc)(message, timeout=30))


def test_the_server_still_serves_after_the_fuzzing(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = grpcclient.InferInput("INPUT0", [3], "FP32")
    x.set_data_from_numpy(np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(client.infer("identity", [x]).as_numpy("OUTPUT0"), np.arange(3, dtype=np.float32))
    client.close()
    assert "Traceback" not in server.log, server.log[-3000:]
