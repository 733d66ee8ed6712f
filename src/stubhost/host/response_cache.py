"""Triton's response cache (the ``local`` cache): one LRU store of successful responses, bounded
in bytes and shared by every model of a server, and the key a request is looked up by.

A model uses it when its configuration has ``response_cache { enable: true }`` and the server
has a cache (``Server(response_cache_bytes=...)``, ``stubhost serve --cache-config
local,size=N``); the lookup and insertion around a model's requests are in
:mod:`stubhost.host.cache_use`.

The key is a 128-bit BLAKE2b digest over the model's name, its version, the load it belongs to
(a reload never answers from the previous copy's entries), each input in name order (its name,
data type, shape and bytes; BYTES inputs in their serialized form) and the names of the
requested outputs. Triton's key is a 64-bit hash of the name, the version and each input's name
and bytes; the rest is stubhost's, so that a response never carries outputs that were not asked
for and two requests whose bytes agree but whose shapes differ never share an entry.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stubhost import _core
from stubhost.host.regions import RegionDestination, RegionTensor

log = logging.getLogger("stubhost")

_BYTES = int(_core.DataType.BYTES)

ENTRY_OVERHEAD = 128
"""Bytes counted for each entry besides its key, tensors and parameters (its bookkeeping)."""
TENSOR_OVERHEAD = 64
"""Bytes counted for each cached tensor besides its name, shape and data."""

INSERTED, EXISTS, TOO_LARGE = "inserted", "exists", "too large"  # what ``insert`` did


@dataclass(frozen=True)
class CachedResponse:
    """One cached response: its outputs (arrays the cache owns, never handed out) and parameters."""

    outputs: tuple[tuple[str, np.ndarray], ...]
    parameters: dict[str, Any]
    nbytes: int

    def take(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Copies of the outputs and parameters for one caller (who may change them)."""
        return {name: array.copy() for name, array in self.outputs}, dict(self.parameters)


def _data_size(array: np.ndarray) -> int:
    """The bytes a tensor's data takes: BYTES in their serialized form (a length prefix each)."""
    if array.dtype.kind in ("O", "S", "U"):
        return sum(4 + len(x if isinstance(x, bytes) else str(x).encode()) for x in array.ravel())
    return int(array.nbytes)


def cached_response(key: bytes, outputs: dict[str, Any], parameters: dict[str, Any]) -> CachedResponse | None:
    """A response as the cache keeps it (copies of its arrays), with its size in bytes; None
    when an output is not an array in host memory (an output the stub wrote elsewhere)."""
    kept: list[tuple[str, np.ndarray]] = []
    size = len(key) + ENTRY_OVERHEAD + (len(json.dumps(parameters)) if parameters else 0)
    for name, array in outputs.items():
        if type(array) is not np.ndarray:
            return None
        copy = array.copy()  # the response's arrays view a stub's pool, which is reused
        copy.flags.writeable = False
        kept.append((name, copy))
        size += len(name.encode()) + TENSOR_OVERHEAD + 8 * copy.ndim + _data_size(copy)
    return CachedResponse(tuple(kept), dict(parameters), size)


def _field(digest: Any, data: bytes) -> None:
    """One length-prefixed field (so that no two different sequences of fields hash alike)."""
    digest.update(struct.pack("<Q", len(data)))
    digest.update(data)


def _tensor_data(value: Any, dtype: int) -> Any:
    """A buffer holding an input's bytes as Triton hashes them, or None when it cannot be read
    here (an input in GPU memory, or in a client region the parent has no view of)."""
    if isinstance(value, RegionTensor):
        view = getattr(value, "view", None)
        return None if value.region.kind != "system" or view is None else view
    if not isinstance(value, np.ndarray):
        return None
    if dtype == _BYTES or value.dtype.kind in ("O", "S", "U"):
        try:
            return _core.encode_bytes(value.ravel())
        except (TypeError, ValueError, _core.CoreError):
            return None
    return np.ascontiguousarray(value)


def request_key(model: str, generation: int, version: int, tensors: Sequence[tuple[str, Any, int]],
                requested: Sequence[str | RegionDestination]) -> bytes | None:
    """The cache key of a checked request, or None when it cannot be hashed (then it is neither
    looked up nor cached, as Triton does with inputs outside CPU memory)."""
    digest = hashlib.blake2b(digest_size=16)
    _field(digest, model.encode())
    digest.update(struct.pack("<qQQ", version, generation, len(tensors)))
    for name, value, dtype in sorted(tensors, key=lambda t: t[0]):
        data = _tensor_data(value, dtype)
        if data is None:
            return None
        _field(digest, name.encode())
        shape = tuple(int(d) for d in value.shape)
        digest.update(struct.pack(f"<iI{len(shape)}q", dtype, len(shape), *shape))
        try:
            size = memoryview(data).nbytes
        except TypeError:
            return None
        digest.update(struct.pack("<Q", size))
        digest.update(data)
    names = sorted(o.name if isinstance(o, RegionDestination) else o for o in requested)
    digest.update(struct.pack("<Q", len(names)))  # 0: every output (not the same as naming them all)
    for name in names:
        _field(digest, name.encode())
    return digest.digest()


class ResponseCache:
    """The server's response cache: responses by key, least recently used evicted first, at most
    ``capacity`` bytes (keys, tensors and the per-entry overheads counted); thread-safe."""

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(f"the response cache size must be a positive number of bytes, got {capacity!r}")
        self.capacity = capacity
        self._entries: OrderedDict[bytes, CachedResponse] = OrderedDict()  # oldest use first
        self._used = 0
        self._lock = threading.Lock()
        log.info("Response Cache is created with size %d", capacity)

    @classmethod
    def of(cls, size: int | None) -> ResponseCache | None:
        """A cache of `size` bytes; None for None or 0 (no cache). Raises ValueError for a size
        that is not a non-negative integer."""
        if size is None or (size == 0 and not isinstance(size, bool)):
            return None
        return cls(size)

    def lookup(self, key: bytes) -> CachedResponse | None:
        """The entry of `key` (now the most recently used), or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def insert(self, key: bytes, entry: CachedResponse) -> str:
        """Stores an entry, evicting the least recently used ones to make room. INSERTED;
        EXISTS when the key is there already (it is left as it is, as Triton's local cache
        does); TOO_LARGE (logged) when the entry alone is larger than the whole cache."""
        if entry.nbytes > self.capacity:
            log.error("Failed to insert key [%s] into response cache: Requested byte_size: %d is greater than "
                      "total cache size: %d", key.hex(), entry.nbytes, self.capacity)
            return TOO_LARGE
        with self._lock:
            if key in self._entries:
                return EXISTS
            while self._used + entry.nbytes > self.capacity:
                _, evicted = self._entries.popitem(last=False)
                self._used -= evicted.nbytes
            self._entries[key] = entry
            self._used += entry.nbytes
        return INSERTED

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def used(self) -> int:
        """Bytes the entries take now (as counted against the capacity)."""
        return self._used
