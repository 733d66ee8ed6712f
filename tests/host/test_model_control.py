"""Metadata, an auto-completed configuration, and load / unload / reload of models."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import (
    SLEEPY_PY,
    config_pbtxt,
    copy_examples,
    instance,
    io,
    pid_alive,
    sleepy_config,
    wait_until,
    write_model,
)

CONSTANT_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils

VALUE = {value}


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([VALUE], dtype=np.int32))])
                for _ in requests]
"""


def constant_model(repo: Path, name: str, value: int) -> None:
    write_model(repo, name, CONSTANT_PY.replace("{value}", str(value)), config_pbtxt(
        name, [io("INPUT0", "TYPE_INT32", [1])], [io("OUTPUT0", "TYPE_INT32", [1])]))


def constant(server: stubhost.Server, name: str) -> int:
    return int(server.infer(name, {"INPUT0": np.zeros(1, np.int32)})["OUTPUT0"][0])


# ---- metadata of a shared server -------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo = copy_examples(tmp_path_factory.mktemp("control") / "models", "auto_complete", "add_sub", "string_upper")
    write_model(repo, "batched", SLEEPY_PY, sleepy_config("batched").replace("max_batch_size: 0",
                                                                               "max_batch_size: 8"))
    with stubhost.Server(repo) as s:
        yield s


def test_auto_complete_model_without_config_loads_and_serves(server: stubhost.Server) -> None:
    assert server.model_ready("auto_complete")
    out = server.infer("auto_complete", {"INPUT0": np.arange(3, dtype=np.int32)})
    np.testing.assert_array_equal(out["OUTPUT0"], [0, 2, 4])
    assert out["OUTPUT0"].dtype == np.int32


def test_auto_completed_config_shows_the_models_inputs_and_outputs(server: stubhost.Server) -> None:
    config = server.model_config("auto_complete")
    assert config["name"] == "auto_complete"
    assert config["backend"] == "python"
    assert config["max_batch_size"] == 0
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [("INPUT0", "TYPE_INT32", [-1])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [("OUTPUT0", "TYPE_INT32", [-1])]


def test_model_config_is_a_copy(server: stubhost.Server) -> None:
    config = server.model_config("add_sub")
    config["input"].clear()
    config["name"] = "changed"
    assert server.model_config("add_sub")["name"] == "add_sub"
    assert len(server.model_config("add_sub")["input"]) == 2


def test_model_config_of_a_configured_model(server: stubhost.Server) -> None:
    config = server.model_config("add_sub")
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    assert [o["data_type"] for o in config["output"]] == ["TYPE_FP32", "TYPE_FP32"]
    assert config["instance_group"][0]["count"] == 1
    assert config["instance_group"][0]["kind"] == "KIND_CPU"


def test_model_metadata_of_auto_completed_model(server: stubhost.Server) -> None:
    meta = server.model_metadata("auto_complete")
    assert meta["name"] == "auto_complete"
    assert meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "INT32", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "INT32", "shape": [-1]}]


def test_model_metadata_shows_bytes_as_BYTES(server: stubhost.Server) -> None:
    meta = server.model_metadata("string_upper")
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "BYTES", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "BYTES", "shape": [-1]},
                               {"name": "OUTPUT1", "datatype": "INT32", "shape": [-1]}]


def test_model_metadata_shows_the_batch_dimension(server: stubhost.Server) -> None:
    meta = server.model_metadata("batched")
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}]
    assert meta["outputs"][1] == {"name": "PID", "datatype": "INT64", "shape": [-1, 1]}


def test_model_metadata_of_a_version(server: stubhost.Server) -> None:
    assert server.model_metadata("add_sub", "1")["name"] == "add_sub"
    with pytest.raises(stubhost.InferenceError) as info:
        server.model_metadata("add_sub", "2")
    assert info.value.code == "NOT_FOUND"


def test_metadata_and_config_of_an_unknown_model(server: stubhost.Server) -> None:
    for call in (server.model_metadata, server.model_config):
        with pytest.raises(stubhost.InferenceError) as info:
            call("nope")
        assert info.value.code == "NOT_FOUND"


def test_server_metadata(server: stubhost.Server) -> None:
    meta = server.metadata()
    assert meta["name"] == "stubhost"
    assert meta["version"] == stubhost.__version__
    assert isinstance(meta["extensions"], list)


def test_models_lists_the_loaded_models(server: stubhost.Server) -> None:
    assert server.models() == ["add_sub", "auto_complete", "batched", "string_upper"]
    assert server.ready()


# ---- load / unload / reload ------------------------------------------------------------------------
@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    constant_model(repo, "a", 1)
    write_model(repo, "b", SLEEPY_PY, sleepy_config("b"))
    return repo


def test_models_argument_limits_what_is_loaded(repo: Path) -> None:
    with stubhost.Server(repo, models=["b"]) as server:
        assert server.models() == ["b"]
        assert not server.model_ready("a")
        with pytest.raises(stubhost.InferenceError) as info:
            constant(server, "a")
        assert info.value.code == "NOT_FOUND"
        server.load("a")
        assert constant(server, "a") == 1


def test_models_argument_naming_a_missing_model_fails(repo: Path) -> None:
    with pytest.raises(stubhost.InferenceError) as info:
        with stubhost.Server(repo, models=["missing"]):
            pass
    assert info.value.code == "NOT_FOUND"


def test_unload_stops_the_model_and_its_stub(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        pid = instance(server, "a").process.pid
        server.unload("a")
        assert not server.model_ready("a")
        assert server.models() == ["b"]
        assert server.ready()  # an unloaded model is not expected any more
        with pytest.raises(stubhost.InferenceError) as info:
            constant(server, "a")
        assert info.value.code == "NOT_FOUND"
        assert wait_until(lambda: not pid_alive(pid), 5.0)


def test_unload_of_an_unknown_model_is_no_error(repo: Path) -> None:
    """As in Triton: unloading what is not loaded (or not known) succeeds and changes nothing."""
    with stubhost.Server(repo) as server:
        before = server.models()
        server.unload("nope")
        assert server.models() == before and server.ready()


def test_load_of_a_model_not_in_the_repository(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        with pytest.raises(stubhost.InferenceError) as info:
            server.load("nope")
        assert info.value.code == "NOT_FOUND"
        assert server.ready()


def test_load_after_unload(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        server.unload("a")
        server.load("a")
        assert server.model_ready("a")
        assert constant(server, "a") == 1


def test_load_of_a_model_added_to_the_repository(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        constant_model(repo, "c", 3)
        server.load("c")
        assert server.models() == ["a", "b", "c"]
        assert constant(server, "c") == 3


def test_reload_picks_up_the_changed_model_and_stops_the_old_stub(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        old_pid = instance(server, "a").process.pid
        assert constant(server, "a") == 1
        constant_model(repo, "a", 2)
        server.load("a")
        assert constant(server, "a") == 2
        assert instance(server, "a").process.pid != old_pid
        assert wait_until(lambda: not pid_alive(old_pid), 5.0)


def test_reload_while_another_model_serves(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        stop = threading.Event()
        errors: list[str] = []
        served = 0

        def hammer() -> None:
            nonlocal served
            x = np.arange(3, dtype=np.float32)
            while not stop.is_set():
                try:
                    out = server.infer("b", {"INPUT0": x}, timeout=10.0)
                    if not np.array_equal(out["OUTPUT0"], x):
                        errors.append(f"wrong output {out['OUTPUT0']}")
                    served += 1
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(repr(e))

        thread = threading.Thread(target=hammer)
        thread.start()
        try:
            for value in (2, 3, 4):
                constant_model(repo, "a", value)
                server.load("a")
                assert constant(server, "a") == value
        finally:
            stop.set()
            thread.join(30)
        assert errors == []
        assert served > 0


def test_reload_lets_a_request_in_flight_finish(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        result: dict[str, object] = {}

        def slow() -> None:
            try:
                result["out"] = server.infer("b", {"INPUT0": np.ones(2, np.float32)}, parameters={"sleep": 1.0},
                                             timeout=20.0)
            except Exception as e:  # noqa: BLE001 - checked below
                result["error"] = e

        thread = threading.Thread(target=slow)
        thread.start()
        assert wait_until(lambda: instance(server, "b").load_count() > 0, 5.0)
        start = time.monotonic()
        server.load("b")
        thread.join(20)
        assert "error" not in result, result.get("error")
        np.testing.assert_array_equal(result["out"]["OUTPUT0"], np.ones(2, np.float32))  # type: ignore[index]
        assert time.monotonic() - start < 10.0
        assert server.model_ready("b")


def test_reload_lets_queued_requests_finish_on_the_old_model(repo: Path) -> None:
    """Requests waiting in the old model's queue when a reload swaps it out are not failed:
    they run on the old model, which stops once they are done (as Triton keeps a model until
    its last request ends)."""
    write_model(repo, "q", SLEEPY_PY, sleepy_config("q", extra="dynamic_batching { }"))
    with stubhost.Server(repo) as server:
        old_pid = instance(server, "q").process.pid
        results: dict[int, object] = {}

        def call(index: int, sleep: float) -> None:
            try:
                results[index] = server.infer("q", {"INPUT0": np.full(2, index, np.float32)},
                                              parameters={"sleep": sleep}, timeout=20.0)["OUTPUT0"]
            except Exception as e:  # noqa: BLE001 - checked below
                results[index] = e

        threads = [threading.Thread(target=call, args=(0, 1.0))]
        threads[0].start()
        assert wait_until(lambda: instance(server, "q").load_count() > 0, 5.0)
        threads += [threading.Thread(target=call, args=(i, 0.0)) for i in (1, 2, 3)]
        for thread in threads[1:]:
            thread.start()
        time.sleep(0.2)  # they wait in the queue behind the slow one
        server.load("q")
        for thread in threads:
            thread.join(20)
        for index in range(4):
            assert not isinstance(results[index], Exception), results[index]
            np.testing.assert_array_equal(results[index], np.full(2, index, np.float32))  # type: ignore[arg-type]
        assert instance(server, "q").process.pid != old_pid
        assert wait_until(lambda: not pid_alive(old_pid), 10.0)
        assert server.model_ready("q")


def test_requests_during_reloads_never_fail(repo: Path) -> None:
    """Callers that looked the model up just before a swap are served (by the old model or its
    successor), never failed because the copy they found is stopping."""
    with stubhost.Server(repo) as server:
        stop = threading.Event()
        errors: list[str] = []

        def hammer() -> None:
            while not stop.is_set():
                try:
                    constant(server, "a")
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(repr(e))

        threads = [threading.Thread(target=hammer) for _ in range(3)]
        for thread in threads:
            thread.start()
        try:
            for value in range(2, 8):
                constant_model(repo, "a", value)
                server.load("a")
        finally:
            stop.set()
            for thread in threads:
                thread.join(30)
        assert errors == []
        assert constant(server, "a") == 7


def test_failed_reload_keeps_the_old_model_serving(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        write_model(repo, "a", "this is not python")
        with pytest.raises(stubhost.InferenceError):
            server.load("a")
        assert constant(server, "a") == 1
        assert server.model_ready("a")


def test_failed_reload_leaves_the_server_ready(repo: Path) -> None:
    """As Triton: a reload that fails keeps the old model serving, so every model is still ready
    (the failure is reported by load() and kept in load_errors)."""
    with stubhost.Server(repo) as server:
        write_model(repo, "a", "this is not python")
        with pytest.raises(stubhost.InferenceError):
            server.load("a")
        assert "a" in server.load_errors
        assert server.ready()


def test_load_and_unload_after_close_are_refused(repo: Path) -> None:
    server = stubhost.Server(repo)
    server.close()
    with pytest.raises(stubhost.InferenceError) as info:
        server.load("a")
    assert info.value.code == "UNAVAILABLE"
    assert not server.ready()
    assert not server.model_ready("a")
    with pytest.raises(stubhost.InferenceError):
        constant(server, "a")


def test_close_is_idempotent(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        server.close()
        server.close()
    assert not server.ready()


def test_two_servers_in_one_process_are_independent(repo: Path) -> None:
    with stubhost.Server(repo) as first:
        with stubhost.Server(repo, models=["a"]) as second:
            assert constant(first, "a") == 1 and constant(second, "a") == 1
            assert instance(first, "a").process.pid != instance(second, "a").process.pid
        assert constant(first, "a") == 1
        assert first.ready()


def test_a_dropped_server_is_closed_by_the_garbage_collector(repo: Path) -> None:
    import gc

    from tests.host.repo_factory import own_shm_entries, stub_pids
    before = own_shm_entries()
    server = stubhost.Server(repo)
    pids = stub_pids(server)
    del server
    gc.collect()
    assert wait_until(lambda: not any(pid_alive(p) for p in pids), 5.0)
    assert own_shm_entries() == before
