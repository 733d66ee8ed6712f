"""tritonserver's ``--metrics-config`` and ``--allow-cpu-metrics`` on `stubhost serve`, driven as a
user drives them: real servers, real tritonclient requests, /metrics parsed as Prometheus does.

- ``summary_latencies=true``: Triton's latency summaries (names, HELP, TYPE, labels, default
  quantiles), fed by successful requests only, cache hits as Triton counts them;
- ``summary_quantiles``: other quantiles, pairs that do not read logged at ERROR and skipped;
- ``counter_latencies=false``: no ``*_duration_us`` counters, no per-model cache counters;
- settings tritonserver 2.51 ignores (``histogram_latencies`` included) are taken and logged;
- malformed entries end start-up with tritonserver's words;
- the in-process API: ``Server(metrics_config=...)`` and ``render_metrics``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

import stubhost
from stubhost.server.metrics import render_metrics
from stubhost.server.metrics_config import MetricsConfig, parse_metrics_config
from tests.host.repo_factory import config_pbtxt, io, write_model
from tests.host.test_response_cache import COUNTED_PY, counted_config
from tests.server.serve_process import ServeProcess
from tests.server.test_metrics_names import PROBE_PY, Family, parse, scrape

DEFAULT_LABELS = ["0.5", "0.9", "0.95", "0.99", "0.999"]
# Triton's summaries, in its order (core src/metrics.cc): name, HELP
SUMMARIES = [
    ("nv_inference_request_summary_us",
     "Summary of inference request duration in microseconds (includes cached requests)"),
    ("nv_inference_queue_summary_us", "Summary of inference queuing duration in microseconds (includes cached requests)"),
    ("nv_inference_compute_input_summary_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_infer_summary_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_output_summary_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
    ("nv_cache_hit_summary_per_model", "Summary of cache hit counts/durations per model, in microseconds."),
    ("nv_cache_miss_summary_per_model", "Summary of cache miss counts/durations per model, in microseconds."),
]
LATENCY_COUNTERS = ["nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                    "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                    "nv_inference_compute_output_duration_us"]
CACHE_COUNTERS = ["nv_cache_num_hits_per_model", "nv_cache_hit_duration_per_model", "nv_cache_num_misses_per_model",
                  "nv_cache_miss_duration_per_model"]
CPU_GAUGES = ["nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"]
PLAIN = ["idle", "measured", "failing"]  # PROBE_PY models (Y = X), by what the tests send them


def write_repo(repo: Path) -> Path:
    for name in PLAIN:
        write_model(repo, name, PROBE_PY, config_pbtxt(name, [io("X", "TYPE_FP32", [4])], [io("Y", "TYPE_FP32", [4])]))
    write_model(repo, "counted", COUNTED_PY, counted_config())  # uses the response cache
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    repo = write_repo(tmp_path_factory.mktemp("summaries") / "models")
    with ServeProcess(repo, "--cache-config", "local,size=1048576", "--metrics-config", "summary_latencies=true",
                      "--allow-cpu-metrics", "false") as srv:
        yield srv


@pytest.fixture(scope="module")
def no_counters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    repo = write_repo(tmp_path_factory.mktemp("no_counters") / "models")
    flags = ["counter_latencies=false", "summary_latencies=true", "summary_quantiles=0.25:0.01,bogus,0.75:0.0.1",
             "histogram_latencies=true", "foo=bar", "counter_latencies=true"]
    with ServeProcess(repo, "--cache-config=local,size=1048576", *[f"--metrics-config={f}" for f in flags]) as srv:
        yield srv


def metrics(srv: ServeProcess) -> tuple[str, dict[str, Family]]:
    """The raw text (which a Prometheus parser must take) and its families, in order."""
    text = scrape(srv)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, _ in SUMMARIES:
        assert name not in families or families[name].type == "summary", name
    return text, parse(text)


def summary(fams: dict[str, Family], name: str, model: str) -> tuple[float, float, dict[str, float]]:
    """One version's count, sum and quantiles (by label) in a summary family."""
    samples = [s for s in fams[name].samples if dict(s.labels)["model"] == model]
    count = [s.value for s in samples if s.name == f"{name}_count"]
    total = [s.value for s in samples if s.name == f"{name}_sum"]
    quantiles = {dict(s.labels)["quantile"]: s.value for s in samples if s.name == name}
    assert len(count) == len(total) == 1, samples
    return count[0], total[0], quantiles


def counter(fams: dict[str, Family], name: str, model: str) -> float:
    [found] = [s.value for s in fams[name].samples if dict(s.labels) == {"model": model, "version": "1"}]
    return found


def infer(srv: ServeProcess, model: str, x: np.ndarray | None = None, **parameters: object) -> None:
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        data = np.ones(4, np.float32) if x is None else x
        tensor = httpclient.InferInput("X", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        client.infer(model, [tensor], parameters=parameters or None)
    finally:
        client.close()


# ---- summary_latencies=true ------------------------------------------------------------------------
def test_summaries_have_tritons_names_help_labels_and_come_last(server: ServeProcess, quiet_log: None) -> None:
    _, fams = metrics(server)
    names = list(fams)
    present = [name for name, _ in SUMMARIES]
    assert names[-len(present):] == present  # after every other family, in Triton's order
    for name, help_text in SUMMARIES:
        assert (fams[name].help, fams[name].type) == (help_text, "summary")
        for sample in fams[name].samples:
            keys = [k for k, _ in sample.labels]
            # prometheus-cpp writes the quantile label after the metric's own (sorted) labels
            assert keys == (["model", "version", "quantile"] if sample.name == name else ["model", "version"]), sample
    models = {name: sorted({dict(s.labels)["model"] for s in fams[name].samples}) for name, _ in SUMMARIES}
    # Triton has no request summary for a model that uses the cache, and cache summaries only there
    assert models["nv_inference_request_summary_us"] == sorted(PLAIN)
    assert models["nv_inference_queue_summary_us"] == sorted([*PLAIN, "counted"])
    assert models["nv_cache_hit_summary_per_model"] == models["nv_cache_miss_summary_per_model"] == ["counted"]
    for name, _ in SUMMARIES:
        for model in models[name]:
            assert list(summary(fams, name, model)[2]) == DEFAULT_LABELS


def test_allow_cpu_metrics_false_drops_the_cpu_gauges_only(server: ServeProcess, quiet_log: None) -> None:
    text, fams = metrics(server)
    assert not any(name in fams or name in text for name in CPU_GAUGES)
    for name in LATENCY_COUNTERS + CACHE_COUNTERS + ["nv_inference_request_success"]:
        assert name in fams, name  # counters stay on by default


def test_a_version_starts_with_empty_summaries(server: ServeProcess, quiet_log: None) -> None:
    text, fams = metrics(server)
    count, total, quantiles = summary(fams, "nv_inference_request_summary_us", "idle")
    assert (count, total) == (0, 0) and all(math.isnan(v) for v in quantiles.values())
    assert 'nv_inference_request_summary_us{model="idle",version="1",quantile="0.5"} Nan' in text.splitlines()


def test_summaries_measure_every_successful_request(server: ServeProcess, quiet_log: None) -> None:
    for _ in range(12):
        infer(server, "measured")
    for _ in range(8):
        infer(server, "measured", sleep_ms=60)
    _, fams = metrics(server)
    success = counter(fams, "nv_inference_request_success", "measured")
    assert success == 20
    for (name, _), duration in zip(SUMMARIES[:5], LATENCY_COUNTERS):
        count, total, quantiles = summary(fams, name, "measured")
        assert count == success, name
        # Whole µs per request, as Triton adds them; the counter rounds the total once.
        assert 0 <= counter(fams, duration, "measured") - total <= count, name
        assert list(quantiles.values()) == sorted(quantiles.values()), name
    _, _, infer_q = summary(fams, "nv_inference_compute_infer_summary_us", "measured")
    _, _, request_q = summary(fams, "nv_inference_request_summary_us", "measured")
    # 12 quick executions and 8 of at least 60 ms: the median is a quick one, the 0.9 a slow one
    assert infer_q["0.5"] < 30_000 <= 60_000 <= infer_q["0.9"] <= infer_q["0.999"]
    assert request_q["0.5"] < 30_000 <= 60_000 <= request_q["0.9"]


def test_failed_requests_are_not_observed(server: ServeProcess) -> None:
    for _ in range(3):
        infer(server, "failing")
    for _ in range(2):  # an execute that raises: a failure (an error response would be a success)
        with pytest.raises(InferenceServerException, match="asked to fail"):
            infer(server, "failing", **{"raise": 1})
    _, fams = metrics(server)
    failures = [s.value for s in fams["nv_inference_request_failure"].samples if dict(s.labels)["model"] == "failing"]
    assert sum(failures) == 2
    for name, _ in SUMMARIES[:5]:
        assert summary(fams, name, "failing")[0] == 3, name


def test_cache_hits_and_misses_are_observed_as_triton_does(server: ServeProcess, quiet_log: None) -> None:
    first, second = np.full((2, 3), 1.0, np.float32), np.full((2, 3), 2.0, np.float32)
    for data in (first, first, second):  # a miss, a hit, a miss
        infer(server, "counted", data)
    _, fams = metrics(server)
    assert counter(fams, "nv_inference_request_success", "counted") == 3
    assert counter(fams, "nv_cache_num_hits_per_model", "counted") == 1
    assert summary(fams, "nv_inference_queue_summary_us", "counted")[0] == 3  # hits wait in the queue too
    for name, _ in SUMMARIES[2:5]:
        assert summary(fams, name, "counted")[0] == 2, name  # a hit computes nothing
    hit_count, hit_sum, _ = summary(fams, "nv_cache_hit_summary_per_model", "counted")
    miss_count, miss_sum, _ = summary(fams, "nv_cache_miss_summary_per_model", "counted")
    assert (hit_count, miss_count) == (1, 2)
    assert 0 <= counter(fams, "nv_cache_hit_duration_per_model", "counted") - hit_sum <= 1
    assert 0 <= counter(fams, "nv_cache_miss_duration_per_model", "counted") - miss_sum <= 2


# ---- counter_latencies=false, summary_quantiles, settings with no effect -----------------------------
def test_counter_latencies_false_drops_the_latency_and_cache_counters(no_counters: ServeProcess) -> None:
    infer(no_counters, "measured")
    infer(no_counters, "counted", np.zeros((2, 3), np.float32))
    text, fams = metrics(no_counters)
    for name in LATENCY_COUNTERS + CACHE_COUNTERS:
        assert name not in text, name  # a later counter_latencies=true does not bring them back
    assert counter(fams, "nv_inference_request_success", "measured") == 1  # the others still count
    assert counter(fams, "nv_inference_exec_count", "counted") == 1
    assert summary(fams, "nv_inference_request_summary_us", "measured")[0] == 1
    for name in CPU_GAUGES:
        assert name in fams, name


def test_summary_quantiles_replace_the_defaults(no_counters: ServeProcess) -> None:
    _, fams = metrics(no_counters)
    for name, _ in SUMMARIES:
        for model in {dict(s.labels)["model"] for s in fams[name].samples}:
            assert list(summary(fams, name, model)[2]) == ["0.25", "0.75"], (name, model)


def test_entries_tritonserver_ignores_are_logged(no_counters: ServeProcess) -> None:
    log = no_counters.log
    assert re.search(r"^E\d{4} .*Invalid option: \[bogus\]\. No ':' delimiter found\. "
                     r"Expected format is <quantile>:<error>", log, re.MULTILINE), log
    for entry, why in (("histogram_latencies=true", "tritonserver 2.51 has no latency histograms"),
                       ("foo=bar", "tritonserver ignores unknown metrics settings")):
        assert re.search(rf"^W\d{{4}} .*--metrics-config {entry} is accepted and has no effect: {why}", log,
                         re.MULTILINE), log
    assert "metric options are fixed" not in log and "--allow-cpu-metrics" not in log


# ---- the flags' errors -----------------------------------------------------------------------------
def test_malformed_entries_end_start_up_with_tritonservers_words(tmp_path: Path) -> None:
    write_model(tmp_path, "idle", PROBE_PY, config_pbtxt("idle", [io("X", "TYPE_FP32", [4])], [io("Y", "TYPE_FP32", [4])]))
    bad = 'error: Bad option: "--metrics-config". --metrics-config option format is <setting>=<value>. Got '
    cases = [
        (["--metrics-config", "summary_latencies"], bad + "summary_latencies"),
        (["--metrics-config=summary_latencies=true", "--metrics-config", "model,summary_latencies=true"],
         bad + "model,summary_latencies=true"),
        (["--metrics-config", "summary_latencies="], bad + "summary_latencies="),
        (["--metrics-config", "=true"], bad + "=true"),
        (["--allow-cpu-metrics", "maybe"], "argument --allow-cpu-metrics: expected a boolean, got 'maybe'"),
    ]
    for flags, message in cases:
        srv = ServeProcess(tmp_path, *flags, expect_start=False)
        srv.start()
        try:
            assert srv.wait_exit(60) == 2, (flags, srv.log)
        finally:
            srv._kill()
            srv._close_log()
        assert message in srv.log, (flags, srv.log)
        assert "Started" not in srv.log and not srv.segments()


def test_parsing_follows_tritonserver() -> None:
    config = parse_metrics_config(["summary_latencies=True", "counter_latencies=0", "summary_quantiles=0.5:0.1",
                                   "summary_quantiles=x:1,:", "foo=a=b,c"])
    # Only exactly 'true' / 'false' act; a later quantile list that does not read changes nothing.
    assert (config.summary_latencies, config.counter_latencies) == (False, True)
    assert config.summary_quantiles == ((0.5, 0.1),)
    assert ("WARNING", "--metrics-config foo=a=b,c is accepted and has no effect: tritonserver ignores unknown "
                       "metrics settings") in config.report
    assert [line for level, line in config.report if level == "ERROR"] == [
        "Invalid option: [x:1]. Error: stod", "Invalid option: [:]. Error: stod"]
    # std::stod reads what it can: "0.0.1" is 0.0, " 0.9x" is 0.9
    assert parse_metrics_config(["summary_quantiles=0.1:0.0.1, 0.9x:0.01"]).summary_quantiles == ((0.1, 0.0),
                                                                                                  (0.9, 0.01))


# ---- the in-process API ----------------------------------------------------------------------------
def test_the_in_process_server_takes_a_metrics_config(tmp_path: Path) -> None:
    write_repo(tmp_path)
    config = parse_metrics_config(["summary_latencies=true", "summary_quantiles=0.5:0.05,0.99:0.001",
                                   "counter_latencies=false"])
    with stubhost.Server(tmp_path, models=["measured"], metrics_config=config) as server:
        for _ in range(5):
            server.infer("measured", {"X": np.ones(4, np.float32)})
        text = render_metrics(server).decode()
    assert "nv_inference_request_duration_us" not in text
    fams = parse(text)
    count, total, quantiles = summary(fams, "nv_inference_compute_infer_summary_us", "measured")
    assert count == 5 and total >= 0 and list(quantiles) == ["0.5", "0.99"]
    assert all(not math.isnan(v) for v in quantiles.values())
    with stubhost.Server(tmp_path, models=["idle"], metrics_config=MetricsConfig()) as server:
        assert "summary" not in render_metrics(server).decode()  # off by default, as in Triton
