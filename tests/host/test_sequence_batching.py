"""Triton's sequence batcher (``sequence_batching``) through the in-process API: requests of
different sequences that share an instance run in one ``execute``, with the ``direct`` strategy
(batch slots, fillers for empty slots, the backlog, ``minimum_slot_utilization``) and the
``oldest`` one (the dynamic batcher over the candidate sequences); a sequence's requests stay in
order and never share a batch; idle sequences, cancellation, restarts, unloading, streams and
statistics. A model with ``max_batch_size: 0`` has one slot per instance (``oldest``:
``max_candidate_sequences``), so an instance runs one sequence at a time, one request per execute.

Every model runs SEQ_PY. Its ``execute`` answers each request with the whole batch as it saw it
(BATCH: per request its correlation id, flags and control inputs), the request's index in the
batch (IDX), a per-stub execute counter (SEQ), the instance (WHO), and the X values its sequence
has sent so far, in the order they ran (SEEN). A request whose parameters carry a gate
(``{"started": path, "gate": path}``) holds its instance until the test opens the gate, so a test
queues requests behind it (waiting until the queue holds them) before anything runs: which
requests form which batch is then fixed by the rules, not by a race.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stubhost
from stubhost import InferenceError
from tests.host.repo_factory import config_pbtxt, io, wait_until, write_model
from tests.host.test_scheduler import (
    GATED_HEAD,
    Gate,
    assert_waiting_fail_with_their_instance,
    batch_counts,
    enqueue,
    queued,
    stats,
)

TIMEOUT = 30.0
START, END = 1, 2

SEQ_PY = GATED_HEAD + '''        self.calls += 1
        for p in params:
            if "exit" in p:
                os._exit(int(p["exit"]))
        batch = []
        for r in requests:
            entry = {"corr": r.correlation_id(), "flags": r.flags(), "id": r.request_id()}
            for name in ("START", "END", "READY", "CORRID"):
                tensor = pb_utils.get_input_tensor_by_name(r, name)
                if tensor is not None:
                    entry[name] = tensor.as_numpy().reshape(-1)[0].item()
            entry["X"] = float(pb_utils.get_input_tensor_by_name(r, "X").as_numpy().reshape(-1)[0])
            batch.append(entry)
        text = json.dumps(batch).encode()
        responses = []
        for i, entry in enumerate(batch):
            corr = entry["corr"]
            seen = []
            if entry.get("READY", 1) and corr:
                if entry["flags"] & 1:
                    self.seen[corr] = []
                seen = self.seen.setdefault(corr, [])
                seen.append(entry["X"])
                if entry["flags"] & 2:
                    self.seen.pop(corr, None)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("BATCH", np.array([[text]], np.object_)),
                pb_utils.Tensor("IDX", np.array([[i]], np.int32)),
                pb_utils.Tensor("SEQ", np.array([[self.calls]], np.int64)),
                pb_utils.Tensor("WHO", np.array([[self.name.encode()]], np.object_)),
                pb_utils.Tensor("SEEN", np.array([[json.dumps(seen).encode()]], np.object_)),
            ]))
        return responses

    def initialize(self, args):
        self.name = args["model_instance_name"]
        self.calls = 0
        self.seen = {}
'''

# Decoupled: each request sends two responses [corr, k, batch size], then the final flag.
STREAM_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        n = len(requests)
        for r in requests:
            sender = r.get_response_sender()
            for k in range(2):
                sender.send(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([[r.correlation_id(), k, n]], np.int64))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

# Reschedules each request once (iterative sequences); answers in its second run.
TWICE_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = {}

    def execute(self, requests):
        responses = []
        for r in requests:
            runs = self.runs.get(id(r), 0) + 1
            if runs == 1:
                self.runs[id(r)] = runs
                r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
                continue
            self.runs.pop(id(r), None)
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 10)]))
        return responses
'''

CONTROLS = """
 control_input [
  { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
  { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
  { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
  { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
 ]"""


def seq_config(name: str, *, max_batch: int = 4, count: int = 1, strategy: str = "",
               idle_us: int = 60_000_000, dims: tuple[int, ...] = (1,)) -> str:
    outputs = [io("BATCH", "TYPE_STRING", [1]), io("IDX", "TYPE_INT32", [1]), io("SEQ", "TYPE_INT64", [1]),
               io("WHO", "TYPE_STRING", [1]), io("SEEN", "TYPE_STRING", [1])]
    sequence = f"sequence_batching {{\n max_sequence_idle_microseconds: {idle_us}\n {strategy}\n{CONTROLS}\n}}"
    return config_pbtxt(name, [io("X", "TYPE_FP32", list(dims))], outputs, max_batch_size=max_batch,
                        extra=f"instance_group [ {{ count: {count} kind: KIND_CPU }} ]\n{sequence}")


MODELS = {
    "direct": seq_config("direct"),  # the default strategy: 4 slots
    "small": seq_config("small", max_batch=2),  # 2 slots: a third sequence waits in the backlog
    "pair": seq_config("pair", max_batch=2, count=2),  # 2 instances of 2 slots
    # a batch waits (5 s at most) until half the slots have a request
    "util": seq_config("util", strategy="direct { max_queue_delay_microseconds: 5000000 "
                                        "minimum_slot_utilization: 0.5 }"),
    # ... or 200 ms, since one slot in four never makes 0.5
    "util_short": seq_config("util_short", strategy="direct { max_queue_delay_microseconds: 200000 "
                                                    "minimum_slot_utilization: 0.5 }"),
    "oldest": seq_config("oldest", strategy="oldest { max_candidate_sequences: 6 preferred_batch_size: [ 2 ] "
                                            "max_queue_delay_microseconds: 5000000 }"),
    "oldest_short": seq_config("oldest_short", strategy="oldest { preferred_batch_size: [ 2 ] "
                                                        "max_queue_delay_microseconds: 200000 }"),
    # max_batch_size 0: one slot per instance, one request per execute
    "unbatched": seq_config("unbatched", max_batch=0),
    "unbatched_pair": seq_config("unbatched_pair", max_batch=0, count=2),
    # ... or max_candidate_sequences slots with oldest (Triton honours it without batching)
    "unbatched_oldest": seq_config("unbatched_oldest", max_batch=0,
                                   strategy="oldest { max_candidate_sequences: 2 }"),
    "shaped": seq_config("shaped", dims=(-1,)),  # requests whose X lengths differ never share a batch
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo: Path = tmp_path_factory.mktemp("sequence_batching") / "models"
    for name, config in MODELS.items():
        write_model(repo, name, SEQ_PY, config)
    write_model(repo, "stream", STREAM_PY, config_pbtxt(
        "stream", [io("X", "TYPE_FP32", [1])], [io("OUT", "TYPE_INT64", [3])], max_batch_size=4,
        extra="model_transaction_policy { decoupled: true }\n"
              "sequence_batching { max_sequence_idle_microseconds: 60000000 }"))
    write_model(repo, "stream0", STREAM_PY, config_pbtxt(  # max_batch_size 0: one stream's request per execute
        "stream0", [io("X", "TYPE_FP32", [1])], [io("OUT", "TYPE_INT64", [3])],
        extra="model_transaction_policy { decoupled: true }\n"
              "sequence_batching { max_sequence_idle_microseconds: 60000000 }"))
    write_model(repo, "twice", TWICE_PY, config_pbtxt(
        "twice", [io("X", "TYPE_FP32", [1])], [io("Y", "TYPE_FP32", [1])], max_batch_size=2,
        extra="sequence_batching { iterative_sequence: true }"))
    with stubhost.Server(repo) as srv:
        yield srv


# ---- helpers ----------------------------------------------------------------------------------------
def read(out: dict[str, np.ndarray]) -> dict[str, Any]:
    return {"batch": json.loads(out["BATCH"].reshape(-1)[0]), "idx": int(out["IDX"].reshape(-1)[0]),
            "seq": int(out["SEQ"].reshape(-1)[0]), "who": out["WHO"].reshape(-1)[0].decode(),
            "seen": json.loads(out["SEEN"].reshape(-1)[0])}


def send(server: stubhost.Server, model: str, corr: int | str, flags: int = 0, value: float = 1.0,
         length: int = 1, **kw: Any) -> dict[str, Any]:
    kw.setdefault("timeout", TIMEOUT)
    shape = (1, length) if server._models[model].config.max_batch_size else (length,)
    return read(server.infer(model, {"X": np.full(shape, value, np.float32)}, correlation_id=corr,
                             flags=flags, **kw))


def hold(pool: ThreadPoolExecutor, server: stubhost.Server, model: str, corr: int, gate: Gate) -> Future:
    """Opens sequence `corr` (X 1.0) with a request that holds the instance until the gate opens.
    With the oldest strategy a request alone waits for the queue delay: a one-request sequence
    goes with it, making the preferred size of 2."""
    first = enqueue(pool, server, model, lambda: send(server, model, corr, START, 1.0, parameters=gate.params()), 1)
    pool.submit(send, server, model, corr + 1000, START | END)
    gate.wait_started()
    assert queued(server, model) == 0
    return first


def end_all(server: stubhost.Server, model: str, ids: list[int]) -> None:
    """Ends sequences at once: with the oldest strategy (preferred size 2) a request alone waits
    for the queue delay, two go at once (an odd count gets a one-request sequence beside it)."""
    calls = [(c, END) for c in ids]
    if len(calls) % 2:
        calls.append((max(ids) + 5000, START | END))
    with ThreadPoolExecutor(len(calls)) as pool:
        for future in [pool.submit(send, server, model, c, flags) for c, flags in calls]:
            future.result(TIMEOUT)


def corrs(result: dict[str, Any]) -> list[Any]:
    return [entry["corr"] for entry in result["batch"]]


# ---- direct -----------------------------------------------------------------------------------------
def test_requests_of_different_sequences_share_a_batch_in_slot_order(server: stubhost.Server, tmp_path: Path) -> None:
    with ThreadPoolExecutor(8) as pool, Gate(tmp_path) as gate:
        first = pool.submit(send, server, "direct", 101, START, 1.0, parameters=gate.params())
        gate.wait_started()
        waiting = [enqueue(pool, server, "direct", lambda: send(server, "direct", 101, 0, 2.0), 1)]
        for k, corr in enumerate((102, 103, 104), 2):  # each opens the next slot: 1, 2, 3
            waiting.append(enqueue(pool, server, "direct", lambda c=corr: send(server, "direct", c, START, c), k))
        gate.open()
        assert first.result(TIMEOUT)["batch"][0]["corr"] == 101
        results = [f.result(TIMEOUT) for f in waiting]
    batch = results[0]["batch"]
    assert corrs(results[0]) == [101, 102, 103, 104]  # one execute, each sequence at its slot's position
    assert [r["idx"] for r in results] == [0, 1, 2, 3]
    assert len({r["seq"] for r in results}) == 1
    assert [e["READY"] for e in batch] == [1, 1, 1, 1]
    assert [e["START"] for e in batch] == [0, 1, 1, 1]
    assert [e["CORRID"] for e in batch] == [101, 102, 103, 104]
    assert results[0]["seen"] == [1.0, 2.0]  # the sequence's requests ran in order, on its instance
    for corr in (101, 102, 103, 104):
        send(server, "direct", corr, END)


def test_a_sequence_never_has_two_requests_in_one_batch(server: stubhost.Server, tmp_path: Path) -> None:
    with ThreadPoolExecutor(8) as pool, Gate(tmp_path) as gate:
        first = pool.submit(send, server, "direct", 201, START, 1.0, parameters=gate.params())
        gate.wait_started()
        waiting = [enqueue(pool, server, "direct", lambda v=v: send(server, "direct", 201, 0, v), k)
                   for k, v in enumerate((2.0, 3.0, 4.0), 1)]
        waiting.append(enqueue(pool, server, "direct", lambda: send(server, "direct", 202, START, 9.0), 4))
        gate.open()
        first.result(TIMEOUT)
        results = [f.result(TIMEOUT) for f in waiting]
    assert [r["seen"] for r in results[:3]] == [[1.0, 2.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]]
    assert corrs(results[0]) == [201, 202]  # the first waiting request of each sequence
    assert results[0]["seq"] == results[3]["seq"]
    assert corrs(results[1]) == [201] and corrs(results[2]) == [201]  # then one after another
    assert results[0]["seq"] < results[1]["seq"] < results[2]["seq"]
    send(server, "direct", 201, END)
    send(server, "direct", 202, END)


def test_an_empty_slot_below_a_request_gets_a_filler(server: stubhost.Server) -> None:
    send(server, "direct", 301, START, 1.0)  # slot 0
    send(server, "direct", 302, START, 1.0)  # slot 1
    before = stats(server, "direct")
    result = send(server, "direct", 302, 0, 5.0, request_id="real")
    after = stats(server, "direct")
    filler, real = result["batch"]
    assert result["idx"] == 1 and real["corr"] == 302 and real["id"] == "real"
    # Triton's null request: not ready, no sequence, the other request's inputs zeroed
    assert filler == {"corr": 0, "flags": 0, "id": "", "START": 0, "END": 0, "READY": 0, "CORRID": 0, "X": 0.0}
    assert result["seen"] == [1.0, 5.0]
    # the filler counts in the batch's size, as Triton's Python backend reports it, not as an inference
    assert after["inference_count"] - before["inference_count"] == 1
    assert after["execution_count"] - before["execution_count"] == 1
    assert batch_counts(after).get(2, 0) - batch_counts(before).get(2, 0) == 1
    assert send(server, "direct", 301, END)["idx"] == 0  # alone in slot 0: no filler
    send(server, "direct", 302, END)


def test_a_request_whose_shapes_differ_waits_and_its_slot_gets_a_filler(server: stubhost.Server,
                                                                         tmp_path: Path) -> None:
    with ThreadPoolExecutor(8) as pool, Gate(tmp_path) as gate:
        first = pool.submit(send, server, "shaped", 351, START, 1.0, parameters=gate.params())
        gate.wait_started()
        waiting = [enqueue(pool, server, "shaped", lambda: send(server, "shaped", 351, 0, 2.0), 1),
                   enqueue(pool, server, "shaped", lambda: send(server, "shaped", 352, START, 3.0, length=2), 2),
                   enqueue(pool, server, "shaped", lambda: send(server, "shaped", 353, START, 4.0), 3)]
        gate.open()
        first.result(TIMEOUT)
        same, other, last = [f.result(TIMEOUT) for f in waiting]
    assert corrs(same) == [351, 0, 353] and same["seq"] == last["seq"]  # slot 1's X is longer: a filler
    assert same["batch"][1]["READY"] == 0
    assert corrs(other) == [0, 352] and other["seq"] > same["seq"]  # it runs in the next batch
    for corr in (351, 352, 353):
        send(server, "shaped", corr, END)


def test_statistics_count_what_was_sent(server: stubhost.Server, tmp_path: Path) -> None:
    before = stats(server, "direct")
    with ThreadPoolExecutor(8) as pool, Gate(tmp_path) as gate:
        first = pool.submit(send, server, "direct", 401, START | END, 1.0, parameters=gate.params())
        gate.wait_started()
        waiting = [enqueue(pool, server, "direct", lambda c=c: send(server, "direct", c, START | END), k)
                   for k, c in enumerate((402, 403, 404), 1)]
        gate.open()
        results = [first.result(TIMEOUT)] + [f.result(TIMEOUT) for f in waiting]
    after = stats(server, "direct")
    sizes = {r["seq"]: len(r["batch"]) for r in results}
    assert sorted(sizes.values()) == [1, 3]
    assert after["inference_count"] - before["inference_count"] == 4
    assert after["execution_count"] - before["execution_count"] == 2
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 4
    grown = {size: n - batch_counts(before).get(size, 0) for size, n in batch_counts(after).items()}
    assert {size: n for size, n in grown.items() if n} == {1: 1, 3: 1}


def test_sequences_beyond_the_slots_wait_in_the_backlog(server: stubhost.Server) -> None:
    send(server, "small", 501, START, 1.0)
    send(server, "small", 502, START, 1.0)
    with ThreadPoolExecutor(4) as pool:
        third = enqueue(pool, server, "small", lambda: send(server, "small", 503, START, 3.0), 1)
        more = enqueue(pool, server, "small", lambda: send(server, "small", 503, 0, 4.0), 2)
        assert send(server, "small", 502, 0, 2.0)["seen"] == [1.0, 2.0]  # the open ones still run
        assert not third.done()
        ended = send(server, "small", 501, END)  # frees slot 0: the backlogged sequence takes it
        results = [third.result(TIMEOUT), more.result(TIMEOUT)]
    assert [r["idx"] for r in results] == [0, 0]
    assert [r["seen"] for r in results] == [[3.0], [3.0, 4.0]]
    assert ended["seq"] < results[0]["seq"] < results[1]["seq"]
    send(server, "small", 502, END)
    send(server, "small", 503, END)
    assert queued(server, "small") == 0


def test_sequences_spread_over_instances_and_slots(server: stubhost.Server) -> None:
    placed = {corr: send(server, "pair", corr, START) for corr in (601, 602, 603, 604)}
    who = {corr: r["who"] for corr, r in placed.items()}
    assert len(set(who.values())) == 2 and sorted(list(who.values()).count(w) for w in set(who.values())) == [2, 2]
    for corr in (601, 602, 603, 604):
        assert send(server, "pair", corr, END)["who"] == who[corr]  # each stays on its instance


@pytest.mark.parametrize("max_batch", [1, 0])
def test_an_idle_sequence_frees_its_slot_for_the_backlog(tmp_path: Path, max_batch: int) -> None:
    """One slot (max_batch_size 1, or 0 as Triton counts it): the sequence that holds it goes
    idle after 300 ms, and the START waiting in the backlog takes its slot."""
    repo = tmp_path / "models"
    write_model(repo, "idle", SEQ_PY, seq_config("idle", max_batch=max_batch, idle_us=300_000))
    with stubhost.Server(repo) as server, ThreadPoolExecutor(2) as pool:
        send(server, "idle", 1, START)
        waiting = enqueue(pool, server, "idle", lambda: send(server, "idle", 2, START, 7.0), 1)
        assert waiting.result(TIMEOUT)["seen"] == [7.0]  # sequence 1 went idle: its slot went to 2
        with pytest.raises(InferenceError, match="must specify the START flag on the first request"):
            send(server, "idle", 1)


def test_minimum_slot_utilization_holds_a_batch_until_enough_slots_are_ready(server: stubhost.Server) -> None:
    with ThreadPoolExecutor(4) as pool:
        alone = enqueue(pool, server, "util", lambda: send(server, "util", 701, START | END), 1)
        time.sleep(0.3)
        assert not alone.done()  # 1 slot of 4 < 0.5, and 5 s have not passed
        other = pool.submit(send, server, "util", 702, START | END)
        results = [alone.result(TIMEOUT), other.result(TIMEOUT)]
    assert [corrs(r) for r in results] == [[701, 702]] * 2


def test_minimum_slot_utilization_gives_way_to_the_queue_delay(server: stubhost.Server) -> None:
    begin = time.monotonic()
    result = send(server, "util_short", 703, START | END)
    assert time.monotonic() - begin >= 0.19  # waited out the 200 ms
    assert corrs(result) == [703]


# ---- oldest -------------------------------------------------------------------------------------------
def test_oldest_batches_the_oldest_requests_at_the_preferred_size(server: stubhost.Server, tmp_path: Path) -> None:
    with ThreadPoolExecutor(8) as pool, Gate(tmp_path) as gate:
        first = hold(pool, server, "oldest", 801, gate)
        waiting = [enqueue(pool, server, "oldest", lambda: send(server, "oldest", 801, 0, 2.0), 1)]
        for k, corr in enumerate((802, 803, 804), 2):
            waiting.append(enqueue(pool, server, "oldest", lambda c=corr: send(server, "oldest", c, START), k))
        gate.open()
        first.result(TIMEOUT)
        results = [f.result(TIMEOUT) for f in waiting]
    # 801's second request could only join the line once its first was done, and so could 802's
    # (it took the slot of 1801, which ran beside 801's first): 803 and 804 are the oldest
    assert corrs(results[2]) == [803, 804]  # the preferred size goes at once, long before the delay
    assert corrs(results[0]) == [801, 802]
    assert results[2]["seq"] < results[0]["seq"]
    assert results[0]["seen"] == [1.0, 2.0]
    assert all("READY" in e and e["READY"] == 1 for r in results for e in r["batch"])  # no fillers
    end_all(server, "oldest", [801, 802, 803, 804])


def test_oldest_waits_the_queue_delay_for_a_preferred_size(server: stubhost.Server) -> None:
    begin = time.monotonic()
    result = send(server, "oldest_short", 805, START | END)
    assert time.monotonic() - begin >= 0.19
    assert corrs(result) == [805]


def test_oldest_never_batches_two_requests_of_a_sequence(server: stubhost.Server, tmp_path: Path) -> None:
    with ThreadPoolExecutor(8) as pool, Gate(tmp_path) as gate:
        first = hold(pool, server, "oldest", 811, gate)
        waiting = [enqueue(pool, server, "oldest", lambda v=v: send(server, "oldest", 811, 0, v), k)
                   for k, v in enumerate((2.0, 3.0), 1)]
        for k, corr in enumerate((812, 813), 3):
            waiting.append(enqueue(pool, server, "oldest", lambda c=corr: send(server, "oldest", c, START), k))
        gate.open()
        first.result(TIMEOUT)
        results = [f.result(TIMEOUT) for f in waiting]
    assert [r["seen"] for r in results[:2]] == [[1.0, 2.0], [1.0, 2.0, 3.0]]
    assert results[0]["seq"] < results[1]["seq"]
    for r in results:
        assert len(corrs(r)) == len(set(corrs(r))) == 2
    end_all(server, "oldest", [811, 812, 813])


# ---- everything else still holds ------------------------------------------------------------------------
def test_many_concurrent_sequences_keep_their_order(server: stubhost.Server, tmp_path: Path) -> None:
    """Eight async sequences of five requests on four slots: four wait in the backlog."""
    async def sequence(corr: int) -> list[dict[str, Any]]:
        out = []
        for step in range(5):
            flags = (START if step == 0 else 0) | (END if step == 4 else 0)
            response = await server.infer_async("direct", {"X": np.full((1, 1), step, np.float32)},
                                                correlation_id=corr, flags=flags, timeout=TIMEOUT)
            out.append(read(response))
        return out

    async def run(gate: Gate) -> list[list[dict[str, Any]]]:
        held = asyncio.ensure_future(server.infer_async("direct", {"X": np.zeros((1, 1), np.float32)},
                                                        correlation_id=900, flags=START | END,
                                                        parameters=gate.params(), timeout=TIMEOUT))
        await asyncio.get_running_loop().run_in_executor(None, gate.wait_started)
        tasks = [asyncio.ensure_future(sequence(c)) for c in range(901, 909)]
        assert await asyncio.get_running_loop().run_in_executor(
            None, wait_until, lambda: queued(server, "direct") == 8, TIMEOUT)
        gate.open()
        await held
        return await asyncio.gather(*tasks)

    with Gate(tmp_path) as gate:
        runs = asyncio.run(run(gate))
    for results in runs:
        assert [r["seen"] for r in results] == [[float(s) for s in range(k + 1)] for k in range(5)]
        for r in results:
            assert len(corrs(r)) == len(set(c for c in corrs(r) if c)) + corrs(r).count(0)
    sizes = [len(r["batch"]) for results in runs for r in results]
    assert max(sizes) == 4 and all(1 <= s <= 4 for s in sizes)


def test_a_waiting_request_whose_caller_gives_up_never_runs(server: stubhost.Server, tmp_path: Path) -> None:
    send(server, "small", 1001, START, 1.0)
    send(server, "small", 1002, START, 1.0)
    with ThreadPoolExecutor(4) as pool, Gate(tmp_path) as gate:
        held = pool.submit(send, server, "small", 1001, 0, 2.0, parameters=gate.params())
        gate.wait_started()
        with pytest.raises(InferenceError, match="Request timeout expired"):
            send(server, "small", 1001, 0, 3.0, timeout=0.3)
        with pytest.raises(InferenceError, match="Request timeout expired"):
            send(server, "small", 1001, END, 4.0, timeout=0.3)  # its END still closes the sequence
        assert queued(server, "small") == 0
        gate.open()
        assert held.result(TIMEOUT)["seen"] == [1.0, 2.0]
    with pytest.raises(InferenceError, match="must specify the START flag"):
        send(server, "small", 1001)
    # its slot is free: a new sequence runs at once instead of waiting in the backlog
    assert send(server, "small", 1003, START | END, 5.0)["seen"] == [5.0]
    send(server, "small", 1002, END)


def later(server: stubhost.Server, model: str, corr: int, value: float, flags: int = 0,
          **kw: Any) -> asyncio.Future:
    """A request of sequence `corr` as a task of the running loop (started at the next await)."""
    shape = (1, 1) if server._models[model].config.max_batch_size else (1,)
    return asyncio.ensure_future(server.infer_response_async(
        model, {"X": np.full(shape, value, np.float32)}, correlation_id=corr, flags=flags, timeout=TIMEOUT, **kw))


async def until_queued(server: stubhost.Server, model: str, count: int) -> None:
    assert await asyncio.get_running_loop().run_in_executor(
        None, wait_until, lambda: queued(server, model) == count, TIMEOUT)


def test_a_cancelled_waiting_request_ends_its_sequence_and_cancels_the_ones_after_it(server: stubhost.Server,
                                                                                      tmp_path: Path) -> None:
    send(server, "small", 1901, START, 1.0)
    send(server, "small", 1902, START, 1.0)
    failed_before = stats(server, "small")["inference_stats"]["fail"]["count"]

    async def main(gate: Gate) -> list[list[float]]:
        held = later(server, "small", 1901, 2.0, parameters=gate.params())
        await asyncio.get_running_loop().run_in_executor(None, gate.wait_started)
        ahead = later(server, "small", 1901, 3.0)
        await until_queued(server, "small", 1)
        cancelled = later(server, "small", 1901, 4.0)
        await until_queued(server, "small", 2)
        behind = [later(server, "small", 1901, 5.0), later(server, "small", 1901, 6.0, END)]
        await until_queued(server, "small", 4)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        for task in behind:  # the requests after it go with it, as in Triton
            with pytest.raises(InferenceError) as err:
                await task
            assert err.value.code == "CANCELLED"
            assert "another request of the sequence was cancelled" in str(err.value)
        assert queued(server, "small") == 1  # the one before it still runs
        gate.open()
        return [read((await task).outputs)["seen"] for task in (held, ahead)]

    with Gate(tmp_path) as gate:
        assert asyncio.run(main(gate)) == [[1.0, 2.0], [1.0, 2.0, 3.0]]
    after = stats(server, "small")["inference_stats"]
    assert after["fail"]["count"] == failed_before + 3  # the cancelled one counts too (reason CANCELED)
    with pytest.raises(InferenceError, match="must specify the START flag"):
        send(server, "small", 1901)  # the sequence is over
    # its slot is free: a new sequence runs at once instead of waiting in the backlog
    assert send(server, "small", 1903, START | END, 7.0)["seen"] == [7.0]
    assert send(server, "small", 1902, END, 8.0)["seen"] == [1.0, 8.0]  # the other sequence never noticed


def test_a_cancelled_request_of_a_backlogged_sequence_cancels_the_whole_sequence(server: stubhost.Server) -> None:
    send(server, "unbatched", 1911, START, 1.0)  # holds the only slot

    async def main() -> None:
        first = later(server, "unbatched", 1912, 2.0, START)
        await until_queued(server, "unbatched", 1)
        cancelled = later(server, "unbatched", 1912, 3.0)
        await until_queued(server, "unbatched", 2)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        with pytest.raises(InferenceError) as err:
            await first  # before it, but in the backlog: the whole sequence goes, as in Triton
        assert err.value.code == "CANCELLED"
        assert queued(server, "unbatched") == 0

    asyncio.run(main())
    with pytest.raises(InferenceError, match="must specify the START flag"):
        send(server, "unbatched", 1912)
    assert send(server, "unbatched", 1911, END, 4.0)["seen"] == [1.0, 4.0]
    assert send(server, "unbatched", 1913, START | END, 5.0)["seen"] == [5.0]


def test_a_backlogged_sequence_is_rejected_when_its_requests_timeout_runs_out(server: stubhost.Server) -> None:
    send(server, "unbatched", 1921, START, 1.0)  # holds the only slot
    rejected_before = stats(server, "unbatched")["inference_stats"]["fail"]["count"]

    async def main() -> float:
        begin = time.monotonic()
        first = later(server, "unbatched", 1922, 2.0, START, request_timeout_us=300_000)
        await until_queued(server, "unbatched", 1)
        follower = later(server, "unbatched", 1922, 3.0)  # no timeout of its own: it goes with its sequence
        for task in (first, follower):
            with pytest.raises(InferenceError) as err:
                await task
            assert err.value.code == "UNAVAILABLE"
            assert str(err.value).endswith("timeout of the corresponding sequence has been expired")
        return time.monotonic() - begin

    assert 0.25 <= asyncio.run(main()) < TIMEOUT
    assert queued(server, "unbatched") == 0
    assert stats(server, "unbatched")["inference_stats"]["fail"]["count"] == rejected_before + 2
    with pytest.raises(InferenceError, match="must specify the START flag"):
        send(server, "unbatched", 1922)
    # a sequence that holds a slot never expires: 1921 goes on; its own timeout is no queue timeout
    assert send(server, "unbatched", 1921, 0, 4.0)["seen"] == [1.0, 4.0]

    async def end() -> Any:
        return await later(server, "unbatched", 1921, 5.0, END, request_timeout_us=1)

    assert read(asyncio.run(end()).outputs)["seen"] == [1.0, 4.0, 5.0]


def test_errors_use_tritons_words(server: stubhost.Server) -> None:
    with pytest.raises(InferenceError) as err:
        send(server, "direct", 1101)
    assert err.value.code == "INVALID_ARG"
    assert str(err.value).endswith("inference request for sequence 1101 to model 'direct' must specify the START "
                                   "flag on the first request of the sequence")
    with pytest.raises(InferenceError, match="must specify a non-zero or non-empty correlation ID"):
        send(server, "direct", 0)
    with pytest.raises(InferenceError, match="must specify batch-size 1 due to requirements of sequence batcher"):
        server.infer("direct", {"X": np.ones((2, 1), np.float32)}, correlation_id=1102, flags=START, timeout=TIMEOUT)
    assert queued(server, "direct") == 0


def test_a_crash_fails_its_batch_and_the_sequences_go_on_after_the_restart(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "crashy", SEQ_PY, seq_config("crashy"))
    with stubhost.Server(repo) as server:
        send(server, "crashy", 1, START, 1.0)
        send(server, "crashy", 2, START, 1.0)
        with pytest.raises(InferenceError) as err:
            send(server, "crashy", 1, 0, 2.0, parameters={"exit": 3})
        assert re.search(r"Stub process '[^']*' is not healthy\.", str(err.value)), str(err.value)
        # the sequences stay on their instance and slot; its restarted stub has lost their state
        assert send(server, "crashy", 2, 0, 3.0)["seen"] == [3.0]
        assert send(server, "crashy", 1, END, 4.0)["seen"] == [4.0]
        send(server, "crashy", 2, END)


@pytest.mark.parametrize("max_batch", [1, 0])
def test_without_restarts_the_waiting_requests_fail(tmp_path: Path, max_batch: int) -> None:
    repo = tmp_path / "models"
    write_model(repo, "crashy", SEQ_PY, seq_config("crashy", max_batch=max_batch))
    gate = Gate(tmp_path)
    with stubhost.Server(repo, restart=False) as server:
        assert_waiting_fail_with_their_instance(
            server, "crashy", gate, lambda: send(server, "crashy", 1, START, parameters=gate.params(exit=3)),
            [lambda: send(server, "crashy", 1), lambda: send(server, "crashy", 2, START)])


@pytest.mark.parametrize("max_batch", [1, 0])
def test_unloading_fails_the_sequences_waiting_in_the_backlog(tmp_path: Path, max_batch: int) -> None:
    repo = tmp_path / "models"
    write_model(repo, "doomed", SEQ_PY, seq_config("doomed", max_batch=max_batch))
    with stubhost.Server(repo) as server, ThreadPoolExecutor(2) as pool:
        send(server, "doomed", 1, START)
        waiting = enqueue(pool, server, "doomed", lambda: send(server, "doomed", 2, START), 1)
        server.unload("doomed")
        with pytest.raises(InferenceError, match="is unloading"):
            waiting.result(TIMEOUT)


def test_a_decoupled_model_streams_each_request_its_own_responses(server: stubhost.Server) -> None:
    def run(corr: int) -> list[list[int]]:
        return [o["OUT"].reshape(-1).tolist()
                for o in server.stream("stream", {"X": np.ones((1, 1), np.float32)}, correlation_id=corr,
                                       flags=START | END, timeout=TIMEOUT)]

    with ThreadPoolExecutor(4) as pool:
        streams = list(pool.map(run, [1201, 1202, 1203, 1204]))
    for corr, items in zip([1201, 1202, 1203, 1204], streams):
        assert [i[:2] for i in items] == [[corr, 0], [corr, 1]]


def test_an_iterative_request_without_id_is_rescheduled_as_before(server: stubhost.Server) -> None:
    out = server.infer("twice", {"X": np.full((1, 1), 3, np.float32)}, timeout=TIMEOUT)
    assert out["Y"].tolist() == [[30.0]]
    out = server.infer("twice", {"X": np.full((1, 1), 4, np.float32)}, correlation_id="text-id",
                       flags=START | END, timeout=TIMEOUT)
    assert out["Y"].tolist() == [[40.0]]


# ---- max_batch_size 0: one sequence per instance ----------------------------------------------------------
def test_without_batching_a_start_waits_until_the_instances_sequence_ends(server: stubhost.Server,
                                                                          tmp_path: Path) -> None:
    """Triton's one slot per instance: a second sequence's START waits in the backlog, behind a
    request of the open sequence sent after it, until the open sequence ENDs."""
    with ThreadPoolExecutor(4) as pool, Gate(tmp_path) as gate:
        first = pool.submit(send, server, "unbatched", 1401, START, 1.0, parameters=gate.params())
        gate.wait_started()  # the instance runs sequence 1401
        other = enqueue(pool, server, "unbatched", lambda: send(server, "unbatched", 1402, START, 5.0), 1)
        later = enqueue(pool, server, "unbatched", lambda: send(server, "unbatched", 1401, 0, 2.0), 2)
        gate.open()
        assert first.result(TIMEOUT)["seen"] == [1.0]
        assert later.result(TIMEOUT)["seen"] == [1.0, 2.0]  # the slot's sequence goes first
        assert not other.done() and queued(server, "unbatched") == 1  # the instance is idle, its slot taken
        ended = send(server, "unbatched", 1401, END, 3.0)
        started = other.result(TIMEOUT)
    assert ended["seen"] == [1.0, 2.0, 3.0]
    assert ended["seq"] < started["seq"] and started["seen"] == [5.0]
    assert len(started["batch"]) == 1 and started["batch"][0]["START"] == 1
    assert send(server, "unbatched", 1402, END, 6.0)["seen"] == [5.0, 6.0]


def test_without_batching_two_instances_run_two_sequences_at_once(server: stubhost.Server, tmp_path: Path) -> None:
    with ThreadPoolExecutor(4) as pool, Gate(tmp_path, "a") as a, Gate(tmp_path, "b") as b:
        held = [pool.submit(send, server, "unbatched_pair", 1501, START, 1.0, parameters=a.params())]
        a.wait_started()
        held.append(pool.submit(send, server, "unbatched_pair", 1502, START, 2.0, parameters=b.params()))
        b.wait_started()  # both run at once, one on each instance
        third = enqueue(pool, server, "unbatched_pair", lambda: send(server, "unbatched_pair", 1503, START, 3.0), 1)
        a.open()
        b.open()
        who = {corr: f.result(TIMEOUT)["who"] for corr, f in zip((1501, 1502), held)}
        assert who[1501] != who[1502]
        assert send(server, "unbatched_pair", 1502, 0, 4.0)["seen"] == [2.0, 4.0]
        assert not third.done()  # both slots are still taken
        send(server, "unbatched_pair", 1502, END)
        assert third.result(TIMEOUT)["who"] == who[1502]  # the freed slot's instance
    send(server, "unbatched_pair", 1501, END)
    send(server, "unbatched_pair", 1503, END)


def test_without_batching_concurrent_sequences_never_interleave(server: stubhost.Server) -> None:
    """Three sequences sent at once on one instance run one after another, one request per
    execute (SEQ numbers each execute), each counted as an execution of batch size 1."""
    before = stats(server, "unbatched")

    def run(corr: int) -> list[dict[str, Any]]:
        return [send(server, "unbatched", corr, (START if v == 0 else 0) | (END if v == 2 else 0), float(v))
                for v in range(3)]

    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(run, [1601, 1602, 1603]))
    after = stats(server, "unbatched")
    order = [corr for _, corr in sorted((r["seq"], r["batch"][0]["corr"]) for results in runs for r in results)]
    blocks = [order[i:i + 3] for i in (0, 3, 6)]
    assert all(len(set(block)) == 1 for block in blocks) and len({block[0] for block in blocks}) == 3, order
    for results in runs:
        assert [len(r["batch"]) for r in results] == [1, 1, 1]
        assert results[-1]["seen"] == [0.0, 1.0, 2.0]
    assert after["inference_count"] - before["inference_count"] == 9
    assert after["execution_count"] - before["execution_count"] == 9
    assert batch_counts(after).get(1, 0) - batch_counts(before).get(1, 0) == 9


def test_without_batching_oldest_gives_each_instance_max_candidate_sequences(server: stubhost.Server) -> None:
    """Two candidate slots: two sequences share the instance (one request per execute), a third
    START waits until one of them ends."""
    model = "unbatched_oldest"
    send(server, model, 1701, START, 1.0)
    send(server, model, 1702, START, 2.0)
    with ThreadPoolExecutor(2) as pool:
        third = enqueue(pool, server, model, lambda: send(server, model, 1703, START, 3.0), 1)
        assert send(server, model, 1701, 0, 4.0)["seen"] == [1.0, 4.0]
        result = send(server, model, 1702, 0, 5.0)
        assert result["seen"] == [2.0, 5.0] and len(result["batch"]) == 1
        assert not third.done()
        send(server, model, 1701, END)
        assert third.result(TIMEOUT)["seen"] == [3.0]
    send(server, model, 1702, END)
    send(server, model, 1703, END)


def test_without_batching_a_backlogged_request_whose_caller_gives_up_never_runs(server: stubhost.Server) -> None:
    send(server, "unbatched", 1801, START, 1.0)
    with pytest.raises(InferenceError, match="Request timeout expired"):
        send(server, "unbatched", 1802, START | END, 2.0, timeout=0.3)  # it waited in the backlog
    assert queued(server, "unbatched") == 0
    assert send(server, "unbatched", 1801, END, 3.0)["seen"] == [1.0, 3.0]
    # the abandoned one-request sequence never ran: the slot is free for the next one at once
    assert send(server, "unbatched", 1803, START | END, 4.0)["seen"] == [4.0]


def test_without_batching_a_crash_keeps_the_slot_and_the_backlog_waits(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "crashy", SEQ_PY, seq_config("crashy", max_batch=0))
    with stubhost.Server(repo) as server, ThreadPoolExecutor(2) as pool:
        send(server, "crashy", 1, START, 1.0)
        waiting = enqueue(pool, server, "crashy", lambda: send(server, "crashy", 2, START, 5.0), 1)
        with pytest.raises(InferenceError) as err:
            send(server, "crashy", 1, 0, 2.0, parameters={"exit": 3})
        assert re.search(r"Stub process '[^']*' is not healthy\.", str(err.value)), str(err.value)
        # sequence 1 keeps the slot across the restart (the new stub has lost its state) ...
        assert send(server, "crashy", 1, END, 3.0)["seen"] == [3.0]
        # ... and the backlogged one runs once it ends
        assert waiting.result(TIMEOUT)["seen"] == [5.0]
        send(server, "crashy", 2, END)


def test_without_batching_a_decoupled_model_streams_one_request_per_execute(server: stubhost.Server) -> None:
    def run(corr: int) -> list[list[int]]:
        return [o["OUT"].reshape(-1).tolist()
                for o in server.stream("stream0", {"X": np.ones(1, np.float32)}, correlation_id=corr,
                                       flags=START | END, timeout=TIMEOUT)]

    with ThreadPoolExecutor(3) as pool:
        streams = list(pool.map(run, [1901, 1902, 1903]))
    for corr, items in zip([1901, 1902, 1903], streams):
        assert items == [[corr, 0, 1], [corr, 1, 1]]
