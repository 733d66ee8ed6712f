"""`stubhost serve` through tritonclient, the same checks on HTTP and gRPC (every test runs on both).

Health, metadata, model config, readiness, repository index, statistics, model control refused in
the default mode, inference (every datatype, requested outputs, ids, parameters, sequences,
versions, batching, async) and the errors a client can provoke, each followed by a working request.
"""

from __future__ import annotations

import base64
import json
import queue
import threading
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from tests.host.repo_factory import wait_until
from tests.server.frontend_support import (
    DATATYPES,
    RESPONSE_PARAMETERS,
    Conn,
    build_repository,
    error_of,
    expect_status,
    proto_json,
    sample,
    stats_counts,
)
from tests.server.serve_process import ServeProcess

MODELS = ("add_sub", "string_upper", "all_types", "echo", "raiser", "versioned", "batched", "slow")
EXPLICIT_MODE_ONLY = "explicit model load / unload is not allowed if polling is enabled"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_repository(tmp_path_factory.mktemp("frontend") / "models", *MODELS)


@pytest.fixture(scope="module")
def server(repo: Path):
    with ServeProcess(repo) as srv:
        yield srv


def add_sub_inputs(conn: Conn, a: np.ndarray | None = None, b: np.ndarray | None = None) -> list:
    a = np.arange(4, dtype=np.float32) if a is None else a
    b = np.full(4, 0.5, dtype=np.float32) if b is None else b
    return [conn.input("INPUT0", a), conn.input("INPUT1", b)]


def assert_still_serving(conn: Conn) -> None:
    """After an error the server answers the next request normally."""
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    result = conn.client.infer("add_sub", add_sub_inputs(conn, a, a))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    assert conn.client.is_server_live() and conn.client.is_server_ready()


def echo_meta(result) -> dict:
    [meta] = result.as_numpy("META")
    return json.loads(meta)


# ---- health and metadata ----------------------------------------------------------------------
def test_health(conn: Conn):
    assert conn.client.is_server_live()
    assert conn.client.is_server_ready()


def extensions_of(conn: Conn) -> list[str]:
    meta = conn.client.get_server_metadata()
    if conn.protocol == "grpc":
        meta = proto_json(meta)
    return list(meta["extensions"])


def test_server_metadata(conn: Conn):
    meta = conn.client.get_server_metadata()
    if conn.protocol == "grpc":
        meta = proto_json(meta)
    assert meta["name"] == "stubhost"
    assert isinstance(meta["version"], str) and meta["version"]
    for ext in ("binary_tensor_data", "model_repository", "statistics", "system_shared_memory"):
        assert ext in meta["extensions"], meta["extensions"]
    assert len(set(meta["extensions"])) == len(meta["extensions"])


def test_extensions_list_only_what_works(conn: Conn):
    """The issue: the extensions list names `cuda_shared_memory` ... only what works. If the server
    answers every CUDA registration with "GPUs not supported", it must not advertise the extension
    (Triton built without GPU support leaves it out)."""
    handle = base64.b64encode(bytes(range(64))).decode()
    try:
        conn.client.register_cuda_shared_memory("ext_probe", handle, 0, 64)
    except Exception as e:  # noqa: BLE001 - any refusal is what is being checked
        refused = "GPUs not supported" in str(e)
    else:
        conn.client.unregister_cuda_shared_memory("ext_probe")
        refused = False
    if refused:
        assert "cuda_shared_memory" not in extensions_of(conn), (
            "server metadata lists cuda_shared_memory but CUDA registration always fails "
            "with 'GPUs not supported'")


def test_model_metadata(conn: Conn):
    meta = conn.client.get_model_metadata("add_sub")
    if conn.protocol == "grpc":
        meta = proto_json(meta)
    assert meta["name"] == "add_sub"
    assert meta["versions"] == ["1"]
    expected = [{"name": n, "datatype": "FP32", "shape": [4]} for n in ("INPUT0", "INPUT1")]
    got = [{"name": t["name"], "datatype": t["datatype"], "shape": [int(d) for d in t["shape"]]}
           for t in meta["inputs"]]
    assert got == expected
    assert [t["name"] for t in meta["outputs"]] == ["OUTPUT0", "OUTPUT1"]


def test_model_metadata_batch_dimension_and_versions(conn: Conn):
    batched = conn.client.get_model_metadata("batched")
    versioned = conn.client.get_model_metadata("versioned")
    if conn.protocol == "grpc":
        batched, versioned = proto_json(batched), proto_json(versioned)
    assert [int(d) for d in batched["inputs"][0]["shape"]] == [-1, 2]
    assert [int(d) for d in batched["outputs"][0]["shape"]] == [-1, 2]
    assert sorted(versioned["versions"]) == ["1", "2"]
    strings = conn.client.get_model_metadata("string_upper")
    if conn.protocol == "grpc":
        strings = proto_json(strings)
    assert strings["inputs"][0]["datatype"] == "BYTES"
    assert {t["name"]: t["datatype"] for t in strings["outputs"]} == {"OUTPUT0": "BYTES", "OUTPUT1": "INT32"}


def test_model_metadata_unknown_model(conn: Conn):
    error = error_of(conn.client.get_model_metadata, "no_such_model")
    assert "no_such_model" in error.message()
    expect_status(conn, error, 404, "NOT_FOUND")


@pytest.mark.parametrize("model", ["add_sub", "batched", "versioned", "string_upper"])
def test_model_config_matches_config_pbtxt(conn: Conn, repo: Path, model: str):
    expected = text_format.Parse((repo / model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    if conn.protocol == "http":
        raw = conn.client.get_model_config(model)
        for tensor in raw["input"] + raw["output"]:  # Triton writes dims as JSON numbers
            assert all(isinstance(d, int) for d in tensor["dims"]), tensor
        got = json_format.ParseDict(raw, model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
    else:
        got = conn.client.get_model_config(model).config
    assert got.name == model
    assert got.backend == "python"
    assert got.max_batch_size == expected.max_batch_size

    def tensors(entries):
        return [(t.name, t.data_type, list(t.dims), t.optional if hasattr(t, "optional") else None)
                for t in entries]

    assert tensors(got.input) == tensors(expected.input)
    assert tensors(got.output) == tensors(expected.output)
    if expected.HasField("version_policy"):
        assert got.version_policy == expected.version_policy
    for want, have in zip(expected.instance_group, got.instance_group):
        assert (have.count, have.kind) == (want.count, want.kind)


def test_model_config_unknown_model(conn: Conn):
    error = error_of(conn.client.get_model_config, "no_such_model")
    assert "no_such_model" in error.message()
    expect_status(conn, error, 404, "NOT_FOUND")


def test_model_ready(conn: Conn):
    client = conn.client
    assert client.is_model_ready("add_sub")
    assert client.is_model_ready("add_sub", "1")
    assert not client.is_model_ready("add_sub", "2")
    assert not client.is_model_ready("no_such_model")
    assert client.is_model_ready("versioned", "1") and client.is_model_ready("versioned", "2")
    assert not client.is_model_ready("versioned", "3")


def index_of(conn: Conn) -> list[dict]:
    index = conn.client.get_model_repository_index()
    if conn.protocol == "grpc":
        return proto_json(index).get("models", [])
    return index


def test_repository_index(conn: Conn):
    entries = index_of(conn)
    state = {(e["name"], e.get("version", "")): e.get("state") for e in entries}
    for model in MODELS:
        if model != "versioned":
            assert state[(model, "1")] == "READY", entries
    assert state[("versioned", "1")] == state[("versioned", "2")] == "READY"
    assert {e["name"] for e in entries} == set(MODELS)


# ---- statistics ------------------------------------------------------------------------------------
def test_statistics_count_successes_and_failures(conn: Conn):
    x = conn.input("INPUT0", np.ones(3, dtype=np.float32))
    before = stats_counts(conn, "echo")
    good, bad = 5, 3
    for _ in range(good):
        conn.client.infer("echo", [x])
    for _ in range(bad):  # answered with an error response: a success, as Triton 2.51 counts it
        error_of(conn.client.infer, "echo", [x], parameters={"fail": True})
    refused = conn.input("NOT_AN_INPUT", np.ones(3, dtype=np.float32))
    error_of(conn.client.infer, "echo", [refused])  # refused by the input checks: a failure
    success, fail, inferences, executions = stats_counts(conn, "echo")
    assert success - before[0] == good + bad
    assert fail - before[1] == 1
    assert inferences - before[2] >= good
    assert executions - before[3] >= good


def test_statistics_times(conn: Conn):
    """queue / compute durations are measured: a model that sleeps 0.2 s in execute shows at least
    that much compute_infer time."""
    def infer_ns(stats) -> int:
        if conn.protocol == "grpc":
            stats = proto_json(stats)
        entry = stats["model_stats"][0]
        return int(entry["inference_stats"].get("compute_infer", {}).get("ns", 0))

    before = infer_ns(conn.client.get_inference_statistics("slow"))
    conn.client.infer("slow", [conn.input("INPUT0", np.ones(2, dtype=np.float32))], parameters={"sleep": 0.2})
    after = conn.client.get_inference_statistics("slow")
    assert infer_ns(after) - before >= 150_000_000, after


def test_statistics_all_models_and_unknown(conn: Conn):
    stats = conn.client.get_inference_statistics()
    if conn.protocol == "grpc":
        stats = proto_json(stats)
    names = {e["name"] for e in stats["model_stats"]}
    assert set(MODELS) <= names
    error = error_of(conn.client.get_inference_statistics, "no_such_model")
    assert "no_such_model" in error.message()


# ---- model control in the default mode ---------------------------------------------------------------
def test_load_unload_refused_in_default_mode(conn: Conn):
    for call in (conn.client.load_model, conn.client.unload_model):
        error = error_of(call, "add_sub")
        assert EXPLICIT_MODE_ONLY in error.message()
        expect_status(conn, error, 503, "UNAVAILABLE")
    assert conn.client.is_model_ready("add_sub")
    assert_still_serving(conn)


# ---- inference ------------------------------------------------------------------------------------
@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize("protocol, encoding", [("http", "json"), ("http", "binary"), ("grpc", "raw")])
def test_infer_every_datatype(conns: dict[str, Conn], protocol: str, encoding: str, datatype: str):
    """Identity on every datatype: JSON and binary on HTTP, raw contents on gRPC; BYTES include
    empty, NUL-holding, long and (where the encoding allows it) non-UTF-8 elements."""
    conn = conns[protocol]
    binary = encoding != "json"
    array = sample(datatype, utf8=not binary)
    result = conn.client.infer("all_types", [conn.input(f"IN_{datatype}", array, binary=binary)],
                               outputs=[conn.output(f"OUT_{datatype}", binary=binary)])
    out = result.as_numpy(f"OUT_{datatype}")
    assert out is not None and out.shape == array.shape
    if datatype == "BYTES":
        # JSON outputs come back as str, binary and raw ones as bytes
        assert [x.encode() if isinstance(x, str) else bytes(x) for x in out.ravel()] == list(array.ravel())
    else:
        assert out.dtype == array.dtype
        np.testing.assert_array_equal(out, array)
        if array.dtype.kind == "f":  # -0.0 keeps its sign
            assert np.signbit(out[0, 2])
    response = conn.response(result)
    [entry] = response["outputs"]
    assert entry["datatype"] == datatype


def test_infer_every_datatype_in_one_request(conn: Conn):
    arrays = {dt: sample(dt) for dt in DATATYPES}
    result = conn.client.infer("all_types", [conn.input(f"IN_{dt}", a) for dt, a in arrays.items()])
    for dt, array in arrays.items():
        out = result.as_numpy(f"OUT_{dt}")
        if dt == "BYTES":
            assert list(out.ravel()) == list(array.ravel())
        else:
            np.testing.assert_array_equal(out, array)


def test_infer_empty_tensor(conn: Conn):
    array = np.zeros((0, 3), dtype=np.float32)
    result = conn.client.infer("all_types", [conn.input("IN_FP32", array)])
    assert result.as_numpy("OUT_FP32").shape == (0, 3)


def test_infer_string_model(conn: Conn):
    words = np.array([b"hello", b"stubhost", b""], dtype=object)
    result = conn.client.infer("string_upper", [conn.input("INPUT0", words)])
    assert list(result.as_numpy("OUTPUT0")) == [b"HELLO", b"STUBHOST", b""]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), [5, 8, 0])


def test_requested_outputs_subset(conn: Conn):
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 2.0, dtype=np.float32)
    result = conn.client.infer("add_sub", add_sub_inputs(conn, a, b), outputs=[conn.output("OUTPUT1")])
    assert [o["name"] for o in conn.response(result)["outputs"]] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_request_id_echoed(conn: Conn):
    x = conn.input("INPUT0", np.ones(2, dtype=np.float32))
    result = conn.client.infer("echo", [x], request_id="my-request-17")
    assert conn.response(result)["id"] == "my-request-17"
    assert echo_meta(result)["request_id"] == "my-request-17"
    result = conn.client.infer("echo", [x])
    assert conn.response(result).get("id", "") == ""


def test_request_parameters_reach_the_model(conn: Conn):
    x = conn.input("INPUT0", np.ones(2, dtype=np.float32))
    sent = {"tag": "blue", "count": 3, "flag": True}
    result = conn.client.infer("echo", [x], parameters=sent)
    params = echo_meta(result)["parameters"]
    for key, value in sent.items():
        assert params[key] == value, params
    for reserved in ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout"):
        assert reserved not in params


def test_response_parameters_come_back(conn: Conn):
    x = conn.input("INPUT0", np.ones(2, dtype=np.float32))
    result = conn.client.infer("echo", [x], parameters={"tag": "red"})
    assert conn.response_parameters(result) == {**RESPONSE_PARAMETERS, "echo": "red"}


@pytest.mark.parametrize("sequence_id, start, end, flags", [
    (42, True, False, 1), (42, False, False, 0), (42, False, True, 2), (7, True, True, 3),
    ("session-a", True, False, 1), (2**40 + 5, False, True, 2)])
def test_sequence_controls(conn: Conn, sequence_id, start, end, flags):
    x = conn.input("INPUT0", np.ones(2, dtype=np.float32))
    result = conn.client.infer("echo", [x], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    meta = echo_meta(result)
    assert meta["correlation_id"] == sequence_id
    assert meta["flags"] == flags


def test_no_sequence(conn: Conn):
    result = conn.client.infer("echo", [conn.input("INPUT0", np.ones(2, dtype=np.float32))])
    meta = echo_meta(result)
    assert (meta["correlation_id"], meta["flags"]) == (0, 0)


def test_model_versions(conn: Conn):
    x = np.zeros(2, dtype=np.float32)
    for version, offset in (("1", 1.0), ("2", 2.0), ("", 2.0)):
        result = conn.client.infer("versioned", [conn.input("INPUT0", x)], model_version=version)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + offset)
        assert conn.response(result)["model_version"] == (version or "2")
    error = error_of(conn.client.infer, "versioned", [conn.input("INPUT0", x)], model_version="3")
    assert "versioned" in error.message()
    assert_still_serving(conn)


def test_batched_model(conn: Conn):
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    result = conn.client.infer("batched", [conn.input("INPUT0", x)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    too_big = np.zeros((9, 2), dtype=np.float32)
    error = error_of(conn.client.infer, "batched", [conn.input("INPUT0", too_big)])
    assert "batch-size must be <= 8" in error.message()
    expect_status(conn, error, 400, "INVALID_ARGUMENT")


def test_async_infer(server: ServeProcess, conn: Conn):
    values = [np.full(4, float(i), dtype=np.float32) for i in range(8)]
    ones = np.ones(4, dtype=np.float32)
    if conn.protocol == "http":
        client = conn.mod.InferenceServerClient(server.http_url, concurrency=4)
        try:
            pending = [client.async_infer("add_sub", add_sub_inputs(conn, v, ones), request_id=str(i))
                       for i, v in enumerate(values)]
            results = [p.get_result() for p in pending]
        finally:
            client.close()
    else:
        done: queue.Queue = queue.Queue()
        for i, v in enumerate(values):
            conn.client.async_infer("add_sub", add_sub_inputs(conn, v, ones),
                                    partial(lambda i, result, error: done.put((i, result, error)), i),
                                    request_id=str(i))
        got = sorted((done.get(timeout=30) for _ in values), key=lambda t: t[0])
        assert all(error is None for _, _, error in got), got
        results = [result for _, result, _ in got]
    for i, (v, result) in enumerate(zip(values, results)):
        assert conn.response(result)["id"] == str(i)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), v + 1)


def test_async_infer_error(server: ServeProcess, conn: Conn):
    x = conn.input("INPUT0", np.ones(2, dtype=np.float32))
    if conn.protocol == "http":
        with pytest.raises(Exception, match="Failed to process the request"):
            conn.client.async_infer("raiser", [x]).get_result()
    else:
        done: queue.Queue = queue.Queue()
        conn.client.async_infer("raiser", [x], lambda result, error: done.put((result, error)))
        result, error = done.get(timeout=30)
        assert result is None and "Failed to process the request" in error.message()
    assert_still_serving(conn)


# ---- errors ---------------------------------------------------------------------------------------
def test_unknown_model(conn: Conn):
    error = error_of(conn.client.infer, "no_such_model", add_sub_inputs(conn))
    assert "no_such_model" in error.message()
    expect_status(conn, error, 404, "NOT_FOUND")
    assert_still_serving(conn)


def test_wrong_datatype(conn: Conn):
    a = np.arange(4, dtype=np.int32)
    error = error_of(conn.client.infer, "add_sub", [conn.input("INPUT0", a), conn.input("INPUT1", a)])
    assert "INPUT0" in error.message() and "data-type" in error.message() and "FP32" in error.message()
    expect_status(conn, error, 400, "INVALID_ARGUMENT")
    assert_still_serving(conn)


def test_wrong_shape(conn: Conn):
    a = np.arange(5, dtype=np.float32)
    error = error_of(conn.client.infer, "add_sub", [conn.input("INPUT0", a), conn.input("INPUT1", a)])
    assert "unexpected shape for input 'INPUT0' for model 'add_sub'" in error.message()
    expect_status(conn, error, 400, "INVALID_ARGUMENT")
    assert_still_serving(conn)


def test_missing_input(conn: Conn):
    error = error_of(conn.client.infer, "add_sub", add_sub_inputs(conn)[:1])
    assert "missing required input(s) ['INPUT1']" in error.message()
    expect_status(conn, error, 400, "INVALID_ARGUMENT")
    assert_still_serving(conn)


def test_unknown_input(conn: Conn):
    extra = conn.input("INPUT2", np.ones(4, dtype=np.float32))
    error = error_of(conn.client.infer, "add_sub", [add_sub_inputs(conn)[0], extra])
    assert "unexpected inference input 'INPUT2' for model 'add_sub'" in error.message()
    error = error_of(conn.client.infer, "add_sub", [*add_sub_inputs(conn), extra])
    assert "expected 2 inputs but got 3 inputs for model 'add_sub'" in error.message()
    expect_status(conn, error, 400, "INVALID_ARGUMENT")
    assert_still_serving(conn)


def test_unknown_output(conn: Conn):
    error = error_of(conn.client.infer, "add_sub", add_sub_inputs(conn), outputs=[conn.output("OUTPUT9")])
    assert "unexpected inference output 'OUTPUT9' for model 'add_sub'" in error.message()
    expect_status(conn, error, 400, "INVALID_ARGUMENT")
    assert_still_serving(conn)


def test_model_that_raises(conn: Conn):
    error = error_of(conn.client.infer, "raiser", [conn.input("INPUT0", np.ones(2, dtype=np.float32))])
    assert "Failed to process the request(s) for model" in error.message()
    assert "raiser always raises" in error.message()
    expect_status(conn, error, 500, "INTERNAL")
    assert conn.client.is_model_ready("raiser")
    assert_still_serving(conn)


def test_model_error_response(conn: Conn):
    x = conn.input("INPUT0", np.ones(2, dtype=np.float32))
    error = error_of(conn.client.infer, "echo", [x], parameters={"fail": True})
    assert "echo was asked to fail" in error.message()
    expect_status(conn, error, 400, "INVALID_ARGUMENT")
    assert_still_serving(conn)


def test_unknown_version(conn: Conn):
    for call in (conn.client.get_model_metadata, conn.client.get_model_config, conn.client.get_inference_statistics):
        error = error_of(call, "versioned", "3")
        assert "versioned" in error.message() and "3" in error.message()
        expect_status(conn, error, 404, "NOT_FOUND")


def test_request_timeout_does_not_kill_the_instance(conn: Conn, server: ServeProcess, tmp_path: Path):
    """The `timeout` request parameter is, in Triton, only respected by models with dynamic batching
    (tritonclient's docs), which `slow` has not: a slow request carrying a short timeout must not
    restart the model instance, nor fail another client's request queued behind it."""
    x = np.ones(2, np.float32)
    pid = conn.client.infer("slow", [conn.input("INPUT0", x)]).as_numpy("PID")[0]
    started = tmp_path / "started"
    timed, other = Conn.open(conn.protocol, server), Conn.open(conn.protocol, server)
    outcome: dict = {}

    def run(name: str, c: Conn, **kw) -> None:
        try:
            outcome[name] = c.client.infer("slow", [c.input("INPUT0", x)], **kw)
        except BaseException as e:  # noqa: BLE001 - reported below
            outcome[name] = e

    with_timeout = threading.Thread(target=run, args=("timed", timed),
                                    kwargs={"parameters": {"sleep": 0.4, "touch": str(started)}, "timeout": 50_000})
    queued = threading.Thread(target=run, args=("other", other))
    with_timeout.start()
    try:
        assert wait_until(started.exists, 30), "the request with a timeout never started"
        queued.start()
        queued.join(30)
        with_timeout.join(30)
    finally:
        timed.close()
        other.close()
    assert not isinstance(outcome["other"], BaseException), f"another client's request failed: {outcome['other']}"
    after = conn.client.infer("slow", [conn.input("INPUT0", x)]).as_numpy("PID")[0]
    assert after == pid, f"the model instance was restarted (timed request: {outcome['timed']})"
