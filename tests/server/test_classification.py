"""The classification extension: the ranking and its text against a reference (hypothesis), and
end to end through `stubhost serve` with tritonclient over HTTP and gRPC: labels from the
model's label file, the batch dimension, several outputs, refusals, and bad label files failing
the load."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from stubhost.host.errors import InferenceError
from stubhost.server.classification import classify
from tests.host.repo_factory import config_pbtxt, write_model
from tests.server.frontend_support import Conn, error_of, expect_status
from tests.server.serve_process import ServeProcess

RANKABLE = {"UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64, "INT8": np.int8,
            "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP32": np.float32, "FP64": np.float64}


def reference(values: list, count: int, labels: list[str], floating: bool) -> list[bytes]:
    """The top classes of one batch item, computed the obvious way."""
    ranked = sorted(range(len(values)), key=lambda i: (-values[i], i))[:count]
    out = []
    for i in ranked:
        text = f"{values[i]:f}" if floating else str(values[i])
        label = labels[i] if i < len(labels) else ""
        out.append(f"{text}:{i}:{label}".encode() if label else f"{text}:{i}".encode())
    return out


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, np.ndarray, int, bool, list[str]]:
    datatype = draw(st.sampled_from(sorted(RANKABLE)))
    dtype = np.dtype(RANKABLE[datatype])
    batched = draw(st.booleans())
    shape = draw(hnp.array_shapes(min_dims=1 if batched else 0, max_dims=3, min_side=0, max_side=5))
    elements = (st.floats(width=dtype.itemsize * 8, allow_nan=False, min_value=-1e6, max_value=1e6)
                if dtype.kind == "f" else None)
    # Few distinct values, so that ties (kept in index order) happen often.
    array = draw(hnp.arrays(dtype, shape, elements=elements if elements is not None else
                            st.sampled_from([0, 1, 7, int(np.iinfo(dtype).max), int(np.iinfo(dtype).min)])))
    count = draw(st.integers(1, 8))
    labels = draw(st.lists(st.sampled_from(["cat", "dog", "", "bird"]), max_size=6))
    return datatype, array, count, batched, labels


@settings(max_examples=300, deadline=None)
@given(cases())
def test_the_ranking_and_its_text_match_a_reference(case: tuple[str, np.ndarray, int, bool, list[str]]) -> None:
    datatype, array, count, batched, labels = case
    out = classify(datatype, array, count, batched, labels)
    floating = array.dtype.kind == "f"
    rows = array.shape[0] if batched and array.ndim and array.shape[0] else 0
    per_row = math.prod(array.shape[1:] if rows else array.shape)
    k = min(count, per_row)
    assert out.dtype == object and out.shape == ((rows, k) if rows else (k,))
    items = array.reshape(max(rows, 1), per_row)
    for row, values in enumerate(items):
        got = list(out[row]) if rows else list(out)
        assert got == reference([v.item() for v in values], count, labels, floating)


@pytest.mark.parametrize("datatype, dtype", [("FP16", np.float16), ("BOOL", np.bool_), ("BF16", np.uint16),
                                             ("BYTES", object)])
def test_types_triton_cannot_rank_are_refused_in_its_words(datatype: str, dtype: type) -> None:
    with pytest.raises(InferenceError) as info:
        classify(datatype, np.zeros(3, dtype), 1, False, [])
    assert info.value.code == "INVALID_ARG"
    assert info.value.message == f"class result not available for output due to unsupported type '{datatype}'"


def test_values_are_written_as_cpp_to_string_writes_them() -> None:
    out = classify("FP32", np.array([0.1, 1e7, -2.5], np.float32), 3, False, ["a", "b"])
    assert list(out) == [b"10000000.000000:1:b", b"0.100000:0:a", b"-2.500000:2"]


# ---- end to end ------------------------------------------------------------------------------------
SCORES_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("PROBS", x),
                                                   pb_utils.Tensor("RAW", (x * 10).astype(np.int32)),
                                                   pb_utils.Tensor("HALF", x.astype(np.float16))]))
        return out
"""
LABELS = "cat\ndog\n\nbird\n"  # class 2 has no label; class 4 is past the end


def scores_config(name: str, max_batch_size: int) -> str:
    return config_pbtxt(name, ['{ name: "X" data_type: TYPE_FP32 dims: [ 5 ] }'], [
        '{ name: "PROBS" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "labels.txt" }',
        '{ name: "RAW" data_type: TYPE_INT32 dims: [ 5 ] }',
        '{ name: "HALF" data_type: TYPE_FP16 dims: [ 5 ] }'], max_batch_size=max_batch_size)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("classification") / "models"
    write_model(repo, "scores", SCORES_PY, scores_config("scores", 0), files={"labels.txt": LABELS})
    write_model(repo, "scores_batched", SCORES_PY, scores_config("scores_batched", 4), files={"labels.txt": LABELS})
    write_model(repo, "no_label_file", SCORES_PY, scores_config("no_label_file", 0))
    write_model(repo, "label_escape", SCORES_PY, scores_config("label_escape", 0).replace(
        '"labels.txt"', '"../scores/labels.txt"'))
    with ServeProcess(repo, "--model-control-mode", "explicit", "--load-model", "scores",
                      "--load-model", "scores_batched") as srv:
        yield srv


def classes(conn: Conn, name: str, count: int, *, binary: bool = True):
    if conn.protocol == "http":
        return conn.mod.InferRequestedOutput(name, binary_data=binary, class_count=count)
    return conn.mod.InferRequestedOutput(name, class_count=count)


X = np.array([0.1, 0.7, 0.05, 0.15, 0.0], np.float32)


def test_top_classes_come_back_with_their_labels(conn: Conn) -> None:
    for binary in (True, False) if conn.protocol == "http" else (True,):  # HTTP: binary and JSON data
        result = conn.client.infer("scores", [conn.input("X", X)],
                                   outputs=[classes(conn, "PROBS", 3, binary=binary)])
        top = result.as_numpy("PROBS")
        assert top.shape == (3,)
        assert [t if isinstance(t, bytes) else t.encode() for t in top] == [
            b"0.700000:1:dog", b"0.150000:3:bird", b"0.100000:0:cat"]
        output = conn.response(result)["outputs"][0]
        assert output["datatype"] == "BYTES" and [int(d) for d in output["shape"]] == [3]


def test_each_batch_item_is_ranked_on_its_own(conn: Conn) -> None:
    x = np.stack([X, X[::-1]])
    result = conn.client.infer("scores_batched", [conn.input("X", x)], outputs=[classes(conn, "PROBS", 2)])
    assert result.as_numpy("PROBS").tolist() == [[b"0.700000:1:dog", b"0.150000:3:bird"],
                                                 [b"0.700000:3:bird", b"0.150000:1:dog"]]


def test_a_count_above_the_classes_gives_every_class_and_other_outputs_stay_data(conn: Conn) -> None:
    result = conn.client.infer("scores", [conn.input("X", X)],
                               outputs=[classes(conn, "RAW", 9), conn.output("PROBS")])
    # RAW is int32(x * 10) = [1, 7, 0, 1, 0]: equal values rank in index order.
    assert result.as_numpy("RAW").tolist() == [b"7:1", b"1:0", b"1:3", b"0:2", b"0:4"]
    np.testing.assert_array_equal(result.as_numpy("PROBS"), X)


def test_an_output_triton_cannot_rank_is_refused(conn: Conn) -> None:
    error = error_of(conn.client.infer, "scores", [conn.input("X", X)], outputs=[classes(conn, "HALF", 2)])
    expect_status(conn, error, 400, "INVALID_ARGUMENT")
    assert "class result not available for output due to unsupported type 'FP16'" in error.message()
    assert conn.client.infer("scores", [conn.input("X", X)], outputs=[classes(conn, "RAW", 1)]) \
        .as_numpy("RAW").tolist() == [b"7:1"]


def test_the_server_lists_the_extension(conn: Conn) -> None:
    meta = conn.client.get_server_metadata()
    extensions = meta["extensions"] if conn.protocol == "http" else meta.extensions
    assert "classification" in extensions


def test_a_label_file_that_cannot_be_read_fails_the_load_in_tritons_words(conn: Conn) -> None:
    error = error_of(conn.client.load_model, "no_label_file")
    assert re.match(r"load failed for model 'no_label_file': version 1 is at UNAVAILABLE state: Internal: failed to "
                    r"open text file for read /\S+/no_label_file/labels.txt: No such file or directory;\n$",
                    error.message()), error.message()
    assert not conn.client.is_model_ready("no_label_file")


def test_a_label_file_outside_the_model_folder_fails_the_load(conn: Conn) -> None:
    error = error_of(conn.client.load_model, "label_escape")
    assert "output 'PROBS': label_filename: '../scores/labels.txt' is outside the model's folder" in error.message()
    assert not conn.client.is_model_ready("label_escape")
