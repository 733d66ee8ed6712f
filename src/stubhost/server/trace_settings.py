"""Triton's trace settings ("triton" trace mode) and the sampling of requests, as Triton's
TraceManager keeps them (server src/tracer.cc, docs/protocol/extension_trace.md).

There is one global setting and, optionally, one per model. A model's setting holds the fields
a client set for it; every other field follows the global setting, and follows it again after
each global update. A field set to null over HTTP (an empty value list over gRPC) is cleared:
a model's goes back to the global value, a global one to the value the server started with.
A model setting with no field set left is removed.

Each setting samples on its own: every ``trace_rate``-th request it sees is traced, until
``trace_count`` traces were taken (-1: no limit; the count shown goes down as traces are
taken). It gathers its finished traces and writes them (trace_file.py) once ``log_frequency``
of them have gathered, to ``<trace_file>.<n>``; once ``trace_count`` is used up (when every
request it saw was traced, as Triton checks it), to ``<trace_file>.<n>`` too; and when it is
replaced by an update or the server stops, to ``<trace_file>`` (to ``<trace_file>.<n>`` with a
``log_frequency``).

Front ends test ``TraceManager.on`` before sampling, so that with tracing off (the default)
a request costs one attribute read.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from stubhost.host.errors import InferenceError
from stubhost.host.trace import LEVELS, RequestTrace, level_names
from stubhost.option_numbers import StoiError, stoi
from stubhost.server.trace_file import TraceFile

MODE = "triton"  # the one trace mode stubhost has
FIELDS = ("level", "rate", "count", "log_frequency", "file")
MIN_TRACE_COUNT = -1
_UINT32 = (1 << 32) - 1
_INT32_MAX = (1 << 31) - 1
CLEAR = object()  # a field cleared back to its fallback value


class TraceSetting:
    """One set of values (global, or a model's) and the traces sampled under it; ``specified``
    names the fields set for it rather than taken from its fallback."""

    def __init__(self, level: int, rate: int, count: int, log_frequency: int, file: TraceFile,
                 specified: frozenset[str] = frozenset()) -> None:
        self.level = level
        self.rate = rate
        self.count = count
        self.log_frequency = log_frequency
        self.file = file
        self.specified = specified
        if level == 0:
            self.reason = "tracing is disabled"
        elif rate == 0:
            self.reason = "sample rate must be non-zero"
        elif not file.name:
            self.reason = "trace file name is not given"
        else:
            self.reason = ""
        self._lock = threading.Lock()
        self._seen = 0        # requests sampled from (Triton's sample_)
        self._collected = 0   # traces written to the stream
        self._live = 0        # traces taken and not yet written
        self._stream: list[bytes] = []
        self._in_stream = 0   # traces in the stream
        self._retired = False

    def valid(self) -> bool:
        """Whether it may trace requests (a used-up count stops it too)."""
        return not self.reason and self.count != 0

    def value(self, field: str) -> Any:
        """A field's value (the file by its name)."""
        return self.file.name if field == "file" else getattr(self, field)

    def take(self) -> bool:
        """Whether the request it sees now is traced (every ``rate``-th, ``count`` times)."""
        with self._lock:
            if self._retired or not self.valid():
                return False
            self._seen += 1
            if self._seen % self.rate:
                return False
            if self.count > 0:
                self.count -= 1
            self._live += 1
            return True

    def write(self, objects: list[bytes]) -> None:
        """A trace taken under this setting is finished: gathers its objects, and saves what has
        gathered when a condition of the module docstring holds."""
        with self._lock:
            self._stream.extend(objects)
            self._in_stream += 1
            self._collected += 1
            self._live -= 1
            if (self.count == 0 and self._collected == self._seen) or (
                    self.log_frequency and self._in_stream >= self.log_frequency):
                batch, indexed = self._drain(), True
            elif self._retired and not self._live:
                batch, indexed = self._drain(), self.log_frequency != 0
            else:
                return
        self.file.save(batch, indexed)

    def retire(self) -> None:
        """It was replaced (or the server stops): no more traces; what has gathered is saved
        once the traces still running are written."""
        with self._lock:
            self._retired = True
            if self._live:
                return
            batch = self._drain()
        self.file.save(batch, self.log_frequency != 0)

    def _drain(self) -> list[bytes]:
        batch, self._stream, self._in_stream = self._stream, [], 0
        return batch


class TraceManager:
    """The global and per-model trace settings of one server, and the sampling of requests.

    Built from the ``--trace-config`` values (server/trace_config.py); Triton's defaults are
    level OFF, rate 1000, count -1, log frequency 0 and no file.
    """

    def __init__(self, level: int = 0, rate: int = 1000, count: int = -1, log_frequency: int = 0,
                 file: str = "") -> None:
        self._files: dict[str, TraceFile] = {}
        trace_file = self._file(file)
        self._default = TraceSetting(level, rate, count, log_frequency, trace_file)  # what clearing returns to
        self._global = TraceSetting(level, rate, count, log_frequency, trace_file)
        self._models: dict[str, TraceSetting] = {}
        self._fallback_models: set[str] = set()  # models with fields that follow the global setting
        self._lock = threading.Lock()
        self.on = self._global.valid()  # whether any setting may trace: front ends sample only then

    def _file(self, name: str) -> TraceFile:
        file = self._files.get(name)
        if file is None:
            file = self._files[name] = TraceFile(name)
        return file

    # ---- sampling --------------------------------------------------------------------------------
    def sample(self, model_name: str) -> RequestTrace | None:
        """The trace of a request to `model_name`, when its setting samples this one; else None."""
        setting = self._models.get(model_name) or self._global
        if not setting.take():
            return None
        return RequestTrace(setting.level, setting.write, model_name)

    # ---- settings --------------------------------------------------------------------------------
    def settings(self, model_name: str = "") -> dict[str, Any]:
        """The settings in force for a model (its own, else the global ones) or, with no name,
        the global ones, in the trace extension's shape: strings, and a list for the level."""
        setting = self._models.get(model_name, self._global) if model_name else self._global
        return {"trace_level": level_names(setting.level), "trace_rate": str(setting.rate),
                "trace_count": str(setting.count), "log_frequency": str(setting.log_frequency),
                "trace_file": setting.file.name, "trace_mode": MODE}

    def update(self, model_name: str, changes: Mapping[str, Any]) -> None:
        """Applies `changes` (field -> value, or CLEAR) to a model's setting or, with no name, to
        the global one (and to what models take from it). Raises InferenceError with Triton's
        words for a setting that could not trace (unless its level is OFF)."""
        with self._lock:
            self._update(model_name, changes)
            if not model_name:
                for name in sorted(self._fallback_models):
                    self._update(name, {}, strict=False)
            self.on = self._global.valid() or any(s.valid() for s in self._models.values())

    def _update(self, model_name: str, changes: Mapping[str, Any], strict: bool = True) -> None:
        """Triton's UpdateTraceSettingInternal. Not `strict` (a model following a global update):
        a model setting that could not trace (its own count used up) is kept as it is, rather
        than failing the global update once it has been made, as Triton fails it."""
        current = self._models.get(model_name) if model_name else self._global
        fallback = self._global if model_name else self._default
        values = {field: fallback.value(field) for field in FIELDS}
        specified = set()
        for field in FIELDS:
            change = changes.get(field)
            if change is CLEAR:
                continue
            if change is not None:
                values[field] = change
            elif current is not None and field in current.specified:
                values[field] = current.value(field)  # the count as it is now, as Triton copies it
            else:
                continue
            specified.add(field)
        if model_name and not specified:  # nothing of its own left: the model follows the global setting
            self._fallback_models.discard(model_name)
            old = self._models.pop(model_name, None)
            if old is not None:
                old.retire()
            return
        setting = TraceSetting(values["level"], values["rate"], values["count"], values["log_frequency"],
                               self._file(values["file"]), frozenset(specified))
        if not setting.valid() and setting.level != 0:
            if not strict:
                return
            raise InferenceError("INVALID_ARG", f"Attempting to set invalid trace setting :{setting.reason}")
        if model_name:
            if len(specified) == len(FIELDS):
                self._fallback_models.discard(model_name)
            else:
                self._fallback_models.add(model_name)
            self._models[model_name] = setting
        else:
            self._global = setting
        if current is not None:
            current.retire()

    def close(self) -> None:
        """The server stops: every setting saves the traces it gathered."""
        with self._lock:
            self.on = False
            for setting in (self._global, *self._models.values()):
                setting.retire()


# ---- the settings a client sends ------------------------------------------------------------------
def _number(name: str, text: str, protocol: str) -> int:
    """A setting's number as Triton reads it (std::stoi), with its errors; the count's lower
    bound is checked here too."""
    try:
        value = stoi(text)
    except StoiError as e:
        if not e.out_of_range:
            raise InferenceError("INVALID_ARG", f"Unable to parse '{name}', got: {text}") from None
        low, high = (MIN_TRACE_COUNT, _INT32_MAX) if name == "trace_count" else (0, _UINT32)
        raise InferenceError("INVALID_ARG", f"Unable to parse '{name}', value is out of range [ {low}, {high} ], "
                                            f"got: {text}") from None
    if name == "trace_count":
        if value < MIN_TRACE_COUNT:
            space = " " if protocol == "grpc" else ""  # Triton's HTTP handler has no space there
            raise InferenceError("INVALID_ARG", f"Unable to parse 'trace_count'. Expecting value >= "
                                                f"{MIN_TRACE_COUNT}, got:{space}{text}")
        return value
    return value & _UINT32  # rate and log frequency are unsigned, as in Triton


def _level(values: list[Any]) -> int | None:
    """A level from its names; None when none of them is a level (nothing changes)."""
    level: int | None = None
    for name in values:
        if not isinstance(name, str):
            raise InferenceError("INTERNAL", "attempt to access JSON non-string as string")
        if name == "OFF":
            if len(values) != 1:
                raise InferenceError("INVALID_ARG", "Expect only one trace level 'OFF' is specified")
            level = 0
        elif name in LEVELS:  # any other name is ignored, as Triton ignores it
            level = (level or 0) | LEVELS[name]
    return level


def http_changes(body: Any) -> dict[str, Any]:
    """The changes a POST to ``v2[/models/<name>]/trace/setting`` asks for, read as Triton's HTTP
    handler reads them: strings, a list of level names, null to clear."""
    if not isinstance(body, dict):
        return {}
    changes: dict[str, Any] = {}
    if "trace_file" in body:
        raise InferenceError("UNSUPPORTED", "trace file location can not be updated through network protocol")
    if "trace_level" in body:
        value = body["trace_level"]
        if value is None:
            changes["level"] = CLEAR
        elif not isinstance(value, list):
            raise InferenceError("INTERNAL", "attempt to access JSON non-array as array")
        else:
            level = _level(value)
            if level is not None:
                changes["level"] = level
    for name, field in (("trace_rate", "rate"), ("trace_count", "count"), ("log_frequency", "log_frequency")):
        if name in body:
            value = body[name]
            if value is None:
                changes[field] = CLEAR
            elif not isinstance(value, str):
                raise InferenceError("INTERNAL", "attempt to access JSON non-string as string")
            else:
                changes[field] = _number(name, value, "http")
    return changes


def grpc_changes(settings: Mapping[str, list[str]]) -> dict[str, Any]:
    """The changes of a TraceSettingRequest's ``settings`` (name -> its values), read as
    Triton's gRPC handler reads them: no value clears a setting."""
    changes: dict[str, Any] = {}
    if "trace_file" in settings:
        raise InferenceError("UNSUPPORTED", "trace file location can not be updated through network protocol")
    if "trace_level" in settings:
        values = list(settings["trace_level"])
        level = _level(values) if values else CLEAR
        if level is not None:
            changes["level"] = level
    for name, field in (("trace_rate", "rate"), ("trace_count", "count"), ("log_frequency", "log_frequency")):
        if name in settings:
            values = list(settings[name])
            if not values:
                changes[field] = CLEAR
            elif len(values) > 1:
                raise InferenceError("INVALID_ARG", f"expect only 1 value for '{name}'")
            else:
                changes[field] = _number(name, values[0], "grpc")
    return changes
