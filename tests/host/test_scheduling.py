"""The model scheduler through the in-process API: dynamic batching, queue policies, priorities,
several instances, sequences (one per instance at a time with max_batch_size 0), statistics.

One model file serves every case: ``execute`` returns, per request, the number of requests in
the call (N), a global execution counter (SEQ), the instance name (WHO) and its input doubled;
a request parameter ``sleep`` makes the call sleep first, so a test can keep an instance busy
while it queues more requests.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import stubhost
from stubhost.host.errors import InferenceError
from tests.host.repo_factory import config_pbtxt, io, write_model

TIMEOUT = 30.0

PROBE_PY = """
import itertools
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

_calls = itertools.count(1)


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]

    def execute(self, requests):
        seq = next(_calls)
        sleep = max(json.loads(r.parameters()).get("sleep", 0) for r in requests)
        if sleep:
            time.sleep(sleep)
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            rows = x.shape[0] if x.ndim == 2 else 1
            shape = (rows, 1) if x.ndim == 2 else (1,)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", x * 2),
                pb_utils.Tensor("N", np.full(shape, len(requests), np.int32)),
                pb_utils.Tensor("SEQ", np.full(shape, seq, np.int32)),
                pb_utils.Tensor("WHO", np.full(shape, self.name.encode(), np.object_)),
            ]))
        return out
"""


def probe_config(name: str, *, max_batch: int = 8, extra: str = "") -> str:
    dims = [4]
    out_dims = [1]
    if max_batch == 0:
        dims, out_dims = [-1, 4], [-1, 1]
    return config_pbtxt(name, [io("X", "TYPE_FP32", dims)],
                        [io("Y", "TYPE_FP32", dims), io("N", "TYPE_INT32", out_dims),
                         io("SEQ", "TYPE_INT32", out_dims), io("WHO", "TYPE_STRING", out_dims)],
                        max_batch_size=max_batch, extra=extra)


MODELS = {
    # a long queue delay: requests that arrive together go together
    "delayed": probe_config("delayed", extra="dynamic_batching { max_queue_delay_microseconds: 200000 }"),
    "preferred": probe_config("preferred", extra="dynamic_batching { preferred_batch_size: [ 2 ] "
                                                  "max_queue_delay_microseconds: 2000000 }"),
    "bounded": probe_config("bounded", extra="dynamic_batching { default_queue_policy { max_queue_size: 2 } }"),
    "expiring": probe_config("expiring", extra="dynamic_batching { default_queue_policy { "
                                                "default_timeout_microseconds: 200000 timeout_action: REJECT "
                                                "allow_timeout_override: true } }"),
    "delaying": probe_config("delaying", extra="dynamic_batching { default_queue_policy { "
                                                "default_timeout_microseconds: 100000 timeout_action: DELAY } }"),
    "ranked": probe_config("ranked", max_batch=0, extra="dynamic_batching { priority_levels: 2 "
                                                         "default_priority_level: 2 }"),
    "quad": probe_config("quad", max_batch=0, extra="instance_group [ { count: 4 kind: KIND_CPU } ]"),
    "seq": probe_config("seq", max_batch=0, extra="instance_group [ { count: 2 kind: KIND_CPU } ]\n"
                                                   "sequence_batching { max_sequence_idle_microseconds: 5000000 }"),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo: Path = tmp_path_factory.mktemp("scheduling") / "models"
    for name, config in MODELS.items():
        write_model(repo, name, PROBE_PY, config)
    with stubhost.Server(repo) as srv:
        yield srv


def x(rows: int | None = 1) -> np.ndarray:
    return np.ones((rows, 4), np.float32) if rows else np.ones((1, 4), np.float32)


def call(server: stubhost.Server, model: str, rows: int = 1, **kw):
    return server.infer(model, {"X": x(rows)}, timeout=TIMEOUT, **kw)


def busy(server: stubhost.Server, model: str, seconds: float, pool: ThreadPoolExecutor):
    """Starts a request that holds the model's instance for `seconds`; waits until it runs."""
    future = pool.submit(call, server, model, parameters={"sleep": seconds})
    time.sleep(min(0.3, seconds / 3))
    return future


def test_batches_form_under_load_and_idle_requests_run_alone(server):
    alone = call(server, "delayed")
    assert alone["N"].tolist() == [[1]]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: call(server, "delayed"), range(8)))
    sizes = [int(r["N"][0, 0]) for r in results]
    assert max(sizes) > 1, sizes
    for r in results:
        np.testing.assert_array_equal(r["Y"], x() * 2)


def test_batch_dimension_never_exceeds_max_batch_size(server):
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: call(server, "delayed", rows=3), range(6)))
    # requests of 3 rows with max_batch_size 8: at most two per execute
    by_call: dict[int, int] = {}
    for r in results:
        by_call[int(r["SEQ"][0, 0])] = int(r["N"][0, 0])
    assert all(n <= 2 for n in by_call.values()), by_call
    assert max(by_call.values()) == 2


def test_preferred_batch_size_goes_without_waiting_for_the_delay(server):
    with ThreadPoolExecutor(4) as pool:
        t0 = time.monotonic()
        results = list(pool.map(lambda _: call(server, "preferred"), range(2)))
        took = time.monotonic() - t0
    assert [int(r["N"][0, 0]) for r in results] == [2, 2]
    assert took < 1.5  # the 2 s queue delay did not run out: the preferred size sent the batch


def test_full_queue_rejects_and_the_model_keeps_serving(server):
    with ThreadPoolExecutor(8) as pool:
        running = busy(server, "bounded", 1.5, pool)
        queued = [pool.submit(call, server, "bounded") for _ in range(2)]
        time.sleep(0.2)
        with pytest.raises(InferenceError) as err:
            call(server, "bounded")
        assert err.value.code == "UNAVAILABLE"
        assert "Exceeds maximum queue size" in str(err.value)
        running.result(TIMEOUT)
        for f in queued:
            f.result(TIMEOUT)
    assert call(server, "bounded")["N"].tolist() == [[1]]


def test_queue_timeout_rejects_what_waited_too_long(server):
    with ThreadPoolExecutor(4) as pool:
        running = busy(server, "expiring", 1.0, pool)
        with pytest.raises(InferenceError) as err:
            call(server, "expiring")
        assert err.value.code == "UNAVAILABLE"
        assert "Request timeout expired" in str(err.value)
        running.result(TIMEOUT)


def test_request_timeout_overrides_the_queue_policy(server):
    async def main():
        with ThreadPoolExecutor(2) as pool:
            running = busy(server, "expiring", 1.0, pool)
            # 5 s of the request's own timeout outlasts the busy instance: it runs
            response = await server.infer_response_async("expiring", {"X": x()}, request_timeout_us=5_000_000,
                                                         timeout=TIMEOUT)
            running.result(TIMEOUT)
        return response

    assert asyncio.run(main()).outputs["N"].tolist() == [[1]]


def test_delayed_requests_still_run(server):
    with ThreadPoolExecutor(4) as pool:
        running = busy(server, "delaying", 0.6, pool)
        late = pool.submit(call, server, "delaying")
        result = late.result(TIMEOUT)
        running.result(TIMEOUT)
    assert result["N"].tolist() == [[1]]


def test_higher_priority_runs_before_queued_lower_priority(server):
    with ThreadPoolExecutor(8) as pool:
        running = busy(server, "ranked", 1.0, pool)
        low = [pool.submit(call, server, "ranked") for _ in range(3)]
        time.sleep(0.2)
        high = pool.submit(call, server, "ranked", priority=1)
        running.result(TIMEOUT)
        high_seq = int(high.result(TIMEOUT)["SEQ"][0, 0])
        low_seqs = [int(f.result(TIMEOUT)["SEQ"][0, 0]) for f in low]
    assert high_seq < min(low_seqs), (high_seq, low_seqs)


def test_in_process_timeout_withdraws_a_queued_request(server):
    with ThreadPoolExecutor(2) as pool:
        running = busy(server, "ranked", 1.0, pool)
        before = server.statistics("ranked")["model_stats"][0]["execution_count"]
        with pytest.raises(InferenceError) as err:
            server.infer("ranked", {"X": x()}, timeout=0.2)
        assert "timeout" in str(err.value).lower()
        running.result(TIMEOUT)
    time.sleep(0.2)
    # the withdrawn request never ran: only the busy one was executed
    assert server.statistics("ranked")["model_stats"][0]["execution_count"] == before + 1


def test_cancelled_async_caller_withdraws_its_queued_request(server):
    async def main():
        with ThreadPoolExecutor(2) as pool:
            running = busy(server, "ranked", 1.0, pool)
            before = server.statistics("ranked")["model_stats"][0]["execution_count"]
            task = asyncio.ensure_future(server.infer_async("ranked", {"X": x()}))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.get_running_loop().run_in_executor(None, running.result, TIMEOUT)
            return before

    before = asyncio.run(main())
    time.sleep(0.2)
    assert server.statistics("ranked")["model_stats"][0]["execution_count"] == before + 1


def test_four_instances_run_four_slow_requests_in_parallel(server):
    with ThreadPoolExecutor(4) as pool:
        t0 = time.monotonic()
        results = list(pool.map(lambda _: call(server, "quad", parameters={"sleep": 1.0}), range(4)))
        took = time.monotonic() - t0
    assert len({r["WHO"][0, 0] for r in results}) == 4
    assert took < 1.9, took


def test_a_slow_instance_does_not_hold_up_the_others(server):
    with ThreadPoolExecutor(8) as pool:
        slow = busy(server, "quad", 3.0, pool)
        t0 = time.monotonic()
        for _ in range(10):
            call(server, "quad")
        assert time.monotonic() - t0 < 2.5
        assert not slow.done()
        slow.result(TIMEOUT)


def test_statistics_count_requests_and_executions(server):
    before = server.statistics("delayed")["model_stats"][0]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: call(server, "delayed"), range(8)))
    after = server.statistics("delayed")["model_stats"][0]
    executions = {int(r["SEQ"][0, 0]) for r in results}
    assert after["inference_count"] - before["inference_count"] == 8
    assert after["execution_count"] - before["execution_count"] == len(executions)
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 8
    batch_counts = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    old_counts = {b["batch_size"]: b["compute_infer"]["count"] for b in before["batch_stats"]}
    seen: dict[int, int] = {}
    for seq in executions:
        size = next(int(r["N"][0, 0]) for r in results if int(r["SEQ"][0, 0]) == seq)
        seen[size] = seen.get(size, 0) + 1
    for size, count in seen.items():
        assert batch_counts.get(size, 0) - old_counts.get(size, 0) == count


def test_sequences_stay_on_their_instance(server):
    """Four sequences at once on two instances with max_batch_size 0: an instance runs one
    sequence at a time (Triton's one slot), so two of them wait for a slot; each sequence stays
    on one instance, and no instance interleaves two sequences (its executes, numbered by SEQ,
    take one sequence's requests after another's)."""
    def run_sequence(corr: int) -> list[tuple[bytes, int]]:
        steps = []
        for step in range(6):
            flags = (1 if step == 0 else 0) | (2 if step == 5 else 0)
            out = call(server, "seq", correlation_id=corr, flags=flags)
            steps.append((out["WHO"][0, 0], int(out["SEQ"][0, 0])))
        return steps

    ids = [11, 12, 13, 14]
    with ThreadPoolExecutor(4) as pool:
        runs = dict(zip(ids, pool.map(run_sequence, ids)))
    placements = [{who for who, _ in steps} for steps in runs.values()]
    assert all(len(p) == 1 for p in placements), placements
    assert len(set().union(*placements)) == 2  # the sequences were spread over both instances
    by_instance: dict[bytes, list[tuple[int, int]]] = {}
    for corr, steps in runs.items():
        for who, seq in steps:
            by_instance.setdefault(who, []).append((seq, corr))
    for who, entries in by_instance.items():
        order = [corr for _, corr in sorted(entries)]
        runs_of = [c for i, c in enumerate(order) if i == 0 or order[i - 1] != c]
        assert len(runs_of) == len(set(runs_of)), (who, order)  # one sequence after another


def test_sequence_errors_use_tritons_words(server):
    with pytest.raises(InferenceError) as err:
        call(server, "seq", correlation_id=77)
    assert err.value.code == "INVALID_ARG"
    assert str(err.value).endswith("inference request for sequence 77 to model 'seq' must specify the START flag "
                                   "on the first request of the sequence")
    with pytest.raises(InferenceError) as err:
        call(server, "seq")
    assert "inference request to model 'seq' must specify a non-zero or non-empty correlation ID" in str(err.value)
    call(server, "seq", correlation_id="abc", flags=1)
    call(server, "seq", correlation_id="abc", flags=2)  # END closes it
    with pytest.raises(InferenceError):
        call(server, "seq", correlation_id="abc")


DECOUPLED_PY = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        n = len(requests)
        for request in requests:
            threading.Thread(target=self.answer, args=(request, n)).start()
        return None

    def answer(self, request, n):
        sender = request.get_response_sender()
        count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0, 0])
        for i in range(count):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([[i, n]], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


def test_decoupled_requests_batched_together_each_get_their_stream(tmp_path):
    repo = tmp_path / "models"
    write_model(repo, "fan", DECOUPLED_PY, config_pbtxt(
        "fan", [io("COUNT", "TYPE_INT32", [1])], [io("OUT", "TYPE_INT32", [2])], max_batch_size=8,
        extra="model_transaction_policy { decoupled: true }\n"
              "dynamic_batching { max_queue_delay_microseconds: 300000 }"))
    with stubhost.Server(repo) as server:
        def run(count: int) -> list[np.ndarray]:
            return [o["OUT"][0] for o in server.stream("fan", {"COUNT": np.array([[count]], np.int32)},
                                                       timeout=TIMEOUT)]

        with ThreadPoolExecutor(4) as pool:
            streams = list(pool.map(run, [1, 2, 3, 4]))
    for count, items in zip([1, 2, 3, 4], streams):
        assert [int(i[0]) for i in items] == list(range(count))
    assert max(int(items[0][1]) for items in streams) > 1  # some ran in one execute


def test_unload_fails_what_waits_in_the_queue(tmp_path):
    repo = tmp_path / "models"
    write_model(repo, "doomed", PROBE_PY, probe_config("doomed", extra="dynamic_batching { }"))
    server = stubhost.Server(repo)
    try:
        outcomes: list[BaseException | None] = []

        def queued() -> None:
            try:
                call(server, "doomed")
                outcomes.append(None)
            except InferenceError as e:
                outcomes.append(e)

        with ThreadPoolExecutor(4) as pool:
            running = busy(server, "doomed", 1.0, pool)
            waiting = [pool.submit(queued) for _ in range(3)]
            time.sleep(0.2)
            unloading = threading.Thread(target=server.unload, args=("doomed",))
            unloading.start()
            for f in waiting:
                f.result(TIMEOUT)
            running.result(TIMEOUT)
            unloading.join(TIMEOUT)
            assert not unloading.is_alive()
        assert len(outcomes) == 3
        for outcome in outcomes:
            # either it ran before the unload began, or it was told clearly
            assert outcome is None or outcome.code == "UNAVAILABLE", outcome
        assert any(o is not None for o in outcomes)
    finally:
        server.close()
