"""Stubs that die or hang: the affected requests fail, the instance is restarted, a crash loop ends."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import (
    SLEEPY_PY,
    child_stub_pids,
    instance,
    own_shm_entries,
    pid_alive,
    sleepy_config,
    wait_until,
    write_model,
)

X = np.array([1.0, 2.0, 3.0], dtype=np.float32)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    write_model(repo, "sleepy", SLEEPY_PY, sleepy_config("sleepy"))
    return repo


def infer_in_thread(server: stubhost.Server, **kwargs: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Starts one infer on "sleepy" in a thread; the dict gets "error" or "out", and "elapsed"."""
    result: dict[str, Any] = {}

    def run() -> None:
        start = time.monotonic()
        try:
            result["out"] = server.infer("sleepy", {"INPUT0": X}, **kwargs)
        except stubhost.InferenceError as e:
            result["error"] = e
        finally:
            result["elapsed"] = time.monotonic() - start

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def wait_replaced(server: stubhost.Server, old_pid: int, timeout: float = 15.0) -> bool:
    inst = instance(server, "sleepy")
    return wait_until(lambda: inst.process.pid != old_pid and server.model_ready("sleepy"), timeout)


def test_sigkill_mid_request_fails_that_request(repo: Path, tmp_path: Path) -> None:
    with stubhost.Server(repo) as server:
        pid = instance(server, "sleepy").process.pid
        started = tmp_path / "started"
        thread, result = infer_in_thread(server, parameters={"sleep": 60, "touch": str(started)})
        assert wait_until(started.exists, 10.0), "execute never started"
        os.kill(pid, signal.SIGKILL)
        thread.join(10.0)
        assert not thread.is_alive(), "the request still waits on a dead stub"
        assert "error" in result, result
        assert "is not healthy" in result["error"].message
        assert result["elapsed"] < 5.0


def test_instance_restarts_after_sigkill_and_serves_again(repo: Path, tmp_path: Path) -> None:
    with stubhost.Server(repo) as server:
        inst = instance(server, "sleepy")
        pid = inst.process.pid
        started = tmp_path / "started"
        thread, result = infer_in_thread(server, parameters={"sleep": 60, "touch": str(started)})
        assert wait_until(started.exists, 10.0)
        os.kill(pid, signal.SIGKILL)
        thread.join(10.0)
        assert wait_replaced(server, pid), "the instance was not restarted"
        out = server.infer("sleepy", {"INPUT0": X}, timeout=10.0)
        np.testing.assert_array_equal(out["OUTPUT0"], X)
        assert int(out["PID"][0]) == inst.process.pid != pid
        assert inst.restarts == 1
        assert not pid_alive(pid)


def test_sigkill_of_an_idle_stub_is_noticed_and_repaired(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        pid = instance(server, "sleepy").process.pid
        os.kill(pid, signal.SIGKILL)
        assert wait_replaced(server, pid)
        np.testing.assert_array_equal(server.infer("sleepy", {"INPUT0": X})["OUTPUT0"], X)


def test_every_request_in_flight_fails_when_the_stub_dies(repo: Path, tmp_path: Path) -> None:
    with stubhost.Server(repo) as server:
        pid = instance(server, "sleepy").process.pid
        started = tmp_path / "started"
        first = infer_in_thread(server, parameters={"sleep": 60, "touch": str(started)})
        assert wait_until(started.exists, 10.0)
        queued = [infer_in_thread(server, parameters={"sleep": 60}) for _ in range(4)]
        assert wait_until(lambda: instance(server, "sleepy").load_count() >= 5, 5.0)
        os.kill(pid, signal.SIGKILL)
        for thread, result in [first, *queued]:
            thread.join(10.0)
            assert not thread.is_alive()
            assert "error" in result and "is not healthy" in result["error"].message


def test_hung_execute_times_out_with_unavailable(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        start = time.monotonic()
        with pytest.raises(stubhost.InferenceError) as info:
            server.infer("sleepy", {"INPUT0": X}, parameters={"sleep": 60}, timeout=0.5)
        elapsed = time.monotonic() - start
        assert info.value.code == "UNAVAILABLE"
        assert "timeout" in info.value.message.lower()
        assert 0.4 < elapsed < 3.0


def test_hung_instance_is_replaced_and_serves_again(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        inst = instance(server, "sleepy")
        pid = inst.process.pid
        with pytest.raises(stubhost.InferenceError):
            server.infer("sleepy", {"INPUT0": X}, parameters={"sleep": 60}, timeout=0.5)
        assert wait_replaced(server, pid), "the hung stub was not replaced"
        assert wait_until(lambda: not pid_alive(pid), 5.0), "the hung stub still runs"
        out = server.infer("sleepy", {"INPUT0": X}, timeout=10.0)
        np.testing.assert_array_equal(out["OUTPUT0"], X)
        assert int(out["PID"][0]) == inst.process.pid


def test_timeout_that_is_long_enough_succeeds(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        pid = instance(server, "sleepy").process.pid
        out = server.infer("sleepy", {"INPUT0": X}, parameters={"sleep": 0.1}, timeout=5.0)
        np.testing.assert_array_equal(out["OUTPUT0"], X)
        assert instance(server, "sleepy").process.pid == pid


def _burst(server: stubhost.Server, count: int, sleep: float, timeout: float) -> list[dict[str, Any]]:
    """`count` requests sent 10 ms apart, each running `sleep` s with `timeout`; their results."""
    runs = []
    for _ in range(count):
        runs.append(infer_in_thread(server, parameters={"sleep": sleep}, timeout=timeout))
        time.sleep(0.01)
    for thread, _ in runs:
        thread.join(30.0)
        assert not thread.is_alive()
    return [result for _, result in runs]


@pytest.mark.parametrize("instances", [1, 2])
def test_requests_that_time_out_behind_a_busy_stub_leave_it_running(tmp_path: Path, instances: int) -> None:
    # Each request runs 0.3 s; the later ones wait their turn (in the stub's inbox, or with two
    # instances in the model's queue) and start with little of their 0.7 s left. A stub that
    # works through them is busy, not hung: before, the first of them to time out while
    # running killed the stub, and every request queued behind it failed INTERNAL.
    repo = tmp_path / "models"
    write_model(repo, "sleepy", SLEEPY_PY, sleepy_config(
        "sleepy", extra=f"instance_group [{{ count: {instances}, kind: KIND_CPU }}]"))
    with stubhost.Server(repo) as server:
        pids = [instance(server, "sleepy", index=i).process.pid for i in range(instances)]
        results = _burst(server, 3 * instances + 1, sleep=0.3, timeout=0.7)
        assert sum("out" in r for r in results) == 2 * instances, results
        for result in results:
            if "error" in result:
                assert result["error"].code == "UNAVAILABLE", result
                assert "Request timeout expired" in result["error"].message
                assert result["elapsed"] < 3.0
        time.sleep(0.6)  # the monitor would have replaced a stub judged hung by now
        assert [instance(server, "sleepy", index=i).process.pid for i in range(instances)] == pids
        assert all(instance(server, "sleepy", index=i).restarts == 0 for i in range(instances))
        out = server.infer("sleepy", {"INPUT0": X}, timeout=10.0)
        assert int(out["PID"][0]) in pids


def test_a_hung_request_that_started_late_is_replaced_once_it_ran_its_whole_timeout(repo: Path) -> None:
    with stubhost.Server(repo) as server:
        inst = instance(server, "sleepy")
        pid = inst.process.pid
        first = infer_in_thread(server, parameters={"sleep": 0.5})
        time.sleep(0.05)
        started = time.monotonic()
        thread, result = infer_in_thread(server, parameters={"sleep": 60}, timeout=1.0)
        thread.join(10.0)
        assert result["error"].code == "UNAVAILABLE" and 0.9 < result["elapsed"] < 3.0, result
        assert first[1].get("out") is not None, first[1]
        # It began at ~0.45 s and had run ~0.55 s when its caller gave up: the stub is hung only
        # once that request has run 1 s, and then the health monitor replaces it.
        assert wait_replaced(server, pid), "the stub stuck in a request that outlived its timeout was not replaced"
        assert time.monotonic() - started >= 1.4
        assert inst.restarts == 1
        np.testing.assert_array_equal(server.infer("sleepy", {"INPUT0": X}, timeout=10.0)["OUTPUT0"], X)


def test_a_request_given_up_while_queued_that_then_hangs_gets_its_stub_replaced(repo: Path) -> None:
    # The hung request's caller left before the stub began it, and the requests queued behind it
    # never start, so none of their timeouts can see the stub hang: its own timeout, counted
    # from the moment the stub began it, must.
    with stubhost.Server(repo) as server:
        inst = instance(server, "sleepy")
        pid = inst.process.pid
        first = infer_in_thread(server, parameters={"sleep": 0.5})
        time.sleep(0.05)
        _, hung = infer_in_thread(server, parameters={"sleep": 60}, timeout=0.3)
        time.sleep(0.5)  # it gave up while queued; the stub has begun it by now
        behind = infer_in_thread(server, parameters={"sleep": 0}, timeout=0.3)
        behind[0].join(10.0)
        assert hung["error"].code == "UNAVAILABLE", hung
        assert "out" in first[1], first[1]
        assert wait_replaced(server, pid, timeout=10.0), "a stub stuck in an abandoned request was never replaced"
        assert inst.restarts == 1
        np.testing.assert_array_equal(server.infer("sleepy", {"INPUT0": X}, timeout=10.0)["OUTPUT0"], X)


def test_crash_loop_ends_not_ready_without_a_respawn_storm(repo: Path) -> None:
    policy = stubhost.RestartPolicy(max_restarts=2, backoff_s=0.01)
    before = child_stub_pids()
    with stubhost.Server(repo, restart=policy) as server:
        inst = instance(server, "sleepy")
        pids = {inst.process.pid}
        codes: list[str] = []
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline and len(codes) < 20:
            with pytest.raises(stubhost.InferenceError) as info:
                server.infer("sleepy", {"INPUT0": X}, parameters={"exit": 1}, timeout=10.0)
            codes.append(info.value.code)
            pids.add(inst.process.pid)
            if info.value.code == "UNAVAILABLE":
                break
        assert codes[-1] == "UNAVAILABLE", codes
        assert not server.model_ready("sleepy")
        assert not server.ready()
        # refused fast from now on
        for _ in range(5):
            start = time.monotonic()
            with pytest.raises(stubhost.InferenceError) as info:
                server.infer("sleepy", {"INPUT0": X}, timeout=10.0)
            assert info.value.code == "UNAVAILABLE"
            assert time.monotonic() - start < 0.5
        # no more restarts happen: the budget was two
        time.sleep(0.5)
        assert inst.restarts == 2
        assert len(pids) == 3, pids
        assert not inst.process.alive()
        assert child_stub_pids() - before == set()


def test_without_restart_a_killed_instance_stays_down(repo: Path) -> None:
    with stubhost.Server(repo, restart=False) as server:
        inst = instance(server, "sleepy")
        pid = inst.process.pid
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: not server.model_ready("sleepy"), 5.0)
        with pytest.raises(stubhost.InferenceError) as info:
            server.infer("sleepy", {"INPUT0": X}, timeout=5.0)
        assert info.value.code == "UNAVAILABLE"
        time.sleep(0.3)
        assert inst.restarts == 0 and inst.process.pid == pid


def test_other_instance_serves_while_one_restarts(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_model(repo, "sleepy", SLEEPY_PY, sleepy_config(
        "sleepy", extra="instance_group [ { count: 2 kind: KIND_CPU } ]"))
    slow_restart = stubhost.RestartPolicy(backoff_s=1.5)
    with stubhost.Server(repo, restart=slow_restart) as server:
        first, second = instance(server, "sleepy", index=0), instance(server, "sleepy", index=1)
        pid, other_pid = first.process.pid, second.process.pid
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: first.state.value != "ready", 5.0)  # noticed, restart pending
        assert server.model_ready("sleepy")  # one READY instance is enough
        for _ in range(20):
            out = server.infer("sleepy", {"INPUT0": X}, timeout=1.0)
            assert int(out["PID"][0]) == other_pid
        assert wait_until(lambda: first.process.pid != pid and first.state.value == "ready", 15.0)
        assert second.process.pid == other_pid


def no_new_stub_or_segment_for(seconds: float, before_pids: set[int], before_shm: set[str]) -> list[str]:
    """Watches for `seconds`; returns what appeared (stubs, segments) that was not there before."""
    seen: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen += [f"stub {p}" for p in child_stub_pids() - before_pids]
        seen += [f"segment {n}" for n in own_shm_entries() - before_shm]
        if seen:
            break
        time.sleep(0.005)
    return seen


def test_close_during_a_pending_restart_starts_no_stub_afterwards(repo: Path) -> None:
    before_pids, before_shm = child_stub_pids(), own_shm_entries()
    with stubhost.Server(repo, restart=stubhost.RestartPolicy(backoff_s=0.3)) as server:
        inst = instance(server, "sleepy")
        os.kill(inst.process.pid, signal.SIGKILL)
        assert wait_until(lambda: inst.state.value == "restarting", 5.0)
    # past the backoff and a stub's start-up: a restart racing close would show now
    appeared = no_new_stub_or_segment_for(1.5, before_pids, before_shm)
    assert appeared == [], f"after Server.close() returned: {appeared}"


def test_close_while_a_restart_initializes_leaves_nothing_running(repo: Path) -> None:
    before_pids, before_shm = child_stub_pids(), own_shm_entries()
    with stubhost.Server(repo, restart=stubhost.RestartPolicy(backoff_s=0.0)) as server:
        inst = instance(server, "sleepy")
        old = inst.process.pid
        os.kill(old, signal.SIGKILL)
        # the replacement stub exists (a new child) but is not READY yet
        wait_until(lambda: bool(child_stub_pids() - before_pids - {old}), 5.0, period=0.001)
    appeared = no_new_stub_or_segment_for(1.0, before_pids, before_shm)
    assert appeared == [], f"after Server.close() returned: {appeared}"


def test_request_arriving_during_a_restart_waits_for_it(repo: Path) -> None:
    with stubhost.Server(repo, restart=stubhost.RestartPolicy(backoff_s=0.5)) as server:
        inst = instance(server, "sleepy")
        pid = inst.process.pid
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: inst.state.value == "restarting", 5.0)
        out = server.infer("sleepy", {"INPUT0": X}, timeout=15.0)
        np.testing.assert_array_equal(out["OUTPUT0"], X)
        assert int(out["PID"][0]) != pid


def test_request_timeout_bounds_the_wait_for_a_restart(repo: Path) -> None:
    with stubhost.Server(repo, restart=stubhost.RestartPolicy(backoff_s=1.5)) as server:
        inst = instance(server, "sleepy")
        os.kill(inst.process.pid, signal.SIGKILL)
        assert wait_until(lambda: inst.state.value == "restarting", 5.0)
        start = time.monotonic()
        with pytest.raises(stubhost.InferenceError) as info:
            server.infer("sleepy", {"INPUT0": X}, timeout=0.3)
        assert info.value.code == "UNAVAILABLE"
        assert time.monotonic() - start < 1.5


def test_close_during_a_restart_backoff_does_not_wait_out_the_backoff(repo: Path) -> None:
    with stubhost.Server(repo, restart=stubhost.RestartPolicy(backoff_s=2.5)) as server:
        inst = instance(server, "sleepy")
        os.kill(inst.process.pid, signal.SIGKILL)
        assert wait_until(lambda: inst.state.value == "restarting", 5.0)
        start = time.monotonic()
        server.close()
        elapsed = time.monotonic() - start
    assert elapsed < 1.0, f"close() took {elapsed:.2f} s: it sat out the restart backoff"
