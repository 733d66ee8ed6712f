"""stubhost: a process host for Triton Python-backend models.

The shared-memory IPC core lives in the C++ extension ``stubhost._core``; the names most code
needs are re-exported here.
"""

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
    "LayoutVersionError",
    "LockTimeoutError",
    "MemoryType",
    "MessageQueue",
    "Pool",
    "PoolFullError",
    "ShmError",
    "ShmSpaceError",
]
__version__ = "0.1.0"
