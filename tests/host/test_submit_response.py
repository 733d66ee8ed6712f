"""``Server.submit_response``: a request started with no thread waiting, answered through a callback.

Runs real stubs through the public API: the answer and the thread it comes from (the caller's
own, when it lingers and the answer comes in time), an error response, requests refused before
they start, a model with a queue, the models that need a waiting thread, and many requests in
flight at once.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import stubhost
from stubhost import InferenceError
from stubhost.host.result import InferResponse
from tests.host.repo_factory import SLEEPY_PY, copy_examples, sleepy_config, write_model

FAILING_PY = '''
class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("the model failed")
'''


class Answers:
    """Collects what ``done`` is called with, and from which thread."""

    def __init__(self, expected: int = 1) -> None:
        self.items: list[InferResponse | InferenceError] = []
        self.threads: set[str] = set()
        self._lock = threading.Lock()
        self._expected = expected
        self._all = threading.Event()

    def __call__(self, outcome: InferResponse | InferenceError) -> None:
        with self._lock:
            self.items.append(outcome)
            self.threads.add(threading.current_thread().name)
            if len(self.items) >= self._expected:
                self._all.set()

    def wait(self) -> list[InferResponse | InferenceError]:
        assert self._all.wait(30), f"{len(self.items)} of {self._expected} answers came"
        return self.items


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo = copy_examples(tmp_path_factory.mktemp("submit") / "models", "add_sub", "repeat")
    batched = shutil.copytree(repo / "add_sub", repo / "add_sub_batched")
    config = (batched / "config.pbtxt").read_text().replace('name: "add_sub"', 'name: "add_sub_batched"')
    (batched / "config.pbtxt").write_text(config.replace("max_batch_size: 0", "max_batch_size: 8") +
                                          "\ndynamic_batching { }\n")
    failing_config = (repo / "add_sub" / "config.pbtxt").read_text().replace('name: "add_sub"', 'name: "failing"')
    write_model(repo, "failing", FAILING_PY, failing_config)
    write_model(repo, "sleepy", SLEEPY_PY, sleepy_config("sleepy"))
    with stubhost.Server(repo) as s:
        yield s


def inputs(value: float = 1.0, shape: tuple[int, ...] = (4,)) -> dict[str, np.ndarray]:
    x = np.full(shape, value, np.float32)
    return {"INPUT0": x, "INPUT1": np.ones(shape, np.float32)}


def test_done_gets_the_response_from_a_parent_thread(server: stubhost.Server) -> None:
    answers = Answers()
    assert server.submit_response("add_sub", inputs(2.0), done=answers, outputs=["OUTPUT0"], request_id="r1") is True
    [response] = answers.wait()
    assert isinstance(response, InferResponse)
    assert list(response.outputs) == ["OUTPUT0"]
    np.testing.assert_array_equal(response.outputs["OUTPUT0"], np.full(4, 3.0, np.float32))
    assert response.model_version == 1
    assert answers.threads == {"stubhost-done-add_sub_0_0"}


def test_an_error_of_the_model_comes_to_done(server: stubhost.Server) -> None:
    def failures() -> int:
        return server.statistics("failing")["model_stats"][0]["inference_stats"]["fail"]["count"]

    before = failures()
    answers = Answers()
    assert server.submit_response("failing", inputs(), done=answers)
    [error] = answers.wait()
    assert isinstance(error, InferenceError)
    assert "ValueError: the model failed" in error.message
    assert failures() == before + 1


def test_a_request_refused_before_it_starts_raises_and_done_is_not_called(server: stubhost.Server) -> None:
    answers = Answers()
    with pytest.raises(InferenceError) as e:
        server.submit_response("add_sub", {"INPUT0": np.zeros(4, np.int32), "INPUT1": np.zeros(4, np.float32)},
                               done=answers)
    assert e.value.code == "INVALID_ARG"
    assert "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'" in e.value.message
    with pytest.raises(InferenceError) as e:
        server.submit_response("no_such_model", inputs(), done=answers)
    assert e.value.code == "NOT_FOUND"
    assert answers.items == []


def test_a_decoupled_model_needs_a_waiting_thread_and_starts_nothing(server: stubhost.Server) -> None:
    answers = Answers()
    stream = {"IN": np.arange(3, dtype=np.int32), "DELAY_MS": np.zeros(1, np.uint32)}
    assert server.submit_response("repeat", stream, done=answers) is False
    assert answers.items == []


def test_a_model_with_a_queue_answers_through_done(server: stubhost.Server) -> None:
    def successes() -> int:
        return server.statistics("add_sub_batched")["model_stats"][0]["inference_stats"]["success"]["count"]

    before = successes()
    answers = Answers(50)
    for i in range(50):
        assert server.submit_response("add_sub_batched", inputs(float(i), shape=(1, 4)), done=answers) is True
    sums = sorted(float(r.outputs["OUTPUT0"][0, 0]) for r in answers.wait() if isinstance(r, InferResponse))
    assert sums == [i + 1.0 for i in range(50)]
    assert answers.threads == {"stubhost-done-add_sub_batched_0_0"}
    assert successes() == before + 50
    # A batch sent at once is answered in the thread that lingers for it.
    answers = Answers()
    assert server.submit_response("add_sub_batched", inputs(shape=(1, 4)), done=answers, linger=5.0) is True
    assert len(answers.items) == 1, "answered before submit_response returned"
    assert answers.threads == {threading.current_thread().name}
    np.testing.assert_array_equal(answers.items[0].outputs["OUTPUT0"], np.full((1, 4), 2.0, np.float32))


def test_many_requests_in_flight_each_get_their_own_answer(server: stubhost.Server) -> None:
    answers = Answers(200)
    for i in range(200):
        assert server.submit_response("add_sub", inputs(float(i)), done=answers, request_id=str(i))
    sums = sorted(float(r.outputs["OUTPUT0"][0]) for r in answers.wait() if isinstance(r, InferResponse))
    assert sums == [i + 1.0 for i in range(200)]


def test_a_caller_that_lingers_gets_a_quick_answer_in_its_own_thread_before_submit_returns(
        server: stubhost.Server) -> None:
    for i in range(20):
        answers = Answers()
        assert server.submit_response("add_sub", inputs(float(i)), done=answers, linger=5.0) is True
        assert len(answers.items) == 1, "answered before submit_response returned"
        assert answers.threads == {threading.current_thread().name}
        np.testing.assert_array_equal(answers.items[0].outputs["OUTPUT0"], np.full(4, i + 1.0, np.float32))


def test_an_answer_later_than_the_linger_comes_once_from_the_completion_thread(server: stubhost.Server) -> None:
    answers = Answers(3)
    for sleep, value in ((0.3, 1.0), (0.05, 2.0), (0.001, 3.0)):
        assert server.submit_response("sleepy", {"INPUT0": np.full(2, value, np.float32)}, done=answers,
                                      parameters={"sleep": sleep}, linger=0.0005)
    items = answers.wait()
    time.sleep(0.2)  # a second hand-over would come by now
    assert sorted(float(r.outputs["OUTPUT0"][0]) for r in items) == [1.0, 2.0, 3.0]  # type: ignore[union-attr]
    assert len(answers.items) == 3
    assert answers.threads == {"stubhost-done-sleepy_0"}


def test_a_stub_killed_while_its_caller_lingers_fails_the_request_once(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "sleepy", SLEEPY_PY, sleepy_config("sleepy"))
    with stubhost.Server(repo) as s:
        pid = int(s.infer("sleepy", {"INPUT0": np.zeros(1, np.float32)})["PID"][0])
        killer = threading.Timer(0.3, os.kill, (pid, signal.SIGKILL))
        killer.start()
        answers = Answers()
        started = time.monotonic()
        try:
            assert s.submit_response("sleepy", {"INPUT0": np.zeros(1, np.float32)}, done=answers,
                                     parameters={"sleep": 30}, linger=10.0)
        finally:
            killer.join()
        assert time.monotonic() - started < 9, "the death ended the linger"
        [error] = answers.wait()
        time.sleep(0.2)
        assert len(answers.items) == 1
        assert isinstance(error, InferenceError)
        assert error.message == "Stub process 'sleepy_0' is not healthy."
