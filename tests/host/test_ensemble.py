"""Ensembles through the in-process API: steps run in data-flow order over real stubs, ready steps
run in parallel, a decoupled step streams, wiring errors fail the load with clear words, and a
composing model's unload or reload shows at once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import SLEEPY_PY, config_pbtxt, copy_examples, io, sleepy_config, write_model

DOUBLE_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x < 0).any():
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative input to double")))
                continue
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 2)]))
        return out
"""


def ensemble_config(name: str, inputs: list[str], outputs: list[str], steps: list[tuple[str, dict, dict]],
                    extra: str = "", max_batch_size: int = 0) -> str:
    """An ensemble config.pbtxt; each step is (model, input_map, output_map)."""
    lines = [f'name: "{name}"', 'platform: "ensemble"', f"max_batch_size: {max_batch_size}"]
    lines.append("input [ " + ", ".join(inputs) + " ]")
    lines.append("output [ " + ", ".join(outputs) + " ]")
    rendered = []
    for model, inputs_map, outputs_map in steps:
        maps = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs_map.items())
        maps += " " + " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs_map.items())
        rendered.append(f'{{ model_name: "{model}" model_version: -1 {maps} }}')
    lines.append("ensemble_scheduling { step [ " + ", ".join(rendered) + " ] }")
    return "\n".join(lines) + "\n" + extra


def write_ensemble(repo: Path, name: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(config)


def double_model(repo: Path, name: str = "double") -> None:
    write_model(repo, name, DOUBLE_PY, config_pbtxt(name, [io("X", "TYPE_FP32", [-1])], [io("Y", "TYPE_FP32", [-1])]))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = copy_examples(tmp_path_factory.mktemp("ensemble") / "models", "add_sub", "add_sub_twice", "repeat")
    double_model(repo)
    vec = [io("X", "TYPE_FP32", [-1])]
    # X -> double -> double: 4X
    write_ensemble(repo, "quadruple", ensemble_config("quadruple", vec, [io("Y", "TYPE_FP32", [-1])], [
        ("double", {"X": "X"}, {"Y": "TWICE"}), ("double", {"X": "TWICE"}, {"Y": "Y"})]))
    # two slow models side by side, fed the same input
    for name in ("slow_a", "slow_b"):
        write_model(repo, name, SLEEPY_PY, sleepy_config(name))
    write_ensemble(repo, "fan_out", ensemble_config(
        "fan_out", [io("X", "TYPE_FP32", [-1])], [io("A", "TYPE_FP32", [-1]), io("B", "TYPE_FP32", [-1])], [
            ("slow_a", {"INPUT0": "X"}, {"OUTPUT0": "A"}), ("slow_b", {"INPUT0": "X"}, {"OUTPUT0": "B"})]))
    # a decoupled step (repeat streams each element) followed by a plain one
    write_model(repo, "to_float", """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy().astype(np.float32) * 10)]) for r in requests]
""", config_pbtxt("to_float", [io("X", "TYPE_INT32", [1])], [io("Y", "TYPE_FP32", [1])]))
    write_ensemble(repo, "stream_tens", ensemble_config(
        "stream_tens", [io("IN", "TYPE_INT32", [-1])], [io("TENS", "TYPE_FP32", [1]), io("IDX", "TYPE_UINT32", [1])], [
            ("repeat", {"IN": "IN"}, {"OUT": "VALUE", "IDX": "IDX"}), ("to_float", {"X": "VALUE"}, {"Y": "TENS"})]))
    return repo


@pytest.fixture(scope="module")
def server(repo: Path):
    with stubhost.Server(repo) as s:
        yield s


def test_the_example_ensemble_composes_add_sub_twice(server: stubhost.Server) -> None:
    a, b = np.arange(4, dtype=np.float32), np.full(4, 3, np.float32)
    out = server.infer("add_sub_twice", {"A": a, "B": b})
    np.testing.assert_array_equal(out["TWICE_A"], 2 * a)
    np.testing.assert_array_equal(out["TWICE_B"], 2 * b)
    only = server.infer("add_sub_twice", {"A": a, "B": b}, outputs=["TWICE_B"])
    assert list(only) == ["TWICE_B"]


def test_asyncio_callers_run_many_ensembles_at_once(server: stubhost.Server) -> None:
    async def main() -> list[dict]:
        return await asyncio.gather(*(server.infer_async("quadruple", {"X": np.full(3, i, np.float32)})
                                      for i in range(20)))
    for i, out in enumerate(asyncio.run(main())):
        np.testing.assert_array_equal(out["Y"], np.full(3, 4 * i, np.float32))


def test_steps_that_are_ready_together_run_in_parallel(server: stubhost.Server) -> None:
    x = np.ones(2, np.float32)
    server.infer("fan_out", {"X": x})  # warm
    start = time.monotonic()
    out = server.infer("fan_out", {"X": x}, parameters={"sleep": 1.0})
    elapsed = time.monotonic() - start
    np.testing.assert_array_equal(out["A"], x)
    np.testing.assert_array_equal(out["B"], x)
    assert elapsed < 1.8, f"two 1 s steps with the same inputs took {elapsed:.2f} s: they did not overlap"


def test_a_decoupled_step_makes_the_ensemble_stream(server: stubhost.Server) -> None:
    assert server.is_decoupled("stream_tens")
    got = [(float(r["TENS"][0]), int(r["IDX"][0])) for r in server.stream("stream_tens", {"IN": np.array([1, 2, 3], np.int32)})]
    assert got == [(10.0, 0), (20.0, 1), (30.0, 2)]
    with pytest.raises(stubhost.InferenceError) as info:
        server.infer("stream_tens", {"IN": np.array([1], np.int32)})
    assert info.value.code == "UNSUPPORTED"


def test_a_decoupled_ensemble_streams_to_asyncio_callers(server: stubhost.Server) -> None:
    async def main() -> list[float]:
        return [float(r["TENS"][0]) async for r in server.stream_async("stream_tens", {"IN": np.array([4, 5], np.int32)})]
    assert asyncio.run(main()) == [40.0, 50.0]


def test_an_error_in_a_step_fails_the_request_with_its_words(server: stubhost.Server) -> None:
    before = server.statistics("quadruple")["model_stats"][0]["inference_stats"]["fail"]["count"]
    with pytest.raises(stubhost.InferenceError, match="negative input to double"):
        server.infer("quadruple", {"X": np.full(2, -1, np.float32)})
    after = server.statistics("quadruple")["model_stats"][0]["inference_stats"]["fail"]["count"]
    assert after == before + 1
    np.testing.assert_array_equal(server.infer("quadruple", {"X": np.ones(1, np.float32)})["Y"], [4])


def test_requests_are_checked_against_the_ensembles_own_config(server: stubhost.Server) -> None:
    with pytest.raises(stubhost.InferenceError) as info:
        server.infer("add_sub_twice", {"A": np.ones(4, np.float32), "NOPE": np.ones(4, np.float32)})
    assert info.value.code == "INVALID_ARG" and "NOPE" in info.value.message
    with pytest.raises(stubhost.InferenceError, match="unexpected inference output 'SUM'"):
        server.infer("add_sub_twice", {"A": np.ones(4, np.float32), "B": np.ones(4, np.float32)}, outputs=["SUM"])


def test_statistics_count_the_ensemble_and_each_step(server: stubhost.Server) -> None:
    def successes(name: str) -> int:
        return server.statistics(name)["model_stats"][0]["inference_stats"]["success"]["count"]
    before = successes("add_sub_twice"), successes("add_sub")
    for _ in range(5):
        server.infer("add_sub_twice", {"A": np.ones(4, np.float32), "B": np.ones(4, np.float32)})
    assert (successes("add_sub_twice"), successes("add_sub")) == (before[0] + 5, before[1] + 10)


def test_metadata_names_the_ensemble_platform(server: stubhost.Server) -> None:
    meta = server.model_metadata("add_sub_twice")
    assert meta["platform"] == "ensemble"
    assert [i["name"] for i in meta["inputs"]] == ["A", "B"]
    assert server.model_config("add_sub_twice")["ensemble_scheduling"]["step"][0]["model_name"] == "add_sub"


# ---- loading ------------------------------------------------------------------------------------
@pytest.mark.parametrize("steps, words", [
    ([("missing", {"X": "X"}, {"Y": "A"}), ("double", {"X": "A"}, {"Y": "B"}), ("gone", {"X": "B"}, {"Y": "Y"})],
     "ensemble broken contains models that are not available or ambiguous: missing, gone"),
    ([("double", {"NOPE": "X"}, {"Y": "Y"})], "is mapping to non-existing input NOPE in model double"),
    ([("double", {"X": "X"}, {"NOPE": "Y"})], "is mapped from non-existing output NOPE in model double"),
    ([("double", {"X": "X"}, {"Y": "OTHER"})], "ensemble output 'Y' for ensemble broken' is not used"),
    ([("double", {"X": "X"}, {"Y": "Y"}), ("double", {"X": "LOOP"}, {"Y": "SPARE"})],
     "ensemble tensor 'LOOP' is unused in ensemble 'broken'"),
    ([("double", {"X": "X"}, {"Y": "Y"}), ("double", {"X": "Y"}, {"Y": "SPARE"})],
     "ensemble tensor 'SPARE' is unused in ensemble 'broken'"),
    ([("double", {"X": "X"}, {"Y": "A"}), ("double", {"X": "LOOP"}, {"Y": "Y"}), ("double", {"X": "Y"}, {"Y": "LOOP"})],
     "output 'Y' for ensemble 'broken' is not written: at least one of its depending tensors, 'LOOP', is not "
     "connected"),
])
def test_bad_wiring_fails_the_load_and_nothing_else(tmp_path: Path, steps, words) -> None:
    repo = tmp_path / "models"
    double_model(repo)
    write_ensemble(repo, "broken", ensemble_config("broken", [io("X", "TYPE_FP32", [-1])],
                                                   [io("Y", "TYPE_FP32", [-1])], steps))
    with stubhost.Server(repo, exit_on_error=False) as server:
        assert words in server.load_errors["broken"], server.load_errors["broken"]
        assert server.model_ready("double")
        assert not server.ready()


FP32_4 = [io("A", "TYPE_FP32", [4]), io("B", "TYPE_FP32", [4])]
ADD_SUB = {"INPUT0": "A", "INPUT1": "B"}


@pytest.mark.parametrize("inputs, outputs, steps, batch, words", [
    # every input a composing model needs is mapped (an optional one may be left out)
    (FP32_4[:1], [io("S", "TYPE_FP32", [4])], [("add_sub", {"INPUT0": "A"}, {"OUTPUT0": "S"})], 0,
     "in ensemble broken, input INPUT1 in model add_sub is not mapped to any ensemble tensors"),
    # one data type per ensemble tensor: the ensemble's own declaration is the first
    ([io("A", "TYPE_INT32", [4]), io("B", "TYPE_FP32", [4])], [io("S", "TYPE_FP32", [4])],
     [("add_sub", ADD_SUB, {"OUTPUT0": "S"})], 0,
     "in ensemble broken, ensemble tensor A: inconsistent data type: TYPE_INT32 is inferred from model broken "
     "while TYPE_FP32 is inferred from model add_sub"),
    # ... and between steps
    (FP32_4, [io("OUT", "TYPE_INT32", [1])],
     [("add_sub", ADD_SUB, {"OUTPUT0": "S"}), ("repeat", {"IN": "S"}, {"OUT": "OUT"})], 0,
     "in ensemble broken, ensemble tensor S: inconsistent data type: TYPE_FP32 is inferred from model add_sub "
     "while TYPE_INT32 is inferred from model repeat"),
    # one shape, with or without the batch dimension (-1 matches any size)
    ([io("A", "TYPE_FP32", [3]), io("B", "TYPE_FP32", [4])], [io("S", "TYPE_FP32", [4])],
     [("add_sub", ADD_SUB, {"OUTPUT0": "S"})], 0,
     "in ensemble broken, ensemble tensor A: inconsistent shape: [3] is inferred from model broken while [4] is "
     "inferred from model add_sub"),
    # a composing model that batches must allow the ensemble's batch size
    ([io("X", "TYPE_FP32", [-1])], [io("Y", "TYPE_FP32", [-1])], [("double4", {"X": "X"}, {"Y": "Y"})], 8,
     "ensemble broken allows maximum batch size 8, but it contains model double4 which only allows maximum batch "
     "size to be 4"),
    # the ensemble's outputs (or a step's inputs) from two sources, one of them decoupled
    ([io("IN", "TYPE_INT32", [-1]), io("X", "TYPE_FP32", [-1])],
     [io("OUT", "TYPE_INT32", [1]), io("Y", "TYPE_FP32", [-1])],
     [("repeat", {"IN": "IN"}, {"OUT": "OUT"}), ("double", {"X": "X"}, {"Y": "Y"})], 0,
     "in ensemble broken, step of model 'broken' receives inputs originated from different decoupled models"),
])
def test_maps_that_disagree_with_the_composing_models_fail_the_load(tmp_path: Path, inputs, outputs, steps, batch,
                                                                     words) -> None:
    """The checks Triton makes when an ensemble loads, against its composing models' configs."""
    repo = copy_examples(tmp_path / "models", "add_sub", "repeat")
    double_model(repo)
    write_model(repo, "double4", DOUBLE_PY, config_pbtxt("double4", [io("X", "TYPE_FP32", [-1])],
                                                         [io("Y", "TYPE_FP32", [-1])], max_batch_size=4))
    write_ensemble(repo, "broken", ensemble_config("broken", inputs, outputs, steps, max_batch_size=batch))
    with stubhost.Server(repo, exit_on_error=False) as server:
        assert words in server.load_errors["broken"], server.load_errors["broken"]
        assert server.model_ready("add_sub") and server.model_ready("repeat")


def test_an_optional_input_may_stay_unmapped_and_a_batching_ensemble_may_run_models_that_do_not_batch(
        tmp_path: Path) -> None:
    repo = copy_examples(tmp_path / "models", "repeat")
    double_model(repo)
    write_ensemble(repo, "fine", ensemble_config(  # repeat's DELAY_MS is optional
        "fine", [io("IN", "TYPE_INT32", [-1])], [io("OUT", "TYPE_INT32", [1]), io("IDX", "TYPE_UINT32", [1])],
        [("repeat", {"IN": "IN"}, {"OUT": "OUT", "IDX": "IDX"})]))
    write_ensemble(repo, "batched", ensemble_config(  # [-1] with a batch dimension is still [-1] for double
        "batched", [io("X", "TYPE_FP32", [-1])], [io("Y", "TYPE_FP32", [-1])],
        [("double", {"X": "X"}, {"Y": "Y"})], max_batch_size=4))
    with stubhost.Server(repo, exit_on_error=False) as server:
        assert server.load_errors == {}
        assert server.model_ready("fine") and server.model_ready("batched")
        outs = [r.outputs["OUT"].item() for r in server.stream_responses("fine", {"IN": np.array([4, 5], np.int32)})
                if not r.empty]
        assert outs == [4, 5]


def test_a_composing_model_that_failed_to_load_is_named_with_its_error(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "bad", "raise ImportError('no such weights')\n",
                config_pbtxt("bad", [io("X", "TYPE_FP32", [-1])], [io("Y", "TYPE_FP32", [-1])]))
    write_ensemble(repo, "broken", ensemble_config("broken", [io("X", "TYPE_FP32", [-1])],
                                                   [io("Y", "TYPE_FP32", [-1])], [("bad", {"X": "X"}, {"Y": "Y"})]))
    with stubhost.Server(repo, exit_on_error=False) as server:
        error = server.load_errors["broken"]
        assert error.startswith("ensemble 'broken' depends on 'bad' which has no loaded version. Model 'bad' loading "
                                "failed with error: "), error
        assert "no such weights" in error


def test_ensembles_that_run_each_other_fail_with_tritons_circular_dependency_text(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    double_model(repo)
    vec_in, vec_out = [io("X", "TYPE_FP32", [-1])], [io("Y", "TYPE_FP32", [-1])]
    write_ensemble(repo, "cyc_a", ensemble_config("cyc_a", vec_in, vec_out, [("cyc_b", {"X": "X"}, {"Y": "Y"})]))
    write_ensemble(repo, "cyc_b", ensemble_config("cyc_b", vec_in, vec_out, [("cyc_a", {"X": "X"}, {"Y": "Y"})]))
    write_ensemble(repo, "outside", ensemble_config("outside", vec_in, vec_out, [("cyc_a", {"X": "X"}, {"Y": "Y"})]))
    with stubhost.Server(repo, exit_on_error=False) as server:
        assert "circular dependency between ensembles: cyc_a -> ... -> cyc_b -> cyc_a" in server.load_errors["cyc_a"]
        assert "circular dependency between ensembles: cyc_b -> ... -> cyc_a -> cyc_b" in server.load_errors["cyc_b"]
        # one that runs the cycle without being in it loads beside it, and names the model it lacks
        assert "ensemble 'outside' depends on 'cyc_a' which has no loaded version." in server.load_errors["outside"]
        assert server.model_ready("double")


def test_an_ensemble_without_a_version_folder_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    double_model(repo)
    (repo / "bare").mkdir()
    (repo / "bare" / "config.pbtxt").write_text(ensemble_config(
        "bare", [io("X", "TYPE_FP32", [-1])], [io("Y", "TYPE_FP32", [-1])], [("double", {"X": "X"}, {"Y": "Y"})]))
    with stubhost.Server(repo, exit_on_error=False) as server:
        assert "at least one version must be available" in server.load_errors["bare"]


def test_loading_an_ensemble_loads_its_models_and_unloading_one_shows(tmp_path: Path) -> None:
    repo = copy_examples(tmp_path / "models", "add_sub", "add_sub_twice")
    a = np.ones(4, np.float32)
    with stubhost.Server(repo, models=[]) as server:
        server.load("add_sub_twice")  # loads add_sub first, as Triton does
        assert server.models() == ["add_sub", "add_sub_twice"]
        np.testing.assert_array_equal(server.infer("add_sub_twice", {"A": a, "B": a})["TWICE_A"], 2 * a)
        server.unload("add_sub")
        assert not server.model_ready("add_sub_twice")
        with pytest.raises(stubhost.InferenceError, match="depends on 'add_sub' which has no loaded version") as info:
            server.infer("add_sub_twice", {"A": a, "B": a})
        assert info.value.code == "UNAVAILABLE"
        server.load("add_sub")
        assert server.model_ready("add_sub_twice")
        np.testing.assert_array_equal(server.infer("add_sub_twice", {"A": a, "B": a})["TWICE_B"], 2 * a)


def test_an_ensemble_of_ensembles_loads_in_order(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    double_model(repo)
    vec_in, vec_out = [io("X", "TYPE_FP32", [-1])], [io("Y", "TYPE_FP32", [-1])]
    write_ensemble(repo, "a_outer", ensemble_config("a_outer", vec_in, vec_out, [
        ("z_inner", {"X": "X"}, {"Y": "MID"}), ("z_inner", {"X": "MID"}, {"Y": "Y"})]))
    write_ensemble(repo, "z_inner", ensemble_config("z_inner", vec_in, vec_out, [
        ("double", {"X": "X"}, {"Y": "Y"})]))
    with stubhost.Server(repo) as server:
        np.testing.assert_array_equal(server.infer("a_outer", {"X": np.ones(2, np.float32)})["Y"], [4, 4])


def test_naming_only_the_ensemble_at_start_up_loads_its_models(tmp_path: Path) -> None:
    repo = copy_examples(tmp_path / "models", "add_sub", "add_sub_twice", "identity")
    with stubhost.Server(repo, models=["add_sub_twice"]) as server:
        assert server.models() == ["add_sub", "add_sub_twice"]
        assert server.ready()


def test_an_ensemble_with_a_decoupled_step_shows_decoupled_in_its_config(server: stubhost.Server) -> None:
    assert server.model_config("stream_tens")["model_transaction_policy"]["decoupled"] is True
    assert not server.model_config("quadruple").get("model_transaction_policy", {}).get("decoupled", False)


def test_a_failed_step_ends_a_streaming_ensemble_with_an_error_response(tmp_path: Path) -> None:
    repo = copy_examples(tmp_path / "models", "repeat")
    double_model(repo)
    write_model(repo, "negate", """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "Y", -pb_utils.get_input_tensor_by_name(r, "X").as_numpy().astype(np.float32))]) for r in requests]
""", config_pbtxt("negate", [io("X", "TYPE_INT32", [1])], [io("Y", "TYPE_FP32", [1])]))
    # repeat -> negate -> double: double refuses negative numbers, so the first path fails
    write_ensemble(repo, "fails", ensemble_config("fails", [io("IN", "TYPE_INT32", [-1])], [io("OUT", "TYPE_FP32", [1])], [
        ("repeat", {"IN": "IN"}, {"OUT": "V"}), ("negate", {"X": "V"}, {"Y": "N"}), ("double", {"X": "N"}, {"Y": "OUT"})]))
    with stubhost.Server(repo) as server:
        responses = list(server.stream_responses("fails", {"IN": np.array([1, 2], np.int32)}))
        assert len(responses) == 1 and responses[0].final
        assert responses[0].error is not None and "negative input to double" in responses[0].error.message
        with pytest.raises(stubhost.InferenceError, match="negative input to double"):
            list(server.stream("fails", {"IN": np.array([1], np.int32)}))


def test_unload_dependents_unloads_the_composing_models_too(tmp_path: Path) -> None:
    repo = copy_examples(tmp_path / "models", "add_sub", "add_sub_twice", "identity")
    with stubhost.Server(repo) as server:
        server.unload("add_sub_twice")
        assert server.models() == ["add_sub", "identity"]  # its models stay without the parameter
        server.load("add_sub_twice")
        server.unload("add_sub_twice", unload_dependents=True)
        assert server.models() == ["identity"]


NAP_PY = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep({nap})
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""


def test_a_step_starts_when_its_inputs_exist_not_when_its_round_ends(tmp_path: Path) -> None:
    """slow (1 s) beside fast -> then (0.6 s): in rounds `then` would wait for `slow` (1.6 s);
    scheduled on each step's completion the whole request takes about 1 s."""
    repo = tmp_path / "models"
    vec_in, vec_out = [io("X", "TYPE_FP32", [-1])], [io("Y", "TYPE_FP32", [-1])]
    for name, nap in (("slow", 1.0), ("fast", 0.0), ("then", 0.6)):
        write_model(repo, name, NAP_PY.replace("{nap}", str(nap)), config_pbtxt(name, vec_in, vec_out))
    write_ensemble(repo, "branches", ensemble_config(
        "branches", vec_in, [io("A", "TYPE_FP32", [-1]), io("C", "TYPE_FP32", [-1])], [
            ("slow", {"X": "X"}, {"Y": "A"}), ("fast", {"X": "X"}, {"Y": "B"}), ("then", {"X": "B"}, {"Y": "C"})]))
    x = np.ones(2, np.float32)
    with stubhost.Server(repo) as server:
        server.infer("branches", {"X": x})  # warm
        start = time.monotonic()
        out = server.infer("branches", {"X": x})
        sync_s = time.monotonic() - start
        start = time.monotonic()
        out_async = asyncio.run(server.infer_async("branches", {"X": x}))
        async_s = time.monotonic() - start
    for result in (out, out_async):
        np.testing.assert_array_equal(result["A"], x)
        np.testing.assert_array_equal(result["C"], x)
    assert sync_s < 1.45 and async_s < 1.45, (sync_s, async_s)
