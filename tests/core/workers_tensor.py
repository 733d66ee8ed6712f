"""Code that runs in a second (spawned) process for tests/core/test_tensor.py.

Top-level functions only, so that a spawn context can import them by name. A failed check raises
(the process then exits non-zero and its traceback goes to stderr).
"""

from __future__ import annotations

import numpy as np

from stubhost._core import DataType, MessageQueue, Pool
from stubhost.tensor import SharedTensor


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(what)


def transform(arr: np.ndarray) -> np.ndarray:
    """What the peer computes from its input (the parent recomputes it to check the result)."""
    if arr.dtype == object:
        return np.array([bytes(x)[::-1] + b"|" for x in arr.ravel()], dtype=object).reshape(arr.shape)
    return (arr * 2 + 1).astype(arr.dtype)


def answer_tensor(pool_name: str, in_handle: int, queue_handle: int, expected: np.ndarray,
                  expected_dtype: int, out_repeat: int = 1) -> None:
    """Attaches the pool, reads and checks the tensor at in_handle, writes transform(input) (tiled
    out_repeat times along a new first axis) as OUTPUT0, pushes its handle, then zeroes the input
    in place so the parent can see the write through its own view."""
    pool = Pool.attach(pool_name)
    try:
        queue = MessageQueue.attach(pool, queue_handle)
        tensor = SharedTensor.read(pool, in_handle)
        _check(tensor.name == "INPUT0", f"name {tensor.name!r}")
        _check(tensor.dtype == DataType(expected_dtype), f"dtype {tensor.dtype!r}")
        _check(tensor.shape == expected.shape, f"shape {tensor.shape}")
        got = tensor.as_numpy()
        if expected.dtype == object:
            _check(got.dtype == object and list(got.ravel()) == list(expected.ravel()), f"values {got!r}")
        else:
            _check(got.dtype == expected.dtype and got.tobytes() == expected.tobytes(), f"values {got!r}")
        result = transform(got)
        if out_repeat > 1:
            result = np.stack([result] * out_repeat)
        out = SharedTensor.from_numpy(pool, "OUTPUT0", result)
        _check(queue.push(out.handle, timeout=30), "result queue stayed full")
        if expected.dtype != object:
            got[...] = 0  # a write into the parent's pool memory
    finally:
        pool.close()
