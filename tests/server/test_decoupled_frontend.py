"""Decoupled models through the front ends of `stubhost serve`: gRPC ModelStreamInfer, the refusal
of unary inference, the HTTP generate extension (``generate`` / ``generate_stream``) and
cancellation (an HTTP client that goes away, a gRPC stream cancelled by its client).

Models: the example ``repeat`` (one response per element of IN, then a final flag alone),
``add_sub`` and ``string_upper`` (default mode), plus two decoupled models written here:
``stutter`` (a response, an error response, the rest, then the final flag) and ``ticker``
(streams until cancelled and writes what happened to a marker file, which is how a test sees
that the model itself was told of the cancellation).
"""

from __future__ import annotations

import http.client
import json
import queue
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.host.repo_factory import WAITER_PY, config_pbtxt, copy_examples, io, waiter_config, write_model
from tests.server.serve_process import ServeProcess

TIMEOUT = 30.0  # generous: a queue wait that runs out is a failure, never a pacing device
FINAL = "triton_final_response"

# ---- models written for this module ----------------------------------------------------------------
# A response per element of IN (OUT = value), but right after the first one an error response
# (not final); then the other elements and the final flag alone. Request parameter
# {"fail_first": true}: the only response is an error carrying the final flag.
STUTTER_PY = """
import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.respond, args=(request,), daemon=True).start()
        return None

    def respond(self, request):
        sender = request.get_response_sender()
        params = json.loads(request.parameters())
        if params.get("fail_first"):
            error = pb_utils.TritonError("stutter refuses at once", pb_utils.TritonError.INVALID_ARG)
            sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        for index, value in enumerate(values):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], dtype=np.int32))]))
            if index == 0:
                error = pb_utils.TritonError("stutter stumbled after the first response",
                                             pb_utils.TritonError.INTERNAL)
                sender.send(pb_utils.InferenceResponse(error=error))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
# A default-mode model that answers every request with an error response.
REFUSER_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("refuser says no")) for _ in requests]
"""
STUTTER_CONFIG = config_pbtxt("stutter", [io("IN", "TYPE_INT32", [-1])], [io("OUT", "TYPE_INT32", [1])],
                              extra="model_transaction_policy { decoupled: true }")

# Streams N = START, START+1, ... every 20 ms for up to 30 s. When it sees is_cancelled() it
# writes "cancelled after <count>" to the file named by the request parameter "marker" and ends
# with a CANCELLED error; if it runs out of time it writes "not cancelled".
TICKER_PY = """
import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def mark(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.respond, args=(request,), daemon=True).start()
        return None

    def respond(self, request):
        sender = request.get_response_sender()
        marker = json.loads(request.parameters())["marker"]
        start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy()[0])
        deadline = time.monotonic() + 30.0
        count = 0
        while time.monotonic() < deadline:
            if request.is_cancelled():
                mark(marker, "cancelled after %d" % count)
                error = pb_utils.TritonError("ticker cancelled", pb_utils.TritonError.CANCELLED)
                sender.send(pb_utils.InferenceResponse(error=error),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            sender.send(pb_utils.InferenceResponse(
                [pb_utils.Tensor("N", np.array([start + count], dtype=np.int32))]))
            count += 1
            time.sleep(0.02)
        mark(marker, "not cancelled")
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""
TICKER_CONFIG = config_pbtxt("ticker", [io("START", "TYPE_INT32", [1])], [io("N", "TYPE_INT32", [1])],
                             extra="model_transaction_policy { decoupled: true }")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("decoupled") / "models"
    repo.mkdir()
    copy_examples(repo, "repeat", "add_sub", "string_upper")
    write_model(repo, "stutter", STUTTER_PY, STUTTER_CONFIG)
    write_model(repo, "ticker", TICKER_PY, TICKER_CONFIG)
    write_model(repo, "waiter", WAITER_PY, waiter_config("waiter"))
    write_model(repo, "refuser", REFUSER_PY, config_pbtxt("refuser", [io("IN", "TYPE_INT32", [-1])],
                                                         [io("OUT", "TYPE_INT32", [1])]))
    with ServeProcess(repo) as srv:
        yield srv


# ---- gRPC helpers ----------------------------------------------------------------------------------
class Collector:
    """A stream callback keeping every (result, error) it is given, in arrival order."""

    def __init__(self) -> None:
        self.items: queue.Queue = queue.Queue()

    def __call__(self, result: Any, error: Any) -> None:
        self.items.put((result, error))

    def take(self, n: int, timeout: float = TIMEOUT) -> list:
        return [self.items.get(timeout=timeout) for _ in range(n)]

    def rest(self) -> list:
        """What is left (call once the stream is closed: nothing more can come)."""
        out = []
        while True:
            try:
                out.append(self.items.get_nowait())
            except queue.Empty:
                return out


@pytest.fixture
def grpc_client(server: ServeProcess):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.fixture
def stream(grpc_client):
    """An open stream on `grpc_client`; closing it at the end waits for the server to end it."""
    collector = Collector()
    grpc_client.start_stream(callback=collector)
    yield collector
    grpc_client.stop_stream()


def repeat_inputs(values: list[int], delay_ms: int | None = None) -> list:
    x = grpcclient.InferInput("IN", [len(values)], "INT32")
    x.set_data_from_numpy(np.array(values, dtype=np.int32))
    inputs = [x]
    if delay_ms is not None:
        d = grpcclient.InferInput("DELAY_MS", [1], "UINT32")
        d.set_data_from_numpy(np.array([delay_ms], dtype=np.uint32))
        inputs.append(d)
    return inputs


def params_of(result: Any) -> dict[str, Any]:
    return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in result.get_response().parameters.items()}


def scalar(result: Any, name: str) -> int:
    array = result.as_numpy(name)
    assert array is not None and array.shape == (1,), (name, array)
    return int(array[0])


def until_final(collector: Collector, request_ids: set[str], timeout: float = TIMEOUT) -> dict[str, list]:
    """With enable_empty_final_response: the (result, error) items of each request, up to and
    including its final one (an empty response with triton_final_response, or an error)."""
    got: dict[str, list] = {rid: [] for rid in request_ids}
    open_ids = set(request_ids)
    deadline = time.monotonic() + timeout
    while open_ids:
        result, error = collector.items.get(timeout=max(0.1, deadline - time.monotonic()))
        assert error is None, f"unexpected stream error: {error}"
        rid = result.get_response().id
        assert rid in open_ids, f"response for {rid!r} after its final response (or unknown id)"
        got[rid].append(result)
        if params_of(result).get(FINAL):
            open_ids.discard(rid)
    return got


# ---- gRPC streaming of a decoupled model -----------------------------------------------------------
def test_stream_repeat_with_empty_final_response(grpc_client, stream: Collector, quiet_log):
    values = [7, -3, 2**31 - 1, 0, 42]
    grpc_client.async_stream_infer("repeat", repeat_inputs(values), request_id="rep-final",
                                   enable_empty_final_response=True)
    items = stream.take(len(values) + 1)
    assert all(error is None for _, error in items), [str(e) for _, e in items if e is not None]
    results = [r for r, _ in items]
    for index, (value, result) in enumerate(zip(values, results)):
        response = result.get_response()
        assert response.id == "rep-final"
        assert response.model_name == "repeat" and response.model_version == "1"
        assert params_of(result) == {FINAL: False}
        assert scalar(result, "OUT") == value
        assert scalar(result, "IDX") == index
        assert result.as_numpy("IDX").dtype == np.uint32 and result.as_numpy("OUT").dtype == np.int32
    last = results[-1].get_response()
    assert last.id == "rep-final" and last.model_name == "repeat"
    assert params_of(results[-1]) == {FINAL: True}
    assert len(last.outputs) == 0 and len(last.raw_output_contents) == 0
    grpc_client.stop_stream()  # waits for the server to end the stream: nothing else came
    assert stream.rest() == []


def test_stream_repeat_without_empty_final_response(grpc_client, stream: Collector, quiet_log):
    values = [5, 6, 7]
    grpc_client.async_stream_infer("repeat", repeat_inputs(values), request_id="rep-plain")
    items = stream.take(len(values))
    assert all(error is None for _, error in items)
    results = [r for r, _ in items]
    assert [scalar(r, "OUT") for r in results] == values
    assert [scalar(r, "IDX") for r in results] == [0, 1, 2]
    for result in results:
        assert result.get_response().id == "rep-plain"
        assert params_of(result) == {FINAL: False}  # Triton flags every response, asked or not
    grpc_client.stop_stream()
    assert stream.rest() == [], "the final flag alone must not be sent without enable_empty_final_response"


def test_stream_repeat_empty_input_gives_only_the_final(grpc_client, stream: Collector):
    grpc_client.async_stream_infer("repeat", repeat_inputs([]), request_id="rep-empty",
                                   enable_empty_final_response=True)
    [(result, error)] = stream.take(1)
    assert error is None
    assert result.get_response().id == "rep-empty"
    assert params_of(result) == {FINAL: True} and len(result.get_response().outputs) == 0
    grpc_client.stop_stream()
    assert stream.rest() == []


def test_stream_concurrent_requests_matched_by_id(grpc_client, stream: Collector, quiet_log):
    sent = {f"c{n}": [n * 100 + i for i in range(n + 2)] for n in range(5)}
    for rid, values in sent.items():
        grpc_client.async_stream_infer("repeat", repeat_inputs(values, delay_ms=5), request_id=rid,
                                       enable_empty_final_response=True)
    got = until_final(stream, set(sent))
    for rid, values in sent.items():
        results = got[rid]
        assert len(results) == len(values) + 1
        assert [scalar(r, "OUT") for r in results[:-1]] == values
        assert [scalar(r, "IDX") for r in results[:-1]] == list(range(len(values)))
        assert [params_of(r)[FINAL] for r in results] == [False] * len(values) + [True]
    grpc_client.stop_stream()
    assert stream.rest() == []


def test_stream_concurrent_requests_without_final_flag(grpc_client, stream: Collector):
    sent = {"a": [1, 2, 3, 4], "b": [10], "c": [20, 21]}
    for rid, values in sent.items():
        grpc_client.async_stream_infer("repeat", repeat_inputs(values, delay_ms=2), request_id=rid)
    items = stream.take(sum(len(v) for v in sent.values()))
    assert all(error is None for _, error in items)
    by_id: dict[str, list] = {}
    for result, _ in items:
        by_id.setdefault(result.get_response().id, []).append(result)
    assert {rid: [scalar(r, "OUT") for r in rs] for rid, rs in by_id.items()} == sent
    assert {rid: [scalar(r, "IDX") for r in rs] for rid, rs in by_id.items()} == {
        rid: list(range(len(v))) for rid, v in sent.items()}
    grpc_client.stop_stream()
    assert stream.rest() == []


def test_stream_error_mid_stream_goes_on(grpc_client, stream: Collector):
    grpc_client.async_stream_infer("stutter", repeat_inputs([1, 2, 3]), request_id="stut",
                                   enable_empty_final_response=True)
    items = stream.take(5)
    (r0, e0), (r1, e1), (r2, e2), (r3, e3), (r4, e4) = items
    assert e0 is None and scalar(r0, "OUT") == 1 and params_of(r0) == {FINAL: False}
    assert r0.get_response().id == "stut"
    assert r1 is None and isinstance(e1, InferenceServerException)
    assert "stutter stumbled after the first response" in e1.message()
    assert e2 is None and scalar(r2, "OUT") == 2 and params_of(r2) == {FINAL: False}
    assert e3 is None and scalar(r3, "OUT") == 3 and params_of(r3) == {FINAL: False}
    assert e4 is None and params_of(r4) == {FINAL: True} and len(r4.get_response().outputs) == 0
    assert r4.get_response().id == "stut"
    # the stream is still usable for other requests
    grpc_client.async_stream_infer("repeat", repeat_inputs([9]), request_id="after-stut")
    [(result, error)] = stream.take(1)
    assert error is None and result.get_response().id == "after-stut" and scalar(result, "OUT") == 9
    grpc_client.stop_stream()
    assert stream.rest() == []


def test_stream_with_the_triton_grpc_error_header_ends_at_the_first_error(grpc_client):
    """Triton's opt-in (its header ``triton_grpc_error: true``): the first error ends the stream
    with its gRPC status and message, and the stream takes no more requests."""
    collector = Collector()
    grpc_client.start_stream(callback=collector, headers={"triton_grpc_error": "true"})
    try:
        grpc_client.async_stream_infer("stutter", repeat_inputs([1, 2, 3]), request_id="stut")
        (r0, e0), (r1, e1) = collector.take(2)
        assert e0 is None and scalar(r0, "OUT") == 1
        assert r1 is None and isinstance(e1, InferenceServerException)
        assert str(e1.status()) == "StatusCode.INTERNAL"
        assert e1.message() == "stutter stumbled after the first response"
        with pytest.raises(InferenceServerException, match="no longer in valid state"):
            grpc_client.async_stream_infer("repeat", repeat_inputs([9]))
    finally:
        grpc_client.stop_stream()
    assert collector.rest() == []  # nothing after the error: responses 2 and 3 were not sent


def test_stream_final_error_is_the_only_response(grpc_client, stream: Collector):
    """An error response carrying the final flag ends the request: no empty final follows."""
    grpc_client.async_stream_infer("stutter", repeat_inputs([1, 2]), request_id="refused",
                                   enable_empty_final_response=True, parameters={"fail_first": True})
    [(result, error)] = stream.take(1)
    assert result is None and "stutter refuses at once" in error.message()
    grpc_client.stop_stream()
    assert stream.rest() == []


@pytest.mark.parametrize("enable_final", [True, False])
def test_stream_default_mode_model_gives_one_response(grpc_client, stream: Collector, enable_final: bool):
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    b = np.array([1, 1, 1, 1], dtype=np.float32)
    inputs = []
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        tensor = grpcclient.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    grpc_client.async_stream_infer("add_sub", inputs, request_id="plain", enable_empty_final_response=enable_final)
    [(result, error)] = stream.take(1)
    assert error is None
    assert result.get_response().id == "plain"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert params_of(result) == {FINAL: True}
    grpc_client.stop_stream()
    assert stream.rest() == []


# ---- unary inference is refused -------------------------------------------------------------------
def test_grpc_unary_infer_refuses_decoupled(grpc_client):
    with pytest.raises(InferenceServerException) as info:
        grpc_client.infer("repeat", repeat_inputs([1, 2]))
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in info.value.message()


def test_http_infer_refuses_decoupled(server: ServeProcess):
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        x = httpclient.InferInput("IN", [2], "INT32")
        x.set_data_from_numpy(np.array([1, 2], dtype=np.int32))
        with pytest.raises(InferenceServerException) as info:
            client.infer("repeat", [x])
        assert info.value.status() == "501"
        assert "HTTP end point doesn't support models with decoupled transaction policy" in info.value.message()
        # the refusal leaves the model serving
        assert client.is_model_ready("repeat")
    finally:
        client.close()


# ---- HTTP generate extension ----------------------------------------------------------------------
class Reply:
    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        assert self.headers.get("content-type", "").startswith("application/json"), self.headers
        return json.loads(self.body)

    def events(self) -> list[Any]:
        """The JSON payloads of the SSE events (checks the framing on the way)."""
        assert self.headers.get("content-type") == "text/event-stream; charset=utf-8"
        text = self.body.decode("utf-8")
        if not text:
            return []
        assert text.endswith("\n\n"), text
        out = []
        for block in text[:-2].split("\n\n"):
            assert block.startswith("data: ") and "\n" not in block, block
            out.append(json.loads(block[len("data: "):]))
        return out


def post(server: ServeProcess, path: str, body: Any, *, raw: bytes | None = None) -> Reply:
    host, port = server.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    try:
        data = raw if raw is not None else json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return Reply(response.status, response.headers, response.read())
    finally:
        conn.close()


def test_generate_add_sub(server: ServeProcess):
    reply = post(server, "/v2/models/add_sub/generate", {"INPUT0": [1, 2, 3, 4], "INPUT1": [1, 1, 1, 1]})
    assert reply.status == 200, reply.body
    assert reply.json() == {"model_name": "add_sub", "model_version": "1", "OUTPUT0": [2, 3, 4, 5],
                            "OUTPUT1": [0, 1, 2, 3]}


def test_generate_with_version_in_path(server: ServeProcess):
    reply = post(server, "/v2/models/add_sub/versions/1/generate",
                 {"INPUT0": [0.5, 0, 0, 0], "INPUT1": [0.25, 0, 0, 1], "parameters": {"tag": "x"}})
    assert reply.status == 200, reply.body
    assert reply.json() == {"model_name": "add_sub", "model_version": "1", "OUTPUT0": [0.75, 0, 0, 1],
                            "OUTPUT1": [0.25, 0, 0, -1]}


def test_generate_bytes_model(server: ServeProcess):
    reply = post(server, "/v2/models/string_upper/generate", {"INPUT0": ["abc", "h\u00e9llo", ""]})
    assert reply.status == 200, reply.body
    assert reply.json() == {"model_name": "string_upper", "model_version": "1",
                            "OUTPUT0": ["ABC", "H\u00c9LLO", ""], "OUTPUT1": [3, 6, 0]}


def test_generate_bytes_scalar_gives_scalars(server: ServeProcess):
    reply = post(server, "/v2/models/string_upper/generate", {"INPUT0": "stream me"})
    assert reply.status == 200, reply.body
    assert reply.json() == {"model_name": "string_upper", "model_version": "1", "OUTPUT0": "STREAM ME",
                            "OUTPUT1": 9}


def test_generate_stream_bytes_model(server: ServeProcess):
    reply = post(server, "/v2/models/string_upper/generate_stream", {"INPUT0": "abc"})
    assert reply.status == 200, reply.body
    assert reply.events() == [{"model_name": "string_upper", "model_version": "1", "OUTPUT0": "ABC", "OUTPUT1": 3}]


def test_generate_stream_default_mode_model_is_one_event(server: ServeProcess):
    reply = post(server, "/v2/models/add_sub/generate_stream", {"INPUT0": [1, 2, 3, 4], "INPUT1": [4, 3, 2, 1]})
    assert reply.status == 200, reply.body
    assert reply.events() == [{"model_name": "add_sub", "model_version": "1", "OUTPUT0": [5, 5, 5, 5],
                               "OUTPUT1": [-3, -1, 1, 3]}]


def test_generate_stream_repeat(server: ServeProcess, quiet_log):
    values = [3, 1, 4, 1, 5]
    reply = post(server, "/v2/models/repeat/generate_stream", {"IN": values, "DELAY_MS": 1})
    assert reply.status == 200, reply.body
    assert reply.events() == [{"model_name": "repeat", "model_version": "1", "OUT": v, "IDX": i}
                              for i, v in enumerate(values)]


def test_generate_stream_repeat_scalar_input(server: ServeProcess):
    reply = post(server, "/v2/models/repeat/versions/1/generate_stream", {"IN": 8})
    assert reply.status == 200, reply.body
    assert reply.events() == [{"model_name": "repeat", "model_version": "1", "OUT": 8, "IDX": 0}]


def test_generate_stream_only_final_flag_is_empty_stream(server: ServeProcess):
    reply = post(server, "/v2/models/repeat/generate_stream", {"IN": []})
    assert reply.status == 200, reply.body
    assert reply.events() == []


def test_generate_single_response_of_decoupled_model(server: ServeProcess):
    reply = post(server, "/v2/models/repeat/generate", {"IN": [5]})
    assert reply.status == 200, reply.body
    assert reply.json() == {"model_name": "repeat", "model_version": "1", "OUT": 5, "IDX": 0}


EXACTLY_ONE = ("generate expects model to produce exactly 1 response, use generate stream for model that generates "
               "various number of responses")


def test_generate_refuses_several_responses(server: ServeProcess):
    """Triton's answer, status and all: a 200 whose body is the error."""
    reply = post(server, "/v2/models/repeat/generate", {"IN": [5, 6, 7]})
    assert reply.status == 200, reply.body
    assert reply.json() == {"error": EXACTLY_ONE}
    assert post(server, "/v2/models/repeat/generate", {"IN": []}).json() == {"error": EXACTLY_ONE}  # no response
    # the model serves on
    again = post(server, "/v2/models/repeat/generate_stream", {"IN": [1, 2]})
    assert again.status == 200 and [e["OUT"] for e in again.events()] == [1, 2]


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_generate_bad_input_type_is_400(server: ServeProcess, endpoint: str):
    reply = post(server, f"/v2/models/repeat/{endpoint}", {"IN": ["not a number"]})
    assert reply.status == 400, reply.body
    assert "IN" in reply.json()["error"]


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_generate_bytes_input_not_text_is_tritons_500(server: ServeProcess, endpoint: str):
    for value in ([1, 2], True, {"USER": "hello"}):
        reply = post(server, f"/v2/models/string_upper/{endpoint}", {"INPUT0": value})
        assert reply.status == 500, reply.body
        assert reply.json() == {
            "error": "Unable to parse JSON bytes array: attempt to access JSON non-string as string"}


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_generate_an_input_given_twice_is_refused(server: ServeProcess, endpoint: str):
    reply = post(server, f"/v2/models/string_upper/{endpoint}", None,
                 raw=b'{"INPUT0": "hello", "INPUT0": "duplicate"}')
    assert reply.status == 400, reply.body
    assert reply.json() == {"error": "[request id: <id_unknown>] input 'INPUT0' already exists in request"}


def test_generate_writes_the_outputs_before_the_model_name(server: ServeProcess):
    reply = post(server, "/v2/models/repeat/generate", {"IN": [5]})
    assert reply.body == b'{"OUT":5,"IDX":0,"model_name":"repeat","model_version":"1"}'


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_generate_wrong_element_count_is_400(server: ServeProcess, endpoint: str):
    reply = post(server, f"/v2/models/add_sub/{endpoint}", {"INPUT0": [1, 2, 3], "INPUT1": [1, 1, 1, 1]})
    assert reply.status == 400, reply.body
    assert "INPUT0" in reply.json()["error"]


@pytest.mark.parametrize("body", [
    {"IN": [1], "nested": {"a": 1}},
    {"IN": [1], "listed": [1, 2]},
    {"IN": [1], "parameters": {"k": [1]}},
    {"IN": [1], "parameters": {"k": None}},
    {"IN": [1], "parameters": "not an object"},
])
def test_generate_bad_parameters_are_400(server: ServeProcess, body: dict):
    reply = post(server, "/v2/models/repeat/generate_stream", body)
    assert reply.status == 400, reply.body
    assert "error" in reply.json()


def test_generate_body_not_an_object_is_400(server: ServeProcess):
    reply = post(server, "/v2/models/repeat/generate_stream", None, raw=b"[1, 2]")
    assert reply.status == 400, reply.body
    assert "error" in reply.json()


def test_generate_body_not_json_is_tritons_500(server: ServeProcess):
    reply = post(server, "/v2/models/repeat/generate", None, raw=b"{not json")
    assert reply.status == 500, reply.body
    assert reply.json()["error"].startswith("failed to parse the request JSON buffer: ")


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_generate_unknown_model_is_404(server: ServeProcess, endpoint: str):
    reply = post(server, f"/v2/models/no_such_model/{endpoint}", {"IN": [1]})
    assert reply.status == 404, reply.body
    assert "no_such_model" in reply.json()["error"]


def test_generate_stream_error_before_first_response_is_a_400_event(server: ServeProcess):
    """As Triton answers it: status 400, and the error as the stream's event."""
    reply = post(server, "/v2/models/stutter/generate_stream", {"IN": [1, 2], "fail_first": True})
    assert reply.status == 400, reply.body
    [event] = reply.events()
    assert set(event) == {"error"} and "stutter refuses at once" in event["error"]


def test_generate_model_error_is_plain_error(server: ServeProcess):
    reply = post(server, "/v2/models/stutter/generate", {"IN": [1], "parameters": {"fail_first": True}})
    assert reply.status == 400, reply.body
    assert "stutter refuses at once" in reply.json()["error"]


def test_generate_stream_error_after_first_response_is_an_event(server: ServeProcess):
    reply = post(server, "/v2/models/stutter/generate_stream", {"IN": [1, 2, 3]})
    assert reply.status == 200, reply.body
    events = reply.events()
    assert events[0] == {"model_name": "stutter", "model_version": "1", "OUT": 1}
    assert set(events[1]) == {"error"} and "stutter stumbled after the first response" in events[1]["error"]
    assert events[2:] == [{"model_name": "stutter", "model_version": "1", "OUT": v} for v in (2, 3)]


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_generate_error_response_of_a_default_mode_model_is_a_400(server: ServeProcess, endpoint: str):
    """As Triton answers it (its QA mock_llm_nd case): 400, the error as JSON or as the event."""
    reply = post(server, f"/v2/models/refuser/{endpoint}", {"IN": [1]})
    assert reply.status == 400, reply.body
    answer = reply.json() if endpoint == "generate" else reply.events()[0]
    assert answer == {"error": "refuser says no"}


def test_generate_error_after_first_response(server: ServeProcess):
    """A response and then an error are two answers: Triton's 'exactly 1 response' reply."""
    reply = post(server, "/v2/models/stutter/generate", {"IN": [1, 2]})
    assert reply.status == 200, reply.body
    assert reply.json() == {"error": EXACTLY_ONE}


# ---- cancellation ----------------------------------------------------------------------------------
def wait_for_file(path: Path, timeout: float = TIMEOUT) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} was not written within {timeout} s"
        time.sleep(0.05)
    return path.read_text()


def open_sse(server: ServeProcess, path: str, body: Any) -> tuple[socket.socket, bytes]:
    """Sends a generate_stream request on a raw socket and reads until its first event is in;
    returns the socket and what was read."""
    host, port = server.http_url.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=TIMEOUT)
    data = json.dumps(body).encode()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    received = b""
    while b"data: " not in received or b"\n\n" not in received.split(b"data: ", 1)[1]:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before the first event: {received!r}"
        received += chunk
    return sock, received


def test_http_disconnect_cancels_generate_stream(server: ServeProcess, tmp_path: Path, quiet_log):
    marker = tmp_path / "http-cancel"
    sock, received = open_sse(server, "/v2/models/ticker/generate_stream", {"START": 100, "marker": str(marker)})
    head = received.split(b"\r\n\r\n", 1)[0].decode()
    assert head.startswith("HTTP/1.1 200") and "text/event-stream" in head
    assert b'"N":100' in received
    sock.close()
    # the model sees is_cancelled() (long before its 30 s of ticking would end)
    assert wait_for_file(marker).startswith("cancelled after ")
    # and a following request is served normally
    reply = post(server, "/v2/models/repeat/generate_stream", {"IN": [4, 5, 6]})
    assert reply.status == 200
    assert [(e["OUT"], e["IDX"]) for e in reply.events()] == [(4, 0), (5, 1), (6, 2)]


def test_http_disconnect_mid_repeat_then_normal_request(server: ServeProcess, quiet_log):
    sock, received = open_sse(server, "/v2/models/repeat/generate_stream",
                              {"IN": list(range(1000)), "DELAY_MS": 10})
    assert b'"OUT":0' in received
    sock.close()
    reply = post(server, "/v2/models/repeat/generate_stream", {"IN": [11, 12]})
    assert reply.status == 200
    assert reply.events() == [{"model_name": "repeat", "model_version": "1", "OUT": 11, "IDX": 0},
                              {"model_name": "repeat", "model_version": "1", "OUT": 12, "IDX": 1}]
    one = post(server, "/v2/models/add_sub/generate", {"INPUT0": [1, 1, 1, 1], "INPUT1": [1, 1, 1, 1]})
    assert one.status == 200 and one.json()["OUTPUT0"] == [2, 2, 2, 2]


def ticker_inputs(start: int) -> list:
    x = grpcclient.InferInput("START", [1], "INT32")
    x.set_data_from_numpy(np.array([start], dtype=np.int32))
    return [x]


def test_grpc_stream_cancel_cancels_request(server: ServeProcess, tmp_path: Path, quiet_log):
    marker = tmp_path / "grpc-cancel"
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        collector = Collector()
        client.start_stream(callback=collector)
        client.async_stream_infer("ticker", ticker_inputs(7), request_id="tick", parameters={"marker": str(marker)})
        [(result, error)] = collector.take(1)
        assert error is None and result.get_response().id == "tick" and scalar(result, "N") == 7
        client.stop_stream(cancel_requests=True)
        assert wait_for_file(marker).startswith("cancelled after ")
        # a new stream on the same client works
        again = Collector()
        client.start_stream(callback=again)
        client.async_stream_infer("repeat", repeat_inputs([1, 2, 3]), request_id="again",
                                  enable_empty_final_response=True)
        got = until_final(again, {"again"})["again"]
        assert [scalar(r, "OUT") for r in got[:-1]] == [1, 2, 3]
        client.stop_stream()
        assert again.rest() == []
    finally:
        client.close()


def test_grpc_cancel_of_a_unary_infer_reaches_a_default_mode_model(server: ServeProcess, tmp_path: Path, quiet_log):
    """A client that cancels its ModelInfer while the model's (default-mode, synchronous)
    execute runs: the model sees ``request.is_cancelled()`` and can stop early."""
    started, cancelled = tmp_path / "started", tmp_path / "cancelled"
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        x = grpcclient.InferInput("INPUT0", [1], "INT32")
        x.set_data_from_numpy(np.array([1], dtype=np.int32))
        outcome = Collector()
        call = client.async_infer("waiter", [x], outcome, parameters={
            "wait": 30, "started": str(started), "cancelled": str(cancelled)})
        wait_for_file(started)
        call.cancel()
        [(result, error)] = outcome.take(1)
        assert result is None and "Locally cancelled by application" in str(error)
        wait_for_file(cancelled)
        # the instance is free again, and the next request runs to its end
        x.set_data_from_numpy(np.array([41], dtype=np.int32))
        out = client.infer("waiter", [x], parameters={"wait": 0})
        assert out.as_numpy("OUTPUT0").tolist() == [42]
    finally:
        client.close()


def test_grpc_stream_cancel_mid_repeat_then_normal_stream(server: ServeProcess, quiet_log):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        collector = Collector()
        client.start_stream(callback=collector)
        client.async_stream_infer("repeat", repeat_inputs(list(range(1000)), delay_ms=10), request_id="long")
        [(result, error)] = collector.take(1)
        assert error is None and result.get_response().id == "long" and scalar(result, "IDX") == 0
        client.stop_stream(cancel_requests=True)
        fresh = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            follow = Collector()
            fresh.start_stream(callback=follow)
            fresh.async_stream_infer("repeat", repeat_inputs([21, 22]), request_id="next",
                                     enable_empty_final_response=True)
            got = until_final(follow, {"next"})["next"]
            assert [(scalar(r, "OUT"), scalar(r, "IDX")) for r in got[:-1]] == [(21, 0), (22, 1)]
            fresh.stop_stream()
            assert follow.rest() == []
        finally:
            fresh.close()
    finally:
        client.close()
