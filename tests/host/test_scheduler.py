"""The model scheduler (Triton's dynamic batcher and default scheduler) through the in-process API.

Every model here runs PROBE_PY. Its ``execute`` answers each request with the number of requests
in the call (N), the rows of the whole call (ROWS), a per-stub execution counter (SEQ), the
request's index in the call (IDX), the instance name (WHO), the request ids the stub has seen
so far (SEEN), the request's ``timeout()`` (TIMEOUT), and twice its input (Y); a request with
the parameter ``fail`` gets an error response instead.

Timing is kept out of the assertions where possible: a request whose parameters carry a *gate*
(``{"started": path, "gate": path}``) creates ``started`` when its batch begins and holds its
instance until the test creates ``gate``. So a test holds an instance busy, queues requests
(waiting until the queue holds them), and only then lets the batch go; which requests form
which batch is then fixed by the scheduler's rules, not by a race.

Waiting until the queue holds N requests reads ``Scheduler.queued()``, and the DELAY test waits
for the request to move to its level's delayed queue (internal, used only to synchronise);
everything asserted comes through ``stubhost.Server``.

preserve_ordering is observable in-process: two async callers on a two-instance model, the first
held, the second done on the other instance; with it the second caller is woken only after the
first (a model without it is the control, where the second comes back at once).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, final

import numpy as np
import pytest

import stubhost
from stubhost import InferenceError
from tests.host.repo_factory import config_pbtxt, io, wait_until, write_model

TIMEOUT = 30.0  # seconds: generous bound of every wait that should end

PROBE_PY = '''
import itertools
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

_calls = itertools.count(1)
_seen = []


def _wait_for(path):
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.002)


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]
        config = json.loads(args["model_config"])
        self.batched = int(config.get("max_batch_size", 0)) > 0
        self.outputs = {o["name"] for o in config.get("output", [])}
        self.acc = {}

    def execute(self, requests):
        seq = next(_calls)
        params = [json.loads(r.parameters()) for r in requests]
        for r in requests:
            _seen.append(r.request_id())
        for p in params:
            if "started" in p:
                open(p["started"], "w").close()
        for p in params:
            if "gate" in p:
                _wait_for(p["gate"])
        for p in params:
            if "exit" in p:
                os._exit(int(p["exit"]))
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        total = sum(int(x.shape[0]) for x in xs) if self.batched else len(requests)
        seen = json.dumps(_seen).encode()
        responses = []
        for i, (r, p, x) in enumerate(zip(requests, params, xs)):
            if p.get("fail"):
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("asked to fail")))
                continue
            shape = (x.shape[0], 1) if self.batched else (1,)
            corr = r.correlation_id()
            flags = r.flags()
            acc = None
            if "ACC" in self.outputs:
                if flags & 1:
                    self.acc[corr] = 0.0
                self.acc[corr] = self.acc.get(corr, 0.0) + float(x.reshape(-1)[0])
                acc = self.acc[corr]
                if flags & 2:
                    self.acc.pop(corr, None)
            values = {
                "Y": (x * 2).astype(np.float32),
                "N": np.full(shape, len(requests), np.int32),
                "ROWS": np.full(shape, total, np.int32),
                "SEQ": np.full(shape, seq, np.int64),
                "IDX": np.full(shape, i, np.int32),
                "WHO": np.full(shape, self.name.encode(), np.object_),
                "SEEN": np.full(shape, seen, np.object_),
                "TIMEOUT": np.full(shape, r.timeout(), np.int64),
                "CORR": np.full(shape, str(corr).encode(), np.object_),
                "FLAGS": np.full(shape, flags, np.int32),
                "ACC": np.full(shape, acc if acc is not None else 0.0, np.float32),
            }
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor(k, v) for k, v in values.items() if k in self.outputs]))
        for p in params:
            if "finished" in p:
                open(p["finished"], "w").close()
        return responses
'''

# The start of a gated model: execute marks the "started" file of each request's parameters,
# then waits for each "gate" file to exist (the test opens the gate).
GATED_HEAD = '''
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _wait_for(path):
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.002)


class TritonPythonModel:
    def execute(self, requests):
        params = [json.loads(r.parameters()) for r in requests]
        for p in params:
            if "started" in p:
                open(p["started"], "w").close()
        for p in params:
            if "gate" in p:
                _wait_for(p["gate"])
'''

# Decoupled: each request sends COUNT responses [COUNT, k, N] (N: requests in the call), then
# the final flag; the same gate parameters as PROBE_PY.
STREAM_PY = GATED_HEAD + '''        n = len(requests)
        for r in requests:
            count = int(pb_utils.get_input_tensor_by_name(r, "COUNT").as_numpy().reshape(-1)[0])
            sender = r.get_response_sender()
            for k in range(count):
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([[count, k, n]], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


def probe_config(name: str, *, max_batch: int = 0, extra: str = "") -> str:
    outputs = [io("Y", "TYPE_FP32", [2])] + [io(n, t, [1]) for n, t in (
        ("N", "TYPE_INT32"), ("ROWS", "TYPE_INT32"), ("SEQ", "TYPE_INT64"), ("IDX", "TYPE_INT32"),
        ("WHO", "TYPE_STRING"), ("SEEN", "TYPE_STRING"), ("TIMEOUT", "TYPE_INT64"))]
    if "sequence_batching" in extra:
        outputs += [io("CORR", "TYPE_STRING", [1]), io("FLAGS", "TYPE_INT32", [1]), io("ACC", "TYPE_FP32", [1])]
    return config_pbtxt(name, [io("X", "TYPE_FP32", [2])], outputs, max_batch_size=max_batch, extra=extra)


TWO_INSTANCES = "instance_group [ { count: 2 kind: KIND_CPU } ]"

MODELS = {
    # batching with a short queue delay
    "batcher": probe_config("batcher", max_batch=8,
                            extra="dynamic_batching { max_queue_delay_microseconds: 20000 }"),
    # the largest preferred size goes at once, long before the 5 s delay runs out
    "pref_now": probe_config("pref_now", max_batch=8,
                             extra="dynamic_batching { preferred_batch_size: [ 4 ] "
                                   "max_queue_delay_microseconds: 5000000 }"),
    # preferred sizes and a delay long enough never to run out in a test
    "pref_long": probe_config("pref_long", max_batch=8,
                              extra="dynamic_batching { preferred_batch_size: [ 2, 4 ] "
                                    "max_queue_delay_microseconds: 5000000 }"),
    # preferred sizes and a short delay
    "pref_short": probe_config("pref_short", max_batch=8,
                               extra="dynamic_batching { preferred_batch_size: [ 2, 4 ] "
                                     "max_queue_delay_microseconds: 100000 }"),
    "bounded": probe_config("bounded", extra="dynamic_batching { default_queue_policy { max_queue_size: 2 } }"),
    "reject": probe_config("reject", extra="dynamic_batching { default_queue_policy { "
                                           "default_timeout_microseconds: 300000 timeout_action: REJECT "
                                           "allow_timeout_override: true } }"),
    "strict": probe_config("strict", extra="dynamic_batching { default_queue_policy { "
                                           "default_timeout_microseconds: 300000 timeout_action: REJECT } }"),
    "delay": probe_config("delay", extra="dynamic_batching { default_queue_policy { "
                                         "default_timeout_microseconds: 300000 timeout_action: DELAY "
                                         "allow_timeout_override: true } }"),
    "ranked": probe_config("ranked", extra="dynamic_batching { priority_levels: 3 default_priority_level: 2 "
                                           "priority_queue_policy { key: 1 value { max_queue_size: 2 } } }"),
    "plain": probe_config("plain", extra="dynamic_batching { }"),
    "ordered": probe_config("ordered", extra=TWO_INSTANCES + "\ndynamic_batching { preserve_ordering: true }"),
    "unordered": probe_config("unordered", extra=TWO_INSTANCES),  # the default scheduler, no batching
    "seq": probe_config("seq", extra=TWO_INSTANCES + "\nsequence_batching { max_sequence_idle_microseconds: 2000000 }"),
}

STREAM_CONFIG = config_pbtxt("stream", [io("COUNT", "TYPE_INT32", [1])], [io("OUT", "TYPE_INT32", [3])],
                             max_batch_size=8,
                             extra="model_transaction_policy { decoupled: true }\n"
                                   "dynamic_batching { max_queue_delay_microseconds: 20000 }")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo: Path = tmp_path_factory.mktemp("scheduler") / "models"
    for name, config in MODELS.items():
        write_model(repo, name, PROBE_PY, config)
    write_model(repo, "stream", STREAM_PY, STREAM_CONFIG)
    with stubhost.Server(repo) as srv:
        yield srv


# ---- helpers ----------------------------------------------------------------------------------------
@final
class Gate:
    """Holds the instance that runs a request carrying ``params()`` until ``open()``."""

    def __init__(self, folder: Path, name: str = "gate") -> None:
        self.started = folder / f"{name}.started"
        self.path = folder / f"{name}.open"

    def params(self, **extra: Any) -> dict[str, Any]:
        return {"started": str(self.started), "gate": str(self.path), **extra}

    def wait_started(self) -> None:
        assert wait_until(self.started.exists, TIMEOUT), "the gated request never started"

    def open(self) -> None:
        self.path.touch()

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.open()  # never leave an instance held, whatever failed


def x(rows: int = 0, value: float = 1.0) -> np.ndarray:
    """X for a request: (rows, 2) for a batching model, (2,) with rows=0."""
    if rows:
        return np.stack([np.full(2, value + r, np.float32) for r in range(rows)])
    return np.full(2, value, np.float32)


def call(server: stubhost.Server, model: str, rows: int = 0, value: float = 1.0, **kw: Any) -> dict[str, Any]:
    """One request; returns its outputs read into plain values (and Y as an array)."""
    kw.setdefault("timeout", TIMEOUT)
    data = x(rows, value)
    out = server.infer(model, {"X": data}, **kw)
    np.testing.assert_array_equal(out["Y"], data * 2)  # every response carries its own request's data
    return read(out)


def read(out: dict[str, np.ndarray]) -> dict[str, Any]:
    info: dict[str, Any] = {}
    for name, array in out.items():
        if name == "Y":
            info[name] = np.array(array)
            continue
        value = array.reshape(-1)[0]
        info[name] = value.decode() if isinstance(value, bytes) else value.item()
    if "SEEN" in info:
        info["SEEN"] = json.loads(info["SEEN"])
    return info


def scheduler(server: stubhost.Server, model: str) -> Any:
    return server._models[model].schedulers[1]


def queued(server: stubhost.Server, model: str) -> int:
    return scheduler(server, model).queued()


def enqueue(pool: ThreadPoolExecutor, server: stubhost.Server, model: str, fn: Callable[[], Any],
            expect: int) -> Future:
    """Runs `fn` (a request) in `pool` and waits until the model's queue holds `expect` requests,
    so that requests enter the queue in the order they are enqueued."""
    future = pool.submit(fn)
    assert wait_until(lambda: queued(server, model) >= expect or future.done(), TIMEOUT)
    if future.done():
        future.result()  # raises what went wrong
        pytest.fail("the request did not wait in the queue")
    assert queued(server, model) == expect
    return future


def stats(server: stubhost.Server, model: str) -> dict[str, Any]:
    return server.statistics(model)["model_stats"][0]


def batch_counts(entry: dict[str, Any]) -> dict[int, int]:
    return {b["batch_size"]: b["compute_infer"]["count"] for b in entry["batch_stats"]}


def seen_now(server: stubhost.Server, model: str) -> list[str]:
    """The request ids the (single) instance has seen, the probe request itself last."""
    info = call(server, model, request_id="probe")
    assert info["SEEN"][-1] == "probe"
    return info["SEEN"]


# ---- dynamic batching -------------------------------------------------------------------------------
def test_idle_requests_run_alone(server: stubhost.Server) -> None:
    results = [call(server, "batcher", rows=1, value=i) for i in range(3)]
    assert [r["N"] for r in results] == [1, 1, 1]
    assert [r["ROWS"] for r in results] == [1, 1, 1]
    assert len({r["SEQ"] for r in results}) == 3


def test_requests_queued_behind_a_busy_instance_run_as_one_batch(server: stubhost.Server, tmp_path: Path) -> None:
    with ThreadPoolExecutor(8) as pool, Gate(tmp_path) as gate:
        running = pool.submit(call, server, "batcher", 1, 100.0, parameters=gate.params())
        gate.wait_started()
        waiting = [enqueue(pool, server, "batcher",
                           partial(call, server, "batcher", 1, float(i), request_id=f"r{i}"), i + 1)
                   for i in range(6)]
        gate.open()
        first = running.result(TIMEOUT)
        results = [f.result(TIMEOUT) for f in waiting]
    assert first["N"] == 1
    assert [r["N"] for r in results] == [6] * 6
    assert len({r["SEQ"] for r in results}) == 1
    assert [r["IDX"] for r in results] == list(range(6))  # the model gets them in the order they came


@pytest.mark.parametrize("rows, groups", [
    ([3, 3, 3, 3, 3], [[0, 1], [2, 3], [4]]),   # 3 rows each, max 8: two per batch at most
    ([3, 4, 2, 1], [[0, 1], [2, 3]]),           # 7 rows, then 2 would make 9: a new batch
    ([8, 1, 8], [[0], [1], [2]]),               # a full request goes alone
    ([5, 3, 1], [[0, 1], [2]]),                 # exactly 8
])
def test_batches_never_exceed_max_batch_size_rows(server: stubhost.Server, tmp_path: Path, rows: list[int],
                                                   groups: list[list[int]]) -> None:
    with ThreadPoolExecutor(8) as pool, Gate(tmp_path) as gate:
        running = pool.submit(call, server, "batcher", 1, parameters=gate.params())
        gate.wait_started()
        waiting = [enqueue(pool, server, "batcher", partial(call, server, "batcher", n, 10.0 * i), i + 1)
                   for i, n in enumerate(rows)]
        gate.open()
        running.result(TIMEOUT)
        results = [f.result(TIMEOUT) for f in waiting]
    assert all(r["ROWS"] <= 8 for r in results), [r["ROWS"] for r in results]
    by_execution: dict[int, list[int]] = {}
    for i, r in enumerate(results):
        by_execution.setdefault(r["SEQ"], []).append(i)
    assert [by_execution[s] for s in sorted(by_execution)] == groups
    for group in groups:
        total = sum(rows[i] for i in group)
        assert all(results[i]["ROWS"] == total and results[i]["N"] == len(group) for i in group)


def test_concurrent_callers_get_batched_and_each_gets_its_own_answer(server: stubhost.Server) -> None:
    errors: list[str] = []
    sizes: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker(k: int) -> None:
        barrier.wait()
        for i in range(25):
            rows = 1 + (k + i) % 3
            try:
                info = call(server, "batcher", rows, float(k * 1000 + i * 10))  # checks Y against its X
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(f"worker {k} request {i}: {e!r}")
                continue
            if info["ROWS"] > 8:
                errors.append(f"a batch of {info['ROWS']} rows")
            with lock:
                sizes.append(info["N"])

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a caller hangs"
    assert errors == []
    assert len(sizes) == 200
    assert max(sizes) > 1, "no batch of more than one request formed under load"


def test_statistics_count_requests_executions_and_batch_sizes(server: stubhost.Server, tmp_path: Path) -> None:
    before = stats(server, "batcher")
    with ThreadPoolExecutor(8) as pool, Gate(tmp_path) as gate:
        running = pool.submit(call, server, "batcher", 1, parameters=gate.params())
        gate.wait_started()
        rows = [1, 1, 1, 1, 1, 1, 2]  # 8 rows: one full batch
        waiting = [enqueue(pool, server, "batcher", partial(call, server, "batcher", n), i + 1)
                   for i, n in enumerate(rows)]
        gate.open()
        running.result(TIMEOUT)
        results = [f.result(TIMEOUT) for f in waiting]
    assert len({r["SEQ"] for r in results}) == 1  # one execute of 8 rows
    after = stats(server, "batcher")
    assert after["inference_count"] - before["inference_count"] == 1 + 8  # counted in rows
    assert after["execution_count"] - before["execution_count"] == 2
    success = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    assert success == 1 + len(rows)
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]
    new, old = batch_counts(after), batch_counts(before)
    grown = {size: new[size] - old.get(size, 0) for size in new if new[size] != old.get(size, 0)}
    assert grown == {1: 1, 8: 1}


def test_statistics_count_a_batch_once_when_its_first_request_is_answered_with_an_error(
        server: stubhost.Server, tmp_path: Path) -> None:
    """One execute is one execution (Triton's backend reports it per execute), counted once; a
    request the model answered with an error response is, as Triton 2.51 counts it, a success and
    an inference (its caller still gets the error)."""
    before = stats(server, "batcher")
    with ThreadPoolExecutor(8) as pool, Gate(tmp_path) as gate:
        running = pool.submit(call, server, "batcher", 1, parameters=gate.params())
        gate.wait_started()
        failing = enqueue(pool, server, "batcher", lambda: call(server, "batcher", 1, parameters={"fail": 1}), 1)
        waiting = [enqueue(pool, server, "batcher", lambda: call(server, "batcher", 1), k) for k in (2, 3)]
        gate.open()
        running.result(TIMEOUT)
        with pytest.raises(InferenceError, match="asked to fail"):
            failing.result(TIMEOUT)
        results = [f.result(TIMEOUT) for f in waiting]
    assert [r["N"] for r in results] == [3, 3]
    after = stats(server, "batcher")
    assert after["execution_count"] - before["execution_count"] == 2  # the held one, then the batch of 3
    assert after["inference_count"] - before["inference_count"] == 4
    assert after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"] == 0
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 4
    new, old = batch_counts(after), batch_counts(before)
    grown = {size: new[size] - old.get(size, 0) for size in new if new[size] != old.get(size, 0)}
    assert grown == {1: 1, 3: 1}


def test_largest_preferred_batch_size_goes_without_waiting_for_the_delay(server: stubhost.Server) -> None:
    barrier = threading.Barrier(4)

    def one(i: int) -> dict[str, Any]:
        barrier.wait()
        return call(server, "pref_now", 1, float(i))

    start = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(4)))
    took = time.monotonic() - start
    assert [r["N"] for r in results] == [4, 4, 4, 4]
    assert took < 4.0, f"{took:.2f} s: the batch waited for the 5 s queue delay"


def preferred_groups(server: stubhost.Server, model: str, gate_dir: Path, rows: list[int],
                     wait_before_release: float = 0.0) -> list[list[int]]:
    """Holds the model's instance, queues requests of `rows`, lets them go; returns which
    requests (by index) ran together, in execution order."""
    with ThreadPoolExecutor(8) as pool, Gate(gate_dir) as gate:
        running = pool.submit(call, server, model, 4, parameters=gate.params())  # 4 rows: goes at once
        gate.wait_started()
        waiting = [enqueue(pool, server, model, partial(call, server, model, n, 10.0 * i), i + 1)
                   for i, n in enumerate(rows)]
        time.sleep(wait_before_release)
        gate.open()
        assert running.result(TIMEOUT)["N"] == 1
        results = [f.result(TIMEOUT) for f in waiting]
    by_execution: dict[int, list[int]] = {}
    for i, r in enumerate(results):
        by_execution.setdefault(r["SEQ"], []).append(i)
    return [by_execution[s] for s in sorted(by_execution)]


@pytest.mark.parametrize("rows, groups", [
    ([1, 1, 1, 1, 2, 2], [[0, 1, 2, 3], [4, 5]]),  # cut at 4 rows (not 8 whole), then 4 rows
    ([2, 1, 1, 4], [[0, 1, 2], [3]]),              # cut at 4, then the 4-row request
    ([3, 3, 1], [[0], [1, 2]]),                    # no preferred size before outgrowing 4: cut there
])
def test_a_batch_that_reaches_a_preferred_size_goes_at_once_cut_there(server: stubhost.Server, tmp_path: Path,
                                                                     rows: list[int], groups: list[list[int]]) -> None:
    """Triton's rule (GetDynamicBatch): before the queue delay runs out, a batch that reached a
    preferred size goes at once, cut at the largest preferred size it reached, or where it
    outgrew the largest one. The 5 s delay never runs out here: every batch goes at once."""
    start = time.monotonic()
    assert preferred_groups(server, "pref_long", tmp_path, rows) == groups
    assert time.monotonic() - start < 4.0  # nothing waited for the 5 s delay


@pytest.mark.parametrize("rows, groups", [
    ([1, 1, 1], [[0, 1, 2]]),
    ([1, 1, 1, 1, 1], [[0, 1, 2, 3, 4]]),
    ([3, 3], [[0, 1]]),
])
def test_a_batch_whose_queue_delay_ran_out_goes_whole(server: stubhost.Server, tmp_path: Path, rows: list[int],
                                                      groups: list[list[int]]) -> None:
    """Triton's rule: once the oldest request waited max_queue_delay_microseconds (0.1 s; they
    wait 0.5 s here), what is pending goes whole, up to max_batch_size."""
    assert preferred_groups(server, "pref_short", tmp_path, rows, wait_before_release=0.5) == groups


def test_decoupled_requests_batched_through_the_queue_each_get_their_stream(server: stubhost.Server,
                                                                            tmp_path: Path) -> None:
    def run(count: int, **kw: Any) -> list[list[int]]:
        return [o["OUT"][0].tolist() for o in server.stream("stream", {"COUNT": np.array([[count]], np.int32)},
                                                            timeout=TIMEOUT, **kw)]

    with ThreadPoolExecutor(6) as pool, Gate(tmp_path) as gate:
        running = pool.submit(run, 1, parameters=gate.params())
        gate.wait_started()
        waiting = [enqueue(pool, server, "stream", partial(run, c), c) for c in (1, 2, 3)]
        gate.open()
        assert running.result(TIMEOUT) == [[1, 0, 1]]
        streams = [f.result(TIMEOUT) for f in waiting]
    for count, items in zip((1, 2, 3), streams):
        assert items == [[count, k, 3] for k in range(count)]


# ---- queue policies ---------------------------------------------------------------------------------
def test_full_queue_rejects_and_the_model_keeps_serving(server: stubhost.Server, tmp_path: Path) -> None:
    before = stats(server, "bounded")
    with ThreadPoolExecutor(4) as pool, Gate(tmp_path) as gate:
        running = pool.submit(call, server, "bounded", parameters=gate.params())
        gate.wait_started()
        waiting = [enqueue(pool, server, "bounded", lambda: call(server, "bounded"), k) for k in (1, 2)]
        with pytest.raises(InferenceError) as err:
            call(server, "bounded")
        assert err.value.code == "UNAVAILABLE"
        assert "Exceeds maximum queue size" in str(err.value)
        assert queued(server, "bounded") == 2
        gate.open()
        results = [f.result(TIMEOUT) for f in [running, *waiting]]
    assert [r["N"] for r in results] == [1, 1, 1]  # max_batch_size 0: one request per execute
    assert len({r["SEQ"] for r in results}) == 3
    assert call(server, "bounded")["N"] == 1
    after = stats(server, "bounded")
    assert after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"] == 1
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 4


def test_queue_timeout_rejects_a_request_that_waited_too_long(server: stubhost.Server, tmp_path: Path) -> None:
    with ThreadPoolExecutor(4) as pool, Gate(tmp_path) as gate:
        running = pool.submit(call, server, "reject", parameters=gate.params())
        gate.wait_started()
        start = time.monotonic()
        late = enqueue(pool, server, "reject", lambda: call(server, "reject", request_id="late"), 1)
        # rejected while the instance is still held: 0.3 s of queue timeout, not the gate, ends it
        with pytest.raises(InferenceError) as err:
            late.result(TIMEOUT)
        waited = time.monotonic() - start
        assert not running.done()
        assert err.value.code == "UNAVAILABLE"
        assert "Request timeout expired" in str(err.value)
        assert waited >= 0.29
        assert queued(server, "reject") == 0
        gate.open()
        running.result(TIMEOUT)
    assert "late" not in seen_now(server, "reject")


def test_request_timeout_overrides_the_queue_policy_when_allowed(server: stubhost.Server, tmp_path: Path) -> None:
    async def main(gate: Gate) -> tuple[Any, bool]:
        task = asyncio.ensure_future(server.infer_response_async("reject", {"X": x()}, timeout=TIMEOUT,
                                                                 request_timeout_us=60_000_000))
        await asyncio.sleep(1.0)  # well past the policy's 0.3 s
        pending = not task.done() and queued(server, "reject") == 1
        gate.open()
        return await task, pending

    with ThreadPoolExecutor(2) as pool, Gate(tmp_path) as gate:
        running = pool.submit(call, server, "reject", parameters=gate.params())
        gate.wait_started()
        response, pending = asyncio.run(main(gate))
        running.result(TIMEOUT)
    assert pending, "the request's own 60 s timeout did not replace the policy's 0.3 s"
    info = read(response.outputs)
    assert info["N"] == 1
    assert info["TIMEOUT"] == 60_000_000  # and the model sees it


def test_request_timeout_is_ignored_without_allow_timeout_override(server: stubhost.Server, tmp_path: Path) -> None:
    async def main() -> Any:
        return await server.infer_response_async("strict", {"X": x()}, timeout=TIMEOUT,
                                                 request_timeout_us=60_000_000)

    with ThreadPoolExecutor(2) as pool, Gate(tmp_path) as gate:
        running = pool.submit(call, server, "strict", parameters=gate.params())
        gate.wait_started()
        with pytest.raises(InferenceError) as err:
            asyncio.run(main())  # the policy's 0.3 s still applies
        assert "Request timeout expired" in str(err.value)
        assert not running.done()
        gate.open()
        running.result(TIMEOUT)


def test_delayed_request_still_runs_after_the_ones_that_did_not_time_out(server: stubhost.Server,
                                                                         tmp_path: Path) -> None:
    def send(request_id: str, timeout_us: int | None) -> dict[str, Any]:
        response = next(iter(server.stream_responses("delay", {"X": x()}, timeout=TIMEOUT, request_id=request_id,
                                                     request_timeout_us=timeout_us)))
        return read(response.outputs)

    level = scheduler(server, "delay").levels[0]
    with ThreadPoolExecutor(4) as pool, Gate(tmp_path) as gate:
        running = pool.submit(call, server, "delay", parameters=gate.params())
        gate.wait_started()
        first = enqueue(pool, server, "delay", lambda: send("first", None), 1)  # the policy's 0.3 s
        # its queue timeout runs out: DELAY moves it behind the requests that did not time out
        assert wait_until(lambda: len(level.delayed) == 1, TIMEOUT)
        assert not first.done()
        b = enqueue(pool, server, "delay", lambda: send("b", 60_000_000), 2)
        c = enqueue(pool, server, "delay", lambda: send("c", 60_000_000), 3)
        gate.open()
        running.result(TIMEOUT)
        delayed, rb, rc = first.result(TIMEOUT), b.result(TIMEOUT), c.result(TIMEOUT)
    assert rb["SEQ"] < rc["SEQ"] < delayed["SEQ"]
    assert delayed["SEEN"][-3:] == ["b", "c", "first"]


# ---- priorities -------------------------------------------------------------------------------------
def test_priority_levels_order_what_waits(server: stubhost.Server, tmp_path: Path) -> None:
    # (request id, priority): 0 and out-of-range levels mean the default level (2)
    order = [("low1", 3), ("default0", 0), ("high1", 1), ("beyond", 9), ("mid", 2), ("high2", 1), ("low2", 3)]
    with ThreadPoolExecutor(8) as pool, Gate(tmp_path) as gate:
        running = pool.submit(call, server, "ranked", parameters=gate.params())
        gate.wait_started()
        waiting = {rid: enqueue(pool, server, "ranked",
                                partial(call, server, "ranked", request_id=rid, priority=p), i + 1)
                   for i, (rid, p) in enumerate(order)}
        gate.open()
        running.result(TIMEOUT)
        results = {rid: f.result(TIMEOUT) for rid, f in waiting.items()}
    ran = sorted(results, key=lambda rid: results[rid]["SEQ"])
    assert ran == ["high1", "high2", "default0", "beyond", "mid", "low1", "low2"]


def test_priority_queue_policy_applies_to_its_level_only(server: stubhost.Server, tmp_path: Path) -> None:
    with ThreadPoolExecutor(8) as pool, Gate(tmp_path) as gate:
        running = pool.submit(call, server, "ranked", parameters=gate.params())
        gate.wait_started()
        waiting = [enqueue(pool, server, "ranked", lambda: call(server, "ranked", priority=1), k) for k in (1, 2)]
        with pytest.raises(InferenceError) as err:
            call(server, "ranked", priority=1)  # level 1 holds at most 2
        assert err.value.code == "UNAVAILABLE"
        assert "Exceeds maximum queue size" in str(err.value)
        waiting += [enqueue(pool, server, "ranked", partial(call, server, "ranked", priority=p), k)
                    for k, p in ((3, 2), (4, 3), (5, 2))]  # the other levels are not bounded
        gate.open()
        running.result(TIMEOUT)
        for f in waiting:
            f.result(TIMEOUT)


# ---- the caller gives up --------------------------------------------------------------------------
def test_in_process_timeout_withdraws_a_queued_request(server: stubhost.Server, tmp_path: Path) -> None:
    with ThreadPoolExecutor(2) as pool, Gate(tmp_path) as gate:
        running = pool.submit(call, server, "plain", parameters=gate.params(), request_id="holder")
        gate.wait_started()
        start = time.monotonic()
        with pytest.raises(InferenceError) as err:
            call(server, "plain", request_id="gave-up", timeout=0.5)
        assert time.monotonic() - start < TIMEOUT / 2
        assert err.value.code == "UNAVAILABLE"
        assert "Request timeout expired" in str(err.value)
        assert queued(server, "plain") == 0
        gate.open()
        assert running.result(TIMEOUT)["N"] == 1  # the busy instance was not taken for hung
    seen = seen_now(server, "plain")
    assert "holder" in seen  # the same stub (a restarted one would have forgotten it)
    assert "gave-up" not in seen


def test_async_timeout_withdraws_a_queued_request(server: stubhost.Server, tmp_path: Path) -> None:
    async def main() -> None:
        await server.infer_async("plain", {"X": x()}, request_id="async-gave-up", timeout=0.5)

    with ThreadPoolExecutor(2) as pool, Gate(tmp_path) as gate:
        running = pool.submit(call, server, "plain", parameters=gate.params(), request_id="async-holder")
        gate.wait_started()
        with pytest.raises(InferenceError) as err:
            asyncio.run(main())
        assert "Request timeout expired" in str(err.value)
        assert queued(server, "plain") == 0
        gate.open()
        running.result(TIMEOUT)
    seen = seen_now(server, "plain")
    assert "async-holder" in seen
    assert "async-gave-up" not in seen


def test_cancelled_async_request_is_withdrawn_and_never_runs(server: stubhost.Server, tmp_path: Path) -> None:
    before = stats(server, "plain")

    async def main() -> int:
        task = asyncio.ensure_future(server.infer_async("plain", {"X": x()}, request_id="cancelled"))
        assert await asyncio.get_running_loop().run_in_executor(
            None, wait_until, lambda: queued(server, "plain") == 1, TIMEOUT)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return queued(server, "plain")

    with ThreadPoolExecutor(2) as pool, Gate(tmp_path) as gate:
        running = pool.submit(call, server, "plain", parameters=gate.params(), request_id="cancel-holder")
        gate.wait_started()
        assert asyncio.run(main()) == 0
        gate.open()
        running.result(TIMEOUT)
    seen = seen_now(server, "plain")
    assert "cancel-holder" in seen
    assert "cancelled" not in seen
    after = stats(server, "plain")
    assert after["execution_count"] - before["execution_count"] == 2  # the holder and the probe


# ---- several instances, preserve_ordering ------------------------------------------------------
def test_default_scheduler_runs_requests_on_every_instance_at_once(server: stubhost.Server, tmp_path: Path) -> None:
    with ThreadPoolExecutor(4) as pool, Gate(tmp_path, "a") as a, Gate(tmp_path, "b") as b:
        first = pool.submit(call, server, "unordered", parameters=a.params())
        a.wait_started()
        second = pool.submit(call, server, "unordered", parameters=b.params())
        b.wait_started()  # both run at once: one per instance
        third = enqueue(pool, server, "unordered", lambda: call(server, "unordered"), 1)  # both busy: it waits
        b.open()
        r3 = third.result(TIMEOUT)
        assert not first.done()
        a.open()
        r1, r2 = first.result(TIMEOUT), second.result(TIMEOUT)
    assert r1["WHO"] != r2["WHO"]
    assert r3["WHO"] == r2["WHO"]  # the instance that came free took it
    assert [r["N"] for r in (r1, r2, r3)] == [1, 1, 1]


def test_a_busy_instance_does_not_hold_up_the_other(server: stubhost.Server, tmp_path: Path) -> None:
    with ThreadPoolExecutor(2) as pool, Gate(tmp_path) as gate:
        held = pool.submit(call, server, "unordered", parameters=gate.params())
        gate.wait_started()
        others = [call(server, "unordered", value=float(i)) for i in range(10)]
        assert not held.done()
        gate.open()
        busy = held.result(TIMEOUT)
    assert len({r["WHO"] for r in others}) == 1
    assert busy["WHO"] not in {r["WHO"] for r in others}


@pytest.mark.parametrize("model, held_back", [("ordered", True), ("unordered", False)])
def test_preserve_ordering_holds_a_later_response_until_the_earlier_one(server: stubhost.Server, tmp_path: Path,
                                                                        model: str, held_back: bool) -> None:
    """Request 1 is held on one instance; request 2 runs on the other and is done. With
    preserve_ordering its caller gets it only after request 1's; without, at once. (The
    unordered model is the control: it shows the difference is observable in-process.)"""
    finished = tmp_path / "second.finished"
    gate = Gate(tmp_path)

    async def main() -> tuple[bool, list[str]]:
        done_order: list[str] = []

        async def one(name: str, params: dict[str, Any]) -> None:
            await server.infer_async(model, {"X": x()}, parameters=params, timeout=TIMEOUT)
            done_order.append(name)

        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(one("first", gate.params()))
        assert await loop.run_in_executor(None, wait_until, gate.started.exists, TIMEOUT)
        second = asyncio.ensure_future(one("second", {"finished": str(finished)}))
        assert await loop.run_in_executor(None, wait_until, finished.exists, TIMEOUT)  # it ran, on the other one
        await asyncio.wait([second], timeout=2.0)
        second_early = second.done()
        gate.open()
        await asyncio.wait_for(asyncio.gather(first, second), TIMEOUT)
        return second_early, done_order

    try:
        second_early, done_order = asyncio.run(main())
    finally:
        gate.open()
    if held_back:
        assert not second_early, "request 2's response was handed back before request 1's"
        assert done_order == ["first", "second"]
    else:
        assert second_early
        assert done_order == ["second", "first"]


def test_preserve_ordering_hands_back_later_responses_when_the_earlier_caller_gives_up(tmp_path: Path) -> None:
    """Request 1 hangs and its caller's timeout runs out (its instance is taken for hung and
    replaced); request 2, done meanwhile on the other instance, is then handed back. (Its own
    server: the replaced stub's new pool would count as a leak of the tests that follow.)"""
    repo = tmp_path / "models"
    write_model(repo, "ordered", PROBE_PY, MODELS["ordered"])
    finished = tmp_path / "second.finished"
    with stubhost.Server(repo) as server, ThreadPoolExecutor(2) as pool:
        with Gate(tmp_path) as gate:
            first = pool.submit(call, server, "ordered", parameters=gate.params(), timeout=2.0)
            gate.wait_started()
            second = pool.submit(call, server, "ordered", parameters={"finished": str(finished)})
            assert wait_until(finished.exists, TIMEOUT)
            with pytest.raises(InferenceError) as err:
                first.result(TIMEOUT)
            assert "Request timeout expired" in str(err.value)
            info = second.result(TIMEOUT)
        assert info["N"] == 1
        # both instances serve again once the hung one is replaced: two held requests run at once
        with Gate(tmp_path, "a") as a, Gate(tmp_path, "b") as b:
            held = [pool.submit(call, server, "ordered", parameters=g.params()) for g in (a, b)]
            a.wait_started()
            b.wait_started()
        assert len({f.result(TIMEOUT)["WHO"] for f in held}) == 2


# ---- sequences --------------------------------------------------------------------------------------
START, END = 1, 2


def seq_call(server: stubhost.Server, corr: int | str, flags: int = 0, value: float = 1.0) -> dict[str, Any]:
    return call(server, "seq", value=value, correlation_id=corr, flags=flags)


def test_one_sequence_per_instance_and_a_third_waits_for_a_slot(server: stubhost.Server) -> None:
    """max_batch_size 0: each instance has one slot (Triton's sequence batcher), so the two
    instances run two sequences, one each, and a third START waits in the backlog until one ENDs;
    it then runs on that sequence's instance."""
    ids: list[int | str] = [101, "s-102"]
    who: dict[int | str, str] = {}
    for c in ids:
        info = seq_call(server, c, START, 1.0)
        assert info["FLAGS"] == START and info["CORR"] == str(c) and info["ACC"] == 1.0
        assert info["TIMEOUT"] == 0  # a queued request does not carry the in-process timeout
        who[c] = info["WHO"]
    assert who[101] != who["s-102"]
    with ThreadPoolExecutor(1) as pool:
        third = enqueue(pool, server, "seq", lambda: seq_call(server, 103, START, 7.0), 1)
        for step in (2, 3):
            for c in ids:
                info = seq_call(server, c, 0, float(step))
                # the instance that holds the sequence's state got every request of it, in order
                assert info["WHO"] == who[c] and info["ACC"] == sum(range(1, step + 1)), (c, step, info)
        assert not third.done() and queued(server, "seq") == 1  # both slots are still taken
        assert seq_call(server, 101, END, 4.0)["ACC"] == 10.0
        started = third.result(TIMEOUT)
    assert started["WHO"] == who[101] and started["ACC"] == 7.0
    assert seq_call(server, 103, END, 1.0)["ACC"] == 8.0
    assert seq_call(server, "s-102", END, 4.0)["WHO"] == who["s-102"]


def test_request_without_start_for_a_closed_sequence_fails_with_tritons_text(server: stubhost.Server) -> None:
    with pytest.raises(InferenceError) as err:
        seq_call(server, 77)
    assert err.value.code == "INVALID_ARG"
    assert str(err.value).endswith("inference request for sequence 77 to model 'seq' must specify the START flag "
                                   "on the first request of the sequence")


@pytest.mark.parametrize("corr", [0, ""])
def test_request_without_correlation_id_fails_with_tritons_text(server: stubhost.Server, corr: int | str) -> None:
    with pytest.raises(InferenceError) as err:
        seq_call(server, corr, START)
    assert err.value.code == "INVALID_ARG"
    assert "inference request to model 'seq' must specify a non-zero or non-empty correlation ID" in str(err.value)


def test_end_closes_the_sequence(server: stubhost.Server) -> None:
    assert seq_call(server, 201, START | END, 5.0)["ACC"] == 5.0  # a one-request sequence
    with pytest.raises(InferenceError, match="must specify the START flag"):
        seq_call(server, 201)
    seq_call(server, "s-202", START)
    seq_call(server, "s-202")
    seq_call(server, "s-202", END)
    with pytest.raises(InferenceError, match="must specify the START flag"):
        seq_call(server, "s-202")
    assert seq_call(server, "s-202", START | END, 2.0)["ACC"] == 2.0  # START opens it again


def test_idle_sequence_is_closed_after_max_sequence_idle(server: stubhost.Server) -> None:
    """max_sequence_idle_microseconds is 2 s: a 1.3 s gap (longer than the 1 s default) keeps a
    sequence open, a 2.6 s one closes it."""
    seq_call(server, 301, START)
    seq_call(server, 302, START)
    time.sleep(1.3)
    seq_call(server, 301)
    time.sleep(1.3)
    with pytest.raises(InferenceError, match="sequence 302 .* must specify the START flag"):
        seq_call(server, 302)
    seq_call(server, 301, END)
    assert seq_call(server, 302, START | END, 4.0)["ACC"] == 4.0


# ---- unload, crash ----------------------------------------------------------------------------------
def test_unload_fails_requests_waiting_in_the_queue(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "doomed", PROBE_PY, probe_config("doomed", extra="dynamic_batching { }"))
    gate = Gate(tmp_path)
    with stubhost.Server(repo) as server:
        unloader = threading.Thread(target=server.unload, args=("doomed",))
        try:
            with ThreadPoolExecutor(4) as pool:
                running = pool.submit(call, server, "doomed", parameters=gate.params())
                gate.wait_started()
                waiting = [enqueue(pool, server, "doomed", lambda: call(server, "doomed"), k) for k in (1, 2, 3)]
                unloader.start()
                for f in waiting:  # they are told now, not after the running request
                    with pytest.raises(InferenceError) as err:
                        f.result(TIMEOUT)
                    assert err.value.code == "UNAVAILABLE"
                    assert "model 'doomed' is unloading" in str(err.value)
                assert not running.done()
                gate.open()
                assert running.result(TIMEOUT)["N"] == 1  # what already ran finishes
        finally:
            gate.open()
            if unloader.ident is not None:
                unloader.join(TIMEOUT)
        assert not unloader.is_alive(), "unload hangs"
        with pytest.raises(InferenceError) as err:
            call(server, "doomed")
        assert err.value.code == "NOT_FOUND"


def test_close_fails_requests_waiting_in_the_queue(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "closing", PROBE_PY, probe_config("closing", max_batch=8, extra="dynamic_batching { }"))
    gate = Gate(tmp_path)
    server = stubhost.Server(repo)
    closer = threading.Thread(target=server.close)
    try:
        with ThreadPoolExecutor(4) as pool:
            running = pool.submit(call, server, "closing", 1, parameters=gate.params())
            gate.wait_started()
            waiting = [enqueue(pool, server, "closing", lambda: call(server, "closing", 1), k) for k in (1, 2)]
            closer.start()
            for f in waiting:
                with pytest.raises(InferenceError) as err:
                    f.result(TIMEOUT)
                assert err.value.code == "UNAVAILABLE"
                assert "model 'closing' is unloading" in str(err.value)
            gate.open()
            assert running.result(TIMEOUT)["N"] == 1
    finally:
        gate.open()
        if closer.ident is not None:
            closer.join(TIMEOUT)
        server.close()
    assert not closer.is_alive(), "close hangs"


CRASHY_CONFIG = probe_config("crashy", max_batch=8, extra="dynamic_batching { }")


def test_crash_fails_the_batch_in_flight_and_queued_requests_run_after_the_restart(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "crashy", PROBE_PY, CRASHY_CONFIG)
    gate = Gate(tmp_path)
    with stubhost.Server(repo) as server:
        try:
            with ThreadPoolExecutor(4) as pool:
                doomed = pool.submit(call, server, "crashy", 1, parameters=gate.params(exit=3), request_id="doomed")
                gate.wait_started()
                waiting = [enqueue(pool, server, "crashy",
                                   partial(call, server, "crashy", 1, float(k), request_id=f"after{k}"), k)
                           for k in (1, 2, 3)]
                gate.open()
                with pytest.raises(InferenceError) as err:
                    doomed.result(TIMEOUT)
                assert re.search(r"Stub process '[^']*' is not healthy\.", str(err.value)), str(err.value)
                results = [f.result(TIMEOUT) for f in waiting]
        finally:
            gate.open()
        for k, r in enumerate(results, 1):
            assert r["N"] == 3  # queued together, they ran together on the restarted stub
            assert "doomed" not in r["SEEN"]  # a fresh stub
            assert f"after{k}" in r["SEEN"]
        assert call(server, "crashy", 1)["N"] == 1


def test_crash_without_restart_fails_the_queued_requests(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "crashy", PROBE_PY, CRASHY_CONFIG)
    gate = Gate(tmp_path)
    with stubhost.Server(repo, restart=False) as server:
        assert_waiting_fail_with_their_instance(server, "crashy", gate,
                                                lambda: call(server, "crashy", 1, parameters=gate.params(exit=3)),
                                                [lambda: call(server, "crashy", 1)] * 2)


def assert_waiting_fail_with_their_instance(server: stubhost.Server, model: str, gate: Gate,
                                            doomed: Callable[[], Any], waiting: list[Callable[[], Any]]) -> None:
    """Runs `doomed` (a request whose execute waits for `gate`, then kills its stub), queues
    `waiting` behind it in order, opens the gate: with no restart, every one of them fails with
    Triton's "not healthy" text, none hangs, and the queue is left empty."""
    try:
        with ThreadPoolExecutor(len(waiting) + 1) as pool:
            futures = [pool.submit(doomed)]
            gate.wait_started()
            futures += [enqueue(pool, server, model, fn, k) for k, fn in enumerate(waiting, 1)]
            gate.open()
            for f in futures:  # no instance will ever run them
                with pytest.raises(InferenceError) as err:
                    f.result(TIMEOUT)
                assert re.search(r"Stub process '[^']*' is not healthy\.", str(err.value)), str(err.value)
    finally:
        gate.open()
    assert queued(server, model) == 0
