"""The metrics endpoint of `stubhost serve` as Triton exports it: family names, HELP texts, TYPE
lines, label names and their order, the failure reasons, the pending-request gauge and the CPU
gauges, checked against what real tritonclient requests did.

One server serves the module. Its models run PROBE_PY (Y = X); request parameters:
{"touch": path} creates `path` when execute starts (so a test knows the instance is busy),
{"sleep_ms": n} sleeps first, {"fail": 1} answers with an error response, {"raise": 1} makes execute raise.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.host.repo_factory import config_pbtxt, io, wait_until, write_model
from tests.server.serve_process import ServeProcess

TIMEOUT = 30.0  # generous: waiting this long is a failure, never a pacing device
REASONS = ["REJECTED", "CANCELED", "BACKEND", "OTHER"]

PROBE_PY = """
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            if "touch" in params:
                open(params["touch"], "w").close()
            time.sleep(int(params.get("sleep_ms", 0)) / 1000.0)
            if params.get("raise"):  # the execute fails: a BACKEND failure
                raise pb_utils.TritonModelException("asked to fail")
            if params.get("fail"):  # an error response: an answer, counted as a success
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("asked to fail")))
                continue
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.copy())]))
        return responses
"""

MODELS = {
    "idle": "",  # never sent anything: every series at its initial value
    "direct": "",  # one instance, no queue: requests go straight to the stub
    "bounded": "dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
    "expiring": "dynamic_batching { default_queue_policy { default_timeout_microseconds: 300000 "
                "timeout_action: REJECT } }",
}

# Triton's families, in its order: (name, TYPE, HELP)
MODEL_FAMILIES = [
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "counter",
     "Number of model executions performed (does not include cached requests)"),
    ("nv_inference_request_duration_us", "counter",
     "Cumulative inference request duration in microseconds (includes cached requests)"),
    ("nv_inference_queue_duration_us", "counter",
     "Cumulative inference queuing duration in microseconds (includes cached requests)"),
    ("nv_inference_compute_input_duration_us", "counter",
     "Cumulative compute input duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_infer_duration_us", "counter",
     "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_output_duration_us", "counter",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
    ("nv_inference_pending_request_count", "gauge",
     "Instantaneous number of pending requests awaiting execution per-model."),
]
CPU_FAMILIES = [
    ("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]"),
    ("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes"),
    ("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes"),
]


# ---- a strict parser of the text format, keeping the order of families and labels ----------------
@dataclass
class Sample:
    name: str
    labels: list[tuple[str, str]]  # in the order they were written
    value: float


@dataclass
class Family:
    name: str
    help: str
    type: str = ""
    samples: list[Sample] = field(default_factory=list)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> dict[str, Family]:
    """Families by name, in order; fails on a line out of place (a sample before its family's
    HELP and TYPE, a TYPE without HELP, labels that are not exactly `name="value"` pairs)."""
    families: dict[str, Family] = {}
    current: Family | None = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP "):].partition(" ")
            assert name not in families, f"family {name} written twice"
            current = families[name] = Family(name, help_text)
        elif line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE "):].partition(" ")
            assert current is not None and current.name == name and not current.type, line
            current.type = kind
        else:
            m = _SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            assert current is not None and current.type and m.group(1).startswith(current.name), line
            body = m.group(2) or ""
            labels = [(k, v) for k, v in _LABEL.findall(body)]
            assert ",".join(f'{k}="{v}"' for k, v in labels) == body, f"malformed labels: {line!r}"
            current.samples.append(Sample(m.group(1), labels, float(m.group(3))))
    return families


def value(families: dict[str, Family], name: str, **labels: str) -> float:
    """The value of the one sample of `name` with exactly these labels."""
    found = [s.value for s in families[name].samples if dict(s.labels) == labels]
    assert len(found) == 1, (name, labels, families[name].samples)
    return found[0]


# ---- the server -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    repo = tmp_path_factory.mktemp("metrics") / "models"
    for name, extra in MODELS.items():
        write_model(repo, name, PROBE_PY, config_pbtxt(name, [io("X", "TYPE_FP32", [4])],
                                                       [io("Y", "TYPE_FP32", [4])], extra=extra))
    with ServeProcess(repo) as srv:
        yield srv


def scrape(server: ServeProcess) -> str:
    pattern = r"Started Metrics Service at \S+:(\d+)"  # logged a little after the other services
    assert wait_until(lambda: re.search(pattern, server.log), TIMEOUT), server.log
    m = re.search(pattern, server.log)
    assert m is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/metrics", timeout=10) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return reply.read().decode()


def metrics(server: ServeProcess) -> dict[str, Family]:
    text = scrape(server)
    list(text_string_to_metric_families(text))  # a Prometheus parser takes it as it is
    return parse(text)


def figures(server: ServeProcess, model: str) -> dict[str, float]:
    """One model version's values: by family, and ``failure:<REASON>``."""
    fams = metrics(server)
    out = {name: value(fams, name, model=model, version="1") for name, _, _ in MODEL_FAMILIES
           if name != "nv_inference_request_failure"}
    for reason in REASONS:
        out[f"failure:{reason}"] = value(fams, "nv_inference_request_failure", model=model, reason=reason,
                                         version="1")
    return out


def grows(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before}


def wait_for(server: ServeProcess, model: str, test: Callable[[dict[str, float]], bool]) -> dict[str, float]:
    """Scrapes until `test` holds for the model's figures; returns them."""
    seen: dict[str, float] = {}

    def check() -> bool:
        nonlocal seen
        seen = figures(server, model)
        return test(seen)
    assert wait_until(check, TIMEOUT, period=0.05), seen
    return seen


def fail_count(server: ServeProcess, model: str) -> int:
    """The statistics extension's ``fail`` count."""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        [entry] = client.get_inference_statistics(model)["model_stats"]
    finally:
        client.close()
    return int(entry["inference_stats"]["fail"]["count"])


def inputs(mod: Any, x: float = 1.0) -> list[Any]:
    data = mod.InferInput("X", [4], "FP32")
    data.set_data_from_numpy(np.full(4, x, np.float32))
    return [data]


def infer(server: ServeProcess, protocol: str, model: str, **parameters: Any) -> Any:
    if protocol == "grpc":
        client: Any = grpcclient.InferenceServerClient(server.grpc_url)
        mod: Any = grpcclient
    else:
        client, mod = httpclient.InferenceServerClient(server.http_url), httpclient
    try:
        return client.infer(model, inputs(mod), parameters=parameters or None)
    finally:
        client.close()


def busy(server: ServeProcess, pool: ThreadPoolExecutor, marker: Path, model: str, sleep_ms: int) -> Future[Any]:
    """A request that holds the model's only instance for `sleep_ms`, once it surely started."""
    future = pool.submit(infer, server, "grpc", model, sleep_ms=sleep_ms, touch=str(marker))
    assert wait_until(lambda: marker.exists() or future.done(), TIMEOUT), "the busy request never started"
    assert not future.done(), f"the busy request ended early: {future.exception()}"
    return future


# ---- the tests --------------------------------------------------------------------------------------
def test_families_have_tritons_names_help_types_and_label_order(server: ServeProcess, quiet_log: None) -> None:
    fams = metrics(server)
    names = [name for name in fams if name.startswith("nv_")]
    assert names == [name for name, _, _ in MODEL_FAMILIES + CPU_FAMILIES]
    for name, kind, help_text in MODEL_FAMILIES + CPU_FAMILIES:
        assert (fams[name].type, fams[name].help) == (kind, help_text), name
    for name, _, _ in MODEL_FAMILIES:
        for sample in fams[name].samples:
            assert sample.name == name  # no _total, no _created
            keys = [k for k, _ in sample.labels]
            failure = name == "nv_inference_request_failure"
            assert keys == (["model", "reason", "version"] if failure else ["model", "version"]), sample
        assert {dict(s.labels)["model"] for s in fams[name].samples} == set(MODELS), name
    for name, _, _ in CPU_FAMILIES:
        [sample] = fams[name].samples
        assert sample.name == name and sample.labels == []


def test_a_model_starts_with_every_series_at_zero_and_every_reason(server: ServeProcess, quiet_log: None) -> None:
    idle = figures(server, "idle")
    assert idle == dict.fromkeys(idle, 0.0)
    fams = metrics(server)
    reasons = [dict(s.labels)["reason"] for s in fams["nv_inference_request_failure"].samples
               if dict(s.labels)["model"] == "idle"]
    assert reasons == REASONS


def test_cpu_gauges_read_the_host(server: ServeProcess, quiet_log: None) -> None:
    fams = metrics(server)
    utilization = value(fams, "nv_cpu_utilization")
    total, used = value(fams, "nv_cpu_memory_total_bytes"), value(fams, "nv_cpu_memory_used_bytes")
    assert 0.0 <= utilization <= 1.0
    with open("/proc/meminfo") as f:
        mem_total_kb = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
    assert total == mem_total_kb * 1024
    assert 0 < used < total


def test_successes_a_model_error_response_and_a_refused_request_are_counted(server: ServeProcess,
                                                                            quiet_log: None) -> None:
    """A request the model answered with an error response counts as a success, as Triton 2.51
    counts it; one the input checks refused is an OTHER failure."""
    before, fail_before = figures(server, "direct"), fail_count(server, "direct")
    for protocol in ("http", "grpc", "http"):
        infer(server, protocol, "direct")
    with pytest.raises(InferenceServerException, match="asked to fail"):
        infer(server, "grpc", "direct", fail=1)
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        wrong = httpclient.InferInput("X", [5], "FP32")  # the model takes [4]
        wrong.set_data_from_numpy(np.ones(5, np.float32))
        with pytest.raises(InferenceServerException):
            client.infer("direct", [wrong])
    finally:
        client.close()
    after = figures(server, "direct")
    delta = grows(before, after)
    assert delta["nv_inference_request_success"] == 4
    assert delta["nv_inference_count"] == 4 and delta["nv_inference_exec_count"] == 4
    assert {r: delta[f"failure:{r}"] for r in REASONS} == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 0, "OTHER": 1}
    for name in ("nv_inference_request_duration_us", "nv_inference_compute_infer_duration_us"):
        assert delta[name] > 0, name
    assert after["nv_inference_request_duration_us"] >= after["nv_inference_compute_infer_duration_us"]
    assert after["nv_inference_pending_request_count"] == 0
    # the statistics extension counts every failure in `fail`
    assert fail_count(server, "direct") - fail_before == 1


def test_a_full_queue_rejects_and_pending_counts_the_queued(server: ServeProcess, tmp_path: Path,
                                                            quiet_log: None) -> None:
    before, fail_before = figures(server, "bounded"), fail_count(server, "bounded")
    with ThreadPoolExecutor(4) as pool:
        running = busy(server, pool, tmp_path / "bounded.started", "bounded", 2000)
        queued = pool.submit(infer, server, "http", "bounded")
        wait_for(server, "bounded", lambda f: f["nv_inference_pending_request_count"] == 1)
        with pytest.raises(InferenceServerException, match="Exceeds maximum queue size"):
            infer(server, "grpc", "bounded")
        running.result(TIMEOUT)
        queued.result(TIMEOUT)
    after = wait_for(server, "bounded", lambda f: f["nv_inference_pending_request_count"] == 0)
    delta = grows(before, after)
    assert delta["nv_inference_request_success"] == 2
    assert {r: delta[f"failure:{r}"] for r in REASONS} == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
    assert delta["nv_inference_queue_duration_us"] > 0  # the queued one waited ~2 s
    assert fail_count(server, "bounded") - fail_before == 1


def test_a_queue_timeout_rejects(server: ServeProcess, tmp_path: Path, quiet_log: None) -> None:
    before = figures(server, "expiring")
    with ThreadPoolExecutor(2) as pool:
        running = busy(server, pool, tmp_path / "expiring.started", "expiring", 1500)
        with pytest.raises(InferenceServerException, match="Request timeout expired"):
            infer(server, "http", "expiring")
        running.result(TIMEOUT)
    delta = grows(before, figures(server, "expiring"))
    assert {r: delta[f"failure:{r}"] for r in REASONS} == {"REJECTED": 1, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
    assert delta["nv_inference_request_success"] == 1


def test_pending_counts_requests_waiting_behind_a_busy_stub(server: ServeProcess, tmp_path: Path,
                                                            quiet_log: None) -> None:
    """Without a queue, the requests wait in the stub's own queue: they are pending too."""
    with ThreadPoolExecutor(4) as pool:
        running = busy(server, pool, tmp_path / "direct.started", "direct", 1500)
        waiting = [pool.submit(infer, server, protocol, "direct") for protocol in ("http", "grpc")]
        wait_for(server, "direct", lambda f: f["nv_inference_pending_request_count"] == 2)
        for future in (running, *waiting):
            future.result(TIMEOUT)
    wait_for(server, "direct", lambda f: f["nv_inference_pending_request_count"] == 0)


def test_a_client_timeout_counts_as_canceled(server: ServeProcess, quiet_log: None) -> None:
    """gRPC's client_timeout is a deadline: the server cancels the call when it passes."""
    before, fail_before = figures(server, "direct"), fail_count(server, "direct")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="Deadline"):
            client.infer("direct", inputs(grpcclient), parameters={"sleep_ms": 1500}, client_timeout=0.3)
    finally:
        client.close()
    after = wait_for(server, "direct", lambda f: f["failure:CANCELED"] == before["failure:CANCELED"] + 1)
    delta = grows(before, after)
    assert {r: delta[f"failure:{r}"] for r in REASONS} == {"REJECTED": 0, "CANCELED": 1, "BACKEND": 0, "OTHER": 0}
    assert delta["nv_inference_request_success"] == 0
    assert fail_count(server, "direct") - fail_before == 1
    infer(server, "http", "direct")  # the model still serves (after the abandoned request ran out)


def test_a_cancelled_queued_request_counts_as_canceled(server: ServeProcess, tmp_path: Path, quiet_log: None) -> None:
    before = figures(server, "bounded")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    done = threading.Event()
    outcome: list[Any] = []

    def callback(result: Any, error: Any) -> None:
        outcome.append(error)
        done.set()

    try:
        with ThreadPoolExecutor(2) as pool:
            running = busy(server, pool, tmp_path / "cancel.started", "bounded", 1500)
            call = client.async_infer("bounded", inputs(grpcclient), callback)
            wait_for(server, "bounded", lambda f: f["nv_inference_pending_request_count"] == 1)
            call.cancel()
            assert done.wait(TIMEOUT)
            after = wait_for(server, "bounded",
                             lambda f: f["failure:CANCELED"] == before["failure:CANCELED"] + 1)
            assert after["nv_inference_pending_request_count"] == 0  # withdrawn from the queue
            running.result(TIMEOUT)
    finally:
        client.close()
    assert outcome and outcome[0] is not None
    time.sleep(0.2)  # nothing more comes: the cancelled request never ran
    delta = grows(before, figures(server, "bounded"))
    assert {r: delta[f"failure:{r}"] for r in REASONS} == {"REJECTED": 0, "CANCELED": 1, "BACKEND": 0, "OTHER": 0}
    assert delta["nv_inference_request_success"] == 1
