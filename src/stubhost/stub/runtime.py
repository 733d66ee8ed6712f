"""The stub's command loop: attach, then Initialize -> Execute* -> Finalize, and exit.

The loop waits on the stub queue with the GIL released. A watchdog thread ends the stub within a
fraction of a second when the parent dies, unlinking the parent's segments so that nothing is
left in /dev/shm even after a SIGKILL of the parent.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import mmap
import os
import signal
import sys
import sysconfig
import threading
import time
import traceback
from types import ModuleType, TracebackType
from typing import Any

import _posixshmem  # CPython's shm_open binding (what multiprocessing.shared_memory uses)

from stubhost import _core
from stubhost._core import Command, IPCControl, IPCMessage, MessageQueue, Pool
from stubhost.backend_utils import bls, metrics
from stubhost.backend_utils import helpers as pb_helpers
from stubhost.backend_utils.constants import TRITONSERVER_REQUEST_RELEASE_ALL, TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
from stubhost.backend_utils.errors import TritonError
from stubhost.backend_utils.logger import Logger, LogLevel, ModelOutput, set_log_sink
from stubhost.backend_utils.model_config import ModelConfig
from stubhost.backend_utils.request import InferenceRequest
from stubhost.backend_utils.response import InferenceResponse
from stubhost.backend_utils.response_sender import set_transport
from stubhost.logs import encode_model_line
from stubhost.protocol import REPLY_ERROR, REPLY_OK, RESPONSE_FAILED, RESPONSE_FINAL, read_payload, write_payload
from stubhost.stub import codec
from stubhost.stub.loader import load_model_module
from stubhost.stub.gpu_io import CudaTarget, StubGpu, force_cpu_only_inputs
from stubhost.stub.caller import StubCaller
from stubhost.stub.execute_returns import ExecuteError, any_rescheduled, check_responses, claim
from stubhost.stub.responder import StubResponder
from stubhost.stub.sequence_controls import clear_start_and_end, cleared_controls

WATCHDOG_PERIOD_S = 0.1
NOTIFY_TIMEOUT_S = 1.0


_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the stubhost package
_STDLIB_DIR = sysconfig.get_paths()["stdlib"]
_SITE_DIRS = tuple({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})


def _runner_frame(filename: str) -> bool:
    """A frame of what runs the model rather than of the model: stubhost's own code, or the
    standard library's event loop and futures that stubhost calls the model through."""
    if filename.startswith(_OWN_DIR + os.sep):
        return True
    return filename.startswith(_STDLIB_DIR + os.sep) and not filename.startswith(_SITE_DIRS)


def format_exception(e: BaseException) -> str:
    """``Type: message`` and the frames, innermost first, as Triton's Python backend words them.

    Only the model's frames are listed, as in Triton, whose runner is C++: stubhost's frames
    (and the event-loop frames that lead into an ``async def execute``) are left out, and so are
    the frames of stubhost's pb_utils, which Triton implements in C++ too."""
    frames = traceback.extract_tb(e.__traceback__)
    first = next((i for i, frame in enumerate(frames) if not _runner_frame(frame.filename)), len(frames))
    lines = [f"{type(e).__name__}: {e}", "", "At:"]
    for frame in reversed(frames[first:]):
        if not frame.filename.startswith(_OWN_DIR + os.sep):
            lines.append(f"  {frame.filename}({frame.lineno}): {frame.name}")
    return "\n".join(lines) + "\n"


def _detail(e: BaseException) -> str:
    return str(e) if isinstance(e, ExecuteError) else format_exception(e)


_log_lock = threading.Lock()


def _log_to_parent(message: str, level: LogLevel, path: str, line: int) -> None:
    """Sends one record to the parent: one line on the output pipe, written whole (the lock
    keeps two threads' long records from interleaving; short writes to a pipe are atomic)."""
    data = memoryview(encode_model_line(level, path, line, message))
    with _log_lock:
        try:
            while data:
                data = data[os.write(2, data):]
        except OSError:
            pass  # the parent is gone (the watchdog ends this stub): there is no log to write to


def _thread_excepthook(args: threading.ExceptHookArgs) -> None:
    """An exception that ends a model's thread: its traceback reaches the log as one record
    (Python's own hook writes it line by line)."""
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else threading.get_ident()
    text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
    sys.stderr.write(f"Exception in thread {name}:\n{text}")


def _excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    """The same for an exception that ends the stub's main thread."""
    sys.stderr.write("".join(traceback.format_exception(exc_type, exc, tb)))


def capture_output() -> tuple[ModelOutput, ModelOutput]:
    """Makes each print() of the model one log record: stdout at INFO, stderr at WARNING (what
    Python writes there unasked is warnings, tracebacks and WARNING-or-worse log records)."""
    sys.stdout = ModelOutput(sys.stdout, LogLevel.INFO)
    sys.stderr = ModelOutput(sys.stderr, LogLevel.WARNING)
    threading.excepthook = _thread_excepthook
    sys.excepthook = _excepthook
    return sys.stdout, sys.stderr


class StubRuntime:
    """One model instance: its pool, its control block, its model object."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.pool = Pool.attach(spec["pool"])
        self.control = IPCControl.attach(self.pool, spec["control"])
        self.inbox = MessageQueue.attach(self.pool, self.control.stub_message_queue)
        self.outbox = MessageQueue.attach(self.pool, self.control.parent_message_queue)
        self.instance_name: str = spec.get("instance", "")
        self.doorbell: int | None = spec.get("doorbell")  # an eventfd: rung for a parent's event loop
        self.parent_pid = int(self.control.parent_pid)
        self.initial_ppid = os.getppid()
        self.module: ModuleType | None = None
        self.model: Any = None
        self.model_name = ""
        self.model_version = 0
        self.regions: dict[int, memoryview] = {}  # client regions by id, read-only views for inputs
        self.iterative = False  # sequence_batching { iterative_sequence: true }: requests may be rescheduled
        self.cleared_controls: dict[str, Any] = {}  # START/END control inputs, false from a second run on
        self.rescheduled: list[InferenceRequest] = []  # to run again in the next execute
        self.targets: dict[int, memoryview | CudaTarget] = {}  # regions, writable, for outputs placed there
        self.gpu: StubGpu | None = None  # client CUDA regions and GPU inputs; made at initialize
        self.calls = MessageQueue.attach(self.pool, self.control.stub_to_parent_mq)
        self.answers = MessageQueue.attach(self.pool, self.control.parent_to_stub_mq)
        self.responder = StubResponder(self.pool, self.calls, self.parent_alive, self.targets)
        self.caller = StubCaller(self.pool, self.calls, self.parent_alive)
        self.decoupled = False
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None  # runs ``async def execute`` (made on first use)

    # ---- lifecycle -------------------------------------------------------------------------------
    def parent_alive(self) -> bool:
        """False once the parent process is gone (reparented, or no such pid)."""
        if os.getppid() != self.initial_ppid:
            return False
        try:
            os.kill(self.parent_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def watch_parent(self) -> None:
        """Watchdog thread: an orphaned stub removes its parent's segments and exits at once."""
        stop = threading.Event()
        while not stop.wait(WATCHDOG_PERIOD_S):
            if not self.parent_alive():
                self.pool.unlink()
                os._exit(1)

    def run(self) -> int:
        """Serves commands until Finalize or Shutdown; returns the exit code."""
        set_log_sink(_log_to_parent)
        outputs = capture_output()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when a stub stops
        self.control.stub_pid = os.getpid()
        self.control.set_health(stub=True, value=True)
        threading.Thread(target=self.watch_parent, name="stubhost-watchdog", daemon=True).start()
        answers = threading.Thread(target=self.serve_answers, name="stubhost-answers", daemon=True)
        answers.start()
        set_transport(self.responder)
        bls.set_caller(self.caller)
        metrics.set_sink(self.caller, self.instance_name)
        try:
            return self.serve()
        finally:
            # A thread blocked in a core call (GIL released) must not outlive the interpreter:
            # it would be killed inside C++ at exit (std::terminate).
            self._stopping = True
            self.answers.push(0, timeout=0.1)
            answers.join(timeout=2.0)
            for output in outputs:
                output.drain()  # text a thread left without a final newline

    def serve(self) -> int:
        """The command loop."""
        handlers = {
            Command.EXECUTE_REQUEST: self.on_execute,
            Command.INITIALIZE_REQUEST: self.on_initialize,
            Command.AUTO_COMPLETE_REQUEST: self.on_auto_complete,
            Command.FINALIZE_REQUEST: self.on_finalize,
            Command.PING: self.on_ping,
            Command.REGION_MAP: self.on_region_map,
            Command.REGION_UNMAP: self.on_region_unmap,
        }
        while True:
            # Rescheduled requests run again as soon as the queue holds nothing to run with them.
            handle = self.inbox.pop(0.0 if self.rescheduled else 1.0)  # positional: see codec.read_requests
            if handle is None:
                if self.rescheduled:
                    self.run_rescheduled()
                continue
            message = IPCMessage.attach(self.pool, handle)
            command = message.command
            if command == Command.SHUTDOWN:
                message.release()
                return 0
            handler = handlers.get(command)
            try:
                if handler is None:
                    raise _core.FormatError(f"the stub does not handle {command.name}")
                handler(message)
            except Exception as e:  # the command failed: the parent gets the reason, the stub goes on
                self.reply_error(message, format_exception(e))
            if message.notify:
                # A parent caller that waits without a thread of its own learns of the reply here
                # (it also polls, so a full queue only delays it).
                self.outbox.push(message.handle, NOTIFY_TIMEOUT_S)
            elif message.ring and self.doorbell is not None:
                self.ring_doorbell()
            message.release()
            if command == Command.FINALIZE_REQUEST:
                self.control.set_health(stub=True, value=False)
                return 0

    def serve_answers(self) -> None:
        """Reads the parent's one-way messages (cancellations, decoupled BLS responses) while the
        stub runs."""
        while not self._stopping:
            handle = self.answers.pop(timeout=1.0)
            if not handle:
                continue
            try:
                message = IPCMessage.attach(self.pool, handle)
            except _core.CoreError as e:
                print(f"stubhost stub: ignoring a malformed message from the parent: {e}", file=sys.stderr)
                continue
            command, request, args = message.command, message.request_id, message.args
            message.release()
            if command == Command.CANCEL_REQUEST:
                self.responder.cancel(request, args)
            elif command == Command.RESPONSE_SEND:  # a response of a decoupled BLS call
                self.caller.deliver(request, args)

    def async_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop ``async def execute`` runs on, in a thread of its own (made once)."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="stubhost-async", daemon=True).start()
            self._loop = loop
        return self._loop

    def reply_error(self, message: IPCMessage, text: str) -> None:
        """Answers `message` with an error payload."""
        try:
            payload = write_payload(self.pool, {"message": text})
        except _core.CoreError:
            payload = 0  # no room for the reason (a full pool): the parent still learns of the failure
        try:
            message.reply(REPLY_ERROR, payload)
        except _core.CoreError:
            if payload:  # already answered: the reason has no reader
                self.pool.free(payload)

    def ring_doorbell(self) -> None:
        """Wakes the parent's event loop that waits for an answer just written."""
        try:
            os.eventfd_write(self.doorbell, 1)  # type: ignore[arg-type]
        except OSError:
            pass  # the count is full (the parent reads it) or the parent is gone: the answer is in either way

    # ---- commands --------------------------------------------------------------------------------
    def load(self, payload: dict[str, Any]) -> ModuleType:
        """Imports the model file once (auto-complete and initialize share the module)."""
        if self.module is None:
            pb_helpers.set_model_dir(payload["version_dir"])
            self.module = load_model_module(payload["model_file"], top_level=bool(payload.get("top_level")))
            if not hasattr(self.module, "TritonPythonModel"):
                raise AttributeError(f"'{payload['model_file']}' does not define class TritonPythonModel")
        return self.module

    def on_auto_complete(self, message: IPCMessage) -> None:
        payload = read_payload(self.pool, message.args)
        model_class = self.load(payload).TritonPythonModel
        config = payload["config"]
        if hasattr(model_class, "auto_complete_config"):
            completed = model_class.auto_complete_config(ModelConfig(json.dumps(config)))
            if not isinstance(completed, ModelConfig):
                raise TypeError("auto_complete_config must return the ModelConfig object it was given, "
                                f"got {type(completed).__name__}")
            config = completed.as_dict()
        message.reply(REPLY_OK, write_payload(self.pool, {"config": config}))

    def on_initialize(self, message: IPCMessage) -> None:
        payload = read_payload(self.pool, message.args)
        module = self.load(payload)
        args: dict[str, str] = payload["args"]
        self.model_name = args["model_name"]
        self.instance_name = args["model_instance_name"]
        self.model_version = int(args["model_version"])
        self.decoupled = self.responder.decoupled = bool(payload.get("decoupled", False))
        config = json.loads(args["model_config"])
        self.iterative = bool((config.get("sequence_batching") or {}).get("iterative_sequence", False))
        self.cleared_controls = cleared_controls(config) if self.iterative else {}
        self.gpu = StubGpu(force_cpu_only_inputs(config))  # loads no CUDA until a CUDA region is mapped
        model = module.TritonPythonModel()
        if not callable(getattr(model, "execute", None)):
            raise AttributeError("TritonPythonModel must define an 'execute' method")
        if hasattr(model, "initialize"):
            model.initialize(args)
        self.model = model
        self.caller.allowed = True
        has_is_ready = callable(getattr(model, "is_ready", None))
        message.reply(REPLY_OK, write_payload(self.pool, {"is_ready": has_is_ready}))

    def on_ping(self, message: IPCMessage) -> None:
        """A readiness probe: the model's optional ``is_ready()``, which must return True."""
        is_ready = getattr(self.model, "is_ready", None)
        ready = self.model is not None and (not callable(is_ready) or is_ready() is True)
        message.reply(REPLY_OK, write_payload(self.pool, {"ready": ready}))

    def on_region_map(self, message: IPCMessage) -> None:
        """Maps a client's region: models read inputs there in place (a system region through
        read-only views; a CUDA region through its opened IPC handle) and outputs the client placed
        there are written into it once."""
        payload = read_payload(self.pool, message.args)
        if payload.get("kind") == "cuda":
            if self.gpu is None:
                raise RuntimeError("a CUDA region was mapped before the model was initialized")
            self.targets[int(payload["id"])] = self.gpu.map_region(payload)
            message.reply(REPLY_OK, 0)
            return
        offset, size = int(payload["offset"]), int(payload["byte_size"])
        fd = _posixshmem.shm_open(str(payload["key"]), os.O_RDWR, 0)
        try:
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            mapped = mmap.mmap(fd, offset - start + size, mmap.MAP_SHARED, offset=start)
        finally:
            os.close(fd)
        window = memoryview(mapped)[offset - start:]  # views keep the mapping alive
        self.targets[int(payload["id"])] = window
        self.regions[int(payload["id"])] = window.toreadonly()
        message.reply(REPLY_OK, 0)

    def on_region_unmap(self, message: IPCMessage) -> None:
        """Forgets a region; arrays a model still holds keep their mapping alive."""
        payload = read_payload(self.pool, message.args)
        self.regions.pop(int(payload["id"]), None)
        self.targets.pop(int(payload["id"]), None)
        if self.gpu is not None:
            self.gpu.unmap_region(int(payload["id"]))
        message.reply(REPLY_OK, 0)

    def on_execute(self, message: IPCMessage) -> None:
        try:  # how long the batch has run, queue time apart, decides whether a timeout means hung
            _core.mark_record_started(self.pool, message.args)
        except _core.CoreError:
            pass  # a bad handle fails in read_requests below
        requests = codec.read_requests(self.pool, message.args, self.model_name, self.model_version, self.regions,
                                       self.gpu)
        start = time.monotonic_ns()
        # Requests rescheduled by the last execute join this batch, first (their callers were
        # answered "deferred" already: their responses go through their senders).
        carried, self.rescheduled = self.rescheduled, []
        if self.decoupled:
            self.execute_decoupled(carried + requests, start)
            message.reply(REPLY_OK, 0)
            return
        batch = carried + requests
        self.responder.begin(requests)  # the carried ones are open already
        try:
            result = self.model.execute(batch)
            if asyncio.iscoroutine(result):
                # Run in the background so that the next Execute need not wait (Triton waits);
                # the responses then travel through the requests' senders.
                self.run_async(result, batch, start)
                result = None
            checked = check_responses(result, batch)
            own = checked
            if carried or any_rescheduled(requests):
                # A rescheduled request's entry is no response: dropped before the others are
                # claimed as this reply's answers.
                own = self.keep_rescheduled(requests, checked[len(carried):], deferred=True)[1]
            responses = claim(own, requests)
        except Exception as e:
            self.log_failure(e)
            self.responder.close_with_error(carried, self.failure_text(e))
            first = self.write_failure(requests, e, start)
        else:
            if carried:
                self.responder.deliver(*self.keep_rescheduled(carried, checked[:len(carried)]))
            if None in responses:  # InferenceResponse has no __eq__: this compares identities
                for request, response in zip(requests, responses):
                    if response is None:
                        self.responder.watch(request, start)
            first = codec.write_responses(self.pool, requests, responses, (start, time.monotonic_ns(), 0),
                                          self.targets)
        self.responder.end(requests)
        message.reply(REPLY_OK, first)

    def run_rescheduled(self) -> None:
        """Runs the requests the last ``execute`` rescheduled, with no new request to join them."""
        carried, self.rescheduled = self.rescheduled, []
        start = time.monotonic_ns()
        if self.decoupled:
            self.execute_decoupled(carried, start)
            return
        try:
            result = self.model.execute(carried)
            if asyncio.iscoroutine(result):
                self.run_async(result, carried, start)
                return
            checked = check_responses(result, carried)
        except Exception as e:
            self.log_failure(e)
            self.responder.close_with_error(carried, self.failure_text(e))
            return
        self.responder.deliver(*self.keep_rescheduled(carried, checked))

    def keep_rescheduled(self, requests: list[InferenceRequest], responses: list[InferenceResponse | None],
                         deferred: bool = False) -> tuple[list[InferenceRequest], list[InferenceResponse | None]]:
        """Takes the requests released with ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` out of a
        default-mode batch: they run again in a later ``execute`` and their entry (None, as
        Triton asks) is no response. In a model without iterative sequence batching such a
        request fails, with Triton's words. Returns the requests and responses that remain.
        With `deferred` (requests whose caller waits for this reply) every request remains and a
        rescheduled one's entry becomes None: the reply calls it deferred, and its response
        comes through its sender later."""
        if not any_rescheduled(requests):
            return requests, responses
        out: list[InferenceResponse | None] = []
        for request, response in zip(requests, responses):
            if request._release_flags != TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
                out.append(response)
            elif not self.iterative:
                request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
                out.append(InferenceResponse(error=TritonError(self.reschedule_refused())))
            else:
                self.reschedule(request)
                out.append(None)
        if deferred:
            return requests, out
        kept = [(q, r) for q, r in zip(requests, out) if q not in self.rescheduled]
        return [q for q, _ in kept], [r for _, r in kept]

    def reschedule(self, request: InferenceRequest) -> None:
        """Queues a request for a later ``execute``, as Triton's iterative sequencer re-enqueues
        it: no longer the start (nor the end) of its sequence, released with ALL by default."""
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        request._flags = 0
        clear_start_and_end(request, self.cleared_controls)
        self.rescheduled.append(request)

    def reschedule_refused(self) -> str:
        return (f"Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, but model '{self.model_name}' "
                "does not use iterative sequence batching (sequence_batching { iterative_sequence: true })")

    def write_failure(self, requests: list[InferenceRequest], e: Exception, start: int) -> int:
        """The reply of a failed default-mode ``execute``: each request fails with the error,
        except those a response sender already answered, which keep that answer (as in Triton,
        the error is then only logged) and are closed if still open."""
        text = self.failure_text(e)
        times = (start, time.monotonic_ns(), RESPONSE_FAILED)  # errors of a failed execute, not the model's answers
        responses: list[InferenceResponse | None] = []
        for request in requests:
            # A request its sender answered keeps that answer (DEFERRED: None here), ended with a
            # final flag if still open. The others are answered by this reply's error, and their
            # senders are closed, so a thread the model handed one to cannot answer a record the
            # parent frees and reuses. A response execute returned was never sent: the error wins.
            state = request._state
            through_sender = state.close() if state is not None else 0
            if through_sender is None:  # closed already: by the sender's final flag, or by a claim
                through_sender = state.sent - state.claimed  # type: ignore[union-attr]
            elif through_sender:
                try:
                    self.responder.send(request, None, RESPONSE_FINAL)
                except _core.CoreError as error:
                    Logger.log_error(f"could not close request '{request.request_id()}': {error}")
            responses.append(None if through_sender else InferenceResponse(error=TritonError(text)))
        if all(r is not None for r in responses):
            return codec.write_errors(self.pool, len(requests), text, times=times)
        return codec.write_responses(self.pool, requests, responses, times, self.targets)

    def execute_decoupled(self, requests: list[InferenceRequest], start: int) -> None:
        """Runs a decoupled ``execute``: it must return None; its responses go through the
        senders. If it fails, every request not closed yet gets the error as its final response."""
        for request in requests:
            self.responder.watch(request, start)
        try:
            result = self.model.execute(requests)
            if asyncio.iscoroutine(result):
                self.run_async(result, requests, start)
            elif result is not None:
                raise ExecuteError(f"Python model '{self.instance_name}' is using the decoupled mode and the execute "
                                    "function must return None.")
        except Exception as e:
            self.log_failure(e)
            self.responder.close_with_error(requests, self.failure_text(e))
            return
        for request in requests:
            if request._release_flags == TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
                if self.iterative:
                    self.reschedule(request)
                else:
                    request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
                    self.responder.close_with_error([request], self.reschedule_refused())

    def run_async(self, coroutine: Any, requests: list[InferenceRequest], start: int) -> None:
        """Runs an ``async def execute`` on the stub's event loop without waiting for it."""
        if not self.decoupled:
            for request in requests:
                self.responder.watch(request, start)
        future = asyncio.run_coroutine_threadsafe(coroutine, self.async_loop())
        future.add_done_callback(lambda done: self.after_async(done, requests))

    def after_async(self, future: concurrent.futures.Future[Any], requests: list[InferenceRequest]) -> None:
        """Delivers what an async ``execute`` returned (or its failure) through the senders."""
        try:
            result = future.result()
            if any_rescheduled(requests):
                raise ExecuteError("Request rescheduling (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) is not supported "
                                    "with 'async def execute' in stubhost")
            if self.decoupled:
                if result is not None:
                    raise ExecuteError(f"Python model '{self.instance_name}' is using the decoupled mode and the "
                                        "execute function must return None.")
            else:
                self.responder.deliver(requests, check_responses(result, requests))
        except BaseException as e:  # noqa: BLE001  (a cancelled future too: its requests still need an end)
            self.log_failure(e)
            self.responder.close_with_error(requests, self.failure_text(e))

    def failure_text(self, e: BaseException) -> str:
        """Triton's text for a failed ``execute``."""
        return f"Failed to process the request(s) for model '{self.instance_name}', message: {_detail(e)}"

    def log_failure(self, e: BaseException) -> None:
        """Logs a failed ``execute`` at ERROR, traceback included, in one record: Triton's stub
        does so (``pb_stub.cc``) for every failure, whether or not a response carries it."""
        Logger.log_error(f"Failed to process the request(s) for model '{self.instance_name}', message: {_detail(e)}")

    def on_finalize(self, message: IPCMessage) -> None:
        self.caller.allowed = False
        carried, self.rescheduled = self.rescheduled, []
        self.responder.close_with_error(carried, f"model '{self.model_name}' is being unloaded; the rescheduled "
                                                 "request did not finish", TritonError.UNAVAILABLE)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self.model is not None and hasattr(self.model, "finalize"):
            self.model.finalize()
        message.reply(REPLY_OK, 0)


def main(argv: list[str]) -> int:
    """``python -m stubhost.stub SPEC_JSON``: one structured argument, never positional fields."""
    if len(argv) != 1:
        print("usage: python -m stubhost.stub SPEC_JSON (started by the stubhost parent)", file=sys.stderr)
        return 2
    runtime = StubRuntime(json.loads(argv[0]))
    return runtime.run()
