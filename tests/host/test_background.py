"""The background event loop of sync callers (host/background.py): results, errors, and a stream
left early closes its async generator on the loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator

import pytest

from stubhost.host.background import iterate_in_background, run_in_background


def test_a_coroutine_runs_on_the_background_loop_and_its_result_or_error_comes_back() -> None:
    async def where() -> str:
        await asyncio.sleep(0)
        return threading.current_thread().name

    assert run_in_background(where()) == "stubhost-background"

    async def fails() -> None:
        raise ValueError("from the loop")

    with pytest.raises(ValueError, match="from the loop"):
        run_in_background(fails())


def test_leaving_an_iteration_early_closes_the_async_generator() -> None:
    closed = threading.Event()

    async def numbers() -> AsyncGenerator[int, None]:
        try:
            for n in range(100):
                yield n
        finally:
            closed.set()

    items = iterate_in_background(numbers())
    assert [next(items) for _ in range(3)] == [0, 1, 2]
    items.close()
    assert closed.is_set()

    async def three() -> AsyncGenerator[int, None]:
        for n in range(3):
            yield n

    assert list(iterate_in_background(three())) == [0, 1, 2]
