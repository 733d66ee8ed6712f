# Type stub of the extension module; regenerate with: pybind11-stubgen stubhost._core -o <dir>
"""
stubhost's shared-memory IPC core (pool, sync, queues, control block, tensor layout).
"""
from __future__ import annotations
import collections.abc
import enum
import numpy
import typing
import typing_extensions  # noqa: F401  (Buffer, CapsuleType; typing-only)
__all__: list[str] = ['ALIGNMENT', 'Command', 'ControlQueue', 'CoreError', 'CorruptionError', 'DataType', 'FormatError', 'GpuView', 'IPCControl', 'IPCMessage', 'InvalidHandleError', 'LAYOUT_VERSION', 'LayoutVersionError', 'LockResult', 'LockTimeoutError', 'MAX_SEGMENTS', 'MemoryType', 'MessageQueue', 'Pool', 'PoolFullError', 'RecordKind', 'RecordLease', 'RobustMutex', 'Semaphore', 'ShmError', 'ShmSpaceError', 'ShmView', 'TensorInfo', 'count_bytes_elements', 'decode_bytes', 'decode_tensor_header', 'dtype_from_name', 'dtype_name', 'dtype_size', 'encode_bytes', 'encode_bytes_into', 'encode_tensor_header', 'encoded_bytes_size', 'free_record_chain', 'from_dlpack', 'gpu_view', 'handle_offset', 'handle_segment', 'make_handle', 'read_record', 'read_tensor', 'set_record_next', 'set_spin_budget', 'spin_budget', 'tensor_array', 'tensor_header_bytes', 'to_dlpack', 'write_record', 'write_tensor']
class CoreError(RuntimeError):
    pass
class ShmError(CoreError):
    pass
class ShmSpaceError(CoreError):
    pass
class PoolFullError(CoreError):
    pass
class InvalidHandleError(CoreError):
    pass
class CorruptionError(CoreError):
    pass
class FormatError(CoreError):
    pass
class LayoutVersionError(CoreError):
    pass
class LockTimeoutError(CoreError):
    pass
class ShmView:
    """
    Zero-copy window on pool memory; supports the buffer protocol (numpy.frombuffer).
    """
    def __len__(self) -> int:
        ...
    @property
    def address(self) -> int:
        ...
    @property
    def handle(self) -> int:
        ...
    @property
    def nbytes(self) -> int:
        ...
    @property
    def readonly(self) -> bool:
        ...
class Pool:
    """
    A growable shared-memory pool of POSIX shm segments.
    """
    @staticmethod
    def attach(name: str, lock_timeout: typing.SupportsFloat | typing.SupportsIndex = 10.0) -> Pool:
        ...
    @staticmethod
    def create(prefix: str = 'stubhost', initial_size: typing.SupportsInt | typing.SupportsIndex = 8388608, growth_size: typing.SupportsInt | typing.SupportsIndex = 33554432, max_size: typing.SupportsInt | typing.SupportsIndex = 8589934592, lock_timeout: typing.SupportsFloat | typing.SupportsIndex = 10.0) -> Pool:
        ...
    def __enter__(self) -> Pool:
        ...
    def __exit__(self, *args) -> None:
        ...
    def _debug_lock(self) -> None:
        ...
    def _debug_unlock(self) -> None:
        ...
    def allocate(self, nbytes: typing.SupportsInt | typing.SupportsIndex) -> int:
        ...
    def allocation_size(self, handle: typing.SupportsInt | typing.SupportsIndex) -> int:
        ...
    def check(self) -> None:
        """
        Verify every allocator invariant; raises CorruptionError.
        """
    def close(self) -> None:
        ...
    def free(self, handle: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    def handle_of(self, address: typing.SupportsInt | typing.SupportsIndex) -> int:
        """
        Handle of an address inside this pool's mappings, or 0.
        """
    def unlink(self) -> None:
        """
        Remove every segment name of this pool from /dev/shm.
        """
    def view(self, handle: typing.SupportsInt | typing.SupportsIndex, nbytes: typing.SupportsInt | typing.SupportsIndex, readonly: bool = False) -> ShmView:
        ...
    @property
    def allocations(self) -> int:
        ...
    @property
    def capacity_bytes(self) -> int:
        ...
    @property
    def closed(self) -> bool:
        ...
    @property
    def free_bytes(self) -> int:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def owner(self) -> bool:
        ...
    @property
    def segment_count(self) -> int:
        ...
    @property
    def used_bytes(self) -> int:
        ...
class Semaphore:
    """
    A futex-based counting semaphore in a pool.
    """
    @staticmethod
    def attach(pool: Pool, handle: typing.SupportsInt | typing.SupportsIndex) -> Semaphore:
        ...
    @staticmethod
    def create(pool: Pool, initial: typing.SupportsInt | typing.SupportsIndex = 0) -> Semaphore:
        ...
    def post(self) -> None:
        ...
    def wait(self, timeout: typing.SupportsFloat | typing.SupportsIndex | None = None) -> bool:
        """
        Take one unit; False on timeout (None waits for ever).
        """
    @property
    def handle(self) -> int:
        ...
    @property
    def value(self) -> int:
        ...
class LockResult(enum.IntEnum):
    ACQUIRED: typing.ClassVar[LockResult]
    RECOVERED: typing.ClassVar[LockResult]
    TIMED_OUT: typing.ClassVar[LockResult]
    @classmethod
    def __new__(cls, value):
        ...
    def __format__(self, format_spec):
        ...
class RobustMutex:
    """
    A process-shared robust mutex in a pool.
    """
    @staticmethod
    def attach(pool: Pool, handle: typing.SupportsInt | typing.SupportsIndex) -> RobustMutex:
        ...
    @staticmethod
    def create(pool: Pool) -> RobustMutex:
        ...
    def lock(self, timeout: typing.SupportsFloat | typing.SupportsIndex | None = None) -> LockResult:
        """
        ACQUIRED, RECOVERED (the previous owner died holding it) or TIMED_OUT.
        """
    def unlock(self) -> None:
        ...
    @property
    def handle(self) -> int:
        ...
class MessageQueue:
    """
    Bounded ring of 64-bit handles in a pool (MPMC).
    """
    @staticmethod
    def attach(pool: Pool, handle: typing.SupportsInt | typing.SupportsIndex) -> MessageQueue:
        ...
    @staticmethod
    def bytes_for(capacity: typing.SupportsInt | typing.SupportsIndex) -> int:
        ...
    @staticmethod
    def create(pool: Pool, capacity: typing.SupportsInt | typing.SupportsIndex) -> MessageQueue:
        ...
    def __len__(self) -> int:
        ...
    def pop(self, timeout: typing.SupportsFloat | typing.SupportsIndex | None = None) -> int | None:
        """
        Take the oldest handle; None if the queue stayed empty until the timeout.
        """
    def push(self, value: typing.SupportsInt | typing.SupportsIndex, timeout: typing.SupportsFloat | typing.SupportsIndex | None = None) -> bool:
        """
        Append a handle; False if the queue stayed full until the timeout (None waits for ever).
        """
    @property
    def capacity(self) -> int:
        ...
    @property
    def handle(self) -> int:
        ...
class ControlQueue(enum.IntEnum):
    MEMORY_MANAGER: typing.ClassVar[ControlQueue]
    PARENT_MESSAGE: typing.ClassVar[ControlQueue]
    PARENT_TO_STUB: typing.ClassVar[ControlQueue]
    STUB_MESSAGE: typing.ClassVar[ControlQueue]
    STUB_TO_PARENT: typing.ClassVar[ControlQueue]
    @classmethod
    def __new__(cls, value):
        ...
    def __format__(self, format_spec):
        ...
class IPCControl:
    """
    The IPCControlShm block shared by a parent and its stub.
    """
    decoupled: bool
    uses_env: bool
    @staticmethod
    def attach(pool: Pool, handle: typing.SupportsInt | typing.SupportsIndex) -> IPCControl:
        ...
    @staticmethod
    def create(pool: Pool) -> IPCControl:
        ...
    def beat(self, stub: bool) -> None:
        """
        Bump one side's heartbeat counter.
        """
    def health(self, stub: bool, lock_timeout: typing.SupportsFloat | typing.SupportsIndex = 1.0) -> bool:
        """
        Read a health flag under its robust mutex.
        """
    def set_health(self, stub: bool, value: bool, lock_timeout: typing.SupportsFloat | typing.SupportsIndex = 1.0) -> None:
        ...
    @property
    def handle(self) -> int:
        ...
    @property
    def memory_manager_message_queue(self) -> int:
        ...
    @memory_manager_message_queue.setter
    def memory_manager_message_queue(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def parent_heartbeat(self) -> int:
        ...
    @property
    def parent_message_queue(self) -> int:
        ...
    @parent_message_queue.setter
    def parent_message_queue(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def parent_pid(self) -> int:
        ...
    @parent_pid.setter
    def parent_pid(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def parent_to_stub_mq(self) -> int:
        ...
    @parent_to_stub_mq.setter
    def parent_to_stub_mq(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def stub_heartbeat(self) -> int:
        ...
    @property
    def stub_message_queue(self) -> int:
        ...
    @stub_message_queue.setter
    def stub_message_queue(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def stub_pid(self) -> int:
        ...
    @stub_pid.setter
    def stub_pid(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
    @property
    def stub_to_parent_mq(self) -> int:
        ...
    @stub_to_parent_mq.setter
    def stub_to_parent_mq(self, arg1: typing.SupportsInt | typing.SupportsIndex) -> None:
        ...
class Command(enum.IntEnum):
    AUTO_COMPLETE_REQUEST: typing.ClassVar[Command]
    AUTO_COMPLETE_RESPONSE: typing.ClassVar[Command]
    CANCEL_REQUEST: typing.ClassVar[Command]
    EXECUTE_REQUEST: typing.ClassVar[Command]
    EXECUTE_RESPONSE: typing.ClassVar[Command]
    FINALIZE_REQUEST: typing.ClassVar[Command]
    FINALIZE_RESPONSE: typing.ClassVar[Command]
    INFER_EXEC_REQUEST: typing.ClassVar[Command]
    INFER_EXEC_RESPONSE: typing.ClassVar[Command]
    INFER_STREAM_EXEC_REQUEST: typing.ClassVar[Command]
    INITIALIZE_REQUEST: typing.ClassVar[Command]
    INITIALIZE_RESPONSE: typing.ClassVar[Command]
    IS_REQUEST_CANCELLED: typing.ClassVar[Command]
    LOG_REQUEST: typing.ClassVar[Command]
    MEMORY_RELEASE: typing.ClassVar[Command]
    METRIC_REQUEST: typing.ClassVar[Command]
    MODEL_CONTROL_REQUEST: typing.ClassVar[Command]
    PING: typing.ClassVar[Command]
    REGION_MAP: typing.ClassVar[Command]
    REGION_UNMAP: typing.ClassVar[Command]
    RESPONSE_CLOSE: typing.ClassVar[Command]
    RESPONSE_SEND: typing.ClassVar[Command]
    SHUTDOWN: typing.ClassVar[Command]
    @classmethod
    def __new__(cls, value):
        ...
    def __format__(self, format_spec):
        ...
class IPCMessage:
    """
    One protocol message: command, args handle, inline-reply slot.
    """
    @staticmethod
    def attach(pool: Pool, handle: typing.SupportsInt | typing.SupportsIndex) -> IPCMessage:
        ...
    @staticmethod
    def create(pool: Pool, command: Command, args: typing.SupportsInt | typing.SupportsIndex = 0, request_id: typing.SupportsInt | typing.SupportsIndex = 0, inline_reply: bool = False, notify: bool = False, ring: bool = False) -> IPCMessage:
        ...
    def release(self) -> None:
        """
        Drop this holder's reference; the last holder frees the message.
        """
    def reply(self, status: typing.SupportsInt | typing.SupportsIndex = 0, args: typing.SupportsInt | typing.SupportsIndex = 0) -> None:
        """
        Answer an inline-reply message (once; a second reply raises CoreError).
        """
    def set_notify(self, on: bool) -> bool:
        """
        Turn the responder's notification on or off in flight; returns `answered` as read after.
        """
    def wait_reply(self, timeout: typing.SupportsFloat | typing.SupportsIndex | None = None) -> bool:
        """
        Wait for the responder's reply(); False on timeout.
        """
    @property
    def answered(self) -> bool:
        """
        True once the reply is complete; unlike wait_reply(), consumes nothing.
        """
    @property
    def args(self) -> int:
        ...
    @property
    def command(self) -> Command:
        ...
    @property
    def handle(self) -> int:
        ...
    @property
    def inline_reply(self) -> bool:
        ...
    @property
    def notify(self) -> bool:
        """
        After replying, the responder also pushes this handle on the parent queue.
        """
    @property
    def ring(self) -> bool:
        """
        After replying, the responder also rings the parent's doorbell (an eventfd).
        """
    @property
    def reply_args(self) -> int:
        ...
    @property
    def reply_status(self) -> int:
        ...
    @property
    def request_id(self) -> int:
        ...
class DataType(enum.IntEnum):
    """
    Triton data types, numbered as TRITONSERVER_DataType.
    """
    BF16: typing.ClassVar[DataType]
    BOOL: typing.ClassVar[DataType]
    BYTES: typing.ClassVar[DataType]
    FP16: typing.ClassVar[DataType]
    FP32: typing.ClassVar[DataType]
    FP64: typing.ClassVar[DataType]
    INT16: typing.ClassVar[DataType]
    INT32: typing.ClassVar[DataType]
    INT64: typing.ClassVar[DataType]
    INT8: typing.ClassVar[DataType]
    INVALID: typing.ClassVar[DataType]
    UINT16: typing.ClassVar[DataType]
    UINT32: typing.ClassVar[DataType]
    UINT64: typing.ClassVar[DataType]
    UINT8: typing.ClassVar[DataType]
    @classmethod
    def __new__(cls, value):
        ...
    def __format__(self, format_spec):
        ...
class MemoryType(enum.IntEnum):
    CPU: typing.ClassVar[MemoryType]
    CPU_PINNED: typing.ClassVar[MemoryType]
    GPU: typing.ClassVar[MemoryType]
    SYSTEM_SHM: typing.ClassVar[MemoryType]
    @classmethod
    def __new__(cls, value):
        ...
    def __format__(self, format_spec):
        ...
class TensorInfo:
    """
    A tensor header as read from (or written to) the pool.
    """
    @property
    def byte_size(self) -> int:
        ...
    @property
    def cuda_ipc_handle(self) -> bytes:
        ...
    @property
    def data_handle(self) -> int:
        ...
    @property
    def data_offset(self) -> int:
        ...
    @property
    def device_id(self) -> int:
        ...
    @property
    def dtype(self) -> DataType:
        ...
    @property
    def memory_type(self) -> MemoryType:
        ...
    @property
    def name(self) -> str:
        ...
    @property
    def shape(self) -> tuple:
        ...
class GpuView:
    """
    CUDA device memory (never dereferenced here), kept alive as long as this view.
    From from_dlpack it owns the consumed DLPack tensor; from gpu_view it holds the owner.
    """
    def __dlpack__(self, stream: typing.Any = None, **kwargs: typing.Any) -> typing_extensions.CapsuleType:
        """
        A new kDLCUDA capsule of the same memory; it keeps this view (and so the memory) alive.
        """
    def __dlpack_device__(self) -> tuple[int, int]:
        ...
    @property
    def byte_size(self) -> int:
        ...
    @property
    def device_id(self) -> int:
        ...
    @property
    def dtype(self) -> DataType:
        ...
    @property
    def ptr(self) -> int:
        """
        Device address of the first element.
        """
    @property
    def shape(self) -> tuple:
        ...
class RecordLease:
    """
    Frees an inference record when its last tensor view goes away.
    """
class RecordKind(enum.IntEnum):
    PAYLOAD: typing.ClassVar[RecordKind]
    REQUEST: typing.ClassVar[RecordKind]
    RESPONSE: typing.ClassVar[RecordKind]
    @classmethod
    def __new__(cls, value):
        ...
    def __format__(self, format_spec):
        ...
def count_bytes_elements(buffer: typing_extensions.Buffer) -> int:
    ...
def decode_bytes(buffer: typing_extensions.Buffer, count: typing.SupportsInt | typing.SupportsIndex) -> numpy.ndarray:
    """
    Parse `count` length-prefixed elements into a 1-D numpy object array of bytes.
    """
def decode_tensor_header(buffer: typing_extensions.Buffer) -> TensorInfo:
    """
    Parse a tensor header from any bytes-like object (never reads past its end).
    """
def dtype_from_name(name: str) -> DataType:
    ...
def dtype_name(dtype: DataType) -> str:
    ...
def dtype_size(dtype: DataType) -> int:
    """
    Bytes per element (0 for BYTES).
    """
def encode_bytes(items: collections.abc.Iterable) -> bytes:
    """
    Serialize elements (C order) in Triton's BYTES layout.
    """
def encode_bytes_into(buffer: typing_extensions.Buffer, items: collections.abc.Iterable) -> int:
    """
    Serialize into a writable buffer; returns the bytes written.
    """
def encode_tensor_header(name: str, dtype: DataType, shape: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], byte_size: typing.SupportsInt | typing.SupportsIndex, memory_type: MemoryType = ..., device_id: typing.SupportsInt | typing.SupportsIndex = 0, data_handle: typing.SupportsInt | typing.SupportsIndex = 0, data_offset: typing.SupportsInt | typing.SupportsIndex = 0, cuda_ipc_handle: bytes = b'') -> bytes:
    ...
def encoded_bytes_size(items: collections.abc.Iterable) -> int:
    ...
def free_record_chain(pool: Pool, handle: typing.SupportsInt | typing.SupportsIndex, limit: typing.SupportsInt | typing.SupportsIndex = 1048576) -> int:
    """
    Free a record and the records chained after it; returns how many were freed.
    """
def from_dlpack(source: typing.Any) -> tuple[DataType, numpy.ndarray | GpuView]:
    """
    Import a DLPack tensor (object with __dlpack__ or a capsule) without copying.
    CPU: returns (DataType, numpy view); BF16 is viewed as uint16 words.
    CUDA (kDLCUDA, C-contiguous only): returns (DataType, GpuView), which owns the tensor.
    """
def gpu_view(owner: typing.Any, ptr: typing.SupportsInt | typing.SupportsIndex, dtype: DataType, shape: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], device_id: typing.SupportsInt | typing.SupportsIndex) -> GpuView:
    """
    Describe device memory at `ptr` that `owner` keeps alive (e.g. an opened CUDA IPC handle).
    """
def handle_offset(handle: typing.SupportsInt | typing.SupportsIndex) -> int:
    ...
def handle_segment(handle: typing.SupportsInt | typing.SupportsIndex) -> int:
    ...
def make_handle(segment: typing.SupportsInt | typing.SupportsIndex, offset: typing.SupportsInt | typing.SupportsIndex) -> int:
    ...
def mark_record_started(pool: Pool, handle: typing.SupportsInt | typing.SupportsIndex) -> None:
    """
    Stamp a request record with the time its execution begins (the stub, as it starts it).
    """
def record_running_ms(pool: Pool, handle: typing.SupportsInt | typing.SupportsIndex) -> int:
    """
    Milliseconds since a request record was stamped by mark_record_started, or -1 if it was not.
    """
def read_record(pool: Pool, handle: typing.SupportsInt | typing.SupportsIndex, lease: bool = False, regions: typing.Any = None) -> tuple[int, int, tuple[int, int, int], int, list, list]:
    """
    Read and validate a record: (kind, status, ints, next, strings, [(name, dtype, array)]).
    Arrays are zero-copy views (BYTES are decoded to object arrays). With lease=True the record
    is freed when the last view goes away; otherwise the writer stays its owner. Tensors that
    live in a client region are views of regions[id] (a dict of buffer objects), bounds-checked;
    without `regions` they are described as (region, offset, byte_size, shape) instead.
    GPU tensors are always described: ("cuda_region", region, offset, byte_size, shape,
    device_id) or ("cuda_ipc", ipc_handle, offset, byte_size, shape, device_id, buffer_id).
    """
def read_tensor(pool: Pool, handle: typing.SupportsInt | typing.SupportsIndex) -> TensorInfo:
    """
    Read and validate the tensor header at handle.
    """
def set_record_next(pool: Pool, handle: typing.SupportsInt | typing.SupportsIndex, next: typing.SupportsInt | typing.SupportsIndex) -> None:
    ...
def set_spin_budget(seconds: typing.SupportsFloat | typing.SupportsIndex) -> None:
    """
    How long a waiter spins before sleeping (process-wide; 0 disables).
    """
def spin_budget() -> float:
    ...
def tensor_array(pool: Pool, info: TensorInfo) -> numpy.ndarray:
    """
    Zero-copy numpy view of a CPU tensor's data (BF16 as uint16 words; not for BYTES).
    """
def tensor_header_bytes(name_length: typing.SupportsInt | typing.SupportsIndex, ndim: typing.SupportsInt | typing.SupportsIndex) -> int:
    ...
def to_dlpack(owner: typing.Any, address: typing.SupportsInt | typing.SupportsIndex, dtype: DataType, shape: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], device_type: typing.SupportsInt | typing.SupportsIndex = 1, device_id: typing.SupportsInt | typing.SupportsIndex = 0) -> typing_extensions.CapsuleType:
    """
    Export memory at `address` (kept alive through `owner`) as a DLPack capsule, compact row-major.
    """
def write_record(pool: Pool, kind: typing.SupportsInt | typing.SupportsIndex, status: typing.SupportsInt | typing.SupportsIndex = 0, ints: collections.abc.Sequence = (), strings: collections.abc.Sequence = (), tensors: collections.abc.Sequence = (), next: typing.SupportsInt | typing.SupportsIndex = 0) -> int:
    """
    Write one record (strings, and tensors given as (name, array[, dtype])) in one allocation.
    Arrays are copied once; str/bytes/object arrays become BYTES. Header-only tensors (no copy):
    (name, shape, dtype, region, region_offset, byte_size) in a client system region;
    (name, shape, dtype, region, region_offset, byte_size, device_id) in a client CUDA region;
    (name, shape, dtype, ipc_handle, offset, byte_size, device_id, buffer_id) in the writer's
    device allocation named by a 64-byte CUDA IPC handle. Returns the record's handle.
    """
def write_tensor(pool: Pool, name: str, dtype: DataType, shape: collections.abc.Sequence[typing.SupportsInt | typing.SupportsIndex], byte_size: typing.SupportsInt | typing.SupportsIndex, memory_type: MemoryType = ..., device_id: typing.SupportsInt | typing.SupportsIndex = 0, data_handle: typing.SupportsInt | typing.SupportsIndex = 0, data_offset: typing.SupportsInt | typing.SupportsIndex = 0, cuda_ipc_handle: bytes = b'') -> tuple[int, TensorInfo]:
    """
    Allocate and write a tensor header (with room for CPU data after it unless data_handle is given).
    Returns (header_handle, TensorInfo); freeing header_handle frees both.
    """
ALIGNMENT: int = 64
LAYOUT_VERSION: int = 1
MAX_SEGMENTS: int = 256
