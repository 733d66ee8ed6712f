"""Repository index, load and unload through `stubhost serve --model-control-mode explicit`, on
HTTP and gRPC: models load and unload on request, the index shows loaded and unloaded models, and
unloading never costs another model (or the unloaded model's own in-flight requests) a request.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.server.frontend_support import (
    PROTOCOLS,
    Conn,
    build_repository,
    error_of,
    expect_status,
    proto_json,
)
from tests.server.serve_process import ServeProcess

MODELS = ("add_sub", "identity", "slow", "broken")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = build_repository(tmp_path_factory.mktemp("control") / "models", *MODELS)
    with ServeProcess(repo, "--model-control-mode", "explicit", "--load-model", "identity") as srv:
        yield srv


@pytest.fixture(params=PROTOCOLS)
def conn(request: pytest.FixtureRequest, conns: dict[str, Conn]):
    c = conns[request.param]
    yield c
    # every test leaves the server as it found it: only identity loaded
    for model in ("add_sub", "slow"):
        if c.client.is_model_ready(model):
            c.client.unload_model(model)


def index(conn: Conn) -> dict[str, dict]:
    answer = conn.client.get_model_repository_index()
    entries = answer if conn.protocol == "http" else proto_json(answer).get("models", [])
    by_name: dict[str, dict] = {}
    for e in entries:
        by_name.setdefault(e["name"], e)
    return by_name


def identity(conn: Conn, x: np.ndarray):
    return conn.client.infer("identity", [conn.input("INPUT0", x)]).as_numpy("OUTPUT0")


def add_sub(conn: Conn, a: np.ndarray):
    return conn.client.infer("add_sub", [conn.input("INPUT0", a), conn.input("INPUT1", a)]).as_numpy("OUTPUT0")


def test_start_up_loads_only_what_was_asked(conn: Conn):
    assert conn.client.is_server_ready()
    assert conn.client.is_model_ready("identity")
    assert not conn.client.is_model_ready("add_sub")
    entries = index(conn)
    assert set(entries) == set(MODELS)
    assert entries["identity"]["state"] == "READY"
    for name in ("add_sub", "slow", "broken"):
        assert entries[name].get("state", "") != "READY", entries[name]


def test_load_and_unload(conn: Conn):
    a = np.arange(4, dtype=np.float32)
    error = error_of(add_sub, conn, a)
    assert "add_sub" in error.message()
    conn.client.load_model("add_sub")
    assert conn.client.is_model_ready("add_sub")
    assert index(conn)["add_sub"]["state"] == "READY"
    np.testing.assert_array_equal(add_sub(conn, a), a + a)
    conn.client.unload_model("add_sub")
    assert not conn.client.is_model_ready("add_sub")
    entry = index(conn)["add_sub"]
    assert entry == {"name": "add_sub", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    error = error_of(add_sub, conn, a)
    assert error.message() == "Request for unknown model: 'add_sub' has no available versions"
    error = error_of(conn.client.get_inference_statistics, "add_sub")
    assert error.message() == "requested model 'add_sub' is not available"
    expect_status(conn, error, 400, "INVALID_ARGUMENT")
    error = error_of(conn.client.infer, "slow", [conn.input("INPUT0", a)])  # never loaded: not known
    assert error.message() == "Request for unknown model: 'slow' is not found"
    assert conn.client.is_server_ready()


def test_load_twice_reloads(conn: Conn):
    a = np.arange(4, dtype=np.float32)
    conn.client.load_model("add_sub")
    conn.client.load_model("add_sub")
    assert conn.client.is_model_ready("add_sub")
    np.testing.assert_array_equal(add_sub(conn, a), a + a)


def test_load_unknown_model(conn: Conn):
    error = error_of(conn.client.load_model, "no_such_model")
    assert "no_such_model" in error.message()
    assert conn.client.is_server_ready()


def test_load_broken_model(conn: Conn):
    """Triton's words (its L0 tests look for "load failed for model"), code and index entry."""
    error = error_of(conn.client.load_model, "broken")
    assert error.message().startswith("load failed for model 'broken': version 1 is at UNAVAILABLE state: "
                                      "Internal: RuntimeError: broken on purpose\n\nAt:\n"), error.message()
    assert error.message().endswith(";\n")
    assert (error.status() == "400") if conn.protocol == "http" else error.status() == "StatusCode.INVALID_ARGUMENT"
    assert not conn.client.is_model_ready("broken")
    entry = index(conn)["broken"]
    assert (entry["version"], entry["state"]) == ("1", "UNAVAILABLE")
    assert entry["reason"].startswith("Internal: RuntimeError: broken on purpose"), entry
    assert conn.client.is_model_ready("identity")


def test_a_model_never_loaded_is_listed_by_name_only(conn: Conn):
    assert index(conn)["slow"] == {"name": "slow"}


def test_unload_not_loaded_model(conn: Conn):
    """Triton answers success for unloading a model that is not loaded, or not known at all."""
    conn.client.unload_model("slow")
    conn.client.unload_model("no_such_model")
    assert conn.client.is_model_ready("identity")


def test_unload_while_another_model_serves_traffic(conn: Conn, conns: dict[str, Conn], server: ServeProcess):
    """identity answers every request while add_sub is loaded and unloaded over and over."""
    traffic = Conn.open(conn.protocol, server)  # its own connection
    stop = threading.Event()
    counts = {"ok": 0}
    failures: list[BaseException] = []

    def hammer() -> None:
        x = np.arange(16, dtype=np.float32)
        while not stop.is_set():
            try:
                np.testing.assert_array_equal(identity(traffic, x), x)
                counts["ok"] += 1
            except BaseException as e:  # noqa: BLE001 - reported below
                failures.append(e)
                return

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        for _ in range(3):
            conn.client.load_model("add_sub")
            np.testing.assert_array_equal(add_sub(conn, np.ones(4, np.float32)), np.full(4, 2.0))
            conn.client.unload_model("add_sub")
        time.sleep(0.05)
    finally:
        stop.set()
        thread.join(30)
        traffic.close()
    assert not failures, failures
    assert counts["ok"] > 0


def test_unload_lets_in_flight_requests_finish(conn: Conn, server: ServeProcess, tmp_path: Path):
    """A request running on a model being unloaded completes (Triton waits for in-flight requests)."""
    conn.client.load_model("slow")
    started = tmp_path / "started"
    worker = Conn.open(conn.protocol, server)
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = worker.client.infer(
                "slow", [worker.input("INPUT0", np.ones(3, np.float32))],
                parameters={"sleep": 0.5, "touch": str(started)})
        except BaseException as e:  # noqa: BLE001
            outcome["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 30
    while not started.exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    conn.client.unload_model("slow")
    thread.join(30)
    worker.close()
    assert "error" not in outcome, outcome.get("error")
    np.testing.assert_array_equal(outcome["result"].as_numpy("OUTPUT0"), np.ones(3, np.float32))
    assert not conn.client.is_model_ready("slow")


DOUBLER_PY = b'''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return out
'''


def identity_config(conn: Conn, **changes: object) -> str:
    """identity's configuration as the server reports it, with `changes`, as JSON text."""
    config = conn.client.get_model_config("identity")
    config = config if conn.protocol == "http" else proto_json(config)["config"]
    config.update(changes)
    return json.dumps(config)


def test_load_with_an_overriding_config(conn: Conn):
    """The "config" parameter replaces config.pbtxt: two instances instead of one; a later load
    without it goes back to the repository's config."""
    config = json.loads(identity_config(conn))
    config["instance_group"] = [{"name": "override", "count": 2, "kind": "KIND_CPU"}]
    conn.client.load_model("identity", config=json.dumps(config))
    try:
        reported = conn.client.get_model_config("identity")
        reported = reported if conn.protocol == "http" else proto_json(reported)["config"]
        assert [(g["name"], int(g["count"])) for g in reported["instance_group"]] == [("override", 2)]
        x = np.arange(8, dtype=np.float32)
        np.testing.assert_array_equal(identity(conn, x), x)
    finally:
        conn.client.load_model("identity")
    reported = conn.client.get_model_config("identity")
    reported = reported if conn.protocol == "http" else proto_json(reported)["config"]
    assert [int(g["count"]) for g in reported["instance_group"]] == [1]


def test_load_with_override_files(conn: Conn):
    """"file:1/model.py" replaces the model's folder: a doubling model.py served under the name
    'identity', until a plain load brings the repository's model back."""
    conn.client.load_model("identity", config=identity_config(conn), files={"file:1/model.py": DOUBLER_PY})
    try:
        x = np.arange(8, dtype=np.float32)
        np.testing.assert_array_equal(identity(conn, x), x * 2)
    finally:
        conn.client.load_model("identity")
    np.testing.assert_array_equal(identity(conn, np.ones(3, np.float32)), np.ones(3, np.float32))


@pytest.mark.parametrize("config, files, words", [
    ("{not json", None, "not valid JSON"),
    ('{"no_such_field": 1}', None, "no_such_field"),
    (None, {"file:1/model.py": DOUBLER_PY}, "'config' parameter must be given"),
    ("{}", {"file:../escape.py": b"x"}, "inside a version folder"),
])
def test_bad_overrides_are_refused_and_change_nothing(conn: Conn, config, files, words):
    if config == "{}":
        config = identity_config(conn)
    kwargs = {"config": config} if config is not None else {}
    error = error_of(conn.client.load_model, "identity", files=files, **kwargs)
    assert words in error.message(), error.message()
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(identity(conn, x), x)
    assert conn.client.is_server_ready()
