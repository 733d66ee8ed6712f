"""BLS: models calling other models through ``pb_utils.InferenceRequest(...).exec()``.

Runs in real stubs through the public API: sync and async calls, a chain across models, calls
to another instance of the caller's own model, a missing model, a failing model, requested
outputs, parameters, BLS outside ``execute``, and a leak check over many calls.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import stubhost
from stubhost import InferenceError
from tests.host.repo_factory import config_pbtxt, copy_examples, instance, io, wait_until, write_model

# Calls add_sub (or whatever the "target" parameter names) and returns what came back; with
# "how": "async" through async_exec, "chain" calls itself one level down through "chain_to".
CALLER_PY = '''
import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def call(self, request):
        params = json.loads(request.parameters())
        x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy().astype(params.get("dtype", "float32"))
        target = params.get("target", "add_sub")
        outputs = params.get("outputs", [])
        bls = pb_utils.InferenceRequest(
            model_name=target, requested_output_names=outputs,
            inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", np.ones_like(x))],
            parameters={"from": self.name}, model_version=int(params.get("version", -1)))
        return bls, params

    def answer(self, response):
        if response.has_error():
            text = f"{response.error().code()}|{response.error().message()}"
            return pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", np.zeros(4, np.float32)),
                pb_utils.Tensor("ERROR", np.array([text.encode()], dtype=object))])
        total = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
        diff = pb_utils.get_output_tensor_by_name(response, "OUTPUT1")
        names = ",".join(sorted(t.name() for t in response.output_tensors()))
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("SUM", total.as_numpy() if total is not None else diff.as_numpy()),
            pb_utils.Tensor("ERROR", np.array([names.encode()], dtype=object))])

    def execute(self, requests):
        responses = []
        for request in requests:
            bls, params = self.call(request)
            if params.get("how") == "async":
                response = asyncio.run(bls.async_exec())
            else:
                response = bls.exec()
            responses.append(self.answer(response))
        return responses
'''

ASYNC_CALLER_PY = CALLER_PY.replace("    def execute(self, requests):", "    def execute_sync(self, requests):") + '''
    async def execute(self, requests):
        calls = [self.call(r)[0].async_exec() for r in requests]
        return [self.answer(r) for r in await asyncio.gather(*calls)]
'''

INIT_BLS_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        x = np.ones(4, np.float32)
        pb_utils.InferenceRequest(model_name="add_sub", requested_output_names=["OUTPUT0"],
                                  inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)]).exec()

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
'''

FAILING_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("the target failed")
'''

# Streams from "repeat" (decoupled) with exec(decoupled=True). Parameters: "cancel_after": n
# cancels the call after n responses; "target": another model; "async": through async_exec.
STREAM_CALLER_PY = '''
import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            target = params.get("target", "repeat")
            if target == "repeat":
                inputs = [pb_utils.Tensor("IN", x.astype(np.int32)),
                          pb_utils.Tensor("DELAY_MS", np.array([params.get("delay_ms", 0)], np.uint32))]
            else:
                inputs = [pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)]
            bls = pb_utils.InferenceRequest(model_name=target, inputs=inputs, requested_output_names=[])
            if params.get("async"):
                stream = asyncio.run(bls.async_exec(decoupled=True))
            else:
                stream = bls.exec(decoupled=True)
            values, log = [], []
            for i, response in enumerate(stream):
                if response.has_error():
                    log.append("error:" + response.error().message())
                elif not response.output_tensors():
                    log.append("empty")
                else:
                    first = response.output_tensors()[0]
                    values.append(float(first.as_numpy().ravel()[0]))
                    log.append("value")
                if i + 1 == params.get("cancel_after"):
                    stream.cancel()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("VALUES", np.array(values, np.float32)),
                pb_utils.Tensor("LOG", np.array([json.dumps(log).encode()], dtype=object))]))
        return responses
'''

# Default mode, but answers through its response sender, from a thread, after execute returned.
SENDER_TARGET_PY = '''
import threading
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            sender = request.get_response_sender()

            def answer(sender=sender, x=x):
                time.sleep(0.05)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 10)]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            threading.Thread(target=answer).start()
        return None
'''

CRASHING_PY = '''
import os


class TritonPythonModel:
    def execute(self, requests):
        os._exit(3)
'''

TARGET_CONFIG = dict(inputs=[io("INPUT0", "TYPE_FP32", [4]), io("INPUT1", "TYPE_FP32", [4])],
                     outputs=[io("OUTPUT0", "TYPE_FP32", [4])])

# The inputs and outputs of add_sub (a copy of its model.py under another name).
CALLER_TARGET_IO = dict(inputs=[io("INPUT0", "TYPE_FP32", [4]), io("INPUT1", "TYPE_FP32", [4])],
                        outputs=[io("OUTPUT0", "TYPE_FP32", [4]), io("OUTPUT1", "TYPE_FP32", [4])])

CALLER_CONFIG = dict(inputs=[io("X", "TYPE_FP32", [4])],
                     outputs=[io("SUM", "TYPE_FP32", [4]), io("ERROR", "TYPE_STRING", [1])])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo = tmp_path_factory.mktemp("bls") / "models"
    copy_examples(repo, "add_sub")
    write_model(repo, "caller", CALLER_PY, config_pbtxt("caller", **CALLER_CONFIG,
                                                        extra="instance_group [{ count: 2, kind: KIND_CPU }]"))
    write_model(repo, "async_caller", ASYNC_CALLER_PY, config_pbtxt("async_caller", **CALLER_CONFIG))
    copy_examples(repo, "repeat")
    write_model(repo, "stream_caller", STREAM_CALLER_PY, config_pbtxt(
        "stream_caller", [io("X", "TYPE_FP32", [-1])],
        [io("VALUES", "TYPE_FP32", [-1]), io("LOG", "TYPE_STRING", [1])]))
    write_model(repo, "failing", FAILING_PY, config_pbtxt("failing", **TARGET_CONFIG))
    write_model(repo, "sender_target", SENDER_TARGET_PY, config_pbtxt("sender_target", **TARGET_CONFIG))
    with stubhost.Server(repo) as s:
        yield s


def call(server: stubhost.Server, model: str = "caller", **params: object) -> tuple[np.ndarray, str]:
    x = np.arange(4, dtype=np.float32)
    result = server.infer(model, {"X": x}, parameters=params or None, timeout=30)
    return result["SUM"], result["ERROR"][0].decode()


def test_exec_returns_the_target_outputs(server: stubhost.Server) -> None:
    total, names = call(server)
    np.testing.assert_array_equal(total, np.arange(4, dtype=np.float32) + 1)
    assert names == "OUTPUT0,OUTPUT1"


def test_requested_outputs_are_honoured(server: stubhost.Server) -> None:
    total, names = call(server, outputs=["OUTPUT1"])
    np.testing.assert_array_equal(total, np.arange(4, dtype=np.float32) - 1)
    assert names == "OUTPUT1"


def test_async_exec(server: stubhost.Server) -> None:
    total, _ = call(server, how="async")
    np.testing.assert_array_equal(total, np.arange(4, dtype=np.float32) + 1)


def test_async_execute_awaits_several_calls(server: stubhost.Server) -> None:
    async def main() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(*(server.infer_async("async_caller", {"X": np.full(4, i, np.float32)})
                                      for i in range(8)))

    for i, result in enumerate(asyncio.run(main())):
        np.testing.assert_array_equal(result["SUM"], np.full(4, i + 1, np.float32))


def test_a_model_may_call_another_instance_of_itself(server: stubhost.Server) -> None:
    # caller has two instances: caller -> caller -> add_sub needs the second one free.
    _, error = call(server, target="caller")
    # caller's own inputs are X, so INPUT0/INPUT1 are refused by the target's checks: the error
    # comes back in the response, which shows the call reached the other instance.
    # A request the target refuses: Triton's INTERNAL and its "Error when running inference" words.
    assert error.startswith("1|Model caller - Error when running inference: [request id: "
                            "<id_unknown>] expected 1 inputs but got 2 inputs for model 'caller'"), error


def test_plain_exec_of_a_decoupled_model_is_refused_in_tritons_words(server: stubhost.Server) -> None:
    _, error = call(server, target="repeat")
    assert error == ("1|Model repeat - Error when running inference: Model repeat is using the decoupled. The current "
                     "BLS request call doesn't support models using the decoupled transaction policy. Please use "
                     "'decoupled=True' argument to the 'exec' or 'async_exec' calls for decoupled models.'")


def test_missing_model_comes_back_as_a_response_error(server: stubhost.Server) -> None:
    # Triton's Python backend checks readiness first: its words, which Triton's own BLS test expects.
    _, error = call(server, target="no_such_model")
    assert error == ("1|Model no_such_model - Error when running inference: Failed for execute the inference request. "
                     "Model 'no_such_model' is not ready.")  # Triton 2.51's words


def test_unknown_version_comes_back_as_a_response_error(server: stubhost.Server) -> None:
    _, error = call(server, version=7)
    assert error == ("1|Model add_sub - Error when running inference: Failed for execute the inference request. "
                     "Model 'add_sub' is not ready.")


def test_failing_model_comes_back_as_a_response_error(server: stubhost.Server) -> None:
    _, error = call(server, target="failing")
    assert "ValueError: the target failed" in error
    total, _ = call(server)  # and the caller goes on
    assert total[0] == 1


def test_a_target_that_answers_through_its_sender_is_waited_for(server: stubhost.Server) -> None:
    total, names = call(server, target="sender_target")
    np.testing.assert_array_equal(total, np.arange(4, dtype=np.float32) * 10)
    assert names == "OUTPUT0"


def test_inputs_the_target_refuses_come_back_as_a_response_error(server: stubhost.Server) -> None:
    def failures() -> int:
        return server.statistics("add_sub")["model_stats"][0]["inference_stats"]["fail"]["count"]

    before = failures()
    _, error = call(server, dtype="int32")
    assert "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'" in error
    assert failures() == before + 1


def test_a_target_stub_that_dies_fails_the_call_and_both_go_on(tmp_path: Path) -> None:
    repo = copy_examples(tmp_path / "models", "add_sub")
    write_model(repo, "caller", CALLER_PY, config_pbtxt("caller", **CALLER_CONFIG))
    write_model(repo, "crashing", CRASHING_PY, config_pbtxt("crashing", **TARGET_CONFIG))
    with stubhost.Server(repo) as server:
        caller_pid = instance(server, "caller").process.pid
        _, error = call(server, target="crashing")
        assert error == "1|Stub process 'crashing_0' is not healthy."
        total, _ = call(server)
        assert total[0] == 1
        assert instance(server, "caller").process.pid == caller_pid
        assert wait_until(lambda: server.model_ready("crashing"), 30.0)  # restarted


def test_bls_in_initialize_is_refused(tmp_path: Path) -> None:
    repo = copy_examples(tmp_path / "models", "add_sub")
    write_model(repo, "init_bls", INIT_BLS_PY, config_pbtxt("init_bls", [io("X", "TYPE_FP32", [4])], []))
    with pytest.raises(InferenceError) as e:
        stubhost.Server(repo, models=["add_sub", "init_bls"])
    assert "BLS is only supported during the 'execute' function." in e.value.message


def test_statistics_count_bls_calls_on_the_target(server: stubhost.Server) -> None:
    before = server.statistics("add_sub")["model_stats"][0]["inference_stats"]["success"]["count"]
    for _ in range(3):
        call(server)
    after = server.statistics("add_sub")["model_stats"][0]["inference_stats"]["success"]["count"]
    assert after == before + 3


def bls_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("stubhost-bls")}


# A target with a queue: one instance that takes 0.5 s, and room for one request waiting.
GATE_PY = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.5)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.full(4, 7, np.float32))])
                for _ in requests]
'''


def test_calls_to_models_with_a_queue_are_answered_without_a_bls_thread(tmp_path: Path) -> None:
    repo = copy_examples(tmp_path / "models", "add_sub")
    write_model(repo, "caller", CALLER_PY, config_pbtxt("caller", **CALLER_CONFIG))
    add_sub = (repo / "add_sub" / "1" / "model.py").read_text()
    write_model(repo, "pair", add_sub, config_pbtxt("pair", **CALLER_TARGET_IO,
                                                    extra="instance_group [{ count: 2, kind: KIND_CPU }]"))
    write_model(repo, "batched", add_sub, config_pbtxt("batched", **CALLER_TARGET_IO, extra="dynamic_batching { }"))
    write_model(repo, "sender_pair", SENDER_TARGET_PY, config_pbtxt(
        "sender_pair", **TARGET_CONFIG, extra="instance_group [{ count: 2, kind: KIND_CPU }]"))
    write_model(repo, "gate", GATE_PY, config_pbtxt(
        "gate", **TARGET_CONFIG, extra="dynamic_batching { default_queue_policy { max_queue_size: 1 } }"))
    x = np.arange(4, dtype=np.float32)
    with stubhost.Server(repo) as server, ThreadPoolExecutor(2) as pool:
        def successes(model: str) -> int:
            return server.statistics(model)["model_stats"][0]["inference_stats"]["success"]["count"]

        idle_bls_threads = bls_threads()  # other servers' (this module's fixture runs one)
        for target in ("pair", "batched"):
            before = successes(target)
            for _ in range(20):
                total, names = call(server, target=target)
                np.testing.assert_array_equal(total, x + 1)
                assert names == "OUTPUT0,OUTPUT1"
            assert successes(target) == before + 20
        # A target that answers through its sender is waited for (on a thread of its own).
        total, names = call(server, target="sender_pair")
        np.testing.assert_array_equal(total, x * 10)
        # A full queue refuses the call; the caller gets the reason in its response.
        running = pool.submit(server.infer, "gate", {"INPUT0": x, "INPUT1": x})
        time.sleep(0.15)
        waiting = pool.submit(server.infer, "gate", {"INPUT0": x, "INPUT1": x})
        assert wait_until(lambda: server._models["gate"].schedulers[1].queued() == 1, 5.0)
        _, error = call(server, target="gate")
        assert "Exceeds maximum queue size" in error
        for future in (running, waiting):
            assert future.result(30)["OUTPUT0"].tolist() == [7] * 4
        total, _ = call(server, target="gate")  # the queue has room again
        assert total.tolist() == [7] * 4
        assert bls_threads() == idle_bls_threads


def test_many_bls_calls_leave_the_pools_as_they_were(tmp_path: Path) -> None:
    repo = copy_examples(tmp_path / "models", "add_sub")
    write_model(repo, "caller", CALLER_PY, config_pbtxt("caller", **CALLER_CONFIG))
    with stubhost.Server(repo) as server:
        pools = [instance(server, "caller").process.pool, instance(server, "add_sub").process.pool]
        call(server)
        assert wait_until(lambda: all(p.allocations == 5 for p in pools), 5.0), [p.allocations for p in pools]
        x = np.arange(4, dtype=np.float32)
        begin = time.monotonic()
        idle_bls_threads = bls_threads()  # other servers' (this module's fixture runs one)
        for _ in range(10_000):
            result = server.infer("caller", {"X": x})
        assert result["SUM"][3] == 4
        del result
        elapsed = time.monotonic() - begin
        assert wait_until(lambda: all(p.allocations == 5 for p in pools), 5.0), [p.allocations for p in pools]
        assert elapsed < 120
        # A call to a plain model is started by the calls thread and answered by the target's
        # completion thread: no BLS thread was ever needed.
        assert bls_threads() == idle_bls_threads


# ---- decoupled BLS -----------------------------------------------------------------------------------
def stream_call(server: stubhost.Server, x: list[float], **params: object) -> tuple[list[float], list[str]]:
    result = server.infer("stream_caller", {"X": np.array(x, np.float32)}, parameters=params or None, timeout=30)
    return result["VALUES"].tolist(), json.loads(result["LOG"][0])


def test_decoupled_exec_iterates_every_response_then_the_empty_final(server: stubhost.Server) -> None:
    values, log = stream_call(server, [5, 6, 7, 8])
    assert values == [5, 6, 7, 8]
    assert log == ["value"] * 4 + ["empty"]


def test_decoupled_async_exec(server: stubhost.Server) -> None:
    values, log = stream_call(server, [1, 2], **{"async": True})
    assert values == [1, 2] and log[-1] == "empty"


def test_decoupled_exec_of_a_default_mode_model_gives_its_one_response(server: stubhost.Server) -> None:
    values, log = stream_call(server, [1, 2, 3, 4], target="add_sub")
    assert values == [2.0] and log == ["value"]


def test_decoupled_exec_of_a_missing_model_gives_an_error_response(server: stubhost.Server) -> None:
    _, log = stream_call(server, [1], target="no_such_model")
    assert log == ["error:Model no_such_model - Error when running inference: Failed for execute the inference "
                   "request. Model 'no_such_model' is not ready."]


def test_cancelling_a_decoupled_call_stops_the_target(server: stubhost.Server) -> None:
    begin = time.monotonic()
    values, log = stream_call(server, list(range(200)), cancel_after=2, delay_ms=20)
    assert values[:2] == [0, 1] and len(values) < 10, values
    assert log[-1].startswith("error:") and "cancel" in log[-1]
    assert time.monotonic() - begin < 3.0  # not the 4 s the whole stream takes
    values, _ = stream_call(server, [3])  # the target goes on serving
    assert values == [3]


# ---- model control from a model ----------------------------------------------------------------------
CONTROLLER_PY = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            op, name = params["op"], params["name"]
            try:
                if op == "load":
                    files = {k: v.encode() for k, v in params.get("files", {}).items()} or None
                    pb_utils.load_model(model_name=name, config=params.get("config", ""), files=files)
                    text = "loaded"
                elif op == "unload":
                    pb_utils.unload_model(name)
                    text = "unloaded"
                else:
                    text = "ready" if pb_utils.is_model_ready(name) else "not ready"
            except Exception as e:
                text = "error: " + str(e)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", np.array([text.encode()], object))]))
        return responses
'''


def control(server: stubhost.Server, op: str, name: str, **extra: object) -> str:
    result = server.infer("controller", {"X": np.zeros(4, np.float32)}, parameters={"op": op, "name": name, **extra},
                          timeout=60)
    return result["TEXT"][0].decode()


def test_a_model_loads_unloads_and_probes_other_models(tmp_path: Path) -> None:
    repo = copy_examples(tmp_path / "models", "add_sub", "identity")
    write_model(repo, "controller", CONTROLLER_PY, config_pbtxt("controller", [io("X", "TYPE_FP32", [4])],
                                                                [io("TEXT", "TYPE_STRING", [1])]))
    overrides_before = set(Path(tempfile.gettempdir()).glob("stubhost-override-*"))
    with stubhost.Server(repo, models=["controller", "add_sub"]) as server:
        assert control(server, "ready", "add_sub") == "ready"
        assert control(server, "ready", "identity") == "not ready"
        assert control(server, "load", "identity") == "loaded"
        assert server.model_ready("identity")
        assert control(server, "ready", "identity") == "ready"
        assert control(server, "unload", "add_sub") == "unloaded"
        assert not server.model_ready("add_sub")
        assert control(server, "load", "no_such_model").startswith("error: failed to load 'no_such_model'")
        assert control(server, "load", "add_sub", config='{"max_batch_size": ').startswith(
            "error: failed to load 'add_sub': the 'config' parameter is not valid JSON")
        assert server.model_ready("identity")
        config = server.model_config("identity")
        config["instance_group"] = [{"name": "two", "count": 2, "kind": "KIND_CPU"}]
        assert control(server, "load", "identity", config=json.dumps(config)) == "loaded"
        assert [g["count"] for g in server.model_config("identity")["instance_group"]] == [2]
        doubler = ("import triton_python_backend_utils as pb_utils\n"
                   "class TritonPythonModel:\n"
                   "    def execute(self, requests):\n"
                   "        return [pb_utils.InferenceResponse([pb_utils.Tensor('OUTPUT0', 2 * pb_utils.get_input_tensor_"
                   "by_name(r, 'INPUT0').as_numpy())]) for r in requests]\n")
        assert control(server, "load", "identity", config=json.dumps(config), files={"file:1/model.py": doubler}) == "loaded"
        np.testing.assert_array_equal(server.infer("identity", {"INPUT0": np.ones(2, np.float32)})["OUTPUT0"], [2, 2])
        assert control(server, "load", "identity") == "loaded"  # back to the repository's files
        np.testing.assert_array_equal(server.infer("identity", {"INPUT0": np.ones(2, np.float32)})["OUTPUT0"], [1, 1])
        assert set(Path(tempfile.gettempdir()).glob("stubhost-override-*")) == overrides_before
        server.allow_model_control = False  # as `stubhost serve` without --model-control-mode explicit
        assert control(server, "unload", "identity") == (
            "error: explicit model load / unload is not allowed if polling is enabled")
        assert server.model_ready("identity")
