"""``pb_utils.serialize_byte_tensor`` / ``deserialize_bytes_tensor`` and ``pb_utils.Logger.LogLevel``.

The serializers are checked against a reference written here from the algorithm of Triton's
``triton_python_backend_utils.py`` (per element in C order: a 4-byte little-endian length, then the
bytes; exact ``bytes`` kept, any other object element written as ``str(x)`` in UTF-8; ``()`` for an
empty tensor; ``None`` for other dtypes; decoding with ``struct`` while bytes remain), with
hypothesis for the round trip, and end to end in a real stub.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import stubhost
from stubhost import backend_utils as pb_utils
from stubhost.backend_utils import logger as logger_module
from tests.host.repo_factory import config_pbtxt, io, wait_until, write_model


# ---- a reference of Triton's behaviour --------------------------------------------------------
def triton_serialize(tensor: np.ndarray) -> Any:
    """What Triton's serialize_byte_tensor returns (re-derived from its algorithm)."""
    if tensor.size == 0:
        return ()
    if tensor.dtype == np.object_ or tensor.dtype.type == np.bytes_:
        parts = []
        for cell in np.nditer(tensor, flags=["refs_ok"], order="C"):
            value = cell.item()
            if tensor.dtype == np.object_ and type(value) is not bytes:
                value = str(value).encode("utf-8")
            parts += [struct.pack("<I", len(value)), value]
        return b"".join(parts)
    return None


def triton_deserialize(buffer: Any) -> np.ndarray:
    """What Triton's deserialize_bytes_tensor returns (re-derived from its algorithm)."""
    items, offset = [], 0
    while offset < len(buffer):
        size = struct.unpack_from("<I", buffer, offset)[0]
        items.append(struct.unpack_from(f"<{size}s", buffer, offset + 4)[0])
        offset += 4 + size
    return np.array(items, dtype=np.object_)


def object_array(items: list[Any], shape: tuple[int, ...] | None = None) -> np.ndarray:
    """An object array holding `items` as they are (np.array would turn lists into dimensions)."""
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array.reshape(shape if shape is not None else (len(items),))


# Elements with NUL bytes (leading, inner, trailing), empty ones and non-ASCII bytes.
ELEMENTS = st.binary(max_size=40) | st.sampled_from([b"", b"\x00", b"a\x00", b"\x00\x00b\x00", "é".encode(),
                                                     b"\xff\xfe\x80"])
SHAPES = hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4)


# ---- serialize_byte_tensor --------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(data=st.data(), shape=SHAPES)
def test_round_trip_of_bytes_object_arrays(data: st.DataObject, shape: tuple[int, ...]) -> None:
    items = data.draw(st.lists(ELEMENTS, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    tensor = object_array(items, shape)
    encoded = pb_utils.serialize_byte_tensor(tensor)
    assert type(encoded) is bytes
    assert encoded == triton_serialize(tensor)
    assert encoded == b"".join(struct.pack("<I", len(b)) + b for b in items)  # C order
    decoded = pb_utils.deserialize_bytes_tensor(encoded)
    assert decoded.dtype == np.object_ and decoded.shape == (len(items),)
    assert [type(b) for b in decoded] == [bytes] * len(items)
    assert decoded.tolist() == items
    assert np.array_equal(decoded.reshape(shape), tensor)


@settings(max_examples=100, deadline=None)
@given(items=st.lists(st.text(max_size=12) | st.integers() | st.floats(allow_nan=False) | st.none() | ELEMENTS,
                      min_size=1, max_size=12))
def test_object_elements_that_are_not_bytes_are_written_as_their_str(items: list[Any]) -> None:
    tensor = object_array(items)
    encoded = pb_utils.serialize_byte_tensor(tensor)
    assert encoded == triton_serialize(tensor)
    expected = [x if type(x) is bytes else str(x).encode("utf-8") for x in items]
    assert pb_utils.deserialize_bytes_tensor(encoded).tolist() == expected


@settings(max_examples=100, deadline=None)
@given(data=st.data(), shape=SHAPES)
def test_np_bytes_arrays_lose_trailing_nuls_as_in_triton(data: st.DataObject, shape: tuple[int, ...]) -> None:
    items = data.draw(st.lists(ELEMENTS, min_size=int(np.prod(shape)), max_size=int(np.prod(shape))))
    tensor = np.array(items, dtype=np.bytes_).reshape(shape)
    encoded = pb_utils.serialize_byte_tensor(tensor)
    assert encoded == triton_serialize(tensor)
    assert pb_utils.deserialize_bytes_tensor(encoded).tolist() == [b.rstrip(b"\x00") for b in items]


def test_bytes_subclasses_and_bytearray_in_an_object_array_are_written_as_str_like_triton() -> None:
    tensor = object_array([np.bytes_(b"ab"), bytearray(b"cd"), np.str_("é"), b"raw"])
    encoded = pb_utils.serialize_byte_tensor(tensor)
    assert encoded == triton_serialize(tensor)
    assert pb_utils.deserialize_bytes_tensor(encoded).tolist() == [b"b'ab'", b"bytearray(b'cd')", "é".encode(),
                                                                   b"raw"]


@pytest.mark.parametrize("tensor", [np.array([], dtype=np.object_), np.zeros((0, 3), dtype=np.object_),
                                    np.array([], dtype=np.bytes_), np.array([], dtype=np.float32),
                                    np.array([], dtype=np.str_)], ids=["object", "object-2d", "bytes", "fp32", "str"])
def test_an_empty_tensor_gives_an_empty_tuple_whatever_its_dtype(tensor: np.ndarray) -> None:
    assert pb_utils.serialize_byte_tensor(tensor) == () and triton_serialize(tensor) == ()
    assert type(pb_utils.serialize_byte_tensor(tensor)) is tuple


@pytest.mark.parametrize("tensor", [np.array(["a", "b"]), np.array([1, 2], np.int32), np.array([1.5]),
                                    np.array([True]), np.zeros(2, dtype="V4")],
                         ids=["str_", "int32", "fp64", "bool", "void"])
def test_other_dtypes_give_none(tensor: np.ndarray) -> None:
    assert pb_utils.serialize_byte_tensor(tensor) is None and triton_serialize(tensor) is None


def test_something_without_size_raises_attribute_error() -> None:
    with pytest.raises(AttributeError):
        pb_utils.serialize_byte_tensor([b"a", b"b"])  # type: ignore[arg-type]


def test_non_contiguous_and_zero_d_arrays_are_written_in_c_order() -> None:
    grid = object_array([str(i).encode() for i in range(12)], (3, 4))
    for view in (grid.T, grid[:, ::2], grid[::-1]):
        assert pb_utils.serialize_byte_tensor(view) == triton_serialize(view)
        assert pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(view)).tolist() == \
            view.ravel(order="C").tolist()
    scalar = np.array(b"one", dtype=np.object_)
    assert pb_utils.serialize_byte_tensor(scalar) == b"\x03\x00\x00\x00one" == triton_serialize(scalar)


def test_same_layout_as_stubhost_bytes_tensors() -> None:
    from stubhost import _core

    tensor = object_array([b"a", b"", b"\x00z"], (3,))
    assert pb_utils.serialize_byte_tensor(tensor) == _core.encode_bytes(tensor)


# ---- deserialize_bytes_tensor -----------------------------------------------------------------
ENCODED = b"\x02\x00\x00\x00hi\x00\x00\x00\x00\x01\x00\x00\x00\x00"


@pytest.mark.parametrize("make", [bytes, bytearray, memoryview, lambda b: np.frombuffer(b, np.uint8)],
                         ids=["bytes", "bytearray", "memoryview", "uint8-array"])
def test_any_bytes_like_buffer_is_read(make: Any) -> None:
    decoded = pb_utils.deserialize_bytes_tensor(make(ENCODED))
    assert decoded.dtype == np.object_ and decoded.shape == (3,)
    assert decoded.tolist() == [b"hi", b"", b"\x00"] == triton_deserialize(make(ENCODED)).tolist()


@pytest.mark.parametrize("empty", [b"", bytearray(), np.zeros(0, np.uint8)], ids=["bytes", "bytearray", "uint8"])
def test_an_empty_buffer_gives_an_empty_object_array(empty: Any) -> None:
    decoded = pb_utils.deserialize_bytes_tensor(empty)
    assert decoded.dtype == np.object_ and decoded.shape == (0,)


@pytest.mark.parametrize("buffer", [b"\x01\x00", b"\x05\x00\x00\x00ab", ENCODED + b"\x01"],
                         ids=["short-prefix", "short-element", "trailing-byte"])
def test_a_truncated_buffer_raises_struct_error_as_tritons_reader_does(buffer: bytes) -> None:
    with pytest.raises(struct.error):
        triton_deserialize(buffer)
    with pytest.raises(struct.error, match="not a serialized BYTES tensor"):
        pb_utils.deserialize_bytes_tensor(buffer)


def test_a_text_string_raises_type_error() -> None:
    with pytest.raises(TypeError):
        pb_utils.deserialize_bytes_tensor("\x01\x00\x00\x00a")  # type: ignore[arg-type]


# ---- Logger.LogLevel ----------------------------------------------------------------------------
def test_logger_loglevel_is_pb_utils_loglevel() -> None:
    assert pb_utils.Logger.LogLevel is pb_utils.LogLevel
    assert [(m.name, int(m)) for m in pb_utils.Logger.LogLevel] == [("INFO", 0), ("WARNING", 1), ("ERROR", 2),
                                                                     ("VERBOSE", 3)]
    assert pb_utils.Logger.INFO is pb_utils.Logger.LogLevel.INFO  # Triton exports the values onto Logger


def test_logger_log_takes_a_logger_loglevel() -> None:
    sent: list[tuple[str, Any]] = []
    logger_module.set_log_sink(lambda message, level, path, line: sent.append((message, level)))
    try:
        for level in pb_utils.Logger.LogLevel:
            pb_utils.Logger.log(f"at {level.name}", level)
    finally:
        logger_module.set_log_sink(logger_module._log_to_python)
    assert sent == [(f"at {level.name}", level) for level in pb_utils.LogLevel]


# ---- end to end, in a stub ----------------------------------------------------------------------
# SERIALIZED: serialize_byte_tensor of the BYTES input, as UINT8; DECODED: deserialize_bytes_tensor
# of the UINT8 input, as BYTES; INFO: JSON of what else the model saw; logs with Logger.LogLevel.
CODEC_PY = r'''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            raw = pb_utils.get_input_tensor_by_name(request, "RAW").as_numpy()
            serialized = pb_utils.serialize_byte_tensor(text)
            decoded = pb_utils.deserialize_bytes_tensor(raw)
            token = json.loads(request.parameters())["token"]
            pb_utils.Logger.log("codec warning " + token, pb_utils.Logger.LogLevel.WARNING)
            pb_utils.Logger.log("codec verbose " + token, level=pb_utils.Logger.LogLevel.VERBOSE)
            info = {
                "serialized_type": type(serialized).__name__,
                "empty": repr(pb_utils.serialize_byte_tensor(np.array([], dtype=np.object_))),
                "str_array": repr(pb_utils.serialize_byte_tensor(np.array(["a"]))),
                "decoded_type": [str(decoded.dtype), list(decoded.shape)],
                "loglevel_is_shared": pb_utils.Logger.LogLevel is pb_utils.LogLevel,
            }
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SERIALIZED", np.frombuffer(serialized, dtype=np.uint8)),
                pb_utils.Tensor("DECODED", decoded),
                pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], dtype=np.object_)),
            ]))
        return responses
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo: Path = tmp_path_factory.mktemp("byte_helpers") / "models"
    write_model(repo, "codec", CODEC_PY, config_pbtxt(
        "codec", [io("TEXT", "TYPE_STRING", [-1, -1]), io("RAW", "TYPE_UINT8", [-1])],
        [io("SERIALIZED", "TYPE_UINT8", [-1]), io("DECODED", "TYPE_STRING", [-1]), io("INFO", "TYPE_STRING", [1])]))
    with stubhost.Server(repo) as s:
        yield s


def test_a_model_serializes_and_deserializes_in_its_stub(server: stubhost.Server,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="stubhost")
    token = "tok-bytes-91c2"
    text = object_array([b"a\x00", b"", "é".encode(), b"\x00\x00", b"xyz", b"\xff"], (2, 3))
    raw_items = [b"", b"\x00nul\x00", "ü".encode(), b"end"]
    raw = np.frombuffer(b"".join(struct.pack("<I", len(b)) + b for b in raw_items), dtype=np.uint8)
    out = server.infer("codec", {"TEXT": text, "RAW": raw}, parameters={"token": token})

    assert out["SERIALIZED"].tobytes() == triton_serialize(text)
    assert out["DECODED"].tolist() == raw_items
    info = json.loads(out["INFO"][0])
    assert info == {"serialized_type": "bytes", "empty": "()", "str_array": "None",
                    "decoded_type": ["object", [4]], "loglevel_is_shared": True}

    def mine() -> dict[str, int]:
        return {r.getMessage(): r.levelno for r in caplog.records if token in r.getMessage()}

    assert wait_until(lambda: len(mine()) >= 2, 5.0), [r.getMessage() for r in caplog.records]
    assert mine() == {f"codec warning {token}": logging.WARNING, f"codec verbose {token}": logging.DEBUG}
