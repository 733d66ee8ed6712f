"""Tensors that live in a shared-memory pool, seen as numpy arrays and DLPack without copies.

A tensor is one pool allocation: a header (name, dtype, shape, memory type, device, byte size)
followed by its data. ``SharedTensor.from_numpy`` copies once into the pool; ``as_numpy`` returns
a view of the pool, never a copy (BYTES tensors are decoded, which must copy).

    pool = Pool.create()
    t = SharedTensor.from_numpy(pool, "INPUT0", np.arange(4, dtype=np.float32))
    peer_sees = SharedTensor.read(pool_attached_elsewhere, t.handle).as_numpy()
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from stubhost import _core
from stubhost._core import DataType, MemoryType, Pool

__all__ = ["SharedTensor", "numpy_to_triton_dtype", "storage_dtype", "triton_to_numpy_dtype"]

_NUMPY_OF: dict[DataType, Any] = {
    DataType.BOOL: np.dtype(np.bool_),
    DataType.UINT8: np.dtype(np.uint8),
    DataType.UINT16: np.dtype(np.uint16),
    DataType.UINT32: np.dtype(np.uint32),
    DataType.UINT64: np.dtype(np.uint64),
    DataType.INT8: np.dtype(np.int8),
    DataType.INT16: np.dtype(np.int16),
    DataType.INT32: np.dtype(np.int32),
    DataType.INT64: np.dtype(np.int64),
    DataType.FP16: np.dtype(np.float16),
    DataType.FP32: np.dtype(np.float32),
    DataType.FP64: np.dtype(np.float64),
    DataType.BYTES: np.dtype(np.object_),
}
_TRITON_OF: dict[np.dtype, DataType] = {v: k for k, v in _NUMPY_OF.items()}


def triton_to_numpy_dtype(dtype: DataType) -> np.dtype:
    """numpy dtype of a Triton dtype (BYTES -> object). BF16 has none and raises TypeError."""
    try:
        return _NUMPY_OF[dtype]
    except KeyError:
        raise TypeError(f"{dtype.name} has no numpy equivalent; use DLPack (e.g. torch) instead") from None


def storage_dtype(dtype: DataType) -> np.dtype:
    """numpy dtype of a tensor's raw elements: BF16, which numpy lacks, as uint16 words."""
    if dtype == DataType.BF16:
        return np.dtype(np.uint16)
    return triton_to_numpy_dtype(dtype)


def numpy_to_triton_dtype(dtype: Any) -> DataType:
    """Triton dtype of a numpy dtype; bytes_ and str_ arrays are BYTES."""
    try:
        known = _TRITON_OF.get(dtype)  # fast path: a native-order numpy dtype
    except TypeError:  # an unhashable dtype spec (a structured-dtype list): the slow path explains
        known = None
    if known is not None:
        return known
    dt = np.dtype(dtype)
    if dt.kind in ("S", "U", "O"):
        return DataType.BYTES
    try:
        return _TRITON_OF[dt.newbyteorder("=")]
    except KeyError:
        raise TypeError(f"numpy dtype {dt} has no Triton equivalent") from None


class SharedTensor:
    """A tensor stored in a pool (header and data in one allocation)."""

    __slots__ = ("pool", "handle", "info")

    def __init__(self, pool: Pool, handle: int, info: _core.TensorInfo) -> None:
        self.pool = pool
        self.handle = handle
        self.info = info

    # ---- creation -------------------------------------------------------------------------------
    @classmethod
    def read(cls, pool: Pool, handle: int) -> SharedTensor:
        """The tensor at ``handle``, validated (its data range must lie inside the pool)."""
        return cls(pool, handle, _core.read_tensor(pool, handle))

    @classmethod
    def empty(cls, pool: Pool, name: str, dtype: DataType, shape: tuple[int, ...] | list[int],
              byte_size: int | None = None) -> SharedTensor:
        """Allocates an uninitialised tensor; fill it through ``as_numpy()`` (or ``data_view()``)."""
        if byte_size is None:
            if dtype == DataType.BYTES:
                raise ValueError("a BYTES tensor needs its serialized byte_size")
            byte_size = math.prod(shape) * _core.dtype_size(dtype)
        handle, info = _core.write_tensor(pool, name, dtype, list(shape), byte_size)
        return cls(pool, handle, info)

    @classmethod
    def from_numpy(cls, pool: Pool, name: str, array: Any) -> SharedTensor:
        """Copies an array (any layout; non-contiguous is fine) into the pool, once."""
        array = np.asarray(array)
        dtype = numpy_to_triton_dtype(array.dtype)
        if dtype == DataType.BYTES:
            payload = _core.encode_bytes(array.ravel(order="C"))
            tensor = cls.empty(pool, name, dtype, array.shape, len(payload))
            np.frombuffer(tensor.data_view(), dtype=np.uint8)[:] = np.frombuffer(payload, dtype=np.uint8)
            return tensor
        tensor = cls.empty(pool, name, dtype, array.shape)
        try:
            np.copyto(tensor.as_numpy(), array, casting="equiv")  # equiv: byte-swaps big-endian input
        except BaseException:
            tensor.free()
            raise
        return tensor

    @classmethod
    def from_dlpack(cls, pool: Pool, name: str, source: Any) -> SharedTensor:
        """Copies a CPU DLPack tensor (torch, numpy, ...) into the pool once; BF16 is kept as is."""
        dtype, view = _core.from_dlpack(source)
        if isinstance(view, _core.GpuView):
            raise ValueError(f"tensor '{name}' is in GPU memory; a pool holds CPU tensors only (see docs/gpu.md)")
        tensor = cls.empty(pool, name, dtype, view.shape)
        np.copyto(np.frombuffer(tensor.data_view(), dtype=view.dtype).reshape(view.shape), view)
        return tensor

    # ---- description ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.info.name

    @property
    def dtype(self) -> DataType:
        return self.info.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.info.shape

    @property
    def byte_size(self) -> int:
        return self.info.byte_size

    @property
    def memory_type(self) -> MemoryType:
        return self.info.memory_type

    # ---- access ---------------------------------------------------------------------------------
    def data_view(self) -> _core.ShmView:
        """The raw data bytes, as a writable zero-copy buffer."""
        return self.pool.view(self.info.data_handle, self.info.byte_size)

    def as_numpy(self) -> np.ndarray:
        """A zero-copy numpy view of the data (BYTES: a decoded object array, which copies)."""
        info = self.info
        dtype = info.dtype
        if dtype == DataType.BYTES:
            shape = info.shape
            return _core.decode_bytes(self.data_view(), math.prod(shape)).reshape(shape)
        if dtype == DataType.BF16:
            raise TypeError("BF16 has no numpy equivalent; use DLPack (e.g. torch.from_dlpack) instead")
        return _core.tensor_array(self.pool, info)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        """DLPack export without a copy; the capsule keeps the pool mapping alive."""
        if copy:
            raise BufferError("SharedTensor exports without copying; copy=True is not supported")
        view = self.data_view()
        return _core.to_dlpack(view, view.address, self.dtype, list(self.shape))

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU

    def to_dlpack(self) -> Any:
        """A DLPack capsule of this tensor (legacy API, like pb_utils.Tensor.to_dlpack)."""
        return self.__dlpack__()

    def free(self) -> None:
        """Returns the allocation to the pool. Views taken earlier must no longer be used."""
        self.pool.free(self.handle)

    def __repr__(self) -> str:
        return f"SharedTensor({self.name!r}, {self.dtype.name}, {self.shape}, handle={self.handle:#x})"
