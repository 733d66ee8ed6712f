"""The response cache in process: what hits and what misses, LRU eviction, entries too large,
statistics as Triton counts them, and every request path (direct, queued, async, submit, BLS,
ensembles)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stubhost
from stubhost.host.errors import InferenceError
from stubhost.host.regions import ClientRegion, RegionDestination, RegionTensor
from stubhost.host.response_cache import (
    EXISTS,
    INSERTED,
    TOO_LARGE,
    ResponseCache,
    cached_response,
    request_key,
)
from tests.host.repo_factory import config_pbtxt, copy_examples, io, wait_until, write_model

# Y = X * 2, CALLS = how many requests this stub has executed (so a hit shows the old count);
# parameters: {"fail": 1} answers with an error response.
COUNTED_PY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.calls += 1
            if json.loads(request.parameters()).get("fail"):
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("asked to fail")))
                continue
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", x * 2), pb_utils.Tensor("CALLS", np.array([self.calls], np.int64))],
                parameters={"calls": self.calls}))
        return responses
"""

# Calls "counted" twice with the same input through BLS and returns both CALLS.
BLS_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            calls = []
            for _ in range(2):
                answer = pb_utils.InferenceRequest(model_name="counted", inputs=[pb_utils.Tensor("X", x)],
                                                   requested_output_names=["CALLS"]).exec()
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                calls.append(int(pb_utils.get_output_tensor_by_name(answer, "CALLS").as_numpy()[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("BOTH", np.array(calls, np.int64))]))
        return responses
"""

CACHED = "response_cache { enable: true }"
MB = 1 << 20


def counted_config(name: str = "counted", *, extra: str = CACHED) -> str:
    return config_pbtxt(name, [io("X", "TYPE_FP32", [-1, -1])],
                        [io("Y", "TYPE_FP32", [-1, -1]), io("CALLS", "TYPE_INT64", [1])], extra=extra)


def batched_config(name: str) -> str:
    return config_pbtxt(name, [io("X", "TYPE_FP32", [-1])], [io("Y", "TYPE_FP32", [-1]), io("CALLS", "TYPE_INT64", [1])],
                        max_batch_size=8, extra=CACHED + "\ndynamic_batching { }\ninstance_group [ { count: 2 kind: KIND_CPU } ]")


def x(value: float = 1.0, shape: tuple[int, ...] = (2, 3)) -> np.ndarray:
    return np.full(shape, value, np.float32)


def stats(server: stubhost.Server, name: str = "counted") -> dict:
    return server.statistics(name)["model_stats"][0]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    write_model(tmp_path, "counted", COUNTED_PY, counted_config())
    return tmp_path


# ---- hits and misses -------------------------------------------------------------------------------
def test_an_identical_request_is_answered_without_running_execute(repo: Path) -> None:
    with stubhost.Server(repo, response_cache_bytes=MB) as server:
        first = server.infer_response("counted", {"X": x()})
        second = server.infer_response("counted", {"X": x()}, request_id="another id")
        assert int(first.outputs["CALLS"][0]) == int(second.outputs["CALLS"][0]) == 1
        np.testing.assert_array_equal(second.outputs["Y"], x() * 2)
        assert second.parameters == {"calls": 1} and second.model_version == 1
        second.outputs["Y"][:] = 0  # the caller's copy: the cached entry is unchanged
        np.testing.assert_array_equal(server.infer("counted", {"X": x()})["Y"], x() * 2)
        assert int(server.infer("counted", {"X": x(2.0)})["CALLS"][0]) == 2  # other data: a miss


def test_other_shapes_and_other_requested_outputs_miss(repo: Path) -> None:
    with stubhost.Server(repo, response_cache_bytes=MB) as server:
        assert int(server.infer("counted", {"X": x(shape=(2, 3))})["CALLS"][0]) == 1
        assert int(server.infer("counted", {"X": x(shape=(3, 2))})["CALLS"][0]) == 2  # same bytes, other shape
        only_y = server.infer("counted", {"X": x(shape=(2, 3))}, outputs=["Y"])
        assert set(only_y) == {"Y"}  # never an output that was not asked for
        both = server.infer("counted", {"X": x(shape=(2, 3))}, outputs=["CALLS", "Y"])
        assert int(both["CALLS"][0]) == 4 and set(both) == {"Y", "CALLS"}
        assert int(server.infer("counted", {"X": x(shape=(2, 3))}, outputs=["Y", "CALLS"])["CALLS"][0]) == 4
        assert stats(server)["inference_stats"]["cache_hit"]["count"] == 1


def test_errors_are_not_cached_and_parameters_are_not_in_the_key(repo: Path) -> None:
    with stubhost.Server(repo, response_cache_bytes=MB) as server:
        with pytest.raises(InferenceError, match="asked to fail"):
            server.infer("counted", {"X": x()}, parameters={"fail": 1})
        assert int(server.infer("counted", {"X": x()})["CALLS"][0]) == 2  # the error was not cached
        # As in Triton, request parameters are not part of the key: this one is a hit.
        assert int(server.infer("counted", {"X": x()}, parameters={"fail": 1})["CALLS"][0]) == 2
        s = stats(server)["inference_stats"]
        # the error response is an answer (a success, as Triton counts it), but it is not cached
        assert (s["fail"]["count"], s["cache_miss"]["count"], s["cache_hit"]["count"]) == (0, 1, 1)
        assert s["success"]["count"] == 3


def test_a_request_refused_by_its_checks_fails_as_before(repo: Path) -> None:
    with stubhost.Server(repo, response_cache_bytes=MB) as server:
        with pytest.raises(InferenceError, match="unexpected inference input 'Z'"):
            server.infer("counted", {"Z": x()})
        assert stats(server)["inference_stats"]["fail"]["count"] == 1


def test_least_recently_used_entries_are_evicted(repo: Path) -> None:
    size = 1000  # elements of X: an entry takes a little over 4000 bytes (Y's; X is not kept)
    with stubhost.Server(repo, response_cache_bytes=10_000) as server:
        def calls(value: float) -> int:
            return int(server.infer("counted", {"X": x(value, (1, size))})["CALLS"][0])

        assert [calls(1), calls(2)] == [1, 2]  # two entries fit
        assert calls(1) == 1  # a hit: 1 is now the most recently used
        assert calls(3) == 3  # a third entry evicts 2, the least recently used
        assert calls(1) == 1
        assert calls(2) == 4  # evicted: executed again, evicting 3 (1 was used after it)
        assert calls(1) == 1
        assert calls(3) == 5


def test_an_entry_larger_than_the_cache_is_not_stored(repo: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="stubhost"), stubhost.Server(repo, response_cache_bytes=4096) as server:
        big = x(1.0, (1, 2000))
        assert int(server.infer("counted", {"X": big})["CALLS"][0]) == 1
        assert int(server.infer("counted", {"X": big})["CALLS"][0]) == 2
        s = stats(server)["inference_stats"]
        assert (s["cache_miss"]["count"], s["cache_hit"]["count"]) == (2, 0)  # a miss all the same, as in Triton
    assert "into response cache: Requested byte_size:" in caplog.text
    assert "is greater than total cache size: 4096" in caplog.text


def test_a_model_that_enables_the_cache_runs_normally_on_a_server_without_one(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        assert [int(server.infer("counted", {"X": x()})["CALLS"][0]) for _ in range(2)] == [1, 2]
        s = stats(server)["inference_stats"]
        assert (s["cache_hit"]["count"], s["cache_miss"]["count"]) == (0, 0)


def test_a_model_without_enable_does_not_use_the_servers_cache(tmp_path: Path) -> None:
    write_model(tmp_path, "counted", COUNTED_PY, counted_config(extra=""))
    with stubhost.Server(tmp_path, response_cache_bytes=MB) as server:
        assert [int(server.infer("counted", {"X": x()})["CALLS"][0]) for _ in range(2)] == [1, 2]


def test_a_reload_does_not_answer_from_the_previous_copy(repo: Path) -> None:
    with stubhost.Server(repo, response_cache_bytes=MB) as server:
        assert int(server.infer("counted", {"X": x()})["CALLS"][0]) == 1
        server.load("counted")
        assert int(server.infer("counted", {"X": x()})["CALLS"][0]) == 1  # executed by the new copy
        assert int(server.infer("counted", {"X": x()})["CALLS"][0]) == 1
        assert stats(server)["inference_stats"]["cache_hit"]["count"] == 1


# ---- statistics --------------------------------------------------------------------------------------
def test_statistics_count_hits_and_misses_as_triton_does(repo: Path) -> None:
    with stubhost.Server(repo, response_cache_bytes=MB) as server:
        server.infer("counted", {"X": x()})
        after_miss = stats(server)
        time.sleep(0.05)  # so that a hit moving last_inference would show
        for _ in range(2):
            server.infer("counted", {"X": x()})
        s = stats(server)
    i = s["inference_stats"]
    assert i["success"]["count"] == 3 and i["queue"]["count"] == 3  # hits are successes
    assert i["cache_hit"]["count"] == 2 and i["cache_hit"]["ns"] > 0
    assert i["cache_miss"]["count"] == 1 and i["cache_miss"]["ns"] > 0
    assert s["inference_count"] == 1 and s["execution_count"] == 1  # hits run nothing
    assert [(b["batch_size"], b["compute_infer"]["count"]) for b in s["batch_stats"]] == [(1, 1)]
    for key in ("compute_input", "compute_infer", "compute_output"):  # neither the time nor the count of hits
        assert i[key]["ns"] == after_miss["inference_stats"][key]["ns"]
        assert i[key]["count"] == 1  # Triton: the success count less the cache hits
    assert abs(s["last_inference"] - after_miss["last_inference"]) <= 1  # only executions move it (ms, rounded)
    # The miss's success time includes its lookup and insertion (Triton's UpdateSuccessCacheMiss).
    assert after_miss["inference_stats"]["success"]["ns"] >= after_miss["inference_stats"]["cache_miss"]["ns"]


def test_hits_through_a_queue_count_no_compute_and_no_execution(tmp_path: Path) -> None:
    write_model(tmp_path, "batched", COUNTED_PY, batched_config("batched"))
    with stubhost.Server(tmp_path, response_cache_bytes=MB) as server:
        one = np.ones((1, 4), np.float32)
        for _ in range(4):
            server.infer("batched", {"X": one})
        s = stats(server, "batched")
    i = s["inference_stats"]
    counts = [i[key]["count"] for key in ("success", "queue", "cache_hit", "cache_miss")]
    assert counts == [4, 4, 3, 1]
    assert [i[key]["count"] for key in ("compute_input", "compute_infer", "compute_output")] == [1, 1, 1]
    assert (s["inference_count"], s["execution_count"], len(s["batch_stats"])) == (1, 1, 1)


# ---- each request is checked once ------------------------------------------------------------------
def spy_checks(model: object) -> list[str]:
    """Wraps the model's checker so that each check that does the work is listed: "inputs" or
    "outputs". One that returns what it was handed, or a result it returned before, did none."""
    checker = model.checker  # type: ignore[attr-defined]
    done: list[str] = []
    seen: list[object] = []

    def counted(kind: str, check: Any) -> Any:
        def run(*args: Any) -> Any:
            result = check(*args)
            if result is not args[0] and not any(result is r for r in seen):
                seen.append(result)
                done.append(kind)
            return result
        return run

    checker.check_inputs = counted("inputs", checker.check_inputs)
    checker.check_outputs = counted("outputs", checker.check_outputs)
    return done


def write_pipeline(repo: Path) -> None:
    """A caching ensemble "pipeline" (IN -> OUT) whose one step is the model "counted"."""
    write_model(repo, "pipeline", None, config_pbtxt(
        "pipeline", [io("IN", "TYPE_FP32", [-1, -1])], [io("OUT", "TYPE_INT64", [1])], extra="""
        platform: "ensemble"
        response_cache { enable: true }
        ensemble_scheduling { step [ { model_name: "counted" model_version: -1
            input_map { key: "X" value: "IN" } output_map { key: "CALLS" value: "OUT" } } ] }
        """).replace('backend: "python"\n', ""))
    (repo / "pipeline" / "1").mkdir()


@pytest.mark.parametrize("model", ["counted", "batched", "pipeline"])
def test_a_miss_checks_its_inputs_and_outputs_once(repo: Path, model: str) -> None:
    write_model(repo, "batched", COUNTED_PY, batched_config("batched"))
    write_pipeline(repo)
    inputs = {"X": np.ones((1, 4), np.float32)} if model == "batched" else {"X": x()}
    if model == "pipeline":
        inputs = {"IN": x()}
    with stubhost.Server(repo, response_cache_bytes=MB) as server:
        done = spy_checks(server._models[model])
        server.infer(model, inputs)  # a miss
        assert done == ["inputs", "outputs"]
        server.infer(model, inputs)  # a hit
        assert done == ["inputs", "outputs"] * 2
        answers: list[object] = []
        if model != "pipeline":  # submit_response: the path the front ends take
            server.submit_response(model, {k: v + 1 for k, v in inputs.items()}, done=answers.append)
            assert wait_until(lambda: answers, 30.0) and not isinstance(answers[0], InferenceError)
            assert done == ["inputs", "outputs"] * 3
        with pytest.raises(InferenceError, match="unexpected inference input"):  # a refusal is still refused
            server.infer(model, {"NOPE": x()})


# ---- every path ------------------------------------------------------------------------------------
def test_a_batching_model_with_two_instances_hits_through_its_queue(tmp_path: Path) -> None:
    write_model(tmp_path, "batched", COUNTED_PY, batched_config("batched"))
    with stubhost.Server(tmp_path, response_cache_bytes=MB) as server:
        one = np.ones((1, 4), np.float32)
        first = server.infer("batched", {"X": one})
        results = [server.infer("batched", {"X": one}) for _ in range(5)]
        assert all(int(r["CALLS"][0]) == int(first["CALLS"][0]) for r in results)

        async def run() -> list[dict[str, np.ndarray]]:
            return await asyncio.gather(*[server.infer_async("batched", {"X": one}) for _ in range(8)])

        assert all(int(r["CALLS"][0]) == int(first["CALLS"][0]) for r in asyncio.run(run()))
        s = stats(server, "batched")
        assert s["inference_stats"]["cache_hit"]["count"] == 13 and s["execution_count"] == 1


def test_the_async_api_hits(repo: Path) -> None:
    with stubhost.Server(repo, response_cache_bytes=MB) as server:
        async def run() -> tuple[int, int]:
            a = await server.infer_async("counted", {"X": x()})
            b = await server.infer_response_async("counted", {"X": x()})
            return int(a["CALLS"][0]), int(b.outputs["CALLS"][0])

        assert asyncio.run(run()) == (1, 1)
        assert stats(server)["inference_stats"]["cache_hit"]["count"] == 1


def test_submit_response_answers_a_hit_before_it_returns(repo: Path) -> None:
    with stubhost.Server(repo, response_cache_bytes=MB) as server:
        server.infer("counted", {"X": x()})
        answers: list[object] = []
        thread = threading.get_ident()
        started = server.submit_response("counted", {"X": x()},
                                         done=lambda r: answers.append((r, threading.get_ident())))
        assert started and len(answers) == 1
        response, where = answers[0]
        assert where == thread and int(response.outputs["CALLS"][0]) == 1  # type: ignore[attr-defined]


def test_bls_calls_hit_the_cache(repo: Path) -> None:
    write_model(repo, "caller", BLS_PY, config_pbtxt("caller", [io("X", "TYPE_FP32", [-1, -1])],
                                                      [io("BOTH", "TYPE_INT64", [2])]))
    with stubhost.Server(repo, response_cache_bytes=MB) as server:
        np.testing.assert_array_equal(server.infer("caller", {"X": x()})["BOTH"], [1, 1])
        assert stats(server)["inference_stats"]["cache_hit"]["count"] == 1


def test_an_ensemble_caches_its_top_level_requests(repo: Path) -> None:
    write_model(repo, "counted", COUNTED_PY, counted_config(extra=""))  # the step itself does not cache
    write_pipeline(repo)
    with stubhost.Server(repo, response_cache_bytes=MB) as server:
        assert [int(server.infer("pipeline", {"IN": x()})["OUT"][0]) for _ in range(3)] == [1, 1, 1]
        assert stats(server, "pipeline")["inference_stats"]["cache_hit"]["count"] == 2
        assert stats(server, "counted")["inference_stats"]["success"]["count"] == 1


def test_region_destinations_come_back_as_arrays_for_the_front_end_to_copy(repo: Path) -> None:
    region = ClientRegion(id=1, key="/not-opened", offset=0, byte_size=64)
    destination = RegionDestination("Y", region, 0, 24)
    with stubhost.Server(repo, response_cache_bytes=MB) as server:
        for _ in range(2):  # a miss, then a hit
            response = server.infer_response("counted", {"X": x()}, outputs=[destination])
            np.testing.assert_array_equal(response.outputs["Y"], x() * 2)
        assert stats(server)["inference_stats"]["cache_hit"]["count"] == 1


def test_a_bad_cache_size_is_refused() -> None:
    for bad in (-1, 1.5, "1", True):
        with pytest.raises(ValueError, match="positive number of bytes"):
            ResponseCache.of(bad)  # type: ignore[arg-type]
    assert ResponseCache.of(None) is None and ResponseCache.of(0) is None


# ---- the cache and the key on their own ------------------------------------------------------------
def test_insert_reports_what_it_did() -> None:
    cache = ResponseCache(10_000)
    entry = cached_response(b"k" * 16, {"Y": np.zeros(10, np.float32)}, {})
    assert entry is not None and entry.nbytes > 40 + 16
    assert cache.insert(b"k" * 16, entry) == INSERTED
    assert cache.insert(b"k" * 16, entry) == EXISTS
    assert cache.used == entry.nbytes and len(cache) == 1
    big = cached_response(b"b" * 16, {"Y": np.zeros(5000, np.float32)}, {})
    assert big is not None and cache.insert(b"b" * 16, big) == TOO_LARGE and len(cache) == 1


def test_bytes_tensors_are_sized_and_hashed_in_their_serialized_form() -> None:
    words = np.array([b"ab", b"cde"], dtype=object)
    entry = cached_response(b"k", {"S": words}, {"p": 1})
    assert entry is not None
    as_objects = request_key("m", 1, 1, [("S", words, 13)], [])
    as_strings = request_key("m", 1, 1, [("S", np.array(["ab", "cde"]), 13)], [])
    assert as_objects == as_strings and as_objects is not None and len(as_objects) == 16


def test_inputs_in_a_region_hash_like_the_same_bytes_in_an_array() -> None:
    data = np.arange(6, dtype=np.float32)
    region = ClientRegion(id=7, key="/k", offset=0, byte_size=24)
    in_region = RegionTensor(region, 0, 24, np.float32, (6,), memoryview(data.tobytes()))
    assert request_key("m", 1, 1, [("X", in_region, 11)], []) == request_key("m", 1, 1, [("X", data, 11)], [])
    unseen = RegionTensor(region, 0, 24, np.float32, (6,))  # no view: not hashable, not cached
    assert request_key("m", 1, 1, [("X", unseen, 11)], []) is None
    gpu = RegionTensor(ClientRegion(id=8, key="", offset=0, byte_size=24, kind="cuda"), 0, 24, np.float32, (6,),
                       memoryview(data.tobytes()))
    assert request_key("m", 1, 1, [("X", gpu, 11)], []) is None  # GPU inputs are not cached (Triton's limit)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-5, 5), min_size=1, max_size=12), st.sampled_from([(-1,), (1, -1)]),
       st.sampled_from([[], ["Y"], ["Y", "Z"]]), st.integers(1, 3))
def test_keys_differ_when_anything_in_the_key_differs(values: list[int], shape: tuple[int, ...],
                                                      outputs: list[str], version: int) -> None:
    data = np.array(values, np.float32).reshape(shape)
    key = request_key("m", 1, version, [("X", data, 11)], outputs)
    assert key == request_key("m", 1, version, [("X", data.copy(), 11)], list(reversed(outputs)))
    others = [
        request_key("n", 1, version, [("X", data, 11)], outputs),
        request_key("m", 2, version, [("X", data, 11)], outputs),
        request_key("m", 1, version + 1, [("X", data, 11)], outputs),
        request_key("m", 1, version, [("X", data.reshape(-1, 1) if data.ndim == 1 else data.ravel(), 11)], outputs),
        request_key("m", 1, version, [("X", data + 1, 11)], outputs),
        request_key("m", 1, version, [("X", data.view(np.int32), 8)], outputs),
        request_key("m", 1, version, [("W", data, 11)], outputs),
        request_key("m", 1, version, [("X", data, 11)], outputs + ["Q"]),
    ]
    assert key is not None and key not in others


def test_an_ensemble_with_a_decoupled_step_cannot_enable_the_cache(tmp_path: Path) -> None:
    copy_examples(tmp_path, "repeat")
    write_model(tmp_path, "streamed", None, config_pbtxt(
        "streamed", [io("IN", "TYPE_INT32", [-1]), io("DELAY_MS", "TYPE_UINT32", [1])],
        [io("OUT", "TYPE_INT32", [1])], extra="""
        platform: "ensemble"
        response_cache { enable: true }
        ensemble_scheduling { step [ { model_name: "repeat" model_version: -1
            input_map [ { key: "IN" value: "IN" }, { key: "DELAY_MS" value: "DELAY_MS" } ]
            output_map { key: "OUT" value: "OUT" } } ] }
        """).replace('backend: "python"\n', ""))
    (tmp_path / "streamed" / "1").mkdir()
    with pytest.raises(InferenceError, match="Response Cache does not currently support model streamed with "
                                             "'decoupled' transaction policy. Please disable the response cache."):
        stubhost.Server(tmp_path, response_cache_bytes=MB)
    with stubhost.Server(tmp_path) as server:  # without a cache on the server it loads and streams
        assert server.is_decoupled("streamed")
