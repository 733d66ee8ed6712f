"""Triton's rate limiter (``--rate-limit execution_count``) through ``stubhost.Server``: resources
that keep instances of different models from executing at once, the copies the flags give, priority
among the instances that wait, load failures in Triton's words, and resources that always come back
(a stub that dies, an unload). The flags' parsing is tested without a server, and the rules of the
limiter on fake instances.

Timing stays out of the assertions: every request of GATE_PY creates its ``started`` file, then
holds its instance until one of its ``wait_for`` files exists (answering which one released it),
and appends ``<model> <start ns> <end ns>`` to a shared log. So a test holds a resource, checks
that another model's request stays queued (``LoadedModel.pending``), and only then lets it go.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import stubhost
from stubhost.config.model_config_pb2 import ModelInstanceGroup
from stubhost.host.errors import InferenceError
from stubhost.host.instance import InstanceState
from stubhost.host.rate_limiter import RateLimiter, RateLimitFlagError, parse_mode, parse_resource
from tests.host.repo_factory import config_pbtxt, io, wait_until, write_model

TIMEOUT = 30.0

GATE_PY = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]

    def execute(self, requests):
        out = []
        for request in requests:
            p = json.loads(request.parameters())
            start = time.monotonic_ns()
            if "started" in p:
                open(p["started"], "w").close()
            released = ""
            deadline = time.monotonic() + float(p.get("max_wait", 30))
            while p.get("wait_for") and not released and time.monotonic() < deadline:
                released = next((w for w in p["wait_for"] if os.path.exists(w)), "")
                if not released:
                    time.sleep(0.002)
            if "exit" in p:
                os._exit(int(p["exit"]))
            if "log" in p:
                with open(p["log"], "a") as f:
                    f.write(f"{self.name} {start} {time.monotonic_ns()}\\n")
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("RELEASED", np.array([os.path.basename(released).encode()], np.object_))]))
        return out
"""


# Decoupled: execute returns at once; a thread sends the one (final) response once "wait_for" exists.
LATER_PY = """
import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def answer(sender, path):
    deadline = time.monotonic() + 30
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.002)
    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("RELEASED", np.array([b"late"], np.object_))]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            path = json.loads(request.parameters())["wait_for"]
            threading.Thread(target=answer, args=(request.get_response_sender(), path)).start()
        return None
"""


def limited(name: str, resources: str = '{ name: "R" count: 1 }', priority: int = 0, count: int = 1,
            extra: str = "") -> str:
    """GATE_PY's config: X INT32 [1] -> RELEASED STRING [1], `count` CPU instances whose
    executions each need `resources`."""
    limiter = f"rate_limiter {{ resources [ {resources} ] priority: {priority} }}"
    return config_pbtxt(name, [io("X", "TYPE_INT32", [1])], [io("RELEASED", "TYPE_STRING", [1])],
                        extra=f"instance_group [ {{ count: {count} kind: KIND_CPU {limiter} }} ]\n{extra}")


def plain(name: str) -> str:
    return config_pbtxt(name, [io("X", "TYPE_INT32", [1])], [io("RELEASED", "TYPE_STRING", [1])])


def call(server: stubhost.Server, model: str, **params: Any) -> str:
    """One request; the name of the file that released it ("" for none)."""
    out = server.infer(model, {"X": np.zeros(1, np.int32)}, parameters=params, timeout=TIMEOUT)
    return out["RELEASED"][0].decode()


def pending(server: stubhost.Server, model: str) -> Callable[[], int]:
    return lambda: server._models[model].pending(1)


def in_use(server: stubhost.Server) -> dict[str, int]:
    limiter = server._options.rate_limiter
    return {name: entry["in_use"] for name, entry in limiter.resources().items()}


def all_back(server: stubhost.Server) -> bool:
    return not any(in_use(server).values())


def runs(log: Path) -> list[tuple[str, int, int]]:
    """The executions the models logged, in the order they started."""
    rows = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    return sorted(((name, int(start), int(end)) for name, start, end in rows), key=lambda row: row[1])


@pytest.fixture
def pool():
    with ThreadPoolExecutor(16) as executor:
        yield executor


# ---- two models that need one resource ------------------------------------------------------------
@pytest.mark.parametrize("rate_limit, resources, overlap", [
    ("execution_count", (), False),        # R has 1 copy: the largest count an instance needs
    ("execution_count", ["R:2"], True),    # the flag gives 2
    ("EXECUTION_COUNT", {"R": 2}, True),   # (any case; a mapping: every device)
    ("off", ["R:1"], True),                # the default: resources are ignored
])
def test_models_that_need_one_resource_overlap_only_with_enough_copies(tmp_path: Path, pool: ThreadPoolExecutor,
                                                                       rate_limit: str, resources: Any,
                                                                       overlap: bool) -> None:
    repo, log = tmp_path / "models", tmp_path / "log"
    write_model(repo, "a", GATE_PY, limited("a"))
    write_model(repo, "b", GATE_PY, limited("b"))
    a_started, b_started, release = tmp_path / "a_started", tmp_path / "b_started", tmp_path / "release"
    with stubhost.Server(repo, rate_limit=rate_limit, rate_limit_resources=resources) as server:
        if rate_limit == "off":
            assert not server._models["a"].schedulers  # no queue: the direct path, as without a limiter
        a = pool.submit(call, server, "a", started=str(a_started), wait_for=[str(b_started), str(release)],
                        log=str(log))
        assert wait_until(a_started.exists, TIMEOUT)
        b = pool.submit(call, server, "b", started=str(b_started), log=str(log))
        if overlap:  # b starts while a runs, and that lets a go
            assert a.result(TIMEOUT) == "b_started"
        else:  # b waits in its queue for R, which a holds
            assert wait_until(lambda: pending(server, "b")() == 1, TIMEOUT)
            queued_by = time.monotonic_ns()
            assert not b_started.exists() and not a.done()
            assert in_use(server) == {"0:R": 1}
            time.sleep(0.1)  # b's wait for R is then far longer than the time it takes to write it
            release.touch()
            assert a.result(TIMEOUT) == "release"
        assert b.result(TIMEOUT) == ""
        (_, a_start, a_end), (_, b_start, b_end) = sorted(runs(log))
        assert (b_start < a_end) is overlap
        if rate_limit != "off":
            assert wait_until(lambda: all_back(server), TIMEOUT)
            stats = server.statistics("b")["model_stats"][0]["inference_stats"]
            assert stats["success"]["count"] == 1
            if not overlap:  # its wait for R is queue time; writing it to the pool (after the wait) is not
                waited = a_end - queued_by
                assert stats["queue"]["ns"] + stats["compute_input"]["ns"] >= waited > 0
                assert stats["queue"]["ns"] >= waited / 2


def test_instances_of_one_model_share_its_resources(tmp_path: Path, pool: ThreadPoolExecutor) -> None:
    """Two instances that each need R:1, with 1 copy: one execution at a time, the other request
    queued; with a global resource of 2 copies both run."""
    repo = tmp_path / "models"
    write_model(repo, "pair", GATE_PY, limited("pair", count=2))
    write_model(repo, "wide", GATE_PY, limited("wide", '{ name: "G" global: true count: 1 }', count=2))
    first, second, release = tmp_path / "first", tmp_path / "second", tmp_path / "release"
    with stubhost.Server(repo, rate_limit="execution_count", rate_limit_resources=["R:1", "G:2"]) as server:
        one = pool.submit(call, server, "pair", started=str(first), wait_for=[str(second), str(release)])
        assert wait_until(first.exists, TIMEOUT)
        two = pool.submit(call, server, "pair", started=str(second))
        assert wait_until(lambda: pending(server, "pair")() == 1, TIMEOUT)
        assert not second.exists()
        release.touch()
        assert (one.result(TIMEOUT), two.result(TIMEOUT)) == ("release", "")
        first.unlink()
        second.unlink()
        one = pool.submit(call, server, "wide", started=str(first), wait_for=[str(second)])
        assert wait_until(first.exists, TIMEOUT)
        assert call(server, "wide", started=str(second)) == ""
        assert one.result(TIMEOUT) == "second"
        assert wait_until(lambda: all_back(server), TIMEOUT)
        assert server._options.rate_limiter.resources() == {"0:R": {"count": 1, "in_use": 0},
                                                            "GLOBAL:G": {"count": 2, "in_use": 0}}


def test_a_model_without_rate_limiter_is_not_limited(tmp_path: Path, pool: ThreadPoolExecutor) -> None:
    repo = tmp_path / "models"
    write_model(repo, "a", GATE_PY, limited("a"))
    write_model(repo, "free", GATE_PY, plain("free"))
    a_started, release = tmp_path / "a_started", tmp_path / "release"
    with stubhost.Server(repo, rate_limit="execution_count") as server:
        assert not server._models["free"].schedulers  # still the direct path
        a = pool.submit(call, server, "a", started=str(a_started), wait_for=[str(release)])
        assert wait_until(a_started.exists, TIMEOUT)
        assert call(server, "free") == ""
        release.touch()
        assert a.result(TIMEOUT) == "release"


# ---- priority -------------------------------------------------------------------------------------
def test_priority_weights_the_turns_of_waiting_instances(tmp_path: Path, pool: ThreadPoolExecutor) -> None:
    """x (priority 1) and y (priority 2) wait for R while 'hold' has it. They then run in the order
    of their executions so far times their priority, the longest waiting first among equals:
    x gets twice y's turns while both wait."""
    repo, log = tmp_path / "models", tmp_path / "log"
    write_model(repo, "hold", GATE_PY, limited("hold"))
    write_model(repo, "x", GATE_PY, limited("x", priority=1))
    write_model(repo, "y", GATE_PY, limited("y", priority=2))
    started, release = tmp_path / "started", tmp_path / "release"
    with stubhost.Server(repo, rate_limit="execution_count") as server:
        hold = pool.submit(call, server, "hold", started=str(started), wait_for=[str(release)])
        assert wait_until(started.exists, TIMEOUT)
        calls: list[Future[str]] = []
        for model in ("x", "y"):  # x's queue waits first
            calls += [pool.submit(call, server, model, log=str(log)) for _ in range(6)]
            assert wait_until(lambda: pending(server, model)() == 6, TIMEOUT)
        release.touch()
        assert hold.result(TIMEOUT) == "release"
        assert [c.result(TIMEOUT) for c in calls] == [""] * 12
        # x: 0,1,2,3,4,5 executions -> ranks 0,1,2,3,4,5; y: 0,2,4,6 (ties: who waited longest)
        assert "".join(name for name, _, _ in runs(log)) == "xyxyxxyxxyyy"
        assert wait_until(lambda: all_back(server), TIMEOUT)


# ---- load failures --------------------------------------------------------------------------------
@pytest.mark.parametrize("resources, words", [
    (["R:1"], 'Resource count for "R" is limited to 1 which will prevent scheduling of one or more model '
              'instances, the minimum required count is 2'),
    (["OTHER:5"], 'Resource count for "R" is limited to 0 which will prevent scheduling'),  # unnamed: no copies
    (["R:9:1"], 'Resource count for "R" is limited to 0'),  # given for device 1; the CPU is device 0
])
def test_a_model_that_needs_more_than_given_fails_to_load(tmp_path: Path, resources: list[str], words: str) -> None:
    repo = tmp_path / "models"
    write_model(repo, "big", GATE_PY, limited("big", '{ name: "R" count: 2 }'))
    write_model(repo, "small", GATE_PY, plain("small"))
    with pytest.raises(InferenceError) as raised:
        stubhost.Server(repo, rate_limit="execution_count", rate_limit_resources=resources)
    assert raised.value.code == "INVALID_ARG"
    assert f"failed to load 'big': {words}" in raised.value.message
    with stubhost.Server(repo, rate_limit="execution_count", rate_limit_resources=resources,
                         exit_on_error=False) as server:
        assert words in server.load_errors["big"]
        assert server.model_ready("small") and not server.model_ready("big")
    with stubhost.Server(repo, rate_limit="off", rate_limit_resources=resources) as server:  # off: ignored
        assert server.model_ready("big")


def test_a_resource_global_in_one_model_and_per_device_in_another_fails_the_second(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "shared", GATE_PY, limited("shared", '{ name: "R" global: true count: 1 }'))
    write_model(repo, "local", GATE_PY, limited("local"))
    with stubhost.Server(repo, models=["shared"], rate_limit="execution_count") as server:
        with pytest.raises(InferenceError) as raised:
            server.load("local")
        assert ('Resource "R" is present as both global and device-specific resource in the model '
                "configuration.") in raised.value.message
        server.unload("shared")
        server.load("local")  # once the other is gone, it loads
        assert server.model_ready("local")


# ---- resources always come back -------------------------------------------------------------------
def test_a_request_that_times_out_while_waiting_leaves_nothing_held(tmp_path: Path,
                                                                    pool: ThreadPoolExecutor) -> None:
    """b's request gives up while b waits for R: when a gives R back, b is granted it, has nothing
    to send, and the grant is taken back; b's next request runs."""
    repo = tmp_path / "models"
    write_model(repo, "a", GATE_PY, limited("a"))
    write_model(repo, "b", GATE_PY, limited("b"))
    a_started, release = tmp_path / "a_started", tmp_path / "release"
    with stubhost.Server(repo, rate_limit="execution_count") as server:
        a = pool.submit(call, server, "a", started=str(a_started), wait_for=[str(release)])
        assert wait_until(a_started.exists, TIMEOUT)
        with pytest.raises(InferenceError, match="Request timeout expired"):
            server.infer("b", {"X": np.zeros(1, np.int32)}, timeout=0.2)
        assert pending(server, "b")() == 0 and in_use(server) == {"0:R": 1}
        release.touch()
        assert a.result(TIMEOUT) == "release"
        assert wait_until(lambda: all_back(server), TIMEOUT)
        assert call(server, "b") == ""
        assert wait_until(lambda: all_back(server), TIMEOUT)


def test_a_stub_that_dies_during_an_execution_gives_its_resources_back(tmp_path: Path,
                                                                       pool: ThreadPoolExecutor) -> None:
    repo = tmp_path / "models"
    write_model(repo, "a", GATE_PY, limited("a"))
    write_model(repo, "b", GATE_PY, limited("b"))
    a_started, release = tmp_path / "a_started", tmp_path / "release"
    with stubhost.Server(repo, rate_limit="execution_count") as server:
        a = pool.submit(call, server, "a", started=str(a_started), wait_for=[str(release)], exit=3)
        assert wait_until(a_started.exists, TIMEOUT)
        b = pool.submit(call, server, "b")
        assert wait_until(lambda: pending(server, "b")() == 1, TIMEOUT)
        release.touch()  # a's stub exits in the middle of its execution
        with pytest.raises(InferenceError, match="not healthy"):
            a.result(TIMEOUT)
        assert b.result(TIMEOUT) == ""
        assert wait_until(lambda: all_back(server), TIMEOUT)
        assert wait_until(lambda: server.model_ready("a"), TIMEOUT)  # restarted, and limited as before
        release.unlink()
        assert call(server, "a") == ""


def test_unloading_a_model_gives_its_resources_back(tmp_path: Path, pool: ThreadPoolExecutor) -> None:
    """'a' runs a request that never ends by itself and has another one queued; 'b' waits for R.
    Unloading 'a' (its stub is stopped after the finalize timeout) lets 'b' run."""
    repo = tmp_path / "models"
    write_model(repo, "a", GATE_PY, limited("a"))
    write_model(repo, "b", GATE_PY, limited("b"))
    a_started = tmp_path / "a_started"
    with stubhost.Server(repo, rate_limit="execution_count", finalize_timeout=0.5) as server:
        running = pool.submit(call, server, "a", started=str(a_started), wait_for=[str(tmp_path / "never")],
                              max_wait=60)
        assert wait_until(a_started.exists, TIMEOUT)
        queued = pool.submit(call, server, "a")
        b = pool.submit(call, server, "b")
        assert wait_until(lambda: pending(server, "a")() == 1 and pending(server, "b")() == 1, TIMEOUT)
        server.unload("a")
        with pytest.raises(InferenceError, match="unloading"):
            queued.result(TIMEOUT)
        with pytest.raises(InferenceError):
            running.result(TIMEOUT)
        assert b.result(TIMEOUT) == ""
        assert wait_until(lambda: all_back(server), TIMEOUT)
        assert server._options.rate_limiter.resources() == {"0:R": {"count": 1, "in_use": 0}}  # b's alone


def test_a_sequence_model_waits_for_its_resources_too(tmp_path: Path, pool: ThreadPoolExecutor) -> None:
    repo = tmp_path / "models"
    write_model(repo, "hold", GATE_PY, limited("hold"))
    write_model(repo, "seq", GATE_PY, limited("seq", extra="sequence_batching { }"))
    started, release = tmp_path / "started", tmp_path / "release"
    with stubhost.Server(repo, rate_limit="execution_count") as server:
        hold = pool.submit(call, server, "hold", started=str(started), wait_for=[str(release)])
        assert wait_until(started.exists, TIMEOUT)
        seq = pool.submit(server.infer, "seq", {"X": np.zeros(1, np.int32)}, correlation_id=7, flags=3,
                          timeout=TIMEOUT)  # START | END
        assert wait_until(lambda: pending(server, "seq")() == 1, TIMEOUT)
        release.touch()
        assert hold.result(TIMEOUT) == "release"
        assert seq.result(TIMEOUT)["RELEASED"].tolist() == [b""]
        assert wait_until(lambda: all_back(server), TIMEOUT)


def test_a_decoupled_execution_ends_when_execute_returns(tmp_path: Path, pool: ThreadPoolExecutor) -> None:
    """The decoupled model returns from ``execute`` at once and answers later, from a thread: R is
    free again as soon as ``execute`` returned, while its stream is still open."""
    repo = tmp_path / "models"
    write_model(repo, "later", LATER_PY, limited("later", extra="model_transaction_policy { decoupled: true }"))
    write_model(repo, "b", GATE_PY, limited("b"))
    answer = tmp_path / "answer"
    with stubhost.Server(repo, rate_limit="execution_count") as server:
        stream = pool.submit(lambda: list(server.stream("later", {"X": np.zeros(1, np.int32)},
                                                        parameters={"wait_for": str(answer)}, timeout=TIMEOUT)))
        # its request is in the stub (its stream open), and R is free: execute returned
        assert wait_until(lambda: server._models["later"].instances()[0].load_count() > 0 and all_back(server),
                          TIMEOUT)
        assert call(server, "b") == ""  # R is free, though 'later' has not answered yet
        assert not stream.done()
        answer.touch()
        assert [out["RELEASED"].tolist() for out in stream.result(TIMEOUT)] == [[b"late"]]
        assert wait_until(lambda: all_back(server), TIMEOUT)


# ---- the flags ------------------------------------------------------------------------------------
def test_flag_values_are_read_as_tritonserver_reads_them() -> None:
    assert parse_mode("Execution_Count") == "execution_count" and parse_mode("OFF") == "off"
    assert parse_resource("R1:4") == ("R1", 4, -1)
    assert parse_resource("R2:5:1") == ("R2", 5, 1)
    assert parse_resource("R: 7x") == ("R", 7, -1)  # std::stoi's leniency
    for value, words in [
        ("R", "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
              "'<resource_name>:<count>'. Got R"),
        ("R:1:2:3", "option format is"),
        ("R:many", "Invalid option value. Got many"),
        ("R:99999999999", "Provided option value is out of bound. Got 99999999999"),
        ("R:-1", "the count must not be negative"),
    ]:
        with pytest.raises(RateLimitFlagError) as raised:
            parse_resource(value)
        assert str(raised.value).startswith('Bad option: "--rate-limit-resource". ')
        assert words in str(raised.value)
    with pytest.raises(RateLimitFlagError, match='Bad option: "--rate-limit". invalid argument for --rate-limit'):
        parse_mode("sometimes")


def test_the_server_refuses_bad_values_before_it_starts(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="invalid argument for --rate-limit"):
        stubhost.Server(tmp_path, rate_limit="on")
    with pytest.raises(ValueError, match="option format is"):
        stubhost.Server(tmp_path, rate_limit="execution_count", rate_limit_resources=["R"])
    with pytest.raises(ValueError, match="expected"):
        stubhost.Server(tmp_path, rate_limit="execution_count", rate_limit_resources=[("R", -1)])


# ---- the rules, on fake instances -----------------------------------------------------------------
def fake(device: int = 0) -> Any:
    return SimpleNamespace(state=InstanceState.READY, spec=SimpleNamespace(device_id=device))


def group(text: str) -> ModelInstanceGroup:
    from google.protobuf import text_format
    return text_format.Parse(text, ModelInstanceGroup())


class Queue:
    """A version's queue as the limiter sees it: free instances, and the pokes it gets."""

    def __init__(self, limits: Any, instances: list[Any]) -> None:
        self.pokes = 0
        self.handle = limits.bind(instances, self.poke)

    def poke(self) -> None:
        self.pokes += 1


def test_the_copies_of_a_resource_and_the_explicit_counts() -> None:
    limiter = RateLimiter([("R2", 5, 0), ("R2", 8, 1), "R1:10", "R2:3:0", ("R3", 2)])
    a, b = fake(0), fake(1)
    limits = limiter.register("m", [(a, group('rate_limiter { resources [{ name: "R1" count: 4 },'
                                               '{ name: "R2" count: 3 }] }')),
                                    (b, group('rate_limiter { resources [{ name: "R2" count: 2 },'
                                              '{ name: "R3" global: true count: 2 }] }'))])
    assert limits is not None
    # R2 on device 0 was given twice: the smaller count stays (Triton's AddRateLimiterResource)
    assert {k: v["count"] for k, v in limiter.resources().items()} == {"GLOBAL:R3": 2, "0:R1": 10, "0:R2": 3,
                                                                       "1:R2": 8}
    assert limiter.register("n", [(fake(), group("kind: KIND_CPU"))]) is None  # no rate_limiter: not limited
    limits.unregister()
    assert limiter.resources() == {}


def test_a_release_hands_the_resources_to_the_next_in_order() -> None:
    limiter = RateLimiter()
    one, two = fake(), fake()
    r1 = group('rate_limiter { resources [{ name: "R" count: 1 }] }')
    first = Queue(limiter.register("one", [(one, r1)]), [one])
    second = Queue(limiter.register("two", [(two, r1)]), [two])
    assert first.handle.admit([one]) is one
    assert second.handle.admit([two]) is None  # staged: R is taken
    assert second.handle.waiting([two])
    grants = first.handle.release(one, queued=0)
    assert [entry.instance for entry, _ in grants] == [two]
    first.handle.settle(grants)
    assert second.pokes == 1
    # the poke did not use the grant (the fake queue sends nothing): it was taken back
    assert limiter.resources()["0:R"]["in_use"] == 0
    assert second.handle.admit([two]) is two
    assert first.handle.admit([one]) is None
    second.handle.give_back(two)  # admitted, but nothing to send: R goes to 'one' (poked from a thread)
    assert wait_until(lambda: first.pokes == 1, TIMEOUT)


def test_a_restarting_instance_is_passed_over_and_holds_up_nobody() -> None:
    limiter = RateLimiter()
    r2, r1 = (group(f'rate_limiter {{ resources [{{ name: "R" count: {n} }}] }}') for n in (2, 1))
    big, small, busy = fake(), fake(), fake()
    holder = Queue(limiter.register("busy", [(busy, r1)]), [busy])
    waiter = Queue(limiter.register("big", [(big, r2)]), [big])
    other = Queue(limiter.register("small", [(small, r1)]), [small])
    assert holder.handle.admit([busy]) is busy
    assert waiter.handle.admit([big]) is None  # needs 2 of 2, 1 taken: waits, and holds up...
    assert other.handle.admit([small]) is None  # ...the one behind it, though 1 copy is free (Triton's order)
    big.state = InstanceState.RESTARTING
    assert other.handle.admit([small]) is small  # a restarting instance holds up nobody
