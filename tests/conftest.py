"""Shared fixtures: every test must leave /dev/shm and the process table as it found them."""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections.abc import Iterator

import pytest

from stubhost import _core

SHM_DIR = "/dev/shm"
SHM_PREFIX = "stubhost"


def stubhost_segments() -> set[str]:
    """Names in /dev/shm of pools this test process created (their names carry its pid), so that
    concurrent runs never see, or delete, each other's segments."""
    own = f"{SHM_PREFIX}_{os.getpid()}_"
    return {n for n in os.listdir(SHM_DIR) if n.startswith(own)}


@pytest.fixture(autouse=True)
def no_shm_leaks() -> Iterator[None]:
    """Fails a test that leaves stubhost segments behind (and removes them, so one leak is one failure)."""
    before = stubhost_segments()
    yield
    gc.collect()
    leaked = stubhost_segments() - before
    for name in leaked:
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except FileNotFoundError:
            pass
    assert not leaked, f"test leaked shared-memory segments: {sorted(leaked)}"


@pytest.fixture(autouse=True)
def no_child_leaks() -> Iterator[None]:
    """Fails a test that leaves child processes running (and kills them)."""
    yield
    alive = multiprocessing.active_children()
    for proc in alive:
        proc.kill()
        proc.join(5)
    assert not alive, f"test left child processes running: {alive}"


@pytest.fixture
def pool() -> Iterator[_core.Pool]:
    """A small pool owned by the test."""
    p = _core.Pool.create(initial_size=1 << 20, growth_size=1 << 20, max_size=64 << 20, lock_timeout=5.0)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def spawn() -> multiprocessing.context.SpawnContext:
    """A multiprocessing context that starts clean interpreters (no inherited mappings or locks)."""
    return multiprocessing.get_context("spawn")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` run where a CUDA GPU can be used and are skipped, with the reason,
    everywhere else."""
    gpu_tests = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_tests:
        return
    from stubhost.gpu import cuda

    reason = cuda.unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {reason}")
    for item in gpu_tests:
        item.add_marker(skip)
