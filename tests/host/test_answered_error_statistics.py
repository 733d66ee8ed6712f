"""Statistics of a request the model answers with an error response: Triton 2.51 counts it as a
success (the model executed it and answered), unlike a request whose ``execute`` raised, which
is a BACKEND failure. Both paths (with and without a queue), both callers (threads and asyncio),
the response sender of a default-mode model and a decoupled model's stream."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import config_pbtxt, io, write_model

ANSWERS_PY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            mode = json.loads(request.parameters()).get("mode", "ok")
            if mode == "raise":
                raise ValueError("execute failed")
            if mode == "error":
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("refused by the model",
                                                                                 pb_utils.TritonError.INVALID_ARG)))
            elif mode == "sender_error":
                request.get_response_sender().send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError("refused through the sender")),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                out.append(None)
            else:
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.ones(1, np.float32))]))
        return out
"""

STREAM_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.ones(1, np.float32))]))
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("a streamed error")),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

IO = dict(inputs=[io("X", "TYPE_FP32", [1])], outputs=[io("Y", "TYPE_FP32", [1])])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo = tmp_path_factory.mktemp("answered") / "models"
    write_model(repo, "direct", ANSWERS_PY, config_pbtxt("direct", **IO))
    write_model(repo, "queued", ANSWERS_PY, config_pbtxt("queued", **IO, max_batch_size=4,
                                                          extra="dynamic_batching { }"))
    write_model(repo, "streamed", STREAM_PY, config_pbtxt("streamed", **IO,
                                                           extra="model_transaction_policy { decoupled: true }"))
    with stubhost.Server(repo) as s:
        yield s


def counts(server: stubhost.Server, model: str) -> dict[str, int]:
    stats = server.statistics(model)["model_stats"][0]
    inference = stats["inference_stats"]
    return {"success": inference["success"]["count"], "fail": inference["fail"]["count"],
            "inferences": stats["inference_count"], "executions": stats["execution_count"]}


def x_for(model: str) -> np.ndarray:
    return np.ones((1, 1) if model == "queued" else 1, np.float32)


def delta(server: stubhost.Server, model: str, run: Any) -> dict[str, int]:
    before = counts(server, model)
    run()
    after = counts(server, model)
    return {key: after[key] - before[key] for key in after}


@pytest.mark.parametrize("model", ["direct", "queued"])
@pytest.mark.parametrize("caller", ["thread", "asyncio"])
@pytest.mark.parametrize("mode", ["error", "sender_error"])
def test_an_error_response_counts_as_a_success(server: stubhost.Server, model: str, caller: str, mode: str) -> None:
    def run() -> None:
        with pytest.raises(stubhost.InferenceError) as info:
            if caller == "thread":
                server.infer(model, {"X": x_for(model)}, parameters={"mode": mode})
            else:
                asyncio.run(server.infer_async(model, {"X": x_for(model)}, parameters={"mode": mode}))
        assert "refused" in info.value.message  # the caller still gets the model's error

    assert delta(server, model, run) == {"success": 1, "fail": 0, "inferences": 1, "executions": 1}


@pytest.mark.parametrize("model", ["direct", "queued"])
def test_an_execute_that_raises_is_a_failure(server: stubhost.Server, model: str) -> None:
    def run() -> None:
        with pytest.raises(stubhost.InferenceError, match="execute failed"):
            server.infer(model, {"X": x_for(model)}, parameters={"mode": "raise"})

    assert delta(server, model, run)["fail"] == 1
    assert delta(server, model, run)["success"] == 0


def test_a_stream_that_ends_with_an_error_response_counts_as_a_success(server: stubhost.Server) -> None:
    def run() -> None:
        responses = list(server.stream_responses("streamed", {"X": np.ones(1, np.float32)}))
        assert [r.error is not None for r in responses] == [False, True]

    assert delta(server, "streamed", run)["success"] == 1
    assert delta(server, "streamed", run)["fail"] == 0
