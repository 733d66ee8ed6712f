"""The scheduler seen from tritonclient (HTTP and gRPC) against `stubhost serve`: batches under
load, the full-queue error, priorities, sequences, statistics, and traffic to one model while
another is unloaded and loaded again.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.host.repo_factory import write_model
from tests.host.test_scheduling import PROBE_PY, probe_config
from tests.server.serve_process import ServeProcess

TIMEOUT = 30.0

MODELS = {
    "batched": probe_config("batched", extra="dynamic_batching { max_queue_delay_microseconds: 200000 }"),
    "bounded": probe_config("bounded", extra="dynamic_batching { default_queue_policy { max_queue_size: 1 } }"),
    "ranked": probe_config("ranked", max_batch=0, extra="dynamic_batching { priority_levels: 2 "
                                                         "default_priority_level: 2 }"),
    "seq": probe_config("seq", max_batch=0, extra="instance_group [ { count: 2 kind: KIND_CPU } ]\n"
                                                   "sequence_batching { }"),
    "other": probe_config("other", extra="dynamic_batching { }"),
}


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("scheduler_clients") / "models"
    for name, config in MODELS.items():
        write_model(repo, name, PROBE_PY, config)
    with ServeProcess(repo, "--model-control-mode", "explicit", "--load-model", "*") as srv:
        yield srv


def grpc_call(url: str, model: str, rows: int = 1, **kw) -> grpcclient.InferResult:
    client = grpcclient.InferenceServerClient(url)
    try:
        x = grpcclient.InferInput("X", [rows, 4], "FP32")
        x.set_data_from_numpy(np.ones((rows, 4), np.float32))
        return client.infer(model, [x], client_timeout=TIMEOUT, **kw)
    finally:
        client.close()


def http_call(url: str, model: str, **kw) -> httpclient.InferResult:
    client = httpclient.InferenceServerClient(url, network_timeout=TIMEOUT)
    try:
        x = httpclient.InferInput("X", [1, 4], "FP32")
        x.set_data_from_numpy(np.ones((1, 4), np.float32))
        return client.infer(model, [x], **kw)
    finally:
        client.close()


def test_grpc_requests_under_load_share_executions(serve):
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: grpc_call(serve.grpc_url, "batched"), range(8)))
    assert max(int(r.as_numpy("N")[0, 0]) for r in results) > 1
    for r in results:
        np.testing.assert_array_equal(r.as_numpy("Y"), np.full((1, 4), 2, np.float32))


def test_http_full_queue_answers_unavailable_and_serving_goes_on(serve):
    with ThreadPoolExecutor(4) as pool:
        running = pool.submit(http_call, serve.http_url, "bounded", parameters={"sleep": 1.5})
        time.sleep(0.4)
        queued = pool.submit(http_call, serve.http_url, "bounded")
        time.sleep(0.3)
        with pytest.raises(InferenceServerException) as err:
            http_call(serve.http_url, "bounded")
        assert "Exceeds maximum queue size" in str(err.value)
        running.result(TIMEOUT)
        queued.result(TIMEOUT)
    assert http_call(serve.http_url, "bounded").as_numpy("N").tolist() == [[1]]


def test_grpc_priority_reaches_the_queue(serve):
    with ThreadPoolExecutor(6) as pool:
        running = pool.submit(grpc_call, serve.grpc_url, "ranked", parameters={"sleep": 1.0})
        time.sleep(0.4)
        low = [pool.submit(grpc_call, serve.grpc_url, "ranked") for _ in range(2)]
        time.sleep(0.3)
        high = pool.submit(grpc_call, serve.grpc_url, "ranked", priority=1)
        running.result(TIMEOUT)
        high_seq = int(high.result(TIMEOUT).as_numpy("SEQ")[0, 0])
        low_seqs = [int(f.result(TIMEOUT).as_numpy("SEQ")[0, 0]) for f in low]
    assert high_seq < min(low_seqs), (high_seq, low_seqs)


def test_sequences_from_tritonclient_stay_on_one_instance(serve):
    def run(corr: int) -> set[bytes]:
        who = set()
        for step in range(4):
            r = grpc_call(serve.grpc_url, "seq", sequence_id=corr, sequence_start=step == 0, sequence_end=step == 3)
            who.add(r.as_numpy("WHO")[0, 0])
        return who

    with ThreadPoolExecutor(4) as pool:
        placements = list(pool.map(run, [101, 102, 103, 104]))
    assert all(len(p) == 1 for p in placements), placements
    with pytest.raises(InferenceServerException) as err:
        http_call(serve.http_url, "seq", sequence_id=999)
    assert "must specify the START flag on the first request of the sequence" in str(err.value)


def test_statistics_over_http_match_what_was_sent(serve):
    client = httpclient.InferenceServerClient(serve.http_url)
    try:
        before = client.get_inference_statistics("batched")["model_stats"][0]
        with ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda _: grpc_call(serve.grpc_url, "batched"), range(6)))
        after = client.get_inference_statistics("batched")["model_stats"][0]
    finally:
        client.close()
    executions = {int(r.as_numpy("SEQ")[0, 0]) for r in results}
    assert int(after["inference_count"]) - int(before["inference_count"]) == 6
    assert int(after["execution_count"]) - int(before["execution_count"]) == len(executions)
    assert int(after["inference_stats"]["success"]["count"]) - int(before["inference_stats"]["success"]["count"]) == 6


def test_unloading_another_model_loses_nothing(serve):
    stop = threading.Event()
    failures: list[str] = []
    done = [0]

    def traffic() -> None:
        while not stop.is_set():
            try:
                grpc_call(serve.grpc_url, "batched")
                done[0] += 1
            except InferenceServerException as e:
                failures.append(str(e))

    client = httpclient.InferenceServerClient(serve.http_url)
    threads = [threading.Thread(target=traffic) for _ in range(3)]
    try:
        for t in threads:
            t.start()
        for _ in range(2):
            client.unload_model("other")
            client.load_model("other")
        assert client.is_model_ready("other")
    finally:
        stop.set()
        for t in threads:
            t.join(TIMEOUT)
        client.close()
    assert not failures, failures[:3]
    assert done[0] > 0
