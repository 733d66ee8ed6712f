"""Concurrent callers: asyncio (infer_async) and threads, on a model with two instances."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest

import stubhost
from tests.host.repo_factory import SLEEPY_PY, copy_examples, instance, sleepy_config, write_model

THREADS = 8
PER_THREAD = 200


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stubhost.Server]:
    repo = copy_examples(tmp_path_factory.mktemp("concurrency") / "models", "add_sub", "string_upper")
    write_model(repo, "sleepy", SLEEPY_PY, sleepy_config("sleepy", extra="instance_group [ { count: 2 kind: KIND_CPU } ]"))
    with stubhost.Server(repo) as s:
        yield s


def test_infer_async_gathers_twenty_concurrent_calls(server: stubhost.Server) -> None:
    inputs = [np.arange(4, dtype=np.float32) * i for i in range(20)]
    ones = np.ones(4, dtype=np.float32)

    async def main() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(*(server.infer_async("add_sub", {"INPUT0": x, "INPUT1": ones})
                                      for x in inputs))

    results = asyncio.run(main())
    assert len(results) == 20
    for x, out in zip(inputs, results):
        np.testing.assert_array_equal(out["OUTPUT0"], x + 1)
        np.testing.assert_array_equal(out["OUTPUT1"], x - 1)


def test_infer_async_overlaps_slow_requests(server: stubhost.Server) -> None:
    """Two 0.6 s requests on a two-instance model finish together, not one after the other."""
    import time

    async def main() -> list[dict[str, np.ndarray]]:
        x = np.zeros(1, np.float32)
        return await asyncio.gather(*(server.infer_async("sleepy", {"INPUT0": x}, parameters={"sleep": 0.6})
                                      for _ in range(2)))

    start = time.monotonic()
    results = asyncio.run(main())
    assert time.monotonic() - start < 1.1
    assert len({int(r["PID"][0]) for r in results}) == 2  # one per instance


def test_infer_async_passes_keyword_arguments(server: stubhost.Server) -> None:
    a = np.arange(4, dtype=np.float32)
    out = asyncio.run(server.infer_async("add_sub", {"INPUT0": a, "INPUT1": a}, outputs=["OUTPUT1"],
                                         request_id="async-1", timeout=10.0))
    assert set(out) == {"OUTPUT1"}


def test_infer_async_raises_inference_error(server: stubhost.Server) -> None:
    async def main() -> None:
        await server.infer_async("add_sub", {"INPUT0": np.zeros(4, np.float32)})

    with pytest.raises(stubhost.InferenceError) as info:
        asyncio.run(main())
    assert info.value.code == "INVALID_ARG"


def test_infer_async_does_not_block_the_event_loop(server: stubhost.Server) -> None:
    async def main() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        await server.infer_async("sleepy", {"INPUT0": np.zeros(1, np.float32)}, parameters={"sleep": 0.3})
        task.cancel()
        return ticks

    assert asyncio.run(main()) >= 10


def test_eight_threads_two_hundred_requests_each_on_two_instances(server: stubhost.Server) -> None:
    errors: list[str] = []
    pids: Counter[int] = Counter()
    lock = threading.Lock()
    barrier = threading.Barrier(THREADS)

    def worker(k: int) -> None:
        barrier.wait()
        local: Counter[int] = Counter()
        for i in range(PER_THREAD):
            x = np.array([k, i, k * 1000 + i], dtype=np.float32)
            try:
                out = server.infer("sleepy", {"INPUT0": x})
            except Exception as e:  # noqa: BLE001 - collected and reported below
                errors.append(f"thread {k} request {i}: {e!r}")
                continue
            if not np.array_equal(out["OUTPUT0"], x):
                errors.append(f"thread {k} request {i}: got {out['OUTPUT0']} for {x}")
            local[int(out["PID"][0])] += 1
        with lock:
            pids.update(local)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a worker hangs"
    assert errors == []
    assert sum(pids.values()) == THREADS * PER_THREAD
    instance_pids = {instance(server, "sleepy", index=i).process.pid for i in range(2)}
    assert set(pids) == instance_pids, f"requests per stub: {dict(pids)}"


def test_threads_on_different_models_at_once(server: stubhost.Server) -> None:
    errors: list[str] = []

    def add_sub(k: int) -> None:
        for i in range(100):
            a = np.full(4, k, np.float32)
            b = np.full(4, i, np.float32)
            out = server.infer("add_sub", {"INPUT0": a, "INPUT1": b})
            if not np.array_equal(out["OUTPUT0"], a + b):
                errors.append(f"add_sub {k}/{i}")

    def upper(k: int) -> None:
        for i in range(100):
            word = f"t{k}-r{i}-abc".encode()
            out = server.infer("string_upper", {"INPUT0": np.array([word], dtype=np.object_)})
            if out["OUTPUT0"].tolist() != [word.upper()]:
                errors.append(f"string_upper {k}/{i}: {out['OUTPUT0']}")

    threads = [threading.Thread(target=f, args=(k,)) for k in range(3) for f in (add_sub, upper)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
