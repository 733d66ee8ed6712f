"""The parent/stub protocol above the IPC core: what each command carries and how replies read.

Both sides import this module; it knows records and messages, not models or servers.

Every command is an inline-reply ``IPCMessage`` pushed on the stub's queue:

==================  ======================================  =====================================
command             args                                    reply (status, reply_args)
==================  ======================================  =====================================
AUTO_COMPLETE       PAYLOAD record: JSON {model, config}    OK + PAYLOAD: JSON {config}
INITIALIZE          PAYLOAD record: JSON {model, args}      OK + PAYLOAD: JSON {is_ready: bool}
EXECUTE             first REQUEST record of a chain         OK + first RESPONSE record of a chain
PING                0                                       OK + PAYLOAD: JSON {ready: bool}
FINALIZE            0                                       OK + 0; then the stub exits
SHUTDOWN            0                                       none; the stub exits
REGION_MAP          PAYLOAD: JSON {id, key, offset, size}   OK + 0 (nobody waits: queued ahead of
                                                            the Execute that needs the region)
REGION_UNMAP        PAYLOAD: JSON {id}                      OK + 0 (nobody waits)
==================  ======================================  =====================================

Calls the other way are one-way messages (nobody waits on them):

==================  ==================  ==========================================================
command             queue               carries
==================  ==================  ==========================================================
RESPONSE_SEND       stub_to_parent_mq   args: a RESPONSE record; request_id: the handle of the
                                        REQUEST record it answers (a response sender's send())
CANCEL_REQUEST      parent_to_stub_mq   request_id: the REQUEST record whose caller cancelled it
==================  ==================  ==========================================================

A BLS call (``pb_utils.InferenceRequest(...).exec()``) is an inline-reply INFER_EXEC_REQUEST on
``stub_to_parent_mq``: args is a REQUEST record in the caller's pool whose strings are
``[request_id, parameters_json, correlation_id_text, model_name, model_version, *requested]``;
the parent frees it and replies OK with a RESPONSE record written into the caller's pool (an
error response when the call failed).

A failed command replies ``REPLY_ERROR`` with a PAYLOAD record holding ``{"message": text}`` (or 0
when the pool had no room for it). The parent itself replies ``REPLY_STUB_GONE`` to messages a
dead stub can no longer answer.

Request records: ints ``(flags, correlation_id, timeout_us)``; strings
``[request_id, parameters_json, correlation_id_text, *requested_output_names]``; tensors = inputs.
Response records: status 0 or ``1 + TritonError code``; ints ``(execute_start_ns, execute_end_ns,
response_flags)`` on the shared CLOCK_MONOTONIC (for statistics; the parent clamps them); strings
``[error_message, parameters_json]``; tensors = outputs. Requests own nothing of the stub's; response records belong to the parent once
replied, which frees them when the last numpy view of their outputs goes away.
"""

from __future__ import annotations

import json
from typing import Any

from stubhost import _core
from stubhost._core import Pool, RecordKind

LOG_MARKER = "\x1fSTUBLOG"  # starts a pb_utils.Logger line on the stub's stderr, parsed by the parent

# Response record flags (the record's third int). A response in an Execute reply is final unless
# it is DEFERRED: a placeholder saying that the request is answered through its response sender.
RESPONSE_FINAL = 1     # TRITONSERVER_RESPONSE_COMPLETE_FINAL: the request's last response
RESPONSE_EMPTY = 2     # no response, only the flags (``sender.send(None, FINAL)``)
RESPONSE_DEFERRED = 4  # Execute reply placeholder: the answer comes as RESPONSE_SEND messages
RESPONSE_FAILED = 8    # an error response for a request whose execute failed (not one the model answered)

REPLY_OK = 0
REPLY_ERROR = 1
REPLY_STUB_GONE = 2

REQUEST_FIXED_STRINGS = 4  # request_id, parameters, correlation id text, trace id; then requested outputs
BLS_FIXED_STRINGS = 6      # ... then the model name and version; then requested outputs
# A requested output the stub should write straight into a client's region is named
# "<name><SEP><region id>:<offset>:<byte_size>"; the model sees only "<name>".
OUTPUT_DESTINATION_SEP = "\x1f"
MAX_BATCH_RECORDS = 1 << 16  # bounds a chain walk, so a corrupt chain cannot loop forever

# TRITONSERVER_Error_Code, as pb_utils.TritonError exposes them.
ERROR_CODE_NAMES = ("UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED",
                    "ALREADY_EXISTS", "CANCELLED")


def encode_destination(name: str, region: int, offset: int, byte_size: int) -> str:
    """The requested-output string for an output bound for a client region."""
    return f"{name}{OUTPUT_DESTINATION_SEP}{region}:{offset}:{byte_size}"


def decode_destination(text: str) -> tuple[str, tuple[int, int, int] | None]:
    """(name, (region, offset, byte_size) or None) of a requested-output string."""
    name, sep, where = text.partition(OUTPUT_DESTINATION_SEP)
    if not sep:
        return name, None
    try:
        region, offset, size = (int(part) for part in where.split(":"))
    except ValueError:
        raise ValueError(f"malformed output destination for '{name}'") from None
    if region < 0 or offset < 0 or size < 0:
        raise ValueError(f"malformed output destination for '{name}'")
    return name, (region, offset, size)


def output_too_large(name: str, size: int, nbytes: int) -> str:
    """Triton's words for an output of `nbytes` that a client region window of `size` cannot hold."""
    return (f"shared memory size specified with the request for output '{name}' ({size} bytes) should be at "
            f"least {nbytes} bytes to hold the results")


def error_code_name(code: int) -> str:
    """Name of a TRITONSERVER error code ("UNKNOWN" for a value outside the enum)."""
    return ERROR_CODE_NAMES[code] if 0 <= code < len(ERROR_CODE_NAMES) else "UNKNOWN"


def write_payload(pool: Pool, value: Any) -> int:
    """Writes a JSON payload record (used off the execute path only)."""
    return _core.write_record(pool, int(RecordKind.PAYLOAD), strings=(json.dumps(value),))


def read_payload(pool: Pool, handle: int) -> Any:
    """Reads and frees a JSON payload record."""
    try:
        _, _, _, _, strings, _ = _core.read_record(pool, handle)
        if not strings:
            raise _core.FormatError("payload record holds no text")
        return json.loads(strings[0])
    finally:
        pool.free(handle)
