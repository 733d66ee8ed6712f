"""The parent's side of BLS: a model's ``exec()`` served by the server it runs in.

A stub's INFER_EXEC_REQUEST names a request record in the stub's own pool. It is read there
(inputs are views, copied once into the target instance's pool), run like any other request
on any loaded model (another instance of the caller included), and answered with a response
record written into the caller's pool, so the caller's outputs are views too. A failed call is
answered with an error response: the model sees it as ``response.error()``.

A call to a model that is neither decoupled nor a sequence, with no timeout, is started by the
stub's calls thread itself, which lingers a moment for a quick answer when its request runs at
once; a later one is answered by the target instance's completion thread (or, for a model with
a queue, by whoever settles the request: that thread, the queue's timer, an unload), so no
thread waits for it. Other calls run on a thread pool of their own: the calls thread only hands
them over, so a slow target never holds up the responses the same stub streams meanwhile.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import threading
import weakref
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from stubhost import _core
from stubhost._core import Command, IPCMessage, Pool, RecordKind
from stubhost.host.background import iterate_in_background, run_in_background
from stubhost.host.errors import InferenceError, UnknownModelError
from stubhost.protocol import (
    BLS_FIXED_STRINGS,
    ERROR_CODE_NAMES,
    REPLY_ERROR,
    REPLY_OK,
    RESPONSE_EMPTY,
    RESPONSE_FINAL,
    read_payload,
    write_payload,
)
from stubhost.tensor import numpy_to_triton_dtype

if TYPE_CHECKING:
    from stubhost.host.result import InferResponse
    from stubhost.host.server import Server
    from stubhost.host.stub_process import StubProcess

log = logging.getLogger("stubhost")

_REQUEST = int(RecordKind.REQUEST)
_RESPONSE = int(RecordKind.RESPONSE)
_BYTES = int(_core.DataType.BYTES)
MAX_BLS_THREADS = 64
# How long the calls thread waits for a plain call's answer before the target's completion
# thread takes over: a quick model's answer then goes straight back (no thread hop), and the
# stub's next message waits at most this long.
BLS_LINGER_S = 300e-6


def _as_bls_error(error: Exception, target: str) -> InferenceError:
    """The error a BLS caller gets for `error` from a call to `target`. As in Triton's Python
    backend, a call that could not start (the target is not ready: its model or version is not
    loaded; the target refused the request) is INTERNAL, ``Model <target> - Error when running
    inference: <why>``; an error the target answered with keeps its code and words; anything not
    an InferenceError becomes INTERNAL."""
    if isinstance(error, UnknownModelError):
        why = f"Failed for execute the inference request. Model '{error.model_name}' is not ready."
    elif isinstance(error, InferenceError) and error.refused:
        why = error.message
    elif isinstance(error, InferenceError):
        return error
    else:
        return InferenceError("INTERNAL", f"BLS request failed: {error}")
    return InferenceError("INTERNAL", f"Model {target} - Error when running inference: {why}")


def _decoupled_target(name: str) -> InferenceError:
    """Triton's refusal of a plain ``exec()`` of a decoupled model (its words, stray quote included)."""
    error = InferenceError("UNSUPPORTED", f"Model {name} is using the decoupled. The current BLS request call doesn't "
                                          "support models using the decoupled transaction policy. Please use "
                                          "'decoupled=True' argument to the 'exec' or 'async_exec' calls for "
                                          "decoupled models.'")
    error.refused = True
    return error


def _error_record(pool: Pool, error: InferenceError) -> int:
    code = ERROR_CODE_NAMES.index(error.code) if error.code in ERROR_CODE_NAMES else 0
    return _core.write_record(pool, _RESPONSE, 1 + code, (0, 0, RESPONSE_FINAL), (error.message, "{}"), ())


def _dtype(array: np.ndarray) -> int:
    return _BYTES if array.dtype.kind == "O" else int(numpy_to_triton_dtype(array.dtype))


class BlsService:
    """Serves the BLS calls of every stub of one server."""

    def __init__(self, server: Server) -> None:
        self._server = weakref.ref(server)  # the server owns this service, not the other way round
        self._threads: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._cancels: dict[tuple[int, int], threading.Event] = {}  # (stub, call id) of running streams

    def handler(self) -> Callable[[StubProcess, IPCMessage], None]:
        """What stub processes call (from their calls thread) for each INFER_EXEC_REQUEST."""
        return self.submit

    def submit(self, process: StubProcess, message: IPCMessage) -> None:
        """Hands one call over to the pool of BLS threads (a cancellation is noted at once)."""
        command = message.command
        if command == Command.METRIC_REQUEST:  # cheap, and applied in the order the stub sent them
            self.serve_metric(process, message)
            return
        if command == Command.CANCEL_REQUEST:
            key = (id(process), message.request_id)
            message.release()
            cancel = self._cancels.get(key)
            if cancel is not None:
                cancel.set()
            return
        if self._threads is None:
            with self._lock:
                if self._threads is None:
                    self._threads = ThreadPoolExecutor(max_workers=MAX_BLS_THREADS, thread_name_prefix="stubhost-bls")
        if command == Command.INFER_STREAM_EXEC_REQUEST:
            record, stream_id = message.args, message.request_id
            message.release()
            cancel = self._cancels[(id(process), stream_id)] = threading.Event()
            try:
                self._threads.submit(self.serve_stream, process, record, stream_id, cancel)
            except RuntimeError:  # shut down: the server is closing
                self._cancels.pop((id(process), stream_id), None)
                process.pool.free(record)
            return
        if not message.inline_reply:  # a call nobody waits for is not one we know
            message.release()
            return
        try:
            if command == Command.MODEL_CONTROL_REQUEST:
                self._threads.submit(self.serve_control, process, message)
            else:
                self.start(process, message)
        except RuntimeError:
            self._answer(process, message, InferenceError("UNAVAILABLE", "the server is closing"))

    def serve_metric(self, process: StubProcess, message: IPCMessage) -> None:
        """A custom-metric update (one-way) or value query (answered with ``{"result": v}``)."""
        pool = process.pool
        answer: dict[str, Any]
        try:
            update = read_payload(pool, message.args)
            server = self._server()
            if server is None or not isinstance(update, dict):
                raise ValueError("the server is closed" if server is None else "malformed metric update")
            answer = {"result": server.custom_metrics.apply(process, update)}  # the stub owns what it declares
        except (ValueError, KeyError, TypeError, _core.CoreError) as e:
            if not message.inline_reply:
                log.warning("instance '%s': custom metric update failed: %s", process.instance_name, e)
            answer = {"error": str(e)}  # the stub words it as Triton does
        if not message.inline_reply:
            message.release()
            return
        self._reply_payload(message, answer, pool)

    def _reply_payload(self, message: IPCMessage, answer: dict[str, Any], pool: Pool) -> None:
        """Answers with a JSON payload (REPLY_ERROR with none when the pool has no room)."""
        try:
            reply = write_payload(pool, answer)
        except _core.CoreError:
            self._reply(message, REPLY_ERROR, 0, pool)
            return
        self._reply(message, REPLY_OK, reply, pool)

    def serve_control(self, process: StubProcess, message: IPCMessage) -> None:
        """``pb_utils.load_model`` / ``unload_model`` / ``is_model_ready``: answered with a JSON
        payload ``{"result": ...}`` or ``{"error": text}``."""
        pool = process.pool
        try:
            try:
                payload = read_payload(pool, message.args)
            except (_core.CoreError, ValueError) as e:
                raise InferenceError("INVALID_ARG", f"malformed model control request: {e}") from None
            server = self._server()
            if server is None:
                raise InferenceError("UNAVAILABLE", "the server is closed")
            op, name = payload.get("op"), str(payload.get("name", ""))
            result: Any = None
            if op == "ready":
                result = server.model_ready(name, str(payload.get("version", "")))
            elif op in ("load", "unload"):
                if not server.allow_model_control:
                    raise InferenceError("UNAVAILABLE", "explicit model load / unload is not allowed if polling "
                                                        "is enabled")
                if op == "load":
                    files = payload.get("files") or {}
                    if not isinstance(files, dict):
                        raise InferenceError("INVALID_ARG", "malformed model control request: 'files' is not a map")
                    server.load(name, config=payload.get("config") or None,
                                files={str(k): base64.b64decode(str(v)) for k, v in files.items()} or None)
                else:
                    server.unload(name, unload_dependents=payload.get("unload_dependents") is True)
            else:
                raise InferenceError("INVALID_ARG", f"unknown model control operation {op!r}")
            answer: dict[str, Any] = {"result": result}
        except InferenceError as e:
            answer = {"error": e.message}
        except Exception as e:  # noqa: BLE001  (the caller must always get an answer)
            answer = {"error": f"model control failed: {e}"}
        self._reply_payload(message, answer, pool)

    def serve_stream(self, process: StubProcess, record: int, stream_id: int, cancel: threading.Event) -> None:
        """Runs one decoupled call: each response is written into the caller's pool and sent to
        its stub as a RESPONSE_SEND naming the call's id, the last one flagged final."""
        pool = process.pool
        responses: Generator[InferResponse, None, None] | None = None
        call: dict[str, Any] = {}
        try:
            server, call = self._call(process, record)
            trace = call.pop("trace")
            responses = (server.stream_responses(**call) if trace is None
                         else iterate_in_background(server.stream_responses_async(**call, trace=trace)))
            for response in responses:
                if record:
                    pool.free(record)  # the request is in the target's pool by now
                    record = 0
                if cancel.is_set():
                    responses.close()  # the target sees is_cancelled(); what it sends is dropped
                    self._send(process, stream_id, lambda: _error_record(pool, InferenceError(
                        "CANCELLED", "the request was cancelled")))
                    return
                if not self._send(process, stream_id, lambda: self._response_record(pool, response)):
                    return  # the caller is gone
                if response.final:
                    return
        except Exception as e:  # noqa: BLE001  (the caller must always get an end)
            error = _as_bls_error(e, call.get("name", ""))
            if not isinstance(e, InferenceError):
                log.exception("decoupled BLS call from '%s' failed", process.instance_name)
            self._send(process, stream_id, lambda: _error_record(pool, error))
        finally:
            if responses is not None:
                responses.close()
            if record:
                pool.free(record)
            self._cancels.pop((id(process), stream_id), None)

    @staticmethod
    def _send(process: StubProcess, stream_id: int, write: Callable[[], int]) -> bool:
        """Writes one response record into the caller's pool and sends it; False when the
        caller can no longer take it."""
        try:
            reply = write()
        except _core.CoreError:
            return False
        if process.post(Command.RESPONSE_SEND, reply, stream_id):
            return True
        try:
            _core.free_record_chain(process.pool, reply)
        except _core.CoreError:
            pass
        return False

    @staticmethod
    def _response_record(pool: Pool, response: InferResponse) -> int:
        flags = RESPONSE_FINAL if response.final else 0
        if response.error is not None:
            error = response.error
            code = ERROR_CODE_NAMES.index(error.code) if error.code in ERROR_CODE_NAMES else 0
            return _core.write_record(pool, _RESPONSE, 1 + code, (0, 0, flags), (error.message, "{}"), ())
        if response.empty:
            return _core.write_record(pool, _RESPONSE, 0, (0, 0, flags | RESPONSE_EMPTY), ("", "{}"), ())
        outputs = [(name, array, _dtype(array)) for name, array in response.outputs.items()]
        parameters = json.dumps(response.parameters) if response.parameters else "{}"
        return _core.write_record(pool, _RESPONSE, 0, (0, 0, flags), ("", parameters), outputs)

    def start(self, process: StubProcess, message: IPCMessage) -> None:
        """Starts one call. One its target can take with no thread waiting (see
        Server.submit_response) is answered from here if it comes within BLS_LINGER_S, else by
        the target instance's completion thread; any other is handed, as read, to a BLS thread."""
        pool, record = process.pool, message.args
        call: dict[str, Any] = {}
        try:
            server, call = self._call(process, record)
            if server.is_decoupled(call["name"]):
                raise _decoupled_target(call["name"])
            request_timeout_us = call.pop("request_timeout_us")  # the no-wait path shows none to the target
            trace = call.pop("trace")  # only the asyncio path traces
            done = functools.partial(self._respond, process, message, call["name"])
            linger = BLS_LINGER_S if not len(process.calls) else 0.0  # nothing else of the stub's waits
            if (request_timeout_us is None and trace is None
                    and server.submit_response(**call, done=done, linger=linger)):
                pool.free(record)  # the inputs are in the target's pool now
                return
        except Exception as e:  # noqa: BLE001  (the caller must always get an answer)
            pool.free(record)
            self._fail(process, message, e, call.get("name", ""))
            return
        try:
            self._threads.submit(self.serve, process, message, server,  # type: ignore[union-attr]
                                 {**call, "request_timeout_us": request_timeout_us, "trace": trace})
        except RuntimeError:  # shut down: the server is closing
            pool.free(record)
            self._answer(process, message, InferenceError("UNAVAILABLE", "the server is closing"))

    def serve(self, process: StubProcess, message: IPCMessage, server: Server, call: dict[str, Any]) -> None:
        """Runs one call, as ``_call`` read it, and answers it (a BLS thread)."""
        trace = call.pop("trace", None)
        try:
            response = (server.infer_response(**call) if trace is None
                        else run_in_background(server.infer_response_async(**call, trace=trace)))
        except Exception as e:  # noqa: BLE001  (the caller must always get an answer)
            self._fail(process, message, e, call["name"])
            return
        finally:
            process.pool.free(message.args)  # the inputs were copied into the target's pool (or never read)
        self._respond(process, message, call["name"], response)

    def _fail(self, process: StubProcess, message: IPCMessage, error: Exception, target: str = "") -> None:
        """Answers a call to `target` that failed with `error` (one that is not an
        InferenceError is logged)."""
        if not isinstance(error, InferenceError):
            log.error("BLS call from '%s' failed", process.instance_name, exc_info=error)
        self._answer(process, message, _as_bls_error(error, target))

    def _respond(self, process: StubProcess, message: IPCMessage, name: str,
                 response: InferResponse | InferenceError) -> None:
        """Answers a call with its response, written into the caller's pool."""
        if isinstance(response, InferenceError):
            self._answer(process, message, response)
            return
        try:
            reply = self._response_record(process.pool, response)
        except (_core.PoolFullError, _core.ShmError, _core.ShmSpaceError):
            self._answer(process, message, InferenceError("UNAVAILABLE", f"no room for the response of model "
                                                                          f"'{name}' in the caller's shared memory"))
            return
        except Exception as e:  # noqa: BLE001
            self._fail(process, message, e)
            return
        self._reply(message, REPLY_OK, reply, process.pool)

    def _answer(self, process: StubProcess, message: IPCMessage, error: InferenceError) -> None:
        try:
            reply = _error_record(process.pool, error)
        except _core.CoreError:
            self._reply(message, REPLY_ERROR, 0, process.pool)  # no room even for the reason
            return
        self._reply(message, REPLY_OK, reply, process.pool)

    @staticmethod
    def _reply(message: IPCMessage, status: int, reply: int, pool: Pool) -> None:
        try:
            message.reply(status, reply)
        except _core.CoreError:  # answered already (cannot happen but for a hostile stub)
            if reply:
                _core.free_record_chain(pool, reply)
        finally:
            message.release()

    def _call(self, process: StubProcess, record: int) -> tuple[Server, dict[str, Any]]:
        """The server and the keyword arguments of the call a BLS request record describes
        (inputs are views of the record, which must outlive the call's start). Its ``trace`` is
        a child of the trace of the request the stub named, when that request is traced and was
        sent to this stub (Triton traces a BLS request made with ``trace=request.trace()``)."""
        try:
            kind, _, ints, _, strings, tensors = _core.read_record(process.pool, record)
        except _core.CoreError as e:
            raise InferenceError("INVALID_ARG", f"malformed BLS request: {e}") from None
        if kind != _REQUEST or len(strings) < BLS_FIXED_STRINGS:
            raise InferenceError("INVALID_ARG", "malformed BLS request: not a BLS request record")
        request_id, parameters, corr_text, trace_id, model_name, version = strings[:BLS_FIXED_STRINGS]
        try:
            params: Any = json.loads(parameters) if parameters and parameters != "{}" else {}
        except ValueError:
            params = None
        if not isinstance(params, dict):
            raise InferenceError("INVALID_ARG", "BLS request parameters must be a JSON object")
        server = self._server()
        if server is None:
            raise InferenceError("UNAVAILABLE", "the server is closed")
        timeout_us = ints[2]
        parent = process.traces.get(int(trace_id)) if trace_id.isdigit() else None
        return server, {"name": model_name, "inputs": {name: array for name, _, array in tensors},
                        "outputs": list(strings[BLS_FIXED_STRINGS:]) or None, "model_version": version,
                        "parameters": params, "request_id": request_id, "correlation_id": corr_text or ints[1],
                        # Triton's request timeout: shown to the target, bounding its wait in a queue
                        # whose policy allows it; never a deadline that ends a running request.
                        "flags": ints[0], "request_timeout_us": timeout_us or None,
                        "trace": parent.child(model_name) if parent is not None else None}

    def close(self) -> None:
        """Stops taking calls (those running finish)."""
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
