"""SharedMemoryRegistry: Triton's system and CUDA shared-memory semantics, bounds, in-flight safety.

Regions are made the way a client makes them, with tritonclient.utils.shared_memory.
"""

from __future__ import annotations

import gc
import os
import secrets
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from hypothesis import given, settings
from hypothesis import strategies as st

from stubhost.host.errors import InferenceError
from stubhost.server.shm_registry import (
    CUDA_IPC_HANDLE_SIZE,
    RegionLease,
    SharedMemoryRegistry,
)
from stubhost.server.types import ShmRef

SHM_DIR = "/dev/shm"
PAGE = os.sysconf("SC_PAGE_SIZE")
U64_MAX = 2**64 - 1
TAG = f"shmreg_{os.getpid()}_"  # every object these tests create carries it (or a stubhost_<pid>_ name)


def _ours(names: set[str]) -> set[str]:
    # Only names this process makes: other test runs may create and remove objects concurrently.
    return {n for n in names if n.startswith((TAG, f"stubhost_{os.getpid()}_"))}


@pytest.fixture(autouse=True)
def no_dev_shm_leftovers() -> Iterator[None]:
    """Fails a test that leaves an object of its own in /dev/shm (and removes it)."""
    before = set(os.listdir(SHM_DIR))
    yield
    gc.collect()
    leftovers = _ours(set(os.listdir(SHM_DIR)) - before)
    for name in leftovers:
        try:
            os.unlink(os.path.join(SHM_DIR, name))
        except FileNotFoundError:
            pass
    assert not leftovers, f"test left objects in /dev/shm: {sorted(leftovers)}"


def mapped(key: str) -> bool:
    """Whether this process still maps the shm object ``key`` (deleted or not)."""
    path = os.path.join(SHM_DIR, key.lstrip("/"))
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].rstrip("\n").removesuffix(" (deleted)") == path:
                return True
    return False


class Regions:
    """Client-side regions made with tritonclient; destroyed at teardown unless a test did it."""

    def __init__(self) -> None:
        self.handles: dict[str, object] = {}

    def create(self, size: int, data: np.ndarray | None = None, offset: int = 0) -> tuple[object, str]:
        key = f"/{TAG}{secrets.token_hex(6)}"
        handle = shm.create_shared_memory_region(key.lstrip("/"), key, size, create_only=True)
        self.handles[key] = handle
        if data is not None:
            shm.set_shared_memory_region(handle, [data], offset=offset)
        return handle, key

    def destroy(self, key: str) -> None:
        shm.destroy_shared_memory_region(self.handles.pop(key))

    def destroy_all(self) -> None:
        for key in list(self.handles):
            self.destroy(key)


@pytest.fixture
def regions() -> Iterator[Regions]:
    r = Regions()
    try:
        yield r
    finally:
        gc.collect()  # numpy views of a client mapping would make its close() fail
        r.destroy_all()


@pytest.fixture
def registry() -> Iterator[SharedMemoryRegistry]:
    reg = SharedMemoryRegistry()
    try:
        yield reg
    finally:
        reg.close()


def error(fn: Callable[..., object], *args: object, **kwargs: object) -> InferenceError:
    with pytest.raises(InferenceError) as info:
        fn(*args, **kwargs)
    return info.value


class FakeCudaHandle:
    def __init__(self, raw: bytes, device_id: int, byte_size: int) -> None:
        self.raw, self.device_id, self.byte_size = raw, device_id, byte_size
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class FakeOpener:
    def __init__(self) -> None:
        self.opened: list[FakeCudaHandle] = []

    def __call__(self, raw: bytes, device_id: int, byte_size: int) -> FakeCudaHandle:
        handle = FakeCudaHandle(raw, device_id, byte_size)
        self.opened.append(handle)
        return handle


RAW = bytes(range(CUDA_IPC_HANDLE_SIZE))


# ---------------------------------------------------------------------------- system regions


def test_register_acquire_reads_the_clients_bytes(registry: SharedMemoryRegistry, regions: Regions) -> None:
    data = np.arange(16, dtype=np.int32)
    _, key = regions.create(64, data)
    registry.register_system("input0", key, 0, 64)

    with registry.acquire(ShmRef("input0", 64)) as lease:
        assert lease.kind == "system" and lease.name == "input0" and lease.device_id == 0
        assert lease.buffer is not None and not lease.buffer.readonly
        assert bytes(lease.buffer) == data.tobytes()
    with registry.acquire(ShmRef("input0", byte_size=16, offset=8)) as lease:
        assert lease.buffer is not None and len(lease.buffer) == 16
        np.testing.assert_array_equal(np.frombuffer(lease.buffer, np.int32).copy(), data[2:6])


def test_registration_offset_is_added_to_request_offsets(registry: SharedMemoryRegistry, regions: Regions) -> None:
    data = np.arange(PAGE, dtype=np.uint8)  # values wrap at 256, positions still tell
    _, key = regions.create(3 * PAGE + 100, data, offset=2 * PAGE + 7)
    # An offset that is neither page aligned nor inside the first page.
    registry.register_system("r", key, 2 * PAGE + 7, PAGE)
    with registry.acquire(ShmRef("r", 10, offset=5)) as lease:
        assert lease.buffer is not None
        assert bytes(lease.buffer) == data[5:15].tobytes()
    with registry.acquire(ShmRef("r", 1, offset=PAGE - 1)) as lease:
        assert lease.buffer is not None and bytes(lease.buffer) == data[-1:].tobytes()


def test_write_through_a_lease_is_seen_by_the_client(registry: SharedMemoryRegistry, regions: Regions) -> None:
    handle, key = regions.create(64)
    registry.register_system("out", key, 16, 48)
    values = np.array([1.5, -2.0, 3.25, 7.0], dtype=np.float32)
    with registry.acquire(ShmRef("out", values.nbytes, offset=8)) as lease:
        assert lease.buffer is not None
        lease.buffer[:] = values.tobytes()
    got = shm.get_contents_as_numpy(handle, np.float32, [4], offset=16 + 8).copy()
    np.testing.assert_array_equal(got, values)


@pytest.mark.parametrize("form", ["/{}", "{}", "//{}"])
def test_key_with_or_without_leading_slash(registry: SharedMemoryRegistry, regions: Regions, form: str) -> None:
    # glibc's shm_open drops leading slashes, as it does for Triton.
    _, key = regions.create(8, np.arange(2, dtype=np.int32))
    registry.register_system("r", form.format(key.lstrip("/")), 0, 8)
    with registry.acquire(ShmRef("r", 8)) as lease:
        assert lease.buffer is not None and bytes(lease.buffer) == np.arange(2, dtype=np.int32).tobytes()
    assert registry.system_status("r")[0]["key"] == form.format(key.lstrip("/"))


def test_whole_object_and_exact_end(registry: SharedMemoryRegistry, regions: Regions) -> None:
    _, key = regions.create(64)
    registry.register_system("a", key, 0, 64)
    registry.register_system("b", key, 63, 1)  # two names on one object, as Triton allows
    registry.register_system("c", key, 60, 4)
    assert [s["name"] for s in registry.system_status()] == ["a", "b", "c"]


# ---------------------------------------------------------------------------- registration errors


def test_missing_object(registry: SharedMemoryRegistry) -> None:
    key = f"/{TAG}does_not_exist"
    e = error(registry.register_system, "r", key, 0, 8)
    assert (e.code, e.message) == ("INTERNAL", f"Unable to open shared memory region: '{key}'")
    assert registry.system_status() == []


@pytest.mark.parametrize("key", ["", "/", "/a/b", f"/{TAG}x/y", ".", "..", "a\0b", "\udcff", "x" * 300])
def test_bad_keys(registry: SharedMemoryRegistry, key: str) -> None:
    e = error(registry.register_system, "r", key, 0, 8)
    assert e.code == "INTERNAL" and e.message.startswith("Unable to open shared memory region")


def test_symlink_is_not_followed(registry: SharedMemoryRegistry, regions: Regions) -> None:
    _, key = regions.create(64)
    link = f"{TAG}symlink"
    os.symlink(os.path.join(SHM_DIR, key.lstrip("/")), os.path.join(SHM_DIR, link))
    try:
        e = error(registry.register_system, "r", "/" + link, 0, 8)
        assert e.code == "INTERNAL"
    finally:
        os.unlink(os.path.join(SHM_DIR, link))


@pytest.mark.parametrize(
    ("offset", "byte_size"),
    [
        (0, 65),  # Triton's test_register_out_of_bound cases, for a 64-byte object
        (1, 64),
        (64, 1),
        (65, 0),
        (0, 0),  # an empty mapping: mmap refuses it in Triton
        (64, 0),
        (-1, 8),
        (0, -1),
        (-(2**63), 8),
        (U64_MAX, 1),
        (1, U64_MAX),
        (U64_MAX, U64_MAX),
        (2**64, 8),
        (8, 2**64),
        (2**64 - 32, 64),  # wraps to 32 in uint64
        pytest.param(10**5000, 8, id="10**5000"),  # more digits than int->str allows: never formatted
        (1.0, 8),
        (0, "8"),
        (True, 8),
        (None, 8),
    ],
)
def test_out_of_bounds_and_invalid_registration(
    registry: SharedMemoryRegistry, regions: Regions, offset: object, byte_size: object
) -> None:
    _, key = regions.create(64)
    e = error(registry.register_system, "r", key, offset, byte_size)
    assert (e.code, e.message) == ("INVALID_ARG", "failed to register shared memory region 'r': invalid args")
    assert registry.system_status() == []


def test_register_needs_a_name(registry: SharedMemoryRegistry, regions: Regions) -> None:
    _, key = regions.create(8)
    e = error(registry.register_system, "", key, 0, 8)
    assert e.code == "INVALID_ARG"
    assert e.message == "'region name' is necessary to register system shared memory region"
    e = error(registry.register_cuda, "", RAW, 0, 8)
    assert e.message == "'region name' is necessary to register cuda shared memory region"


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 3 * PAGE),
    offset=st.one_of(st.integers(-(2**65), 2**65), st.integers(-2, 3 * PAGE + 2)),
    byte_size=st.one_of(st.integers(-(2**65), 2**65), st.integers(-2, 3 * PAGE + 2)),
)
def test_registration_bounds_property(size: int, offset: int, byte_size: int) -> None:
    # Accepted exactly when Triton's uint64 check would pass and the mapping is not empty.
    expected = offset >= 0 and byte_size > 0 and offset + byte_size <= size
    r = Regions()
    reg = SharedMemoryRegistry()
    try:
        _, key = r.create(size)
        if expected:
            reg.register_system("r", key, offset, byte_size)
            assert reg.system_status("r") == [{"name": "r", "key": key, "offset": offset, "byte_size": byte_size}]
        else:
            e = error(reg.register_system, "r", key, offset, byte_size)
            assert e.code == "INVALID_ARG"
    finally:
        reg.close()
        r.destroy_all()


# ---------------------------------------------------------------------------- reserved keys


def _pool_like_name() -> str:
    return f"stubhost_{os.getpid()}_{secrets.token_hex(8)}"


@pytest.mark.parametrize(
    "form", ["/{}", "{}", "//{}", "/{}_2", "{}_17", "/{}/x"]
)
@pytest.mark.parametrize("exists", [True, False])
def test_pool_segments_are_never_registrable(
    registry: SharedMemoryRegistry, regions: Regions, form: str, exists: bool
) -> None:
    pool = _pool_like_name()
    key = form.format(pool)
    handle = None
    if exists:
        handle = shm.create_shared_memory_region("pool", "/" + key.strip("/").split("/")[0], 64)
    try:
        e = error(registry.register_system, "r", key, 0, 8)
    finally:
        if handle is not None:
            shm.destroy_shared_memory_region(handle)
    # The same answer whether or not the segment exists, and no segment name in it.
    assert (e.code, e.message) == (
        "INVALID_ARG",
        "cannot register shared memory region 'r' as the key contains a reserved prefix",
    )
    assert pool not in e.message and "stubhost" not in e.message
    assert registry.system_status() == []


def test_reserved_check_precedes_duplicate_check(registry: SharedMemoryRegistry, regions: Regions) -> None:
    _, key = regions.create(8)
    registry.register_system("r", key, 0, 8)
    e = error(registry.register_system, "r", "/" + _pool_like_name(), 0, 8)
    assert e.code == "INVALID_ARG"  # not ALREADY_EXISTS: nothing about the key leaks either way


def test_extra_reserved_prefix(regions: Regions) -> None:
    _, key = regions.create(8)
    with SharedMemoryRegistry(reserved_prefixes=[TAG]) as reg:
        e = error(reg.register_system, "r", key, 0, 8)
        assert e.code == "INVALID_ARG" and key.lstrip("/") not in e.message
        e = error(reg.register_system, "r", "/" + _pool_like_name(), 0, 8)  # still reserved
        assert e.code == "INVALID_ARG"


def test_hard_link_to_a_pool_segment_is_refused(registry: SharedMemoryRegistry) -> None:
    pool = _pool_like_name()
    handle = shm.create_shared_memory_region("pool", "/" + pool, 64)
    alias = f"{TAG}alias"
    os.link(os.path.join(SHM_DIR, pool), os.path.join(SHM_DIR, alias))
    try:
        e = error(registry.register_system, "r", "/" + alias, 0, 8)
        assert e.code == "INVALID_ARG" and "reserved prefix" in e.message
        assert pool not in e.message
        assert registry.system_status() == []
    finally:
        os.unlink(os.path.join(SHM_DIR, alias))
        shm.destroy_shared_memory_region(handle)


def test_hard_link_between_client_objects_is_fine(registry: SharedMemoryRegistry, regions: Regions) -> None:
    _, key = regions.create(8)
    alias = f"{TAG}alias2"
    os.link(os.path.join(SHM_DIR, key.lstrip("/")), os.path.join(SHM_DIR, alias))
    try:
        registry.register_system("r", "/" + alias, 0, 8)
    finally:
        os.unlink(os.path.join(SHM_DIR, alias))


# ---------------------------------------------------------------------------- one namespace


def test_duplicate_names_across_kinds(regions: Regions) -> None:
    _, key = regions.create(64)
    opener = FakeOpener()
    with SharedMemoryRegistry(cuda_opener=opener) as reg:
        reg.register_system("a", key, 0, 64)
        reg.register_cuda("g", RAW, 0, 128)
        for call in (
            lambda: reg.register_system("a", key, 0, 8),
            lambda: reg.register_cuda("a", RAW, 0, 8),
            lambda: reg.register_system("g", key, 0, 8),
            lambda: reg.register_cuda("g", RAW, 0, 8),
        ):
            e = error(call)
            assert e.code == "ALREADY_EXISTS"
            assert e.message in ("shared memory region 'a' already in manager", "shared memory region 'g' already in manager")
        # The originals are untouched, and the rejected CUDA registrations opened nothing.
        assert reg.system_status() == [{"name": "a", "key": key, "offset": 0, "byte_size": 64}]
        assert reg.cuda_status() == [{"name": "g", "device_id": 0, "byte_size": 128}]
        assert len(opener.opened) == 1


# ---------------------------------------------------------------------------- status


def test_status(regions: Regions) -> None:
    _, k1 = regions.create(64)
    _, k2 = regions.create(32)
    with SharedMemoryRegistry(cuda_opener=FakeOpener()) as reg:
        assert reg.system_status() == [] and reg.cuda_status() == []
        reg.register_system("zeta", k1, 16, 48)
        reg.register_system("alpha", k2, 0, 32)
        reg.register_cuda("gpu", RAW, 1, 256)
        assert reg.system_status() == [
            {"name": "alpha", "key": k2, "offset": 0, "byte_size": 32},
            {"name": "zeta", "key": k1, "offset": 16, "byte_size": 48},
        ]
        assert reg.system_status("") == reg.system_status()
        assert reg.system_status("zeta") == [{"name": "zeta", "key": k1, "offset": 16, "byte_size": 48}]
        assert reg.cuda_status() == [{"name": "gpu", "device_id": 1, "byte_size": 256}]
        assert reg.cuda_status("gpu") == reg.cuda_status()

        e = error(reg.system_status, "nope")
        assert (e.code, e.message) == ("NOT_FOUND", "Unable to find system shared memory region: 'nope'")
        e = error(reg.cuda_status, "nope")
        assert (e.code, e.message) == ("NOT_FOUND", "Unable to find cuda shared memory region: 'nope'")
        e = error(reg.system_status, "gpu")
        assert (e.code, e.message) == (
            "NOT_FOUND",
            "The region named 'gpu' is registered as CUDA shared memory, not system shared memory",
        )
        e = error(reg.cuda_status, "alpha")
        assert (e.code, e.message) == (
            "NOT_FOUND",
            "The region named 'alpha' is registered as system shared memory, not CUDA shared memory",
        )


# ---------------------------------------------------------------------------- acquire errors


def test_acquire_unknown_region(registry: SharedMemoryRegistry) -> None:
    e = error(registry.acquire, ShmRef("nope", 8))
    assert (e.code, e.message) == ("NOT_FOUND", "Unable to find shared memory region: 'nope'")


@pytest.mark.parametrize(
    ("offset", "byte_size", "message"),
    [
        (64, 0, "Invalid offset for shared memory region: 'r'"),  # offset must be < size, as in Triton
        (64, 8, "Invalid offset for shared memory region: 'r'"),
        (-1, 8, "Invalid offset for shared memory region: 'r'"),
        (2**64 - 32, 8, "Invalid offset for shared memory region: 'r'"),
        pytest.param(10**5000, 8, "Invalid offset for shared memory region: 'r'", id="offset-10**5000"),
        (60, 8, "Invalid offset + byte size for shared memory region: 'r'"),
        (0, 65, "Invalid offset + byte size for shared memory region: 'r'"),
        (0, -1, "Invalid offset + byte size for shared memory region: 'r'"),
        (0, 2**64, "Invalid offset + byte size for shared memory region: 'r'"),
        pytest.param(0, 10**5000, "Invalid offset + byte size for shared memory region: 'r'", id="size-10**5000"),
        (0, U64_MAX, "Invalid offset + byte size for shared memory region: 'r'"),
        (
            32,
            2**64 - 32,
            (
                f"Integer overflow detected: byte_size ({2**64 - 32}) + offset (32) exceeds maximum value "
                f"({U64_MAX}) for region 'r'"
            ),
        ),
        (1.5, 8, "Invalid offset for shared memory region: 'r'"),
        (0, "8", "Invalid offset + byte size for shared memory region: 'r'"),
    ],
)
def test_acquire_out_of_bounds(
    registry: SharedMemoryRegistry, regions: Regions, offset: object, byte_size: object, message: str
) -> None:
    _, key = regions.create(128)
    registry.register_system("r", key, 32, 64)  # the bounds are the registered 64, not the object's 128
    e = error(registry.acquire, ShmRef("r", byte_size, offset))  # type: ignore[arg-type]
    assert (e.code, e.message) == ("INVALID_ARG", message)


def test_acquire_kind_hint(regions: Regions) -> None:
    _, key = regions.create(8)
    with SharedMemoryRegistry(cuda_opener=FakeOpener()) as reg:
        reg.register_system("s", key, 0, 8)
        reg.register_cuda("g", RAW, 0, 8)
        reg.acquire(ShmRef("s", 8), kind_hint="system").release()
        reg.acquire(ShmRef("g", 8), kind_hint="cuda").release()
        e = error(reg.acquire, ShmRef("s", 8), kind_hint="cuda")
        assert e.code == "NOT_FOUND" and "registered as system shared memory" in e.message
        e = error(reg.acquire, ShmRef("g", 8), kind_hint="system")
        assert e.code == "NOT_FOUND" and "registered as CUDA shared memory" in e.message


def test_acquire_bounds_property(regions: Regions) -> None:
    size, reg_offset = 2 * PAGE + 3, PAGE + 5
    pattern = np.frombuffer(os.urandom(size), np.uint8)
    _, key = regions.create(reg_offset + size, pattern, offset=reg_offset)
    with SharedMemoryRegistry() as reg:
        reg.register_system("r", key, reg_offset, size)
        edges = st.sampled_from([0, 1, size - 1, size, size + 1, U64_MAX, 2**64, -1, U64_MAX - size])
        values = st.one_of(edges, st.integers(-2, size + 2), st.integers(-(2**70), 2**70))

        @settings(max_examples=500, deadline=None)
        @given(offset=values, byte_size=values)
        def check(offset: int, byte_size: int) -> None:
            ok = 0 <= offset < size and byte_size >= 0 and offset + byte_size <= size
            if not ok:
                e = error(reg.acquire, ShmRef("r", byte_size, offset))
                assert e.code == "INVALID_ARG"
                return
            with reg.acquire(ShmRef("r", byte_size, offset)) as lease:
                assert lease.buffer is not None and len(lease.buffer) == byte_size
                assert bytes(lease.buffer) == pattern[offset : offset + byte_size].tobytes()

        check()


# ---------------------------------------------------------------------------- unregister and leases


def test_unregister_unknown_is_a_noop(regions: Regions) -> None:
    _, key = regions.create(8)
    with SharedMemoryRegistry(cuda_opener=FakeOpener()) as reg:
        reg.unregister_system("nope")
        reg.unregister_cuda("nope")
        reg.register_system("s", key, 0, 8)
        reg.register_cuda("g", RAW, 0, 8)
        reg.unregister_cuda("s")  # the other kind: ignored, as in Triton
        reg.unregister_system("g")
        assert [s["name"] for s in reg.system_status()] == ["s"]
        assert [s["name"] for s in reg.cuda_status()] == ["g"]
        reg.unregister_system("s")
        reg.unregister_system("s")  # twice is fine
        assert reg.system_status() == []


def test_unregister_frees_the_mapping(registry: SharedMemoryRegistry, regions: Regions) -> None:
    _, key = regions.create(64)
    registry.register_system("r", key, 0, 64)
    regions.destroy(key)  # the client's own mapping is gone, the object unlinked
    assert mapped(key)
    registry.unregister_system("r")
    assert not mapped(key)


def test_unregister_while_leased_keeps_the_buffer_until_release(
    registry: SharedMemoryRegistry, regions: Regions
) -> None:
    data = np.arange(16, dtype=np.int32)
    _, key = regions.create(64, data)
    registry.register_system("r", key, 0, 64)
    lease = registry.acquire(ShmRef("r", 64))
    registry.unregister_system("r")

    # The name is gone at once ...
    assert registry.system_status() == []
    assert error(registry.acquire, ShmRef("r", 8)).code == "NOT_FOUND"
    assert error(registry.system_status, "r").code == "NOT_FOUND"
    _, key2 = regions.create(8, np.array([42, 43], dtype=np.int32))
    registry.register_system("r", key2, 0, 8)  # ... and free for another region
    with registry.acquire(ShmRef("r", 8)) as other:
        assert other.buffer is not None and np.frombuffer(other.buffer, np.int32).tolist() == [42, 43]

    # ... but the old window still works, even after the client destroyed its object.
    regions.destroy(key)
    assert lease.buffer is not None
    assert bytes(lease.buffer) == data.tobytes()
    lease.buffer[:4] = b"\xff\xff\xff\xff"
    assert mapped(key)

    lease.release()
    assert lease.buffer is None
    assert not mapped(key)
    lease.release()  # idempotent


def test_mapping_lives_while_any_lease_does(registry: SharedMemoryRegistry, regions: Regions) -> None:
    _, key = regions.create(64)
    registry.register_system("r", key, 0, 64)
    leases = [registry.acquire(ShmRef("r", 8, offset=8 * i)) for i in range(4)]
    regions.destroy(key)
    registry.unregister_system("r")
    for lease in leases[:-1]:
        lease.release()
        assert mapped(key)
    leases[-1].release()
    assert not mapped(key)


def test_views_kept_past_release_stay_valid(registry: SharedMemoryRegistry, regions: Regions) -> None:
    data = np.arange(16, dtype=np.int32)
    _, key = regions.create(64, data)
    registry.register_system("r", key, 0, 64)
    lease = registry.acquire(ShmRef("r", 64))
    assert lease.buffer is not None
    view = np.frombuffer(lease.buffer, np.int32)  # a caller that keeps a derived view (it should not)
    regions.destroy(key)
    registry.unregister_system("r")
    lease.release()  # must not raise
    np.testing.assert_array_equal(view, data)  # memory safety does not depend on the caller
    del view
    gc.collect()
    assert not mapped(key)


def test_forgotten_lease_is_released_when_collected(registry: SharedMemoryRegistry, regions: Regions) -> None:
    _, key = regions.create(64)
    registry.register_system("r", key, 0, 64)
    registry.acquire(ShmRef("r", 8))  # dropped at once
    regions.destroy(key)
    registry.unregister_system("r")
    gc.collect()
    assert not mapped(key)


def test_forgotten_cuda_lease_still_closes_the_handle() -> None:
    # A system mapping would die with its region object anyway; a CUDA handle needs close().
    opener = FakeOpener()
    with SharedMemoryRegistry(cuda_opener=opener) as reg:
        reg.register_cuda("g", RAW, 0, 64)
        reg.acquire(ShmRef("g", 8))  # dropped at once
        reg.unregister_cuda("g")
        gc.collect()
        assert opener.opened[0].closed == 1


def test_lease_finalized_while_the_lock_is_held_is_released_later() -> None:
    opener = FakeOpener()
    with SharedMemoryRegistry(cuda_opener=opener) as reg:
        reg.register_cuda("g", RAW, 0, 64)
        lease = reg.acquire(ShmRef("g", 8))
        reg.unregister_cuda("g")
        with reg._lock:  # as if the collector ran inside one of the registry's critical sections
            del lease
            gc.collect()
        assert opener.opened[0].closed == 0
        reg.cuda_status()  # the next operation releases it
        assert opener.opened[0].closed == 1


def test_unregister_all(regions: Regions) -> None:
    keys = [regions.create(16)[1] for _ in range(3)]
    opener = FakeOpener()
    with SharedMemoryRegistry(cuda_opener=opener) as reg:
        for i, key in enumerate(keys):
            reg.register_system(f"s{i}", key, 0, 16)
        reg.register_cuda("g0", RAW, 0, 16)
        reg.register_cuda("g1", RAW, 1, 16)
        held = reg.acquire(ShmRef("s1", 16))

        reg.unregister_system()
        assert reg.system_status() == []
        assert [s["name"] for s in reg.cuda_status()] == ["g0", "g1"]
        assert held.buffer is not None and len(held.buffer) == 16

        reg.unregister_cuda("")  # the empty name means all, as in Triton
        assert reg.cuda_status() == []
        assert [h.closed for h in opener.opened] == [1, 1]
        held.release()
        assert len(reg) == 0


def test_close_unregisters_everything(regions: Regions) -> None:
    _, key = regions.create(16)
    opener = FakeOpener()
    reg = SharedMemoryRegistry(cuda_opener=opener)
    reg.register_system("s", key, 0, 16)
    reg.register_cuda("g", RAW, 0, 16)
    lease = reg.acquire(ShmRef("g", 4))
    reg.close()
    assert reg.system_status() == [] and reg.cuda_status() == []
    assert opener.opened[0].closed == 0  # in use
    lease.release()
    assert opener.opened[0].closed == 1
    reg.close()  # twice is fine


# ---------------------------------------------------------------------------- CUDA


def test_cuda_without_opener() -> None:
    with SharedMemoryRegistry() as reg:
        e = error(reg.register_cuda, "g", RAW, 0, 1024)
        assert (e.code, e.message) == (
            "INVALID_ARG",
            "failed to register CUDA shared memory region: 'g', GPUs not supported",
        )
        assert reg.cuda_status() == []
        reg.unregister_cuda("g")  # fine: nothing there


def test_cuda_with_fake_opener() -> None:
    opener = FakeOpener()
    with SharedMemoryRegistry(cuda_opener=opener) as reg:
        reg.register_cuda("g", bytearray(RAW), 3, 4096)
        (handle,) = opener.opened
        assert (handle.raw, handle.device_id, handle.byte_size) == (RAW, 3, 4096)
        assert reg.cuda_status("g") == [{"name": "g", "device_id": 3, "byte_size": 4096}]

        with reg.acquire(ShmRef("g", 1024, offset=2048)) as lease:
            assert lease.kind == "cuda" and lease.buffer is None and lease.device_id == 3
            assert lease.region.handle is handle and (lease.offset, lease.byte_size) == (2048, 1024)
            reg.unregister_cuda("g")
            assert handle.closed == 0  # in flight
            assert error(reg.acquire, ShmRef("g", 8)).code == "NOT_FOUND"
        assert handle.closed == 1

        reg.register_cuda("g", RAW, 0, 16)
        e = error(reg.acquire, ShmRef("g", 8, offset=16))
        assert (e.code, e.message) == ("INVALID_ARG", "Invalid offset for shared memory region: 'g'")
        reg.unregister_cuda("g")
        assert opener.opened[1].closed == 1


@pytest.mark.parametrize("raw", [RAW[:-1], RAW + b"\0", b"", "x" * 64, None])
def test_cuda_bad_raw_handle(raw: object) -> None:
    opener = FakeOpener()
    with SharedMemoryRegistry(cuda_opener=opener) as reg:
        e = error(reg.register_cuda, "g", raw, 0, 8)
        assert (e.code, e.message) == ("INVALID_ARG", "'raw_handle' must be a valid cudaIpcMemHandle_t")
        assert opener.opened == []


@pytest.mark.parametrize(("device_id", "byte_size"), [(-1, 8), (0, 0), (0, -8), (0, 2**64), (2**64, 8), (0, 8.0)])
def test_cuda_bad_args(device_id: object, byte_size: object) -> None:
    opener = FakeOpener()
    with SharedMemoryRegistry(cuda_opener=opener) as reg:
        e = error(reg.register_cuda, "g", RAW, device_id, byte_size)
        assert (e.code, e.message) == ("INVALID_ARG", "failed to register shared memory region 'g': invalid args")
        assert opener.opened == []


def test_cuda_opener_failures() -> None:
    def broken(raw: bytes, device_id: int, byte_size: int) -> object:
        raise RuntimeError("cudaIpcOpenMemHandle: invalid argument")

    with SharedMemoryRegistry(cuda_opener=broken) as reg:
        e = error(reg.register_cuda, "g", RAW, 0, 8)
        assert (e.code, e.message) == ("INVALID_ARG", "failed to register shared memory region 'g': invalid args")
        assert reg.cuda_status() == []

    def no_device(raw: bytes, device_id: int, byte_size: int) -> object:
        raise InferenceError(
            "UNAVAILABLE", "failed to register CUDA shared memory region 'g': no CUDA device available"
        )

    with SharedMemoryRegistry(cuda_opener=no_device) as reg:
        e = error(reg.register_cuda, "g", RAW, 0, 8)
        assert e.code == "UNAVAILABLE" and "no CUDA device available" in e.message
        assert reg.cuda_status() == []


# ---------------------------------------------------------------------------- threads


def test_thread_safety_smoke(regions: Regions) -> None:
    n_threads, rounds = 8, 200
    keys = [regions.create(64)[1] for _ in range(n_threads)]
    _, shared_key = regions.create(64)
    opener = FakeOpener()
    failures: list[BaseException] = []
    stop = threading.Event()
    reg = SharedMemoryRegistry(cuda_opener=opener)
    reg.register_system("shared", shared_key, 0, 64)

    def worker(i: int) -> None:
        try:
            for r in range(rounds):
                name = f"w{i}"
                reg.register_system(name, keys[i], 0, 64)
                with reg.acquire(ShmRef(name, 8, offset=8 * (r % 8))) as lease:
                    assert lease.buffer is not None
                    lease.buffer[:] = (i * rounds + r).to_bytes(8, "little")
                    assert int.from_bytes(lease.buffer, "little") == i * rounds + r
                reg.unregister_system(name)
                reg.register_cuda(f"g{i}", RAW, i, 64)
                reg.acquire(ShmRef(f"g{i}", 64)).release()
                reg.unregister_cuda(f"g{i}")
                try:
                    with reg.acquire(ShmRef("shared", 64)) as lease:
                        assert lease.buffer is not None and len(lease.buffer) == 64
                except InferenceError as e:
                    assert e.code == "NOT_FOUND"  # between the churner's unregister and register
        except BaseException as e:  # reported by the main thread
            failures.append(e)

    def churner() -> None:
        try:
            while not stop.is_set():
                reg.unregister_system("shared")
                try:
                    reg.register_system("shared", shared_key, 0, 64)
                except InferenceError as e:
                    assert e.code == "ALREADY_EXISTS"
                reg.system_status()
        except BaseException as e:
            failures.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    churn = threading.Thread(target=churner)
    churn.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    stop.set()
    churn.join(60)
    reg.close()
    assert not failures, failures[0]
    assert len(reg) == 0
    assert all(h.closed == 1 for h in opener.opened) and len(opener.opened) == n_threads * rounds
    for key in keys + [shared_key]:
        regions.destroy(key)
        assert not mapped(key)


def test_lease_is_the_public_type(registry: SharedMemoryRegistry, regions: Regions) -> None:
    _, key = regions.create(8)
    registry.register_system("r", key, 0, 8)
    lease = registry.acquire(ShmRef("r", 8))
    assert isinstance(lease, RegionLease) and "held" in repr(lease)
    lease.release()
    assert "released" in repr(lease)
