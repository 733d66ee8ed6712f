"""stubhost: a process host for Triton Python-backend models.

``stubhost.Server`` is the in-process API (see stubhost.host.server); the shared-memory IPC core
lives in the C++ extension ``stubhost._core``, and the names most code needs are re-exported here.
"""

from typing import TYPE_CHECKING

from stubhost._core import (
    LAYOUT_VERSION,
    CoreError,
    CorruptionError,
    DataType,
    FormatError,
    InvalidHandleError,
    IPCControl,
    IPCMessage,
    LayoutVersionError,
    LockTimeoutError,
    MemoryType,
    MessageQueue,
    Pool,
    PoolFullError,
    ShmError,
    ShmSpaceError,
)

__all__ = [
    "LAYOUT_VERSION",
    "CoreError",
    "CorruptionError",
    "DataType",
    "FormatError",
    "InvalidHandleError",
    "IPCControl",
    "IPCMessage",
    "InferenceError",
    "LayoutVersionError",
    "LockTimeoutError",
    "MemoryType",
    "MessageQueue",
    "Pool",
    "PoolFullError",
    "ShmError",
    "RestartPolicy",
    "Server",
    "ShmSpaceError",
]
__version__ = "0.1.0"

if TYPE_CHECKING:  # type checkers see the lazy names below as what they are
    from stubhost.host.errors import InferenceError
    from stubhost.host.instance_spec import RestartPolicy
    from stubhost.host.server import Server

# The parent-side API is imported on first use, so that a stub (which imports stubhost) never
# loads the host layer.
_LAZY = {
    "InferenceError": "stubhost.host.errors",
    "RestartPolicy": "stubhost.host.instance_spec",
    "Server": "stubhost.host.server",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stubhost' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
