"""``--backend-config`` parsing: the Python backend's shared-memory keys size the stubs, other
keys are accepted and reported, malformed entries are refused; the sizes reach a real stub."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import stubhost
from stubhost.host.stub_process import StubSettings
from stubhost.server.backend_config import parse_backend_config
from tests.host.repo_factory import copy_examples


def test_python_keys_set_the_stub_settings() -> None:
    config = parse_backend_config(["python,shm-default-byte-size=1048576", "python,shm-growth-byte-size=2097152",
                                   "python,shm-message-queue-size=64", "python,shm-region-prefix-name=prod_shm"])
    assert config.stub == StubSettings(pool_size=1 << 20, pool_growth=2 << 20, queue_capacity=64, prefix="prod_shm")
    assert all(line.endswith(": applied") for line in config.report)


def test_nothing_given_keeps_the_defaults() -> None:
    config = parse_backend_config([])
    assert (config.stub, config.report) == (StubSettings(), [])


@pytest.mark.parametrize("entry, words", [
    ("python,stub-timeout-seconds=30", "accepted, no effect (a stub's start"),
    ("default-max-batch-size=8", "accepted, no effect (auto-completed"),
    ("python,some-future-key=1", "accepted, no effect (not a setting stubhost knows)"),
    ("onnxruntime,enable-global-threadpool=1", "ignored, stubhost hosts only Python-backend models"),
])
def test_other_keys_are_accepted_and_reported(entry: str, words: str) -> None:
    config = parse_backend_config([entry])
    assert config.stub == StubSettings()
    assert len(config.report) == 1 and config.report[0].startswith(f"--backend-config {entry}: {words}")


@pytest.mark.parametrize("entry, words", [
    ("python", "expected <backend>,<setting>=<value>"),
    ("python,=3", "expected <backend>,<setting>=<value>"),
    ("python,shm-default-byte-size=big", "'big' is not an integer"),
    ("python,shm-message-queue-size=0", "must be positive"),
    ("python,shm-region-prefix-name=../x", "letters, digits"),
])
def test_malformed_entries_are_refused(entry: str, words: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_backend_config([entry])
    assert words in str(info.value)


def test_the_settings_reach_the_stubs(tmp_path: Path) -> None:
    """A small first pool still serves a tensor bigger than it (the pool grows), and the
    segments carry the configured prefix and are gone after close."""
    repo = copy_examples(tmp_path / "models", "identity")
    prefix = f"bcfg{os.getpid()}"
    settings = StubSettings(pool_size=256 << 10, pool_growth=1 << 20, queue_capacity=32, prefix=prefix)
    with stubhost.Server(repo, stub_settings=settings) as server:
        assert any(name.startswith(prefix) for name in os.listdir("/dev/shm"))
        x = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: more than the first pool
        np.testing.assert_array_equal(server.infer("identity", {"INPUT0": x})["OUTPUT0"], x)
    assert not any(name.startswith(prefix) for name in os.listdir("/dev/shm"))
