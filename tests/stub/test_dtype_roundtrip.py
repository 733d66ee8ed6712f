"""Every data type through a real stub and back: one identity model per dtype, values and dtype exact.

Each model has a 1-D pair (INPUT0 -> OUTPUT0, dims [-1]) and a 3-D pair (INPUT1 -> OUTPUT1,
dims [-1, -1, -1]), both optional, so one model covers every shape.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import config_pbtxt, io, write_model

IDENTITY_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for tensor in request.inputs():
                outputs.append(pb_utils.Tensor(tensor.name().replace("INPUT", "OUTPUT"), tensor.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

STRING_KINDS_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([
            pb_utils.Tensor("UNICODE", np.array(["h\u00e9llo", "", "\u4e2d"])),
            pb_utils.Tensor("FIXED", np.array([b"ab", b"c", b""], dtype="S2")),
            pb_utils.Tensor("OBJECT_STR", np.array(["x", "\u00df", ""], dtype=np.object_)),
        ]) for _ in requests]
"""

DTYPES = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
    "FP32": np.float32, "FP64": np.float64, "STRING": np.object_,
}


def model_name(dtype: str) -> str:
    return f"identity_{dtype.lower()}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo = tmp_path_factory.mktemp("dtypes") / "models"
    for dtype in DTYPES:
        name = model_name(dtype)
        t = f"TYPE_{dtype}"
        write_model(repo, name, IDENTITY_PY, config_pbtxt(
            name, [io("INPUT0", t, [-1], optional=True), io("INPUT1", t, [-1, -1, -1], optional=True)],
            [io("OUTPUT0", t, [-1]), io("OUTPUT1", t, [-1, -1, -1])]))
    write_model(repo, "string_kinds", STRING_KINDS_PY, config_pbtxt(
        "string_kinds", [io("INPUT0", "TYPE_INT32", [1])],
        [io(n, "TYPE_STRING", [3]) for n in ("UNICODE", "FIXED", "OBJECT_STR")]))
    with stubhost.Server(repo) as s:
        yield s


def sample(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Values that use the type's whole range (extremes, negative zero, inf, nan, subnormals)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    np_type = DTYPES[dtype]
    if dtype == "BOOL":
        flat = rng.integers(0, 2, n).astype(np.bool_)
    elif dtype == "STRING":
        pool = [b"", b"plain", "unicode \u00e9\u4e2d\U0001f600".encode(), b"\xff\xfe\x80 not utf-8", b"nul\x00inside",
                b"\x00", b"x" * 1000]
        flat = np.array([pool[i % len(pool)] for i in range(n)], dtype=np.object_)
    elif dtype.startswith("FP"):
        info = np.finfo(np_type)
        special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, info.max, info.min, info.tiny, info.smallest_subnormal,
                            1.0 / 3.0], dtype=np_type)
        flat = np.concatenate([special, rng.standard_normal(n).astype(np_type)])[:n]
    else:
        info = np.iinfo(np_type)
        special = np.array([info.min, info.max, 0, 1], dtype=np_type)
        flat = np.concatenate([special, rng.integers(info.min, info.max, n, dtype=np_type, endpoint=True)])[:n]
    return flat.reshape(shape)


def assert_identical(got: np.ndarray, sent: np.ndarray) -> None:
    assert got.dtype == sent.dtype, f"dtype {got.dtype} != {sent.dtype}"
    assert got.shape == sent.shape, f"shape {got.shape} != {sent.shape}"
    if sent.dtype == np.object_:
        assert all(type(v) is bytes for v in got.ravel()), [type(v) for v in got.ravel()]
        assert got.ravel().tolist() == sent.ravel().tolist()
    else:
        assert got.tobytes() == sent.tobytes()  # bit-exact: -0.0, nan payloads, subnormals


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_1d_round_trip_is_exact(server: stubhost.Server, dtype: str) -> None:
    x = sample(dtype, (37,))
    out = server.infer(model_name(dtype), {"INPUT0": x})
    assert set(out) == {"OUTPUT0"}
    assert_identical(out["OUTPUT0"], x)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_3d_round_trip_is_exact(server: stubhost.Server, dtype: str) -> None:
    x = sample(dtype, (2, 3, 5), seed=1)
    out = server.infer(model_name(dtype), {"INPUT1": x})
    assert_identical(out["OUTPUT1"], x)


@pytest.mark.parametrize("shape", [(0,), (0, 0, 0), (2, 0, 3), (3, 4, 0)], ids=str)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_zero_size_round_trip(server: stubhost.Server, dtype: str, shape: tuple[int, ...]) -> None:
    x = np.zeros(shape, dtype=DTYPES[dtype])
    key = "INPUT0" if len(shape) == 1 else "INPUT1"
    out = server.infer(model_name(dtype), {key: x})
    assert_identical(out[key.replace("INPUT", "OUTPUT")], x)


@pytest.mark.parametrize("dtype", ["FP32", "STRING", "BOOL"])
def test_both_inputs_in_one_request(server: stubhost.Server, dtype: str) -> None:
    a, b = sample(dtype, (5,), seed=2), sample(dtype, (1, 2, 2), seed=3)
    out = server.infer(model_name(dtype), {"INPUT0": a, "INPUT1": b})
    assert_identical(out["OUTPUT0"], a)
    assert_identical(out["OUTPUT1"], b)


def test_bytes_empty_strings_only(server: stubhost.Server) -> None:
    x = np.array([b"", b"", b""], dtype=np.object_)
    assert_identical(server.infer("identity_string", {"INPUT0": x})["OUTPUT0"], x)


def test_bytes_non_utf8_bytes_survive(server: stubhost.Server) -> None:
    x = np.array([bytes(range(256)), b"\xc3\x28", b"\xed\xa0\x80"], dtype=np.object_)
    assert_identical(server.infer("identity_string", {"INPUT0": x})["OUTPUT0"], x)


def test_bytes_given_as_fixed_width_numpy_bytes(server: stubhost.Server) -> None:
    x = np.array([b"ab", b"c", b"\xff\xfe"], dtype="S2")
    got = server.infer("identity_string", {"INPUT0": x})["OUTPUT0"]
    assert got.dtype == np.object_
    assert got.tolist() == [b"ab", b"c", b"\xff\xfe"]


def test_bytes_given_as_str_arrive_utf8_encoded(server: stubhost.Server) -> None:
    x = np.array(["h\u00e9llo", "", "\u4e2d"], dtype=np.object_)
    got = server.infer("identity_string", {"INPUT0": x})["OUTPUT0"]
    assert got.tolist() == ["h\u00e9llo".encode(), b"", "\u4e2d".encode()]


def test_bytes_non_bytes_objects_become_their_str_in_utf8(server: stubhost.Server) -> None:
    """As tritonclient's serialize_byte_tensor does: str(obj).encode("utf-8")."""
    x = np.array([1, 2.5, None, bytearray(b"ba")], dtype=np.object_)
    got = server.infer("identity_string", {"INPUT0": x})["OUTPUT0"]
    assert got.tolist() == [b"1", b"2.5", b"None", b"ba"]


def test_bytes_unencodable_str_is_an_invalid_argument(server: stubhost.Server) -> None:
    with pytest.raises(stubhost.InferenceError) as info:
        server.infer("identity_string", {"INPUT0": np.array(["ok", "lone \ud800 surrogate"], dtype=np.object_)})
    assert info.value.code == "INVALID_ARG"
    # the server goes on serving
    x = np.array([b"ok"], dtype=np.object_)
    assert_identical(server.infer("identity_string", {"INPUT0": x})["OUTPUT0"], x)


def test_big_endian_input_arrives_as_native_values(server: stubhost.Server) -> None:
    x = np.arange(10, dtype=">i4")
    got = server.infer("identity_int32", {"INPUT0": x})["OUTPUT0"]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.arange(10, dtype=np.int32))



def test_model_string_outputs_of_every_numpy_kind_arrive_as_utf8_bytes(server: stubhost.Server) -> None:
    out = server.infer("string_kinds", {"INPUT0": np.zeros(1, np.int32)})
    for name in ("UNICODE", "FIXED", "OBJECT_STR"):
        assert out[name].dtype == np.object_, name
    assert out["UNICODE"].tolist() == ["h\u00e9llo".encode(), b"", "\u4e2d".encode()]
    assert out["FIXED"].tolist() == [b"ab", b"c", b""]
    assert out["OBJECT_STR"].tolist() == [b"x", "\u00df".encode(), b""]
