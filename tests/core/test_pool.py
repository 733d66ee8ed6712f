"""The growable pool: allocation, reuse, growth seen by other processes, exhaustion, forged handles."""

from __future__ import annotations

import os

import numpy as np
import pytest

from stubhost import _core
from tests.core import workers
from tests.core.procs import join_peer

MiB = 1 << 20


def run(spawn, target, *args, timeout: float = 30) -> None:
    proc = spawn.Process(target=target, args=args)
    proc.start()
    join_peer(proc, timeout)


def test_allocations_are_aligned_and_reused_after_free(pool):
    handles = [pool.allocate(n) for n in (1, 63, 64, 65, 1000, 4096)]
    assert all(_core.handle_offset(h) % 64 == 0 for h in handles)
    assert len(set(handles)) == len(handles)
    assert [pool.allocation_size(h) for h in handles] == [1, 63, 64, 65, 1000, 4096]
    pool.free(handles[4])
    assert pool.allocate(1000) == handles[4]
    for h in handles:
        pool.free(h)
    assert pool.used_bytes == 0 and pool.allocations == 0
    pool.check()


def test_usage_counters_return_to_baseline(pool):
    base_used, base_free = pool.used_bytes, pool.free_bytes
    handles = [pool.allocate(300) for _ in range(50)]
    assert pool.used_bytes > base_used and pool.free_bytes < base_free
    assert pool.allocations == 50
    for h in handles:
        pool.free(h)
    assert (pool.used_bytes, pool.free_bytes) == (base_used, base_free)


def test_fragmentation_holes_are_skipped_then_coalesced(pool):
    small = [pool.allocate(1000) for _ in range(200)]
    for h in small[::2]:
        pool.free(h)  # 100 holes of ~1 KiB each, none big enough for 64 KiB
    segments = pool.segment_count
    big = pool.allocate(64 * 1024)
    assert all(abs(_core.handle_offset(big) - _core.handle_offset(h)) > 1024 for h in small[::2])
    assert pool.segment_count == segments  # the tail of the segment served it, no growth
    pool.check()
    for h in small[1::2]:
        pool.free(h)
    pool.free(big)
    pool.check()
    # Everything merged back: one allocation of almost the whole segment fits without growing.
    whole = pool.allocate(pool.capacity_bytes - 64 * 2)
    assert pool.segment_count == segments
    pool.free(whole)


def test_reverse_and_random_free_orders_keep_invariants(pool):
    rng = np.random.default_rng(7)
    handles = [pool.allocate(int(n)) for n in rng.integers(1, 20000, size=300)]
    for i in rng.permutation(len(handles)):
        pool.free(handles[i])
        if i % 37 == 0:
            pool.check()
    assert pool.used_bytes == 0
    pool.check()


def test_large_tensor_costs_one_growth_step():
    with _core.Pool.create(initial_size=MiB, growth_size=MiB, max_size=256 * MiB) as pool:
        h = pool.allocate(64 * MiB)
        assert pool.segment_count == 2
        assert pool.capacity_bytes >= 64 * MiB
        pool.free(h)


def test_growth_is_seen_by_a_second_process(pool, spawn):
    big = pool.allocate(3 * MiB)  # beyond segment 0
    assert _core.handle_segment(big) >= 1
    run(spawn, workers.write_pattern, pool.name, big, 3 * MiB, 7)
    assert np.frombuffer(pool.view(big, 3 * MiB), dtype=np.uint8).min() == 7
    pool.free(big)


def test_second_process_can_grow_the_pool_and_the_owner_maps_it_lazily(pool, spawn):
    q = _core.MessageQueue.create(pool, 4)
    segments = pool.segment_count
    run(spawn, workers.grow_and_report, pool.name, 2 * MiB, 9, q.handle)
    h = q.pop(timeout=5)
    assert pool.segment_count == segments + 1
    assert _core.handle_segment(h) == segments
    assert np.frombuffer(pool.view(h, 2 * MiB), dtype=np.uint8).max() == 9
    pool.free(h)
    pool.check()


def test_exhaustion_is_a_clear_error_and_recovers_after_frees():
    with _core.Pool.create(initial_size=MiB, growth_size=MiB, max_size=4 * MiB) as pool:
        handles = []
        with pytest.raises(_core.PoolFullError, match="pool is full.*maximum"):
            for _ in range(100):
                handles.append(pool.allocate(512 * 1024))
        assert len(handles) >= 4
        pool.free(handles.pop())
        handles.append(pool.allocate(512 * 1024))
        for h in handles:
            pool.free(h)
        pool.check()


def test_request_larger_than_the_maximum_is_refused():
    with _core.Pool.create(initial_size=MiB, max_size=8 * MiB) as pool:
        with pytest.raises(_core.PoolFullError):
            pool.allocate(16 * MiB)
        with pytest.raises(_core.PoolFullError):
            pool.allocate(2**64 - 1)


@pytest.mark.parametrize(
    "make",
    [
        lambda p, h: (_core.make_handle(300, 64), 8),  # segment index beyond the limit
        lambda p, h: (_core.make_handle(17, 64), 8),  # segment that does not exist
        lambda p, h: (_core.make_handle(0, p.capacity_bytes * 4), 8),  # offset past the end
        lambda p, h: (h, 8 * MiB),  # length past the end
        lambda p, h: (h, 2**64 - 1),  # offset + length overflows
        lambda p, h: (_core.make_handle(0, 0), 8),  # the pool header itself
    ],
    ids=["segment-beyond-limit", "missing-segment", "offset-past-end", "length-past-end", "overflow", "header"],
)
def test_forged_handles_raise_instead_of_crashing(pool, make):
    h = pool.allocate(64)
    handle, length = make(pool, h)
    with pytest.raises(_core.InvalidHandleError):
        pool.view(handle, length)
    pool.free(h)


def test_free_rejects_foreign_interior_and_double_frees(pool):
    h = pool.allocate(1000)
    with pytest.raises(_core.InvalidHandleError):
        pool.free(h + 64)  # interior of an allocation
    with pytest.raises(_core.InvalidHandleError):
        pool.free(h + 3)  # misaligned
    with pytest.raises(_core.InvalidHandleError):
        pool.free(_core.make_handle(40, 128))
    pool.free(h)
    with pytest.raises(_core.InvalidHandleError, match="freed twice"):
        pool.free(h)
    pool.check()


def test_views_are_zero_copy_and_outlive_close():
    pool = _core.Pool.create(initial_size=MiB)
    h = pool.allocate(16)
    a = np.frombuffer(pool.view(h, 16), dtype=np.uint8)
    b = np.frombuffer(pool.view(h, 16), dtype=np.uint8)
    a[:] = 5
    assert b.tolist() == [5] * 16
    assert pool.handle_of(a.ctypes.data) == h
    pool.close()
    assert not [n for n in os.listdir("/dev/shm") if pool.name.lstrip("/") in n]
    assert b.sum() == 80  # mapping survives while a view holds the pool
    with pytest.raises(ValueError, match="closed"):
        pool.allocate(8)


def test_attach_refuses_missing_and_foreign_segments(pool):
    with pytest.raises(_core.ShmError):
        _core.Pool.attach("/stubhost_does_not_exist")
    name = "/stubhost_foreign_test"
    fd = os.open("/dev/shm" + name, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, MiB)
        with pytest.raises(_core.CorruptionError, match="not a stubhost pool"):
            _core.Pool.attach(name)
    finally:
        os.close(fd)
        os.unlink("/dev/shm" + name)


def test_segment_names_are_private_and_unguessable(pool):
    st = os.stat("/dev/shm" + pool.name)
    assert st.st_mode & 0o777 == 0o600
    other = _core.Pool.create(initial_size=MiB)
    try:
        assert other.name != pool.name
        assert len(pool.name.rsplit("_", 1)[-1]) == 16
    finally:
        other.close()


def test_full_dev_shm_is_reported_with_sizes():
    st = os.statvfs("/dev/shm")
    too_big = st.f_blocks * st.f_frsize * 2
    with pytest.raises(_core.ShmSpaceError, match=r"asked for .* free of .* in /dev/shm"):
        _core.Pool.create(initial_size=too_big, max_size=too_big)


def test_stale_unrecorded_segment_does_not_block_growth(pool):
    # A grower that died after creating segment 1 but before recording it leaves the name behind.
    stale = "/dev/shm" + pool.name + "_1"
    with open(stale, "wb") as f:
        f.write(b"\0" * 4096)
    h = pool.allocate(2 * MiB)
    assert _core.handle_segment(h) == 1 and pool.segment_count == 2
    assert os.path.getsize(stale) >= 2 * MiB  # replaced by a real segment
    pool.free(h)
    pool.check()


def test_attacher_limits_are_fixed_at_attach(pool, spawn):
    # The owner's limit holds even if the shared header's copy is rewritten afterwards.
    with open("/dev/shm" + pool.name, "r+b") as f:
        import mmap

        with mmap.mmap(f.fileno(), 4096) as m:
            max_bytes_offset = 128
            m[max_bytes_offset : max_bytes_offset + 8] = (1 << 40).to_bytes(8, "little")
    with pytest.raises(_core.PoolFullError):
        pool.allocate(128 * MiB)  # over the 64 MiB the owner created the pool with


def test_grower_killed_before_recording_leaves_a_usable_pool(pool):
    # Simulates a grower that died after creating and formatting segment 1 but before publishing
    # segment_count: the segment exists on disk, full of data, yet unlisted.
    stale = "/dev/shm" + pool.name + "_1"
    with open(stale, "wb") as f:
        f.write(b"\xab" * (2 * MiB))
    pool.check()  # the unlisted segment is invisible to the walk
    h = pool.allocate(3 * MiB)  # growth replaces it
    assert _core.handle_segment(h) == 1
    pool.free(h)
    pool.check()
