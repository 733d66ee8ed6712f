"""The paths of a streaming ensemble, and ``max_inflight_requests``, through the in-process API: each
response of a decoupled step continues the graph at once, beside the others, and
``ensemble_scheduling { max_inflight_requests: N }`` bounds the requests in flight at each step
across every request of the ensemble, as Triton's ensemble scheduler does."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import config_pbtxt, copy_examples, io, write_model
from tests.host.test_ensemble import ensemble_config, write_ensemble

NAP_S = 0.4

# Sleeps ({nap} s) and answers when it started and ended: the windows show which requests overlapped.
WINDOW_PY = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            start = time.time()
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            time.sleep({nap})
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("VALUE", x.copy()),
                pb_utils.Tensor("WINDOW", np.array([start, time.time()], np.float64))]))
        return out
"""

WINDOW_OUTPUTS = [io("VALUE", "TYPE_INT32", [1]), io("WINDOW", "TYPE_FP64", [2])]


def paths_ensemble(name: str, extra: str = "", then: str = "window") -> str:
    """IN -> repeat (one response per element) -> `then`, for each response."""
    config = ensemble_config(name, [io("IN", "TYPE_INT32", [-1])], WINDOW_OUTPUTS, [
        ("repeat", {"IN": "IN"}, {"OUT": "ELEMENT"}),
        (then, {"X": "ELEMENT"}, {"VALUE": "VALUE", "WINDOW": "WINDOW"})])
    return config.replace("ensemble_scheduling {", "ensemble_scheduling { " + extra) if extra else config


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = copy_examples(tmp_path_factory.mktemp("paths") / "models", "repeat")
    three = "instance_group [{ count: 3, kind: KIND_CPU }]"
    write_model(repo, "window", WINDOW_PY.replace("{nap}", str(NAP_S)),
                config_pbtxt("window", [io("X", "TYPE_INT32", [1])], WINDOW_OUTPUTS, extra=three))
    # sleeps X tenths of a second
    write_model(repo, "nap", WINDOW_PY.replace("{nap}", "float(x[0]) / 10"),
                config_pbtxt("nap", [io("X", "TYPE_INT32", [1])], WINDOW_OUTPUTS, extra=three))
    write_ensemble(repo, "naps", paths_ensemble("naps", then="nap"))
    write_ensemble(repo, "paths", paths_ensemble("paths"))
    write_ensemble(repo, "paths_one", paths_ensemble("paths_one", "max_inflight_requests: 1"))
    write_ensemble(repo, "window_one", ensemble_config(
        "window_one", [io("IN", "TYPE_INT32", [1])], WINDOW_OUTPUTS,
        [("window", {"X": "IN"}, {"VALUE": "VALUE", "WINDOW": "WINDOW"})]).replace(
        "ensemble_scheduling {", "ensemble_scheduling { max_inflight_requests: 1"))
    with stubhost.Server(repo) as s:
        yield s


def overlapping(windows: list[np.ndarray]) -> bool:
    spans = sorted((float(w[0]), float(w[1])) for w in windows)
    return any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:]))


def stream(server: stubhost.Server, name: str, values: list[int]) -> list[dict[str, np.ndarray]]:
    return list(server.stream(name, {"IN": np.array(values, np.int32)}))


def test_the_paths_of_a_decoupled_step_run_side_by_side(server: stubhost.Server) -> None:
    """Three responses, a 3-instance next step: the three paths overlap (one after another they
    could not)."""
    got = stream(server, "paths", [7, 8, 9])
    assert sorted(int(r["VALUE"][0]) for r in got) == [7, 8, 9]
    assert overlapping([r["WINDOW"] for r in got]), [r["WINDOW"] for r in got]


def test_responses_keep_the_order_of_the_decoupled_steps_responses(server: stubhost.Server) -> None:
    """The first path is the slowest (0.4 s, then 0.2, 0.1): the paths overlap, and the ensemble
    still answers in the order the decoupled step did."""
    got = stream(server, "naps", [4, 2, 1])
    assert [int(r["VALUE"][0]) for r in got] == [4, 2, 1]
    windows = [r["WINDOW"] for r in got]
    assert windows[2][1] < windows[0][1], "the last path did not finish first: the test proves nothing"


def test_max_inflight_requests_runs_a_steps_requests_one_at_a_time(server: stubhost.Server) -> None:
    got = stream(server, "paths_one", [7, 8, 9])
    assert sorted(int(r["VALUE"][0]) for r in got) == [7, 8, 9]
    assert not overlapping([r["WINDOW"] for r in got]), [r["WINDOW"] for r in got]


def test_the_limit_is_shared_by_every_request_of_the_ensemble(server: stubhost.Server) -> None:
    """Triton's limit is per step of the ensemble model, across all its requests: four concurrent
    requests of a one-step ensemble with max_inflight_requests 1 never overlap, in threads or in
    one event loop."""
    async def concurrently() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(*(server.infer_async("window_one", {"IN": np.array([i], np.int32)})
                                      for i in range(4)))
    got = asyncio.run(concurrently())
    assert [int(r["VALUE"][0]) for r in got] == [0, 1, 2, 3]
    assert not overlapping([r["WINDOW"] for r in got])

    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(3) as pool:
        threaded = list(pool.map(lambda i: server.infer("window_one", {"IN": np.array([i], np.int32)}), range(3)))
    assert not overlapping([r["WINDOW"] for r in threaded])


def test_leaving_a_stream_early_frees_every_place(server: stubhost.Server) -> None:
    responses = server.stream("paths_one", {"IN": np.array([1, 2, 3, 4], np.int32)})
    first = next(responses)
    assert int(first["VALUE"][0]) == 1
    responses.close()
    ensemble = next(m for m in server.loaded() if m.name == "paths_one")
    assert [limiter.inflight for limiter in ensemble._limiters] == [0, 0]
    again = stream(server, "paths_one", [5])  # nothing left waiting: the next request runs at once
    assert [int(r["VALUE"][0]) for r in again] == [5]


def test_the_limit_is_logged_at_load(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    repo = copy_examples(tmp_path / "models", "add_sub")
    write_ensemble(repo, "limited", ensemble_config(
        "limited", [io("A", "TYPE_FP32", [4]), io("B", "TYPE_FP32", [4])], [io("SUM", "TYPE_FP32", [4])],
        [("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "SUM"})]).replace(
        "ensemble_scheduling {", "ensemble_scheduling { max_inflight_requests: 2"))
    with caplog.at_level(logging.INFO, logger="stubhost"), stubhost.Server(repo) as server:
        out = server.infer("limited", {"A": np.ones(4, np.float32), "B": np.ones(4, np.float32)})
    np.testing.assert_array_equal(out["SUM"], np.full(4, 2, np.float32))
    assert "Ensemble model 'limited' configured with max_inflight_requests: 2" in caplog.text
