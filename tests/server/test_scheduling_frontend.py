"""The model scheduler through the front ends of `stubhost serve`, with the real tritonclient:
dynamic batching (queue delay, max_batch_size, preferred sizes), queue policies (max_queue_size,
queue timeouts and the client's ``timeout`` override), priorities, several instances, sequences
(one per instance at a time with max_batch_size 0), statistics, model control while a queue is
busy, and a decoupled model whose requests are batched.

One server serves the module (explicit model control, every model loaded at start-up). Every
model but ``fan`` runs PROBE_PY: per request it answers Y = X, N = how many requests its execute
call got, SEQ = that call's number in its stub, ORD = the request's number in its stub, WHO = the
instance name, ACC = the running sum of X over the request's sequence (correlation id). Request
parameters: {"sleep_ms": n} makes the call sleep first, {"touch": path} creates `path` when the
call starts, so that a test knows an instance is busy before it queues more requests.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from tests.host.repo_factory import config_pbtxt, io, wait_until, write_model
from tests.server.serve_process import ServeProcess

TIMEOUT = 30.0  # generous: waiting this long is a failure, never a pacing device
FINAL = "triton_final_response"
PROTOCOLS = ("http", "grpc")

PROBE_PY = """
import itertools
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

_executes = itertools.count(1)
_requests = itertools.count(1)


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]
        self.totals = {}

    def execute(self, requests):
        seq = next(_executes)
        params = [json.loads(r.parameters()) for r in requests]
        for p in params:
            if "touch" in p:
                open(p["touch"], "w").close()
        sleep_ms = max(int(p.get("sleep_ms", 0)) for p in params)
        if sleep_ms:
            time.sleep(sleep_ms / 1000.0)
        responses = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            lead = x.shape[:-1] + (1,)
            corr = r.correlation_id()
            total = 0.0
            if corr:
                if r.flags() & 1:  # START
                    self.totals[corr] = 0.0
                total = self.totals.get(corr, float("nan")) + float(x.sum())
                self.totals[corr] = total
                if r.flags() & 2:  # END
                    del self.totals[corr]
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", x.copy()),
                pb_utils.Tensor("N", np.full(lead, len(requests), np.int32)),
                pb_utils.Tensor("SEQ", np.full(lead, seq, np.int32)),
                pb_utils.Tensor("ORD", np.full(lead, next(_requests), np.int32)),
                pb_utils.Tensor("WHO", np.full(lead, self.name.encode(), np.object_)),
                pb_utils.Tensor("ACC", np.full(lead, total, np.float32)),
            ]))
        return responses
"""

# Decoupled: per request COUNT responses OUT = [i, number of requests in the execute call], then
# the final flag alone.
FAN_PY = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        n = len(requests)
        for request in requests:
            threading.Thread(target=self.answer, args=(request, n), daemon=True).start()
        return None

    def answer(self, request, n):
        sender = request.get_response_sender()
        count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy().reshape(-1)[0])
        for i in range(count):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([[i, n]], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


def probe_config(name: str, *, max_batch: int = 0, extra: str = "") -> str:
    return config_pbtxt(name, [io("X", "TYPE_FP32", [4])],
                        [io("Y", "TYPE_FP32", [4]), io("N", "TYPE_INT32", [1]), io("SEQ", "TYPE_INT32", [1]),
                         io("ORD", "TYPE_INT32", [1]), io("WHO", "TYPE_STRING", [1]), io("ACC", "TYPE_FP32", [1])],
                        max_batch_size=max_batch, extra=extra)


def instances(count: int) -> str:
    return f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]"


PROBES = {
    # a queue delay long enough that requests sent together are batched together
    "batcher": probe_config("batcher", max_batch=8,
                            extra="dynamic_batching { max_queue_delay_microseconds: 100000 }"),
    # the delay is far beyond the test: only a preferred size (or max_batch_size) sends a batch
    "preferred": probe_config("preferred", max_batch=8,
                              extra="dynamic_batching { preferred_batch_size: [ 4 ] "
                                    "max_queue_delay_microseconds: 10000000 }"),
    "bounded": probe_config("bounded", extra="dynamic_batching { default_queue_policy { max_queue_size: 2 } }"),
    "expiring": probe_config("expiring", extra="dynamic_batching { default_queue_policy { "
                                               "default_timeout_microseconds: 300000 timeout_action: REJECT "
                                               "allow_timeout_override: true } }"),
    "ranked": probe_config("ranked", extra="dynamic_batching { priority_levels: 2 default_priority_level: 2 }"),
    "counted": probe_config("counted", max_batch=8,
                            extra="dynamic_batching { max_queue_delay_microseconds: 50000 }"),
    "quad": probe_config("quad", extra=instances(4)),
    "duo": probe_config("duo", extra=instances(2)),
    "seq": probe_config("seq", extra=instances(2) + "\n"
                        "sequence_batching { max_sequence_idle_microseconds: 60000000 }"),
    "steady": probe_config("steady", max_batch=8, extra=instances(2) + "\n"
                           "dynamic_batching { max_queue_delay_microseconds: 2000 }"),
    "flip": probe_config("flip"),
}
FAN_CONFIG = config_pbtxt("fan", [io("COUNT", "TYPE_INT32", [1])], [io("OUT", "TYPE_INT32", [2])], max_batch_size=8,
                          extra="model_transaction_policy { decoupled: true }\n"
                                "dynamic_batching { max_queue_delay_microseconds: 300000 }")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("scheduling") / "models"
    for name, config in PROBES.items():
        write_model(repo, name, PROBE_PY, config)
    write_model(repo, "fan", FAN_PY, FAN_CONFIG)
    with ServeProcess(repo, "--model-control-mode", "explicit", "--load-model", "*", start_timeout=120.0) as srv:
        yield srv


# ---- helpers --------------------------------------------------------------------------------------
def mod_of(protocol: str) -> Any:
    return httpclient if protocol == "http" else grpcclient


def open_client(server: ServeProcess, protocol: str) -> Any:
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url, network_timeout=TIMEOUT)
    return grpcclient.InferenceServerClient(server.grpc_url)


def x_input(protocol: str, value: float = 1.0, rows: int | None = None) -> Any:
    """X filled with `value`: shape [4] (rows None: a model without batching) or [rows, 4]."""
    array = np.full((4,) if rows is None else (rows, 4), value, np.float32)
    tensor = mod_of(protocol).InferInput("X", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return tensor


def scalar(result: Any, name: str) -> Any:
    value = result.as_numpy(name).reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else value.item()


def infer(server: ServeProcess, protocol: str, model: str, value: float = 1.0, rows: int | None = None,
          **kwargs: Any) -> Any:
    """One request on a client of its own (so that threads never share one)."""
    client = open_client(server, protocol)
    try:
        if protocol == "grpc":
            kwargs.setdefault("client_timeout", TIMEOUT)
        result = client.infer(model, [x_input(protocol, value, rows)], **kwargs)
        np.testing.assert_array_equal(result.as_numpy("Y"),
                                      np.full((4,) if rows is None else (rows, 4), value, np.float32))
        return result
    finally:
        client.close()


def failure(future: Future) -> InferenceServerException:
    error = future.exception(TIMEOUT)
    assert isinstance(error, InferenceServerException), f"expected a failure, got {error!r}"
    return error


def grpc_async(client: Any, model: str, values: list[float], rows: int = 1, **kwargs: Any) -> list[queue.Queue]:
    """Sends one request per value with grpc async_infer (all in flight at once); each queue gets
    its request's (result, error)."""
    boxes: list[queue.Queue] = []
    for value in values:
        box: queue.Queue = queue.Queue()
        client.async_infer(model, [x_input("grpc", value, rows)],
                           lambda result, error, box=box: box.put((result, error)), client_timeout=TIMEOUT, **kwargs)
        boxes.append(box)
    return boxes


def collect(boxes: list[queue.Queue], values: list[float], rows: int = 1) -> list[Any]:
    """The results of grpc_async's requests, each checked to carry its own input back."""
    results = []
    for box, value in zip(boxes, values):
        result, error = box.get(timeout=TIMEOUT)
        assert error is None, f"request failed: {error}"
        np.testing.assert_array_equal(result.as_numpy("Y"), np.full((rows, 4), value, np.float32))
        results.append(result)
    return results


class Busy:
    """A request that holds an instance of `model` for `sleep_ms`; entering waits until its execute
    call has started (the model touches a file), so the instance is busy for sure."""

    def __init__(self, server: ServeProcess, pool: ThreadPoolExecutor, tmp_path: Path, model: str, sleep_ms: int,
                 protocol: str = "grpc", name: str = "busy") -> None:
        marker = tmp_path / f"{model}-{name}.started"
        self.future = pool.submit(infer, server, protocol, model, 9.0,
                                  parameters={"sleep_ms": sleep_ms, "touch": str(marker)})
        assert wait_until(lambda: marker.exists() or self.future.done(), TIMEOUT), "the busy request never started"
        assert not self.future.done(), f"the busy request ended early: {self.future.exception()}"
        self.started = time.monotonic()

    def result(self) -> Any:
        return self.future.result(TIMEOUT)


def model_stats(client: Any, protocol: str, model: str) -> dict[str, Any]:
    stats = client.get_inference_statistics(model)
    if protocol == "grpc":
        stats = json_format.MessageToDict(stats, preserving_proto_field_name=True)
    [entry] = [e for e in stats["model_stats"] if e["name"] == model]
    return entry


def stat_counts(entry: dict[str, Any]) -> dict[str, Any]:
    inference = entry.get("inference_stats", {})
    return {
        "inference_count": int(entry.get("inference_count", 0)),
        "execution_count": int(entry.get("execution_count", 0)),
        "success": int(inference.get("success", {}).get("count", 0)),
        "fail": int(inference.get("fail", {}).get("count", 0)),
        "batches": {int(b["batch_size"]): int(b.get("compute_infer", {}).get("count", 0))
                    for b in entry.get("batch_stats", [])},
    }


# ---- dynamic batching -------------------------------------------------------------------------------
def test_batches_form_under_load_and_an_idle_request_runs_alone(server: ServeProcess, quiet_log):
    alone = infer(server, "grpc", "batcher", 3.0, rows=1)
    assert scalar(alone, "N") == 1

    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        values = [float(i) for i in range(16)]
        results = collect(grpc_async(client, "batcher", values), values)
    finally:
        client.close()
    sizes = [scalar(r, "N") for r in results]
    assert max(sizes) > 1, sizes
    assert max(sizes) <= 8, sizes
    # every execute call's requests all came back, each with its own input (checked in collect)
    per_call = Counter(scalar(r, "SEQ") for r in results)
    for r in results:
        assert per_call[scalar(r, "SEQ")] == scalar(r, "N"), (per_call, sizes)

    # and idle again: a request alone runs alone
    again = infer(server, "http", "batcher", 5.0, rows=1)
    assert scalar(again, "N") == 1


def test_batch_dimensions_never_exceed_max_batch_size(server: ServeProcess):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        values = [float(i) for i in range(6)]
        results = collect(grpc_async(client, "batcher", values, rows=3), values, rows=3)
    finally:
        client.close()
    # 3 rows each, max_batch_size 8: at most two requests per execute call, and some call had two
    per_call = {scalar(r, "SEQ"): scalar(r, "N") for r in results}
    assert all(n <= 2 for n in per_call.values()), per_call
    assert max(per_call.values()) == 2, per_call


def test_preferred_batch_size_is_honoured(server: ServeProcess, tmp_path: Path, quiet_log):
    """preferred [4], max_batch_size 8, a 10 s queue delay. Four requests sent together go as one
    batch of 4 at once (the delay never runs out in this test); while that batch runs, eight more
    queue up; when the instance frees, Triton's dynamic batcher (GetDynamicBatch: a preferred size
    found within the delay is what it executes) sends them as two batches of 4."""
    marker = tmp_path / "preferred.started"
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        t0 = time.monotonic()
        first_values = [100.0 + i for i in range(4)]
        first = grpc_async(client, "preferred", first_values,
                           parameters={"sleep_ms": 1500, "touch": str(marker)})
        assert wait_until(marker.exists, TIMEOUT), "the first batch never started"
        later_values = [float(i) for i in range(8)]
        later = grpc_async(client, "preferred", later_values)
        first_results = collect(first, first_values)
        later_results = collect(later, later_values)
        took = time.monotonic() - t0
    finally:
        client.close()
    assert [scalar(r, "N") for r in first_results] == [4, 4, 4, 4]
    assert len({scalar(r, "SEQ") for r in first_results}) == 1
    later_sizes = [scalar(r, "N") for r in later_results]
    later_calls = Counter(scalar(r, "SEQ") for r in later_results)
    assert later_sizes == [4] * 8, f"batch sizes the model saw: {later_sizes} (execute calls: {dict(later_calls)})"
    assert sorted(later_calls.values()) == [4, 4]
    assert took < 8.0, took  # no batch waited for the 10 s queue delay


# ---- queue policies ---------------------------------------------------------------------------------
def test_full_queue_rejects_and_the_model_keeps_serving(server: ServeProcess, tmp_path: Path, quiet_log):
    """One running + max_queue_size 2 queued: of six requests sent while the only instance is busy,
    exactly two are accepted; the others fail at once with Triton's words."""
    with ThreadPoolExecutor(8) as pool:
        busy = Busy(server, pool, tmp_path, "bounded", 3000)
        protocols = ["grpc", "http"] * 3
        futures = [pool.submit(infer, server, protocol, "bounded", float(i))
                   for i, protocol in enumerate(protocols)]
        # the rejections come back at once, while the busy request still runs
        assert wait_until(lambda: sum(f.done() for f in futures) >= 4, TIMEOUT)
        assert not busy.future.done(), "the rejections came only after the busy request ended"
        busy.result()
        outcomes = [(protocol, f.exception(TIMEOUT), f) for protocol, f in zip(protocols, futures)]
    rejected = [(protocol, error) for protocol, error, _ in outcomes if error is not None]
    accepted = [f.result() for _, error, f in outcomes if error is None]
    assert len(accepted) == 2, [str(e) for _, e in rejected]
    assert len(rejected) == 4
    for protocol, error in rejected:
        assert isinstance(error, InferenceServerException), repr(error)
        assert "Exceeds maximum queue size" in error.message(), error.message()
        if protocol == "grpc":
            assert error.status() == "StatusCode.UNAVAILABLE", error.status()
        else:
            assert error.status() == "503", error.status()
    for result in accepted:
        assert scalar(result, "N") == 1
    # the server keeps serving the model (and the queue is empty again)
    for protocol in PROTOCOLS:
        assert scalar(infer(server, protocol, "bounded", 7.0), "N") == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_queue_timeout_rejects_and_the_request_timeout_overrides_it(server: ServeProcess, tmp_path: Path,
                                                                    protocol: str, quiet_log):
    """default_timeout_microseconds 300 ms, REJECT, allow_timeout_override: behind a request that
    runs 2.5 s, a request with the default timeout is rejected after ~0.3 s, one with its own
    100 ms timeout too, and one with a 20 s timeout (tritonclient ``timeout=``, in µs, sent as the
    request's "timeout" parameter on both protocols) waits its turn and runs."""
    with ThreadPoolExecutor(4) as pool:
        busy = Busy(server, pool, tmp_path, "expiring", 2500, protocol=protocol, name=protocol)
        default = pool.submit(infer, server, protocol, "expiring", 1.0)
        short = pool.submit(infer, server, protocol, "expiring", 2.0, timeout=100_000)
        patient = pool.submit(infer, server, protocol, "expiring", 3.0, timeout=20_000_000)
        for future in (default, short):
            error = failure(future)
            assert "Request timeout expired" in error.message(), error.message()
            if protocol == "grpc":
                assert error.status() == "StatusCode.UNAVAILABLE", error.status()
            else:
                assert error.status() == "503", error.status()
        rejected_at = time.monotonic()
        assert not busy.future.done(), "the rejections came only after the busy request ended"
        assert rejected_at - busy.started < 2.0, rejected_at - busy.started
        busy.result()
        result = patient.result(TIMEOUT)
    assert scalar(result, "N") == 1


# ---- several instances --------------------------------------------------------------------------------
def test_four_instances_run_four_slow_requests_in_parallel(server: ServeProcess, quiet_log):
    clients = [grpcclient.InferenceServerClient(server.grpc_url) for _ in range(4)]
    try:
        with ThreadPoolExecutor(4) as pool:
            t0 = time.monotonic()
            futures = [pool.submit(c.infer, "quad", [x_input("grpc", float(i))], parameters={"sleep_ms": 1000},
                                   client_timeout=TIMEOUT) for i, c in enumerate(clients)]
            results = [f.result(TIMEOUT) for f in futures]
            took = time.monotonic() - t0
    finally:
        for c in clients:
            c.close()
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result.as_numpy("Y"), np.full(4, float(i), np.float32))
        assert scalar(result, "N") == 1
    assert len({scalar(r, "WHO") for r in results}) == 4, [scalar(r, "WHO") for r in results]
    assert took < 1.8, f"4 requests of 1 s on 4 instances took {took:.2f} s"


def test_a_slow_instance_does_not_block_the_other(server: ServeProcess, tmp_path: Path, quiet_log):
    with ThreadPoolExecutor(2) as pool:
        slow = Busy(server, pool, tmp_path, "duo", 4000)
        quick = []
        for i in range(10):
            quick.append(infer(server, "grpc" if i % 2 else "http", "duo", float(i)))
        quick_done = time.monotonic()
        assert not slow.future.done(), "the quick requests only finished after the slow one"
        slow_result = slow.result()
    assert quick_done - slow.started < 3.0, quick_done - slow.started
    quick_instances = {scalar(r, "WHO") for r in quick}
    assert len(quick_instances) == 1, quick_instances
    assert scalar(slow_result, "WHO") not in quick_instances


# ---- sequences ------------------------------------------------------------------------------------------
def test_sequences_stay_on_their_instance(server: ServeProcess, quiet_log):
    """Four sequences (one with a string id) on two instances of a model with max_batch_size 0,
    which gives each instance one sequence slot, as Triton does: the first two are opened one
    after the other and take one instance each; the other two are started meanwhile from threads
    and wait for a slot. Every request of a sequence runs on one instance (the model's running sum
    per correlation id is right at every step), and no instance interleaves two sequences (ORD,
    its request counter, takes one sequence's requests after another's)."""
    ids: list[int | str] = [101, 102, 103, "seq-104"]
    steps = 6
    placements: dict[int | str, list[str]] = {cid: [] for cid in ids}
    orders: dict[int | str, list[int]] = {cid: [] for cid in ids}
    sums: dict[int | str, list[float]] = {cid: [] for cid in ids}
    protocols = {cid: PROTOCOLS[i % 2] for i, cid in enumerate(ids)}

    def step(client: Any, cid: int | str, k: int) -> None:
        value = float(k + 1)
        flags = {"sequence_start": k == 0, "sequence_end": k == steps - 1}
        result = client.infer("seq", [x_input(protocols[cid], value)], sequence_id=cid, **flags)
        np.testing.assert_array_equal(result.as_numpy("Y"), np.full(4, value, np.float32))
        placements[cid].append(scalar(result, "WHO"))
        orders[cid].append(scalar(result, "ORD"))
        sums[cid].append(scalar(result, "ACC"))

    def run(cid: int | str, first: int) -> None:
        client = open_client(server, protocols[cid])
        try:
            for k in range(first, steps):
                step(client, cid, k)
        finally:
            client.close()

    clients = {protocol: open_client(server, protocol) for protocol in PROTOCOLS}
    try:
        for cid in ids[:2]:
            step(clients[protocols[cid]], cid, 0)
    finally:
        for c in clients.values():
            c.close()
    assert placements[101][0] != placements[102][0]
    with ThreadPoolExecutor(len(ids)) as pool:
        waiting = [pool.submit(run, cid, 0) for cid in ids[2:]]
        running = [pool.submit(run, cid, 1) for cid in ids[:2]]
        for f in running + waiting:
            f.result(TIMEOUT)

    expected = [4.0 * sum(range(1, k + 2)) for k in range(steps)]  # X = k+1 in 4 elements
    for cid in ids:
        assert len(set(placements[cid])) == 1, (cid, placements[cid])
        assert sums[cid] == expected, (cid, sums[cid])
    for who in set(placements[101] + placements[102]):
        order = sorted((o, cid) for cid in ids if placements[cid][0] == who for o in orders[cid])
        runs = [cid for i, (_, cid) in enumerate(order) if i == 0 or order[i - 1][1] != cid]
        assert len(runs) == len(set(runs)), (who, order)  # one sequence after another


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_sequence_errors_use_tritons_words(server: ServeProcess, protocol: str):
    client = open_client(server, protocol)
    try:
        with pytest.raises(InferenceServerException) as err:
            client.infer("seq", [x_input(protocol)], sequence_id=9999)
        assert ("inference request for sequence 9999 to model 'seq' must specify the START flag on the first "
                "request of the sequence") in err.value.message()
        with pytest.raises(InferenceServerException) as err:
            client.infer("seq", [x_input(protocol)])  # no sequence_id: correlation id 0
        assert "inference request to model 'seq' must specify a non-zero or non-empty correlation ID" in \
            err.value.message()
        # an ended sequence is closed: continuing it needs START again
        client.infer("seq", [x_input(protocol)], sequence_id=4242, sequence_start=True)
        client.infer("seq", [x_input(protocol)], sequence_id=4242, sequence_end=True)
        with pytest.raises(InferenceServerException) as err:
            client.infer("seq", [x_input(protocol)], sequence_id=4242)
        assert "inference request for sequence 4242 to model 'seq' must specify the START flag" in \
            err.value.message()
    finally:
        client.close()


def hold_both_slots(client: Any, protocol: str, base: int) -> None:
    """Opens sequences base+1 and base+2: each of ``seq``'s two instances has one slot, so a
    third sequence waits in the backlog."""
    for cid in (base + 1, base + 2):
        client.infer("seq", [x_input(protocol)], sequence_id=cid, sequence_start=True)


def end_both(client: Any, protocol: str, base: int) -> None:
    """Ends what hold_both_slots opened; each sequence ran both of its requests (4 + 4)."""
    for cid in (base + 1, base + 2):
        assert scalar(client.infer("seq", [x_input(protocol)], sequence_id=cid, sequence_end=True), "ACC") == 8.0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_backlogged_sequence_expires_with_the_clients_timeout(server: ServeProcess, protocol: str, quiet_log):
    """The client's ``timeout`` (µs, the request's "timeout" parameter) bounds a sequence's wait
    in the backlog, as in Triton: the sequence is rejected and over; the ones in slots go on."""
    client = open_client(server, protocol)
    base = 7100 if protocol == "http" else 7200
    try:
        hold_both_slots(client, protocol, base)
        begin = time.monotonic()
        with pytest.raises(InferenceServerException) as err:
            client.infer("seq", [x_input(protocol)], sequence_id=base + 3, sequence_start=True, timeout=300_000)
        assert time.monotonic() - begin >= 0.25
        assert "timeout of the corresponding sequence has been expired" in err.value.message()
        assert err.value.status() == ("StatusCode.UNAVAILABLE" if protocol == "grpc" else "503")
        with pytest.raises(InferenceServerException) as err:
            client.infer("seq", [x_input(protocol)], sequence_id=base + 3)
        assert "must specify the START flag" in err.value.message()
        end_both(client, protocol, base)
    finally:
        client.close()


def test_a_grpc_cancel_of_a_backlogged_request_ends_its_sequence(server: ServeProcess, quiet_log):
    """A cancelled request cancels its sequence, as in Triton. The probe that follows the cancel
    either comes after it (refused: the sequence is over) or joins the backlog just before it
    (cancelled with it); without the rule it would wait in the backlog for a slot."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    base = 7300
    try:
        hold_both_slots(client, "grpc", base)
        box: queue.Queue = queue.Queue()
        call = client.async_infer("seq", [x_input("grpc")], lambda result, error: box.put((result, error)),
                                  sequence_id=base + 3, sequence_start=True, client_timeout=TIMEOUT)
        time.sleep(0.2)  # (it reaches the backlog, or the cancel finds it on its way: either is a cancel)
        call.cancel()
        result, error = box.get(timeout=TIMEOUT)
        assert result is None and "CANCELLED" in str(error.status()), error
        with pytest.raises(InferenceServerException) as err:
            client.infer("seq", [x_input("grpc")], sequence_id=base + 3, client_timeout=10.0)
        message = err.value.message()
        assert ("must specify the START flag" in message
                or "another request of the sequence was cancelled" in message), message
        end_both(client, "grpc", base)
    finally:
        client.close()


# ---- priorities -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_higher_priority_runs_before_queued_lower_priority(server: ServeProcess, tmp_path: Path, protocol: str,
                                                            quiet_log):
    with ThreadPoolExecutor(6) as pool:
        busy = Busy(server, pool, tmp_path, "ranked", 2500, protocol=protocol, name=protocol)
        low = []
        for i in range(3):
            low.append(pool.submit(infer, server, protocol, "ranked", float(i)))
            time.sleep(0.1)
        time.sleep(0.3)
        high = pool.submit(infer, server, protocol, "ranked", 50.0, priority=1)
        time.sleep(0.2)
        assert not busy.future.done(), "the busy request ended before the high-priority one was queued"
        busy_order = scalar(busy.result(), "ORD")
        high_order = scalar(high.result(TIMEOUT), "ORD")
        low_orders = [scalar(f.result(TIMEOUT), "ORD") for f in low]
    assert busy_order < high_order < min(low_orders), (busy_order, high_order, low_orders)
    assert low_orders == sorted(low_orders), low_orders  # the default level is FIFO


# ---- statistics ---------------------------------------------------------------------------------------------
def test_statistics_count_requests_and_executions(server: ServeProcess, quiet_log):
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        before = stat_counts(model_stats(http, "http", "counted"))
        values = [float(i) for i in range(12)]
        results = collect(grpc_async(grpc, "counted", values), values)
        results.append(infer(server, "http", "counted", 99.0, rows=1))  # alone: a batch of 1
        values.append(99.0)
        after = {protocol: stat_counts(model_stats(c, protocol, "counted"))
                 for protocol, c in (("http", http), ("grpc", grpc))}
    finally:
        http.close()
        grpc.close()
    calls = {scalar(r, "SEQ"): scalar(r, "N") for r in results}  # execute call -> its batch size
    assert sum(calls.values()) == len(values), calls
    assert max(calls.values()) > 1, calls  # some requests did run together
    expected_batches = Counter(calls.values())
    for protocol, now in after.items():
        assert now["inference_count"] - before["inference_count"] == len(values), (protocol, before, now)
        assert now["execution_count"] - before["execution_count"] == len(calls), (protocol, before, now, calls)
        assert now["success"] - before["success"] == len(values), (protocol, before, now)
        assert now["fail"] == before["fail"], (protocol, before, now)
        grown = {size: count - before["batches"].get(size, 0) for size, count in now["batches"].items()}
        assert {s: c for s, c in grown.items() if c} == dict(expected_batches), (protocol, grown, calls)


# ---- model control ---------------------------------------------------------------------------------------------
def test_unloading_another_model_loses_no_request(server: ServeProcess, quiet_log):
    stop = threading.Event()
    done: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def hammer(index: int, protocol: str) -> None:
        client = open_client(server, protocol)
        n = 0
        try:
            while not stop.is_set():
                value = float(index * 1000 + n)
                result = client.infer("steady", [x_input(protocol, value, rows=1)])
                np.testing.assert_array_equal(result.as_numpy("Y"), np.full((1, 4), value, np.float32))
                n += 1
        except BaseException as e:  # noqa: BLE001
            with lock:
                errors.append(e)
        finally:
            client.close()
            with lock:
                done.append(n)

    control = grpcclient.InferenceServerClient(server.grpc_url)
    threads = [threading.Thread(target=hammer, args=(i, PROTOCOLS[i % 2])) for i in range(4)]
    try:
        for t in threads:
            t.start()
        for _ in range(3):
            control.unload_model("flip")
            assert not control.is_model_ready("flip")
            control.load_model("flip")
            assert control.is_model_ready("flip")
            result = control.infer("flip", [x_input("grpc", 4.0)], client_timeout=TIMEOUT)
            assert scalar(result, "N") == 1
    finally:
        stop.set()
        for t in threads:
            t.join(TIMEOUT)
        control.close()
    assert not any(t.is_alive() for t in threads)
    assert errors == [], [str(e) for e in errors]
    assert len(done) == 4 and all(n > 0 for n in done), done


# ---- a decoupled model, batched ------------------------------------------------------------------------------
def test_decoupled_requests_batched_together_each_get_their_responses(server: ServeProcess, quiet_log):
    counts = {"f0": 0, "f1": 1, "f2": 2, "f3": 3, "f5": 5}
    items: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: items.put((result, error)))
    try:
        for rid, count in counts.items():
            tensor = grpcclient.InferInput("COUNT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[count]], np.int32))
            client.async_stream_infer("fan", [tensor], request_id=rid, enable_empty_final_response=True)
        got: dict[str, list] = {rid: [] for rid in counts}
        open_ids = set(counts)
        deadline = time.monotonic() + TIMEOUT
        while open_ids:
            result, error = items.get(timeout=max(0.1, deadline - time.monotonic()))
            assert error is None, f"stream error: {error}"
            response = result.get_response()
            assert response.id in open_ids, f"response for {response.id!r} after its final one"
            got[response.id].append(result)
            final = response.parameters[FINAL].bool_param if FINAL in response.parameters else False
            if final:
                open_ids.discard(response.id)
    finally:
        client.stop_stream()
        client.close()
    assert items.empty(), "responses came after every request's final one"
    batch_sizes = set()
    for rid, count in counts.items():
        results = got[rid]
        assert len(results) == count + 1, (rid, len(results))
        outs = [result.as_numpy("OUT") for result in results[:-1]]
        assert [int(o[0, 0]) for o in outs] == list(range(count)), (rid, outs)
        batch_sizes.update(int(o[0, 1]) for o in outs)
        last = results[-1].get_response()
        assert len(last.outputs) == 0 and last.parameters[FINAL].bool_param
    assert max(batch_sizes) > 1, batch_sizes  # requests did run in one execute call
