"""Model warmup: Triton's ``model_warmup``, run on each instance before it becomes READY.

As Triton does it (``TritonModelInstance::GenerateWarmupData`` and ``WarmUp`` in
``core/src/backend_model_instance.cc``):

- A sample whose ``batch_size`` is 0 is skipped. Otherwise it makes ``batch_size`` identical
  requests, each of batch 1 (each input has shape ``[1] + dims`` when ``max_batch_size`` > 0,
  ``dims`` otherwise), and one Execute carries them all. That Execute runs ``count`` times
  (0 counts as 1), with the same data each time.
- ``zero_data``: zeros. ``random_data``: random bytes, one buffer per sample that every random
  input reads its first bytes from. A string input's zero or random data is ``count`` empty
  strings. ``input_data_file``: the file ``<model dir>/warmup/<file>``: for a string input, the
  serialized tensor (a 4-byte little-endian length before each element); otherwise raw row-major
  bytes, of which the first ones the tensor needs are used (a shorter file is an error).
- Every sample's data is built before the first one runs. The requests have no id, no requested
  outputs (so all of them), no parameters, correlation id 0 and no flags, and bypass the model's
  queue and sequence batcher. An input the configuration does not declare is passed as it is
  (Triton's override inputs, as a sequence model's control inputs are given).
- Every response of every request is waited for (all of a decoupled model's, to the final
  flag). If any is an error, the load fails with ``INVALID_ARG`` ``failed to run warmup sample
  '<name>': <error>; <error>; `` (each error followed by ``; ``), and no later sample runs.
- The requests count in the model's statistics as any others: the Python backend reports them.

stubhost's own choices: an instance restarted after a crash is warmed up again before it is
READY (Triton never restarts a stub); a restart whose warmup fails counts as another crash. Each
warmup Execute is bounded by ``init_timeout``. An instance whose warmup failed is finalized (its
model's ``finalize`` runs, as when Triton destroys the instance) and its stub stopped.

The requests travel like any request: written by ``ModelInstance.write_request``, chained and
sent as one Execute (as the scheduler sends a batch), answered through ``outcomes``,
``await_sender`` and ``streams_executed``.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stubhost import _core
from stubhost._core import Command
from stubhost.config.dict_form import config_from_dict
from stubhost.config.dtypes import config_dtype_to_triton
from stubhost.config.model_config_pb2 import DataType
from stubhost.host.answers import request_timeout
from stubhost.host.errors import InferenceError
from stubhost.host.instance_spec import InstanceSpec
from stubhost.host.streams import ResponseStream
from stubhost.host.stub_process import StubCallError, StubGoneError, StubProcess
from stubhost.tensor import storage_dtype

if TYPE_CHECKING:
    from stubhost.host.instance import ModelInstance
    from stubhost.host.stats import ModelStatistics

log = logging.getLogger("stubhost")

WARMUP_FOLDER = "warmup"  # Triton's kWarmupDataFolder, under the model's directory
_ID = "[request id: <id_unknown>] "
_BYTES = int(_core.DataType.BYTES)
_TENSORS = list[tuple[str, Any, int]]
# One warmup request's statistics: (batch, begin, sent, exec_start, exec_end, done, execution).
_Tally = tuple[int, int, int, int, int, int, int]


@dataclass(frozen=True)
class _Input:
    name: str
    dtype: int              # a _core.DataType value
    dims: tuple[int, ...]
    source: str             # "zero_data", "random_data" or "input_data_file"
    file: str = ""


@dataclass(frozen=True)
class _Sample:
    name: str
    batch_size: int
    count: int
    inputs: tuple[_Input, ...]


def samples_of(config: Mapping[str, Any]) -> list[_Sample]:
    """The samples that run, from a validated configuration in its JSON form."""
    cfg = config_from_dict(config, "the model configuration")
    samples = []
    for sample in cfg.model_warmup:
        if sample.batch_size == 0:  # Triton skips it ("Skipping batch 0 warmup sample")
            continue
        inputs = []
        for name in sorted(sample.inputs):
            entry = sample.inputs[name]
            dtype = int(_core.dtype_from_name(config_dtype_to_triton(DataType.Name(entry.data_type))))
            source = entry.WhichOneof("input_data_type") or ""
            inputs.append(_Input(name, dtype, tuple(int(d) for d in entry.dims), source, entry.input_data_file))
        samples.append(_Sample(sample.name, int(sample.batch_size), max(int(sample.count), 1), tuple(inputs)))
    return samples


class Warmup:
    """The warmup of one instance: its samples, and the statistics of the warmups it ran."""

    def __init__(self, spec: InstanceSpec) -> None:
        self.spec = spec
        self.samples = samples_of(spec.config) if spec.config.get("model_warmup") else []
        self.batching = int(spec.config.get("max_batch_size", 0)) > 0
        self._lock = threading.Lock()
        self._stats: ModelStatistics | None = None
        self._pending: list[_Tally] = []  # ran before the model's statistics existed

    # ---- statistics ------------------------------------------------------------------------------
    def count_into(self, stats: ModelStatistics) -> None:
        """Counts the warmups run so far, and from now on those of restarts, in `stats`."""
        with self._lock:
            self._stats, pending, self._pending = stats, self._pending, []
        for tally in pending:
            stats.record_success(self.spec.version, *tally)

    def _count(self, tallies: list[_Tally]) -> None:
        with self._lock:
            stats = self._stats
            if stats is None:
                self._pending.extend(tallies)
                return
        for tally in tallies:
            stats.record_success(self.spec.version, *tally)

    # ---- running ---------------------------------------------------------------------------------
    def run(self, instance: ModelInstance, process: StubProcess) -> None:
        """Warms up `process`, the instance's initialized stub. On failure the stub is
        finalized (when it still answers) and closed, and InferenceError is raised."""
        if not self.samples:
            return
        answering = True
        try:
            built = [(sample, self._tensors(sample)) for sample in self.samples]
            for sample, tensors in built:
                for iteration in range(1, sample.count + 1):
                    log.debug("model '%s' instance %s is running warmup sample '%s' for iteration %d",
                              self.spec.model_name, instance.name, sample.name, iteration)
                    errors, tallies = self._execute(instance, process, sample, tensors)
                    if errors:
                        answering = process.alive() and not any(e.startswith("Request timeout") for e in errors)
                        raise InferenceError("INVALID_ARG", f"failed to run warmup sample '{sample.name}': "
                                                            + "".join(f"{e}; " for e in errors))
                    self._count(tallies)
        except BaseException:
            self._discard(instance, process, answering)
            raise

    def _discard(self, instance: ModelInstance, process: StubProcess, answering: bool) -> None:
        """Ends a stub whose warmup failed: Finalize first while it still answers."""
        if answering and process.alive():
            try:
                process.call(Command.FINALIZE_REQUEST, 0, self.spec.finalize_timeout_s)
                process.process.wait(timeout=self.spec.finalize_timeout_s)
            except (StubCallError, StubGoneError, TimeoutError, _core.CoreError) as e:
                log.error("Finalize of instance '%s' failed: %s", instance.name, e)
            except Exception as e:  # noqa: BLE001  (subprocess.TimeoutExpired)
                log.error("Instance '%s' did not exit after finalize: %s", instance.name, e)
        process.close()

    def _execute(self, instance: ModelInstance, process: StubProcess, sample: _Sample,
                 tensors: _TENSORS) -> tuple[list[str], list[_Tally]]:
        """One Execute holding the sample's `batch_size` requests; the error texts of their
        responses, and their statistics."""
        timeout = self.spec.init_timeout_s
        pool = process.pool
        begin = time.monotonic_ns()
        written: list[tuple[int, int]] = []  # (record, serial)
        try:
            for _ in range(sample.batch_size):
                serial = process.next_serial()
                written.append((instance.write_request(process, tensors, [], "", "{}", 0, 0, None, None, serial),
                                serial))
            records = [record for record, _ in written]
            for record, following in itertools.pairwise(records):
                _core.set_record_next(pool, record, following)
            streams = [(r, process.stream_for(r, s)) for r, s in written] if self.spec.decoupled else None
            message = process.submit(Command.EXECUTE_REQUEST, records[0], timeout)
        except (InferenceError, TimeoutError, _core.CoreError) as e:
            for record, _ in written:
                pool.free(record)
            return [e.message if isinstance(e, InferenceError) else str(e)], []
        sent = time.monotonic_ns()
        deadline = time.monotonic() + timeout
        if not process.wait(message, timeout):
            return [request_timeout(instance.name, timeout).message], []
        if streams is not None:
            instance.streams_executed(process, message, streams)
            answers = [self._drain(instance, process, r, s, deadline) for r, s in streams]
        else:
            answers = []
            for record, outcome in zip(records, instance.outcomes(process, message, records, sent)):
                if isinstance(outcome, ResponseStream):
                    try:
                        outcome = instance.await_sender(process, record, outcome, sent, timeout, deadline)
                    except InferenceError as e:
                        outcome = e
                answers.append(([outcome.message], 0, 0) if isinstance(outcome, InferenceError)
                               else ([], outcome.exec_start, outcome.exec_end))
        done = time.monotonic_ns()
        errors = [text for texts, _, _ in answers for text in texts]
        tallies = [(1, begin, sent, start, end, done, sample.batch_size if i == 0 else 0)
                   for i, (_, start, end) in enumerate(answers)]
        return errors, tallies

    @staticmethod
    def _drain(instance: ModelInstance, process: StubProcess, record: int, stream: ResponseStream,
               deadline: float) -> tuple[list[str], int, int]:
        """Every response of a decoupled request, to the final flag: their error texts, and when
        the stub began and ended it."""
        errors: list[str] = []
        start = end = 0
        try:
            while True:
                item = stream.next(max(deadline - time.monotonic(), 0.0))
                if item is None:
                    errors.append(request_timeout(instance.name, instance.spec.init_timeout_s).message)
                    break
                if item.error is not None:
                    errors.append(item.error.message)
                start, end = start or item.exec_start, item.exec_end or end
                if item.final:
                    break
        finally:
            instance._leave(process, record, stream)
        return errors, start, end

    # ---- the requests' data ----------------------------------------------------------------------
    def _tensors(self, sample: _Sample) -> _TENSORS:
        """The inputs of the sample's requests (every request of the sample has the same)."""
        sizes = [math.prod(i.dims) * storage_dtype(_core.DataType(i.dtype)).itemsize
                 for i in sample.inputs if i.source == "random_data" and i.dtype != _BYTES]
        random = np.random.default_rng().bytes(max(sizes, default=0))
        tensors: _TENSORS = []
        for spec in sample.inputs:
            shape = ((1,) if self.batching else ()) + spec.dims
            if spec.dtype == _BYTES:
                array = self._strings(spec, shape)
            else:
                element = storage_dtype(_core.DataType(spec.dtype))
                size = math.prod(spec.dims) * element.itemsize
                if spec.source == "zero_data":
                    data = bytes(size)
                elif spec.source == "random_data":
                    data = random[:size]
                else:
                    data = self._read(spec)
                    if len(data) < size:
                        raise InferenceError("INVALID_ARG", f"{_ID}warmup setting expects {size} bytes, but the data "
                                                            f"provided from {spec.file}only has {len(data)} bytes")
                array = np.frombuffer(data, dtype=element, count=math.prod(spec.dims)).reshape(shape)
            tensors.append((spec.name, array, spec.dtype))
        return tensors

    def _strings(self, spec: _Input, shape: tuple[int, ...]) -> np.ndarray:
        """A string input: empty strings (zero or random data), or the elements of its file."""
        count = math.prod(spec.dims)
        if spec.source != "input_data_file":
            return np.array([b""] * count, dtype=object).reshape(shape)
        data = memoryview(self._read(spec))
        try:
            found = _core.count_bytes_elements(data)  # the BYTES layout's one reader
        except _core.FormatError:
            raise InferenceError("INVALID_ARG", f"{_ID}element byte size indicator exceeds the end of the "
                                                "buffer") from None
        model = self.spec.model_name
        if found < count:
            raise InferenceError("INVALID_ARG", f"{_ID}expected {count} string elements for inference input "
                                                f"'{spec.name}' for model '{model}', got {found}")
        if found > count:
            raise InferenceError("INVALID_ARG", f"{_ID}unexpected number of string elements {found} for "
                                                f"inference input '{spec.name}' for model '{model}', expecting {count}")
        return _core.decode_bytes(data, count).reshape(shape)

    def _read(self, spec: _Input) -> bytes:
        path = os.path.join(self.spec.model_dir, WARMUP_FOLDER, spec.file)
        try:
            return Path(path).read_bytes()
        except OSError as e:
            raise InferenceError("INTERNAL", f"failed to open text file for read {path}: {e.strerror}") from None
