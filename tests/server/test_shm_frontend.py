"""System shared memory through `stubhost serve`, driven by tritonclient.utils.shared_memory.

Register (HTTP and gRPC), status (all and by name), inputs read from regions and outputs written
into them (with offsets, also on top of a registration offset), unregister by name and all, and
the errors: windows outside a region, unknown regions, outputs that do not fit, duplicate names,
stubhost's own pool segments (refused without naming them), CUDA registration without a GPU, and
a region unregistered while a slow request uses it. Every test destroys the regions it made.
"""

from __future__ import annotations

import base64
import http.client
import itertools
import json
import os
import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from tests.server.frontend_support import (
    Conn,
    build_repository,
    error_of,
    expect_status,
    proto_json,
)
from tests.server.serve_process import ServeProcess

MODELS = ("add_sub", "string_upper", "slow")
KEY_PREFIX = f"fe_shm_{os.getpid()}_"
_counter = itertools.count()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = build_repository(tmp_path_factory.mktemp("shm") / "models", *MODELS)
    with ServeProcess(repo) as srv:
        yield srv


class Regions:
    """Client regions made by one test; all unregistered and destroyed when it ends."""

    def __init__(self, conns: dict[str, Conn]) -> None:
        self.conns = conns
        self.handles: list[Any] = []

    def create(self, name: str, byte_size: int) -> tuple[Any, str]:
        """A new POSIX shm object of `byte_size` bytes; returns (handle, key)."""
        key = f"/{KEY_PREFIX}{next(_counter)}"
        handle = shm.create_shared_memory_region(name, key, byte_size, create_only=True)
        self.handles.append(handle)
        return handle, key

    def close(self) -> None:
        errors = []
        for c in self.conns.values():
            try:
                c.client.unregister_system_shared_memory()
            except InferenceServerException as e:
                errors.append(e)
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)
        left = [n for n in os.listdir("/dev/shm") if n.startswith(KEY_PREFIX)]
        for name in left:
            os.unlink(os.path.join("/dev/shm", name))
        assert not errors, errors
        assert not left, f"regions left in /dev/shm: {left}"


@pytest.fixture
def regions(conns: dict[str, Conn]) -> Iterator[Regions]:
    r = Regions(conns)
    yield r
    r.close()


def status(conn: Conn, name: str = "") -> dict[str, tuple[str, int, int]]:
    """{region name: (key, offset, byte_size)} as the server reports it."""
    answer = conn.client.get_system_shared_memory_status(name)
    if conn.protocol == "http":
        entries = answer
    else:
        entries = list(proto_json(answer).get("regions", {}).values())
    return {e["name"]: (e["key"], int(e.get("offset", 0)), int(e["byte_size"])) for e in entries}


def shm_input(conn: Conn, name: str, shape: list[int], datatype: str, region: str, byte_size: int,
              offset: int = 0) -> Any:
    tensor = conn.mod.InferInput(name, shape, datatype)
    tensor.set_shared_memory(region, byte_size, offset)
    return tensor


def shm_output(conn: Conn, name: str, region: str, byte_size: int, offset: int = 0) -> Any:
    out = conn.mod.InferRequestedOutput(name)
    out.set_shared_memory(region, byte_size, offset)
    return out


def assert_no_data(conn: Conn, result: Any, name: str) -> None:
    """An output written to shared memory comes back without data."""
    if conn.protocol == "http":
        out = result.get_output(name)
        assert out is not None and "data" not in out
        assert "binary_data_size" not in out.get("parameters", {})
    else:
        response = result.get_response()
        index = [o.name for o in response.outputs].index(name)
        out = response.outputs[index]
        assert not any(getattr(out.contents, f) for f in ("fp32_contents", "bytes_contents", "int_contents"))
        if index < len(response.raw_output_contents):
            assert response.raw_output_contents[index] == b""


def add_sub_arrays() -> tuple[np.ndarray, np.ndarray]:
    return np.arange(4, dtype=np.float32), np.array([10, 20, 30, 40], dtype=np.float32)


# ---- registration and status ----------------------------------------------------------------------
def test_register_and_status(conn: Conn, conns: dict[str, Conn], regions: Regions):
    _, key_a = regions.create("reg_a", 64)
    _, key_b = regions.create("reg_b", 128)
    conn.client.register_system_shared_memory("reg_a", key_a, 64)
    conn.client.register_system_shared_memory("reg_b", key_b, 32, offset=16)
    assert status(conn) == {"reg_a": (key_a, 0, 64), "reg_b": (key_b, 16, 32)}
    assert status(conn, "reg_b") == {"reg_b": (key_b, 16, 32)}
    other = conns["grpc" if conn.protocol == "http" else "http"]
    assert status(other) == status(conn)  # one registry behind both front ends


def test_status_of_unknown_region(conn: Conn):
    error = error_of(conn.client.get_system_shared_memory_status, "no_such_region")
    assert "no_such_region" in error.message()
    expect_status(conn, error, 404, "NOT_FOUND")


def test_unregister_by_name_and_all(conn: Conn, regions: Regions):
    for name in ("un_a", "un_b", "un_c"):
        _, key = regions.create(name, 64)
        conn.client.register_system_shared_memory(name, key, 64)
    conn.client.unregister_system_shared_memory("un_b")
    assert set(status(conn)) == {"un_a", "un_c"}
    error = error_of(conn.client.get_system_shared_memory_status, "un_b")
    expect_status(conn, error, 404, "NOT_FOUND")
    conn.client.unregister_system_shared_memory("never_registered")  # a no-op, as in Triton
    conn.client.unregister_system_shared_memory()
    assert status(conn) == {}


def test_register_same_name_twice(conn: Conn, regions: Regions):
    _, key = regions.create("twice", 64)
    _, other_key = regions.create("twice_other", 64)
    conn.client.register_system_shared_memory("twice", key, 64)
    error = error_of(conn.client.register_system_shared_memory, "twice", other_key, 64)
    assert "twice" in error.message() and "already" in error.message()
    expect_status(conn, error, 400, "ALREADY_EXISTS")
    assert status(conn, "twice") == {"twice": (key, 0, 64)}


@pytest.mark.parametrize("offset, byte_size", [(0, 128), (60, 8), (64, 1), (0, 0), (2**63, 8)])
def test_register_outside_the_object(conn: Conn, regions: Regions, offset: int, byte_size: int):
    _, key = regions.create("outside", 64)
    error = error_of(conn.client.register_system_shared_memory, "outside", key, byte_size, offset=offset)
    assert "outside" in error.message()
    assert status(conn) == {}


def test_register_missing_key(conn: Conn):
    error = error_of(conn.client.register_system_shared_memory, "missing", f"/{KEY_PREFIX}does_not_exist", 64)
    assert status(conn) == {}
    assert error.message()


@pytest.mark.parametrize("key", ["", "a/b", "/../../etc/hostname", "/dev/shm/../../etc/hostname", "nul\x00key"])
def test_register_bad_keys(conn: Conn, key: str):
    error = error_of(conn.client.register_system_shared_memory, "bad_key", key, 8)
    assert error.message()
    assert status(conn) == {}


@pytest.mark.parametrize("offset, byte_size", [(0, 2**64 + 8), (2**64, 8), (2**64 - 1, 2**64 - 1), (-1, 8)])
def test_register_huge_values_over_http(conns: dict[str, Conn], regions: Regions, offset: int, byte_size: int):
    """Sizes and offsets beyond uint64, or negative, are refused (tritonclient.http sends them as
    JSON numbers as given)."""
    conn = conns["http"]
    _, key = regions.create("huge", 64)
    error = error_of(conn.client.register_system_shared_memory, "huge", key, byte_size, offset=offset)
    assert error.status() == "400" and "huge" in error.message()
    assert status(conn) == {}


# ---- stubhost's own segments ---------------------------------------------------------------------
def test_pool_segment_cannot_be_registered(conn: Conn, server: ServeProcess):
    segments = sorted(server.segments())
    assert segments, "the server should have pool segments in /dev/shm"
    pid = str(server.proc.pid)
    for segment in segments[:3]:
        for key in (f"/{segment}", segment, f"//{segment}"):
            error = error_of(conn.client.register_system_shared_memory, "pool", key, 64)
            assert segment not in error.message() and f"stubhost_{pid}" not in error.message(), error.message()
    assert status(conn) == {}


def test_hard_link_to_pool_segment_cannot_be_registered(conn: Conn, server: ServeProcess):
    segment = sorted(server.segments())[0]
    link = f"{KEY_PREFIX}link"
    try:
        os.link(os.path.join("/dev/shm", segment), os.path.join("/dev/shm", link))
    except OSError as e:
        pytest.fail(f"cannot make the hard link this check needs: {e}")
    try:
        error = error_of(conn.client.register_system_shared_memory, "linked", f"/{link}", 64)
        assert segment not in error.message()
        assert status(conn) == {}
    finally:
        os.unlink(os.path.join("/dev/shm", link))


def test_error_messages_never_name_pool_segments(conn: Conn, server: ServeProcess, regions: Regions):
    """No status or error the shared-memory API gives out names a segment of the server's pool."""
    handle, key = regions.create("quiet", 64)
    conn.client.register_system_shared_memory("quiet", key, 64)
    texts = [json.dumps(status(conn))]
    for call in (lambda: conn.client.get_system_shared_memory_status("nope"),
                 lambda: conn.client.register_system_shared_memory("quiet", key, 64),
                 lambda: conn.client.infer("add_sub", [shm_input(conn, "INPUT0", [4], "FP32", "quiet", 16, 60),
                                                       shm_input(conn, "INPUT1", [4], "FP32", "quiet", 16)])):
        with pytest.raises(InferenceServerException) as info:
            call()
        texts.append(info.value.message())
    pid = str(server.proc.pid)
    for text in texts:
        assert f"stubhost_{pid}" not in text, text


# ---- inference ------------------------------------------------------------------------------------
def test_inputs_and_outputs_in_shm_with_offsets(conn: Conn, regions: Regions):
    a, b = add_sub_arrays()
    in_handle, in_key = regions.create("io_in", 128)
    out_handle, out_key = regions.create("io_out", 128)
    shm.set_shared_memory_region(in_handle, [a], offset=16)
    shm.set_shared_memory_region(in_handle, [b], offset=64)
    conn.client.register_system_shared_memory("io_in", in_key, 128)
    conn.client.register_system_shared_memory("io_out", out_key, 128)
    result = conn.client.infer(
        "add_sub",
        [shm_input(conn, "INPUT0", [4], "FP32", "io_in", 16, 16), shm_input(conn, "INPUT1", [4], "FP32", "io_in", 16, 64)],
        outputs=[shm_output(conn, "OUTPUT0", "io_out", 16, 0), shm_output(conn, "OUTPUT1", "io_out", 16, 48)])
    assert_no_data(conn, result, "OUTPUT0")
    assert_no_data(conn, result, "OUTPUT1")
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [4], offset=0), a + b)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [4], offset=48), a - b)
    # the output's shape and datatype are still reported
    names = [o["name"] for o in conn.response(result)["outputs"]]
    assert names == ["OUTPUT0", "OUTPUT1"]


def test_registration_offset_adds_to_request_offset(conn: Conn, regions: Regions):
    a, b = add_sub_arrays()
    in_handle, in_key = regions.create("off_in", 256)
    out_handle, out_key = regions.create("off_out", 256)
    shm.set_shared_memory_region(in_handle, [a, b], offset=100 + 8)  # registered at 100, asked at 8
    conn.client.register_system_shared_memory("off_in", in_key, 64, offset=100)
    conn.client.register_system_shared_memory("off_out", out_key, 64, offset=128)
    conn.client.infer("add_sub", [shm_input(conn, "INPUT0", [4], "FP32", "off_in", 16, 8),
                                  shm_input(conn, "INPUT1", [4], "FP32", "off_in", 16, 24)],
                      outputs=[shm_output(conn, "OUTPUT0", "off_out", 16, 32)])
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [4], offset=128 + 32), a + b)


def test_shm_mixed_with_regular_tensors(conn: Conn, regions: Regions):
    a, b = add_sub_arrays()
    in_handle, in_key = regions.create("mix_in", 64)
    out_handle, out_key = regions.create("mix_out", 64)
    shm.set_shared_memory_region(in_handle, [a])
    conn.client.register_system_shared_memory("mix_in", in_key, 64)
    conn.client.register_system_shared_memory("mix_out", out_key, 64)
    result = conn.client.infer("add_sub", [shm_input(conn, "INPUT0", [4], "FP32", "mix_in", 16), conn.input("INPUT1", b)],
                               outputs=[shm_output(conn, "OUTPUT0", "mix_out", 16), conn.output("OUTPUT1")])
    assert_no_data(conn, result, "OUTPUT0")
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [4]), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_bytes_in_shm(conn: Conn, regions: Regions):
    words = np.array([b"alpha", b"", "h\u00e9".encode()], dtype=object)
    serialized = serialize_byte_tensor(words)
    size = len(serialized.item())
    in_handle, in_key = regions.create("str_in", 64)
    out_handle, out_key = regions.create("str_out", 64)
    shm.set_shared_memory_region(in_handle, [serialized], offset=8)
    conn.client.register_system_shared_memory("str_in", in_key, 64)
    conn.client.register_system_shared_memory("str_out", out_key, 64)
    result = conn.client.infer("string_upper", [shm_input(conn, "INPUT0", [3], "BYTES", "str_in", size, 8)],
                               outputs=[shm_output(conn, "OUTPUT0", "str_out", 64), conn.output("OUTPUT1")])
    assert_no_data(conn, result, "OUTPUT0")
    upper = shm.get_contents_as_numpy(out_handle, np.object_, [3])
    assert list(upper) == [b"ALPHA", b"", "H\u00c9".encode()]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), [5, 0, 3])


def test_region_contents_are_read_at_each_request(conn: Conn, regions: Regions):
    """The server reads the region when the request runs: new contents, and a name registered
    again over another object, are seen by the next request (no stale mapping or copy)."""
    ones = np.ones(4, dtype=np.float32)
    handle, key = regions.create("again", 64)
    out_handle, out_key = regions.create("again_out", 64)
    conn.client.register_system_shared_memory("again", key, 64)
    conn.client.register_system_shared_memory("again_out", out_key, 64)
    inputs = [shm_input(conn, "INPUT0", [4], "FP32", "again", 16), conn.input("INPUT1", ones)]
    outputs = [shm_output(conn, "OUTPUT0", "again_out", 16)]
    for value in (1.0, 5.0, 9.0):
        shm.set_shared_memory_region(handle, [np.full(4, value, dtype=np.float32)])
        conn.client.infer("add_sub", inputs, outputs=outputs)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [4]), value + 1)
    conn.client.unregister_system_shared_memory("again")
    other, other_key = regions.create("again_2", 64)
    shm.set_shared_memory_region(other, [np.full(4, 100.0, dtype=np.float32)])
    conn.client.register_system_shared_memory("again", other_key, 64)
    conn.client.infer("add_sub", inputs, outputs=outputs)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [4]), 101.0)


def test_many_requests_over_one_region(conn: Conn, regions: Regions):
    handle, key = regions.create("many", 4096)
    out_handle, out_key = regions.create("many_out", 4096)
    conn.client.register_system_shared_memory("many", key, 4096)
    conn.client.register_system_shared_memory("many_out", out_key, 4096)
    ones = np.ones(4, dtype=np.float32)
    for i in range(50):
        offset = (i * 32) % 4000
        shm.set_shared_memory_region(handle, [np.full(4, float(i), dtype=np.float32)], offset=offset)
        conn.client.infer("add_sub", [shm_input(conn, "INPUT0", [4], "FP32", "many", 16, offset), conn.input("INPUT1", ones)],
                          outputs=[shm_output(conn, "OUTPUT0", "many_out", 16, offset)])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [4], offset=offset), i + 1.0)


# ---- errors in requests ------------------------------------------------------------------------------
@pytest.mark.parametrize("offset, byte_size, fragment", [
    (56, 16, "Invalid offset + byte size for shared memory region: 'win'"),
    (64, 16, "Invalid offset for shared memory region: 'win'"),
    (1000, 16, "Invalid offset for shared memory region: 'win'"),
    (2**62, 2**62, "Invalid offset for shared memory region: 'win'"),
    (8, 2**62, "Invalid offset + byte size for shared memory region: 'win'"),
])
def test_input_window_outside_region(conn: Conn, regions: Regions, offset: int, byte_size: int, fragment: str):
    _, key = regions.create("win", 64)
    conn.client.register_system_shared_memory("win", key, 64)
    inputs = [shm_input(conn, "INPUT0", [4], "FP32", "win", byte_size, offset),
              shm_input(conn, "INPUT1", [4], "FP32", "win", 16)]
    error = error_of(conn.client.infer, "add_sub", inputs)
    assert fragment in error.message()
    expect_status(conn, error, 400, "INVALID_ARGUMENT")


@pytest.mark.parametrize("offset, byte_size", [(2**64 - 8, 16), (8, 2**64 - 1), (2**64 - 1, 2**64 - 1)])
def test_window_near_uint64_max_over_http(conns: dict[str, Conn], regions: Regions, offset: int, byte_size: int):
    """offset + byte_size past 2**64 must not wrap around (tritonclient.http sends JSON uint64s;
    tritonclient.grpc cannot send values above int64)."""
    conn = conns["http"]
    _, key = regions.create("wrap", 64)
    conn.client.register_system_shared_memory("wrap", key, 64)
    inputs = [shm_input(conn, "INPUT0", [4], "FP32", "wrap", byte_size, offset),
              shm_input(conn, "INPUT1", [4], "FP32", "wrap", 16)]
    error = error_of(conn.client.infer, "add_sub", inputs)
    assert "'wrap'" in error.message()
    assert error.status() == "400"


def test_input_byte_size_does_not_match_shape(conn: Conn, regions: Regions):
    _, key = regions.create("short", 64)
    conn.client.register_system_shared_memory("short", key, 64)
    inputs = [shm_input(conn, "INPUT0", [4], "FP32", "short", 12), shm_input(conn, "INPUT1", [4], "FP32", "short", 16)]
    error = error_of(conn.client.infer, "add_sub", inputs)
    assert "INPUT0" in error.message()
    expect_status(conn, error, 400, "INVALID_ARGUMENT")


def test_unknown_region_in_request(conn: Conn, regions: Regions):
    a, b = add_sub_arrays()
    error = error_of(conn.client.infer, "add_sub", [shm_input(conn, "INPUT0", [4], "FP32", "no_such_region", 16),
                                                    conn.input("INPUT1", b)])
    assert "Unable to find shared memory region: 'no_such_region'" in error.message()
    _, key = regions.create("present", 64)
    conn.client.register_system_shared_memory("present", key, 64)
    error = error_of(conn.client.infer, "add_sub", [conn.input("INPUT0", a), conn.input("INPUT1", b)],
                     outputs=[shm_output(conn, "OUTPUT0", "no_such_out", 16)])
    assert "no_such_out" in error.message()


def test_region_too_small_for_output(conn: Conn, regions: Regions):
    a, b = add_sub_arrays()
    _, key = regions.create("small_out", 64)
    conn.client.register_system_shared_memory("small_out", key, 64)
    error = error_of(conn.client.infer, "add_sub", [conn.input("INPUT0", a), conn.input("INPUT1", b)],
                     outputs=[shm_output(conn, "OUTPUT0", "small_out", 8)])
    assert ("shared memory size specified with the request for output 'OUTPUT0' (8 bytes) should be at least "
            "16 bytes to hold the results") in error.message()
    # ... and the region can be used properly right after
    out_handle = regions.handles[-1]
    conn.client.infer("add_sub", [conn.input("INPUT0", a), conn.input("INPUT1", b)],
                      outputs=[shm_output(conn, "OUTPUT0", "small_out", 16)])
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [4]), a + b)


def test_input_with_data_and_shm_over_http(server: ServeProcess, regions: Regions, conns: dict[str, Conn]):
    _, key = regions.create("both", 64)
    conns["http"].client.register_system_shared_memory("both", key, 64)
    host, port = server.http_url.rsplit(":", 1)
    cases = [
        ({"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4],
          "parameters": {"shared_memory_region": "both", "shared_memory_byte_size": 16}}, "only one"),
        ({"name": "INPUT0", "datatype": "FP32", "shape": [4],
          "parameters": {"shared_memory_region": "both"}}, "shared_memory_byte_size"),
        ({"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4],
          "parameters": {"shared_memory_byte_size": 16}}, "shared_memory_region"),
    ]
    for tensor, fragment in cases:
        body = json.dumps({"inputs": [tensor, {"name": "INPUT1", "datatype": "FP32", "shape": [4],
                                               "data": [1, 2, 3, 4]}]})
        c = http.client.HTTPConnection(host, int(port), timeout=30)
        try:
            c.request("POST", "/v2/models/add_sub/infer", body)
            response = c.getresponse()
            doc = json.loads(response.read())
        finally:
            c.close()
        assert response.status == 400
        assert fragment in doc["error"], doc


def test_cuda_register_without_gpu(conn: Conn):
    """CUDA registration of a handle the server cannot open fails with a clear error naming the
    region, and nothing is registered (without a GPU: because there is none)."""
    handle = base64.b64encode(bytes(64)).decode()
    error = error_of(conn.client.register_cuda_shared_memory, "cuda_region", handle, 0, 64)
    assert "cuda_region" in error.message()
    if not Path("/dev/nvidiactl").exists():
        assert "GPU" in error.message() or "CUDA" in error.message(), error.message()
    status_answer = conn.client.get_cuda_shared_memory_status()
    regions = status_answer if conn.protocol == "http" else list(proto_json(status_answer).get("regions", {}))
    assert not regions
    error = error_of(conn.client.get_cuda_shared_memory_status, "cuda_region")
    expect_status(conn, error, 404, "NOT_FOUND")


def test_names_shared_between_system_and_cuda(conn: Conn, regions: Regions):
    _, key = regions.create("shared_name", 64)
    conn.client.register_system_shared_memory("shared_name", key, 64)
    error = error_of(conn.client.get_cuda_shared_memory_status, "shared_name")
    assert "shared_name" in error.message()
    conn.client.unregister_cuda_shared_memory("shared_name")  # not a CUDA region: nothing happens
    assert "shared_name" in status(conn)


# ---- in-flight safety -------------------------------------------------------------------------------
def test_unregister_while_a_slow_request_uses_the_region(server: ServeProcess, conn: Conn, regions: Regions,
                                                         tmp_path: Path):
    x = np.array([1.5, 2.5, 3.5], dtype=np.float32)
    in_handle, in_key = regions.create("busy_in", 64)
    out_handle, out_key = regions.create("busy_out", 64)
    shm.set_shared_memory_region(in_handle, [x])
    conn.client.register_system_shared_memory("busy_in", in_key, 64)
    conn.client.register_system_shared_memory("busy_out", out_key, 64)
    started = tmp_path / "started"
    done: queue.Queue = queue.Queue()
    inputs = [shm_input(conn, "INPUT0", [3], "FP32", "busy_in", 12)]
    outputs = [shm_output(conn, "OUTPUT0", "busy_out", 12), conn.output("PID")]
    params = {"sleep": 0.5, "touch": str(started)}
    if conn.protocol == "http":
        # a client of its own, so that the unregister calls below do not queue behind the request
        client = conn.mod.InferenceServerClient(server.http_url, concurrency=2)
        pending = client.async_infer("slow", inputs, outputs=outputs, parameters=params)
    else:
        conn.client.async_infer("slow", inputs, lambda result, error: done.put((result, error)), outputs=outputs,
                                parameters=params)
    deadline = time.monotonic() + 30
    while not started.exists():
        assert time.monotonic() < deadline, "the slow request never started"
        time.sleep(0.01)
    conn.client.unregister_system_shared_memory("busy_in")
    conn.client.unregister_system_shared_memory("busy_out")
    if conn.protocol == "http":
        result = pending.get_result()
        client.close()
    else:
        result, error = done.get(timeout=30)
        assert error is None, error
    assert_no_data(conn, result, "OUTPUT0")
    np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [3]), x)
    assert result.as_numpy("PID") is not None
    assert "busy_in" not in status(conn)
    # the server goes on serving and the names can be registered again
    conn.client.register_system_shared_memory("busy_in", in_key, 64)
    assert "busy_in" in status(conn)


# ---- CUDA shared memory, where a GPU exists -------------------------------------------------------------
@pytest.fixture
def cuda_regions() -> Iterator[tuple[Any, list]]:
    """tritonclient's CUDA shared-memory helpers and a list of their regions (destroyed at the end);
    the tests using it need a CUDA device, which only GPU machines have."""
    try:
        import tritonclient.utils.cuda_shared_memory as cudashm
    except ImportError as e:  # the helpers need cuda-python, an optional extra of tritonclient
        pytest.skip(f"needs tritonclient's CUDA helpers (pip install 'tritonclient[cuda]'): {e}")
    # On a GPU machine with the helpers, a failure here is a real failure, not a skip.
    probe = cudashm.create_shared_memory_region("probe", 64, 0)
    cudashm.destroy_shared_memory_region(probe)
    made: list = []
    yield cudashm, made
    for handle in made:
        cudashm.destroy_shared_memory_region(handle)


@pytest.mark.gpu
def test_cuda_inputs_and_outputs(conn: Conn, cuda_regions):
    """With a GPU, CUDA regions register and carry inputs and outputs (ARCHITECTURE §4)."""
    cudashm, made = cuda_regions
    a, b = add_sub_arrays()
    in_handle = cudashm.create_shared_memory_region("cuda_in", 32, 0)
    out_handle = cudashm.create_shared_memory_region("cuda_out", 32, 0)
    made += [in_handle, out_handle]
    cudashm.set_shared_memory_region(in_handle, [a, b])
    try:
        conn.client.register_cuda_shared_memory("cuda_in", cudashm.get_raw_handle(in_handle), 0, 32)
        conn.client.register_cuda_shared_memory("cuda_out", cudashm.get_raw_handle(out_handle), 0, 32)
        assert {"cuda_in", "cuda_out"} <= set(
            [r["name"] for r in conn.client.get_cuda_shared_memory_status()] if conn.protocol == "http"
            else proto_json(conn.client.get_cuda_shared_memory_status()).get("regions", {}))
        result = conn.client.infer(
            "add_sub", [shm_input(conn, "INPUT0", [4], "FP32", "cuda_in", 16),
                        shm_input(conn, "INPUT1", [4], "FP32", "cuda_in", 16, 16)],
            outputs=[shm_output(conn, "OUTPUT0", "cuda_out", 16), shm_output(conn, "OUTPUT1", "cuda_out", 16, 16)])
        assert_no_data(conn, result, "OUTPUT0")
        out = cudashm.get_contents_as_numpy(out_handle, np.float32, [8])
        np.testing.assert_array_equal(out[:4], a + b)
        np.testing.assert_array_equal(out[4:], a - b)
    finally:
        conn.client.unregister_cuda_shared_memory()
