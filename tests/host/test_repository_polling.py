"""Several model repositories, and poll mode: a new model loads, an edited one reloads (its
requests in flight finish), a removed one unloads, a broken one keeps the server not ready."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import SLEEPY_PY, config_pbtxt, io, sleepy_config, wait_until, write_model
from tests.host.test_model_control import constant, constant_model


def touch_later(path: Path) -> None:
    """Makes sure an edit shows in the modification time even on coarse-grained file systems."""
    stamp = path.stat().st_mtime_ns + 1_000_000_000
    os.utime(path, ns=(stamp, stamp))


def test_models_of_several_repositories_are_served(tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    constant_model(first, "a", 1)
    constant_model(second, "b", 2)
    with stubhost.Server([first, second]) as server:
        assert server.models() == ["a", "b"]
        assert (constant(server, "a"), constant(server, "b")) == (1, 2)


def test_a_model_in_two_repositories_is_refused(tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    constant_model(first, "a", 1)
    constant_model(second, "a", 2)
    constant_model(second, "b", 3)
    with pytest.raises(stubhost.InferenceError, match="not unique across all model repositories"):
        stubhost.Server([first, second])
    with stubhost.Server([first, second], exit_on_error=False) as server:
        assert server.models() == ["b"]
        assert "model appears in two or more repositories" in server.load_errors["a"]
        assert not server.ready()
        with pytest.raises(stubhost.InferenceError, match="not unique across all model repositories"):
            server.load("a")


def test_poll_loads_reloads_and_unloads(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    constant_model(repo, "a", 1)
    with stubhost.Server(repo) as server:
        constant_model(repo, "b", 2)
        constant_model(repo, "a", 10)
        touch_later(repo / "a" / "1" / "model.py")
        server.poll()
        assert server.models() == ["a", "b"]
        assert (constant(server, "a"), constant(server, "b")) == (10, 2)
        pid = server._models["a"].instances()[0].process.pid
        server.poll()  # nothing changed: nothing reloads
        assert server._models["a"].instances()[0].process.pid == pid
        shutil.rmtree(repo / "b")
        server.poll()
        assert server.models() == ["a"]
        assert server.ready()


def test_a_broken_edit_keeps_the_old_model_serving_until_fixed(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    constant_model(repo, "a", 1)
    with stubhost.Server(repo) as server:
        (repo / "a" / "1" / "model.py").write_text("raise RuntimeError('broken on purpose')\n")
        server.poll()
        assert constant(server, "a") == 1
        assert "broken on purpose" in server.load_errors["a"]
        server.poll()  # unchanged and still broken: not retried
        constant_model(repo, "a", 3)
        touch_later(repo / "a" / "1" / "model.py")
        server.poll()
        assert constant(server, "a") == 3
        assert "a" not in server.load_errors


def test_a_new_broken_model_makes_the_server_not_ready(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    constant_model(repo, "a", 1)
    with stubhost.Server(repo) as server:
        write_model(repo, "bad", "raise RuntimeError('broken on purpose')\n", config_pbtxt(
            "bad", [io("INPUT0", "TYPE_INT32", [1])], [io("OUTPUT0", "TYPE_INT32", [1])]))
        server.poll()
        assert not server.ready()
        shutil.rmtree(repo / "bad")
        server.poll()
        assert server.ready()


def test_the_poll_thread_reloads_while_requests_run(tmp_path: Path) -> None:
    """With poll_interval the server polls by itself; a request running on the old model when
    the edit lands finishes there, and later requests see the new model."""
    repo = tmp_path / "models"
    write_model(repo, "slow", SLEEPY_PY, sleepy_config("slow"))
    constant_model(repo, "a", 1)
    with stubhost.Server(repo, poll_interval=0.2) as server:
        outcome: dict[str, object] = {}

        def run() -> None:
            try:
                outcome["out"] = server.infer("slow", {"INPUT0": np.ones(2, np.float32)},
                                              parameters={"sleep": 1.0})["OUTPUT0"]
            except BaseException as e:  # noqa: BLE001 - checked below
                outcome["error"] = e

        thread = threading.Thread(target=run)
        thread.start()
        time.sleep(0.2)
        touch_later(repo / "slow" / "1" / "model.py")
        constant_model(repo, "a", 5)
        touch_later(repo / "a" / "1" / "model.py")
        assert wait_until(lambda: constant(server, "a") == 5, 30.0)
        thread.join(30)
        assert "error" not in outcome, outcome.get("error")
        np.testing.assert_array_equal(outcome["out"], np.ones(2, np.float32))
        assert server.ready()


def test_a_bad_poll_interval_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    constant_model(repo, "a", 1)
    with pytest.raises(ValueError, match="poll_interval"):
        stubhost.Server(repo, poll_interval=0)
