"""What every sequence model shares: the sequence flags, the default idle time, and Triton's
texts for the requests a sequence model refuses.

A model with ``sequence_batching`` has Triton's sequence batcher (sequence_batcher.py), with or
without ``max_batch_size``; the control inputs it adds to requests are made by
sequence_controls.py.
"""

from __future__ import annotations

from stubhost.host.errors import InferenceError

FLAG_SEQUENCE_START = 1  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
FLAG_SEQUENCE_END = 2    # TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
DEFAULT_IDLE_US = 1_000_000


def no_correlation_id(model_name: str) -> InferenceError:
    """Triton's error for a sequence model's request without a correlation id."""
    return InferenceError("INVALID_ARG", f"inference request to model '{model_name}' must specify a non-zero or "
                                         "non-empty correlation ID")


def not_started(model_name: str, correlation_id: int | str) -> InferenceError:
    """Triton's error for a request that continues a sequence that is not open."""
    return InferenceError("INVALID_ARG", f"inference request for sequence {correlation_id} to model '{model_name}' "
                                         "must specify the START flag on the first request of the sequence")


def sequence_cancelled(model_name: str, correlation_id: int | str) -> InferenceError:
    """The error of the waiting requests that a cancelled request of their sequence takes along
    (Triton's code; Triton gives no text)."""
    return InferenceError("CANCELLED", f"request for sequence {correlation_id} to model '{model_name}' cancelled: "
                                       "another request of the sequence was cancelled")
