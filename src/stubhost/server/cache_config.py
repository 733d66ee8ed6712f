"""tritonserver's response-cache flags, read as tritonserver reads them.

    --cache-config local,size=1048576        (repeatable: <cache>,<setting>=<value>)
    --cache-config=local,size=1048576
    --response-cache-byte-size 1048576       (deprecated: the same as local,size=1048576)

Only Triton's ``local`` cache exists here: an in-memory LRU cache of ``size`` bytes shared by every
model (host/response_cache.py). Its only setting is ``size``; a size of 0 means no cache. Any
other cache name fails start-up, as tritonserver fails when it finds no library for that cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

LOCAL = "local"


class CacheFlagError(ValueError):
    """A malformed flag value (reported as a usage error)."""


class CacheCreateError(ValueError):
    """A well-formed setting the cache cannot be created with (reported as a failed start-up)."""


@dataclass
class CacheSettings:
    """What the flags ask for: the local cache's size in bytes (None: no cache), and lines to
    log at start-up."""

    size: int | None = None
    report: list[str] = field(default_factory=list)


def split_cache_config(value: str) -> tuple[str, str, str]:
    """``<cache>,<setting>=<value>`` as (cache, setting, value); raises CacheFlagError."""
    cache, comma, setting = value.partition(",")
    key, equals, setting_value = setting.partition("=")
    if not comma or not equals or not cache.strip() or not key.strip():
        raise CacheFlagError(f"--cache-config option format is '<cache name>,<setting>=<value>'. Got {value}")
    return cache.strip(), key.strip(), setting_value.strip()


def _size(text: str) -> int:
    """A cache size: a non-negative integer of bytes (Triton's local cache wants an unsigned one)."""
    if not text.isascii() or not text.isdigit():
        raise CacheCreateError("Failed to initialize LocalCache: config didn't contain a valid 'size' field.")
    return int(text)


def parse_cache_settings(cache_config: Sequence[str], byte_size: Sequence[str] = ()) -> CacheSettings:
    """Reads the ``--cache-config`` values and the deprecated ``--response-cache-byte-size``
    values; the last size given wins, a ``--cache-config`` size over the deprecated flag's.
    Raises CacheFlagError or CacheCreateError."""
    settings = CacheSettings()
    sizes: list[int] = []
    for value in byte_size:
        settings.report.append(f"'--response-cache-byte-size' has been deprecated: it selects the 'local' cache "
                               f"with that size; the equivalent is '--cache-config=local,size={value}'")
        sizes.append(_size(value.strip()))
    seen_local = False
    for value in cache_config:
        cache, key, text = split_cache_config(value)
        if cache != LOCAL:
            raise CacheCreateError(f"unable to find 'libtritoncache_{cache}.so' for cache: stubhost has only the "
                                   f"'{LOCAL}' cache")
        seen_local = True
        if key == "size":
            sizes.append(_size(text))
        else:
            settings.report.append(f"--cache-config {value}: accepted, no effect (the local cache's only setting "
                                   "is 'size')")
    if seen_local and not sizes:
        raise CacheCreateError("Failed to initialize LocalCache: config didn't contain a valid 'size' field.")
    if sizes and sizes[-1] > 0:
        settings.size = sizes[-1]
        settings.report.append(f"Response Cache: local, {settings.size} bytes")
    return settings
