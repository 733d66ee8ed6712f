"""Custom metrics (``pb_utils.MetricFamily``) declared by models, read back by the models and
exported on ``stubhost serve``'s metrics endpoint beside Triton's counters."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

import stubhost
from tests.host.repo_factory import config_pbtxt, io, wait_until, write_model
from tests.server.serve_process import ServeProcess

METRICS_PY = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.requests = pb_utils.MetricFamily("demo_requests_total", "Requests seen by the model",
                                              pb_utils.MetricFamily.COUNTER)
        self.depth = pb_utils.MetricFamily("demo_queue_depth", "A gauge", pb_utils.MetricFamily.GAUGE)
        self.latency = pb_utils.MetricFamily("demo_latency_ms", "A histogram", pb_utils.MetricFamily.HISTOGRAM)
        self.counter = self.requests.Metric(labels={"model": args["model_name"], "kind": "all"})
        self.gauge = self.depth.Metric(labels={"model": args["model_name"]})
        self.histogram = self.latency.Metric(labels={"model": args["model_name"]}, buckets=[1.0, 10.0, 100.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            self.counter.increment(1)
            self.gauge.set(x)
            self.histogram.observe(x)
            errors = []
            for attempt in (lambda: self.counter.increment(-1), lambda: self.counter.set(3),
                            lambda: self.histogram.increment(1), lambda: self.histogram.value(),
                            lambda: self.requests.Metric(labels={"a": "b"}, buckets=[1.0]),
                            lambda: self.latency.Metric(labels={"a": "b"})):
                try:
                    attempt()
                except pb_utils.TritonModelException as e:
                    errors.append(str(e))
            values = np.array([self.counter.value(), self.gauge.value()], np.float64)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("VALUES", values),
                pb_utils.Tensor("ERRORS", np.array([json.dumps(errors).encode()], dtype=object))]))
        return responses
'''

CONFIG = config_pbtxt("metered", [io("X", "TYPE_FP64", [1])],
                      [io("VALUES", "TYPE_FP64", [2]), io("ERRORS", "TYPE_STRING", [1])])


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    write_model(repo, "metered", METRICS_PY, CONFIG)
    return repo


def test_values_are_shared_and_read_back_by_the_model(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        first = server.infer("metered", {"X": np.array([5.0])})
        second = server.infer("metered", {"X": np.array([50.0])})
        assert first["VALUES"].tolist() == [1.0, 5.0]
        assert second["VALUES"].tolist() == [2.0, 50.0]
        errors = second["ERRORS"][0].decode()
        refused = "Failed to process the request for model 'metered_0_0', message: "  # Triton 2.51's words
        for text in (f"Failed to increment metric value: {refused}TRITONSERVER_METRIC_KIND_COUNTER can only be "
                     "incremented monotonically by non-negative values.",
                     f"Failed to set metric value: {refused}TRITONSERVER_METRIC_KIND_COUNTER does not support Set",
                     f"Failed to increment metric value: {refused}TRITONSERVER_METRIC_KIND_HISTOGRAM does not support "
                     "Increment",
                     f"Failed to get metric value: {refused}TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value",
                     "Unexpected buckets found for non-histogram metrics.",
                     "Failed to create metric. Missing required buckets."):
            assert text in errors, errors


def test_two_instances_share_one_metric(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "metered", METRICS_PY, CONFIG + "instance_group [{ count: 2, kind: KIND_CPU }]\n")
    with stubhost.Server(repo) as server:
        for _ in range(6):
            last = server.infer("metered", {"X": np.array([1.0])})
        assert last["VALUES"][0] == 6.0
        text = "\n".join(server.custom_metrics.render())
        assert 'demo_requests_total{kind="all",model="metered"} 6' in text


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    repo = tmp_path_factory.mktemp("metrics") / "models"
    write_model(repo, "metered", METRICS_PY, CONFIG)
    with ServeProcess(repo) as srv:
        yield srv


def _scrape(server: ServeProcess) -> str:
    pattern = r"Started Metrics Service at \S+:(\d+)"
    assert wait_until(lambda: re.search(pattern, server.log), 10.0), server.log
    port = re.search(pattern, server.log)
    assert port is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/metrics") as response:
        return response.read().decode()


def test_custom_metrics_are_exported_beside_tritons(served: ServeProcess) -> None:
    client = httpclient.InferenceServerClient(served.http_url)
    for x in (0.5, 5.0, 500.0):
        data = httpclient.InferInput("X", [1], "FP64")
        data.set_data_from_numpy(np.array([x]))
        client.infer("metered", [data])
    client.close()
    assert wait_until(lambda: "demo_latency_ms_count" in _scrape(served), 5.0)
    text = _scrape(served)
    assert "# TYPE demo_requests_total counter" in text
    assert 'demo_requests_total{kind="all",model="metered"} 3' in text
    assert "# TYPE demo_queue_depth gauge" in text and 'demo_queue_depth{model="metered"} 500' in text
    assert "# TYPE demo_latency_ms histogram" in text
    assert 'demo_latency_ms_bucket{model="metered",le="1"} 1' in text
    assert 'demo_latency_ms_bucket{model="metered",le="10"} 2' in text
    assert 'demo_latency_ms_bucket{model="metered",le="+Inf"} 3' in text
    assert 'demo_latency_ms_sum{model="metered"} 505.5' in text
    assert 'demo_latency_ms_count{model="metered"} 3' in text
    assert 'nv_inference_request_success{model="metered",version="1"} 3' in text


def test_an_unloaded_models_metrics_leave_the_endpoint(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "metered", METRICS_PY, CONFIG)
    with ServeProcess(repo, "--model-control-mode", "explicit", "--load-model", "metered") as served:
        client = httpclient.InferenceServerClient(served.http_url)
        data = httpclient.InferInput("X", [1], "FP64")
        data.set_data_from_numpy(np.array([2.0]))
        client.infer("metered", [data])
        assert wait_until(lambda: 'demo_queue_depth{model="metered"} 2' in _scrape(served), 5.0)
        client.unload_model("metered")
        client.close()
        text = _scrape(served)
        assert "demo_requests_total" not in text and "demo_queue_depth" not in text
        assert "demo_latency_ms" not in text
