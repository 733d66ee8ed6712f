"""When custom metrics leave the metrics endpoint, with real stubs: a deleted ``MetricFamily`` takes
its metrics along (a deleted ``Metric`` alone does not: Triton's family keeps its metrics), a
``Metric`` used after its family was deleted raises Triton's error, and unloading a model or
losing a stub removes what only that instance held, while what other instances hold stays."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stubhost
from stubhost.server.metrics import render_metrics
from tests.host.repo_factory import config_pbtxt, instance, io, wait_until, write_model

# Each request's STEPS is a JSON list of steps the model runs on its slots of MetricFamily and
# Metric objects; RESULTS has one entry per step: null, a value, or {"error": text}. Every instance
# also holds the family "life_shared" from initialize: one metric all instances share and one of
# its own. Execute ends with a value() read, a round trip queued behind everything the stub sent
# before, so the parent has applied a request's steps by the time its response arrives.
SCRIPTED_PY = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils

KINDS = {"counter": pb_utils.MetricFamily.COUNTER, "gauge": pb_utils.MetricFamily.GAUGE,
         "histogram": pb_utils.MetricFamily.HISTOGRAM}


class TritonPythonModel:
    def initialize(self, args):
        self.slots = {}
        shared = pb_utils.MetricFamily("life_shared", "Held by every instance", pb_utils.MetricFamily.GAUGE)
        self.slots["shared"] = shared
        self.slots["common"] = shared.Metric(labels={"model": args["model_name"]})
        self.slots["own"] = shared.Metric(labels={"instance": args["model_instance_name"]})

    def step(self, op, *args):
        if op == "family":
            slot, name, kind, description = args
            self.slots[slot] = pb_utils.MetricFamily(name, description, KINDS[kind])
        elif op == "metric":
            slot, family, labels, buckets = args
            self.slots[slot] = self.slots[family].Metric(labels=labels, buckets=buckets)
        elif op == "del":
            self.slots.pop(args[0])
        elif op == "inc":
            self.slots[args[0]].increment(args[1])
        elif op == "set":
            self.slots[args[0]].set(args[1])
        elif op == "observe":
            self.slots[args[0]].observe(args[1])
        elif op == "value":
            return self.slots[args[0]].value()
        return None

    def execute(self, requests):
        responses = []
        for request in requests:
            steps = json.loads(pb_utils.get_input_tensor_by_name(request, "STEPS").as_numpy()[0])
            results = []
            for op, *args in steps:
                try:
                    results.append(self.step(op, *args))
                except pb_utils.TritonModelException as e:
                    results.append({"error": str(e)})
            self.slots["common"].value()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("RESULTS", np.array([json.dumps(results).encode()], dtype=object))]))
        return responses
"""

FAMILY_DELETED = ("Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
                  "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have been "
                  "deleted.")


def scripted_model(repo: Path, name: str, instances: int = 1) -> None:
    write_model(repo, name, SCRIPTED_PY, config_pbtxt(
        name, [io("STEPS", "TYPE_STRING", [1])], [io("RESULTS", "TYPE_STRING", [1])],
        extra=f"instance_group [{{ count: {instances}, kind: KIND_CPU }}]"))


def run(server: stubhost.Server, model: str, *steps: list[Any]) -> list[Any]:
    """Runs `steps` in one instance of `model`; their results."""
    out = server.infer(model, {"STEPS": np.array([json.dumps(steps).encode()], dtype=object)})
    return json.loads(out["RESULTS"][0])


def scrape(server: stubhost.Server) -> str:
    """What GET /metrics would answer now."""
    return render_metrics(server).decode()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[stubhost.Server]:
    repo = tmp_path / "models"
    scripted_model(repo, "life")
    with stubhost.Server(repo) as s:
        yield s


def test_a_family_leaves_with_its_object_and_takes_its_metrics(server: stubhost.Server) -> None:
    assert run(server, "life", ["family", "f1", "life_requests", "counter", "Requests"],
               ["metric", "m1", "f1", {"k": "a"}, None], ["inc", "m1", 2]) == [None, None, None]
    assert 'life_requests{k="a"} 2' in scrape(server)

    # Deleting the Metric object alone removes nothing: Triton's family keeps its metrics.
    run(server, "life", ["del", "m1"])
    assert 'life_requests{k="a"} 2' in scrape(server)

    # Another family object of the same name (another description: the first stays) and a metric
    # with the same labels: the same series.
    assert run(server, "life", ["family", "f2", "life_requests", "counter", "Other words"],
               ["metric", "m2", "f2", {"k": "a"}, None], ["metric", "keep", "f1", {"k": "b"}, None],
               ["value", "m2"]) == [None, None, None, 2.0]
    text = scrape(server)
    assert "# HELP life_requests Requests" in text and "Other words" not in text

    # f1 goes: its own series goes with it; the shared one stays, held by f2.
    assert run(server, "life", ["del", "f1"], ["inc", "keep", 1], ["set", "keep", 1], ["value", "keep"],
               ["value", "m2"]) == [None, {"error": f"Failed to increment metric value: {FAMILY_DELETED}"},
                                    {"error": f"Failed to set metric value: {FAMILY_DELETED}"},
                                    {"error": f"Failed to get metric value: {FAMILY_DELETED}"}, 2.0]
    text = scrape(server)
    assert 'life_requests{k="a"} 2' in text and 'k="b"' not in text

    # The last family object goes: the family leaves the endpoint.
    run(server, "life", ["del", "f2"])
    assert "life_requests" not in scrape(server)
    assert 'life_requests{k="a"}' not in "\n".join(server.custom_metrics.render())


def test_histogram_and_gauge_follow_the_same_rules(server: stubhost.Server) -> None:
    assert run(server, "life", ["family", "h", "life_latency", "histogram", "Latency"],
               ["metric", "hm", "h", {}, []], ["observe", "hm", 3.0],
               ["family", "g", "life_depth", "gauge", "Depth"], ["metric", "gm", "g", {}, None],
               ["set", "gm", 5], ["del", "h"], ["observe", "hm", 1.0]) == [
        None, None, None, None, None, None, None,
        {"error": f"Failed to observe metric value: {FAMILY_DELETED}"}]
    text = scrape(server)
    assert "life_latency" not in text and "life_depth 5" in text


def test_a_name_taken_by_another_kind_is_refused_with_tritons_words(server: stubhost.Server) -> None:
    results = run(server, "life", ["family", "c", "life_taken", "counter", "A counter"],
                  ["family", "g", "life_taken", "gauge", "A gauge"], ["family", "e", "life_empty", "gauge", "Empty"])
    assert results == [None, {"error": "Error when creating MetricFamily: Failed to process the request for model "
                                       "'life_0_0', message: Family name already exists with different type"}, None]
    text = scrape(server)
    assert "life_taken" not in text and "life_empty" not in text  # a family without metrics is not exported


def test_unloading_a_model_removes_what_only_it_held(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    scripted_model(repo, "life")
    scripted_model(repo, "other")
    with stubhost.Server(repo) as server:
        run(server, "life", ["family", "f", "life_requests", "counter", "Requests"],
            ["metric", "m", "f", {"k": "a"}, None], ["inc", "m", 3])
        run(server, "other", ["family", "f", "life_requests", "counter", "Requests"],
            ["metric", "m", "f", {"k": "other"}, None])
        text = scrape(server)
        assert 'life_shared{model="life"} 0' in text and 'life_shared{model="other"} 0' in text
        server.unload("life")
        text = scrape(server)
        assert 'k="a"' not in text and 'model="life"' not in text and 'instance="life' not in text
        assert 'life_requests{k="other"} 0' in text and 'life_shared{model="other"} 0' in text
        server.unload("other")
        assert "life_" not in scrape(server)
        server.load("life")  # declared afresh: the old values are gone
        assert run(server, "life", ["family", "f", "life_requests", "counter", "Requests"],
                   ["metric", "m", "f", {"k": "a"}, None], ["value", "m"]) == [None, None, 0.0]


def test_a_killed_instance_loses_its_own_series_and_the_shared_ones_stay(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    scripted_model(repo, "life", instances=2)
    slow_restart = stubhost.RestartPolicy(backoff_s=1.5)
    with stubhost.Server(repo, restart=slow_restart) as server:
        first, second = instance(server, "life", index=0), instance(server, "life", index=1)
        run(server, "life", ["inc", "common", 4])
        own = [f'life_shared{{instance="{i.name}"}} 0' for i in (first, second)]
        text = scrape(server)
        assert 'life_shared{model="life"} 4' in text and all(line in text for line in own)

        pid = first.process.pid
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: first.state.value == "restarting", 10.0)  # noticed, restart pending
        text = scrape(server)
        assert 'life_shared{model="life"} 4' in text  # the other instance still holds it
        assert own[0] not in text and own[1] in text

        assert wait_until(lambda: first.process.pid != pid and first.state.value == "ready", 15.0)
        text = scrape(server)
        assert 'life_shared{model="life"} 4' in text and all(line in text for line in own)

        second.process.kill()  # and the other one: the restarted one holds the shared series now
        assert wait_until(lambda: second.state.value == "restarting", 10.0)
        text = scrape(server)
        assert 'life_shared{model="life"} 4' in text and own[0] in text and own[1] not in text


def test_a_stub_that_stays_down_releases_everything(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    scripted_model(repo, "life")
    with stubhost.Server(repo, restart=stubhost.RestartPolicy(enabled=False)) as server:
        run(server, "life", ["family", "f", "life_requests", "counter", "Requests"],
            ["metric", "m", "f", {}, None], ["inc", "m", 1])
        assert "life_requests 1" in scrape(server)
        os.kill(instance(server, "life").process.pid, signal.SIGKILL)
        assert wait_until(lambda: instance(server, "life").state.value == "failed", 10.0)
        assert "life_" not in scrape(server)
