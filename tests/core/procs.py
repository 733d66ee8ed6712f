"""Helpers for tests that run peer processes."""

from __future__ import annotations

import multiprocessing

import pytest


def join_peer(proc: multiprocessing.process.BaseProcess, timeout: float = 30) -> None:
    """Waits for a peer; kills and fails the test if it hangs, fails it if it exited non-zero."""
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join(5)
        pytest.fail("peer did not exit")
    assert proc.exitcode == 0, f"peer failed with exit code {proc.exitcode} (its traceback is in stderr)"
