"""Triton's classification extension: an output asked for with ``"classification": k`` comes back
as its top-k classes instead of its data.

Each class is the string ``"<value>:<index>[:<label>]"``: the value as C++'s ``std::to_string``
writes it (six decimals for floating point), the index of the class within one batch item, and
the label the model's ``label_filename`` gives that index, when it gives one. The returned tensor
is BYTES with shape ``[batch, min(k, classes)]`` for a model that batches (the first dimension
is the batch), else ``[min(k, classes)]``. Classes are ranked by value, highest first; equal
values keep index order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from stubhost.host.errors import InferenceError

# The datatypes Triton can rank: fixed-size integers and FP32/FP64 (not FP16, BF16, BOOL, BYTES).
_RANKABLE = frozenset(("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"))


def classify(datatype: str, array: np.ndarray, count: int, batched: bool, labels: Sequence[str]) -> np.ndarray:
    """The top `count` classes of an output (of KServe `datatype`), as an object array of bytes."""
    if datatype not in _RANKABLE:
        raise InferenceError("INVALID_ARG", f"class result not available for output due to unsupported type "
                                            f"'{datatype}'")
    shape = array.shape
    rows = int(shape[0]) if batched and shape else 0
    per_row = math.prod(shape[1:] if rows else shape)
    flat = np.ascontiguousarray(array).reshape(max(rows, 1), per_row)
    k = min(count, per_row)
    floating = array.dtype.kind == "f"
    out = np.empty((max(rows, 1), k), dtype=object)
    for row, values in enumerate(flat):
        # Reversed, a stable ascending sort puts equal values last-index first; reversed back,
        # the ranking is descending with equal values in index order.
        ranked = per_row - 1 - np.argsort(values[::-1], kind="stable")[::-1][:k]
        for j, index in enumerate(ranked.tolist()):
            value = values[index]
            text = f"{float(value):f}" if floating else str(int(value))
            label = labels[index] if index < len(labels) else ""
            out[row, j] = f"{text}:{index}:{label}".encode() if label else f"{text}:{index}".encode()
    return out if rows else out.reshape(k)
