"""Sequence batching control inputs through `stubhost serve` with the real tritonclient (HTTP and
gRPC): a sequence sent with ``sequence_id`` / ``sequence_start`` / ``sequence_end`` reaches the
model with its START, END, READY and CORRID tensors, for integer and string ids; a client that
sends a control tensor itself is refused.

The models are those of tests/host/test_sequence_controls.py: each control input comes back as
``OUT_<name>``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.host.repo_factory import write_model
from tests.host.test_sequence_controls import (
    BOOL_READY,
    ECHO_PY,
    INT_END,
    INT_START,
    control_config,
    corrid,
)
from tests.server.frontend_support import Conn, error_of, expect_status
from tests.server.serve_process import ServeProcess

MODELS = {
    "ctl": control_config("ctl", {"START": (INT_START, "TYPE_INT32"), "END": (INT_END, "TYPE_INT32"),
                                  "READY": (BOOL_READY, "TYPE_BOOL"),
                                  "CORRID": (corrid("TYPE_UINT64"), "TYPE_UINT64")}, max_batch_size=4),
    "ctl_text": control_config("ctl_text", {"START": (INT_START, "TYPE_INT32"),
                                            "CORRID": (corrid("TYPE_STRING"), "TYPE_STRING")}),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("controls") / "models"
    for name, config in MODELS.items():
        write_model(repo, name, ECHO_PY, config)
    with ServeProcess(repo) as srv:
        yield srv


def run_sequence(conn: Conn, model: str, sequence_id: int | str, shape: tuple[int, ...]) -> list[Any]:
    """START, a middle request, END: the three results."""
    x = conn.input("X", np.ones(shape, np.float32))
    return [conn.client.infer(model, [x], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
            for start, end in ((True, False), (False, False), (False, True))]


def values(results: list[Any], name: str) -> list[Any]:
    return [r.as_numpy(name).reshape(-1)[0] for r in results]


def test_a_sequence_gets_its_controls(conn: Conn, quiet_log):
    results = run_sequence(conn, "ctl", 2**40 + 3, (1, 1))
    assert values(results, "OUT_START") == [9, 7, 7]
    assert values(results, "OUT_END") == [0, 0, 1]
    assert values(results, "OUT_READY") == [True, True, True]
    assert values(results, "OUT_CORRID") == [2**40 + 3] * 3
    for result in results:
        for name, dtype in (("OUT_START", np.int32), ("OUT_END", np.int32), ("OUT_READY", np.bool_),
                            ("OUT_CORRID", np.uint64)):
            array = result.as_numpy(name)
            assert array.dtype == dtype and array.shape == (1, 1), (name, array)


def test_a_string_sequence_id_reaches_a_string_corrid(conn: Conn, quiet_log):
    results = run_sequence(conn, "ctl_text", f"session-{conn.protocol}", (1,))
    assert values(results, "OUT_CORRID") == [f"session-{conn.protocol}".encode()] * 3
    assert values(results, "OUT_START") == [9, 7, 7]


def test_a_client_sending_a_control_input_is_refused(conn: Conn):
    inputs = [conn.input("X", np.ones((1, 1), np.float32)), conn.input("START", np.ones((1, 1), np.int32))]
    error = error_of(conn.client.infer, "ctl", inputs, sequence_id=5, sequence_start=True)
    expect_status(conn, error, 400, "INVALID_ARGUMENT")
    assert "expected 1 inputs but got 2 inputs for model 'ctl'" in error.message()
