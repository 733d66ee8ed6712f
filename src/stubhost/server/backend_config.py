"""tritonserver's ``--backend-config`` entries, read the way the Python backend reads them.

    --backend-config python,shm-default-byte-size=16777216     one backend's setting
    --backend-config default-max-batch-size=8                   a setting of every backend

The Python backend's shared-memory keys size each stub's pool and queues (``StubSettings``).
Keys that have no counterpart here are accepted, so that a launch script written for
tritonserver starts unchanged, and each is reported once at start-up with the reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from stubhost.host.stub_process import StubSettings

# Python-backend key -> StubSettings field (all byte sizes or counts but the prefix)
_HONOURED = {
    "shm-default-byte-size": "pool_size",
    "shm-growth-byte-size": "pool_growth",
    "shm-message-queue-size": "queue_capacity",
    "shm-region-prefix-name": "prefix",
}
_WHY_NOT = {
    "stub-timeout-seconds": "a stub's start and its initialize() are bounded by the model load timeout",
    "default-max-batch-size": "auto-completed configurations keep the max_batch_size the model sets",
}


@dataclass
class BackendConfig:
    """What ``--backend-config`` asked for: the stubs' settings, and one line per entry saying
    whether and how it applies (logged at start-up)."""

    stub: StubSettings = field(default_factory=StubSettings)
    report: list[str] = field(default_factory=list)


def parse_backend_config(entries: Sequence[str]) -> BackendConfig:
    """Reads ``--backend-config`` values; raises ValueError for a malformed entry or a bad value
    of a key that applies."""
    changes: dict[str, int | str] = {}
    report: list[str] = []
    for entry in entries:
        backend, key, value = _split(entry)
        if backend not in ("", "python"):
            report.append(f"--backend-config {entry}: ignored, stubhost hosts only Python-backend models")
        elif key in _HONOURED:
            changes[_HONOURED[key]] = _value(entry, key, value)
            report.append(f"--backend-config {entry}: applied")
        elif key in _WHY_NOT:
            report.append(f"--backend-config {entry}: accepted, no effect ({_WHY_NOT[key]})")
        else:
            report.append(f"--backend-config {entry}: accepted, no effect (not a setting stubhost knows)")
    return BackendConfig(stub=dataclasses.replace(StubSettings(), **changes), report=report)  # type: ignore[arg-type]


def _split(entry: str) -> tuple[str, str, str]:
    """``[<backend>,]<key>=<value>`` as (backend, key, value); the backend is "" for a global one."""
    backend, _, setting = entry.rpartition(",") if "," in entry.split("=", 1)[0] else ("", "", entry)
    key, equals, value = setting.partition("=")
    if not equals or not key.strip():
        raise ValueError(f"--backend-config '{entry}': expected <backend>,<setting>=<value>, "
                         "e.g. python,shm-default-byte-size=16777216")
    return backend.strip(), key.strip(), value.strip()


def _value(entry: str, key: str, value: str) -> int | str:
    if key == "shm-region-prefix-name":
        if not value or "/" in value or not value.isascii() or not value.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"--backend-config '{entry}': the prefix must be letters, digits, '_' or '-'")
        return value
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"--backend-config '{entry}': '{value}' is not an integer") from None
    if number <= 0:
        raise ValueError(f"--backend-config '{entry}': the value must be positive")
    return number
