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

In the "opentelemetry" mode (server/trace_otel.py) a finished trace is exported as spans rather
than written to a file, so no file is needed and ``log_frequency`` does nothing. A request that
continues a client's span (a valid W3C ``traceparent``) is traced whatever the rate and the count
left, as Triton traces it; ``trace_rate`` 0 then traces only such requests.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from stubhost.host.errors import InferenceError
from stubhost.host.trace import LEVELS, RequestTrace, level_names, new_span_ids
from stubhost.option_numbers import StoiError, stoi
from stubhost.server.trace_file import TraceFile
from stubhost.server.trace_otel import OtelExporter, OtelSettings, remote_parent

TRITON, OPENTELEMETRY = "triton", "opentelemetry"  # the trace modes
FIELDS = ("level", "rate", "count", "log_frequency", "file")
MIN_TRACE_COUNT = -1
_UINT32 = (1 << 32) - 1
_INT32_MAX = (1 << 31) - 1
CLEAR = object()  # a field cleared back to its fallback value


class TraceSetting:
    """One set of values (global, or a model's) and the traces sampled under it; ``specified``
    names the fields set for it rather than taken from its fallback."""

    def __init__(self, level: int, rate: int, count: int, log_frequency: int, file: TraceFile,
                 specified: frozenset[str] = frozenset(), exporter: OtelExporter | None = None) -> None:
        self.level = level
        self.rate = rate
        self.count = count
        self.log_frequency = log_frequency
        self.file = file
        self.specified = specified
        self.exporter = exporter  # opentelemetry mode: where finished traces go
        if level == 0:
            self.reason = "tracing is disabled"
        elif rate == 0 and exporter is None:
            self.reason = "sample rate must be non-zero"
        elif not file.name and exporter is None:
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

    def active(self) -> bool:
        """Whether some request may be traced: by sampling, or (opentelemetry mode) because it
        continues a client's span."""
        return self.valid() or (self.exporter is not None and not self.reason)

    def value(self, field: str) -> Any:
        """A field's value (the file by its name)."""
        return self.file.name if field == "file" else getattr(self, field)

    def take(self, forced: bool = False) -> bool:
        """Whether the request it sees now is traced (every ``rate``-th, ``count`` times; a
        `forced` one, which continues a client's span, always)."""
        with self._lock:
            if self._retired or self.reason:
                return False
            if forced:
                self._live += 1
                return True
            if self.count == 0 or self.rate == 0:
                return False
            self._seen += 1
            if self._seen % self.rate:
                return False
            if self.count > 0:
                self.count -= 1
            self._live += 1
            return True

    def write(self, trace: RequestTrace) -> None:
        """A trace taken under this setting is finished: exports it (opentelemetry mode), or
        gathers its objects and saves what has gathered when a condition of the module docstring
        holds."""
        if self.exporter is not None:
            with self._lock:
                self._live -= 1
            self.exporter.export(trace)
            return
        objects = trace.objects()
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
            if self._live or self.exporter is not None:
                return
            batch = self._drain()
        self.file.save(batch, self.log_frequency != 0)

    def _drain(self) -> list[bytes]:
        batch, self._stream, self._in_stream = self._stream, [], 0
        return batch


class TraceManager:
    """The global and per-model trace settings of one server, and the sampling of requests.

    Built from the ``--trace-config`` values (server/trace_config.py); Triton's defaults are
    level OFF, rate 1000, count -1, log frequency 0 and no file, in the "triton" mode. With
    `opentelemetry` settings, the mode is "opentelemetry": traces become spans (trace_otel.py).
    """

    def __init__(self, level: int = 0, rate: int = 1000, count: int = -1, log_frequency: int = 0,
                 file: str = "", *, opentelemetry: OtelSettings | None = None) -> None:
        self.mode = TRITON if opentelemetry is None else OPENTELEMETRY
        self._exporter = None if opentelemetry is None else OtelExporter(opentelemetry)
        self._files: dict[str, TraceFile] = {}
        trace_file = self._file(file)
        self._default = self._setting(level, rate, count, log_frequency, trace_file)  # what clearing returns to
        self._global = self._setting(level, rate, count, log_frequency, trace_file)
        self._models: dict[str, TraceSetting] = {}
        self._fallback_models: set[str] = set()  # models with fields that follow the global setting
        self._lock = threading.Lock()
        self.on = self._global.active()  # whether any setting may trace: front ends sample only then
        self.propagates = self._exporter is not None  # front ends pass the client's traceparent

    def _setting(self, level: int, rate: int, count: int, log_frequency: int, file: TraceFile,
                 specified: frozenset[str] = frozenset()) -> TraceSetting:
        return TraceSetting(level, rate, count, log_frequency, file, specified, self._exporter)

    def _file(self, name: str) -> TraceFile:
        file = self._files.get(name)
        if file is None:
            file = self._files[name] = TraceFile(name)
        return file

    # ---- sampling --------------------------------------------------------------------------------
    def sample(self, model_name: str, traceparent: str | None = None,
               tracestate: str | None = None) -> RequestTrace | None:
        """The trace of a request to `model_name`, when its setting samples this one; else None.
        opentelemetry mode: a request with a valid W3C `traceparent` (its client's span) is
        always traced, as a continuation of that span."""
        setting = self._models.get(model_name) or self._global
        if self._exporter is None:
            return RequestTrace(setting.level, setting.write, model_name) if setting.take() else None
        remote = remote_parent(traceparent, tracestate) if setting.level else None
        if not setting.take(remote is not None):
            return None
        return RequestTrace(setting.level, setting.write, model_name, spans=new_span_ids(remote))

    # ---- settings --------------------------------------------------------------------------------
    def settings(self, model_name: str = "") -> dict[str, Any]:
        """The settings in force for a model (its own, else the global ones) or, with no name,
        the global ones, in the trace extension's shape: strings, and a list for the level."""
        setting = self._models.get(model_name, self._global) if model_name else self._global
        shown = {"trace_level": level_names(setting.level), "trace_rate": str(setting.rate),
                 "trace_count": str(setting.count)}
        if self._exporter is not None:  # no file in this mode; its own settings instead, as Triton shows them
            return {**shown, "trace_mode": OPENTELEMETRY, **self._exporter.settings.shown()}
        return {**shown, "log_frequency": str(setting.log_frequency), "trace_file": setting.file.name,
                "trace_mode": TRITON}

    def update(self, model_name: str, changes: Mapping[str, Any]) -> None:
        """Applies `changes` (field -> value, or CLEAR) to a model's setting or, with no name, to
        the global one (and to what models take from it). Raises InferenceError with Triton's
        words for a setting that could not trace (unless its level is OFF)."""
        with self._lock:
            self._update(model_name, changes)
            if not model_name:
                for name in sorted(self._fallback_models):
                    self._update(name, {}, strict=False)
            self.on = self._global.active() or any(s.active() for s in self._models.values())

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
        setting = self._setting(values["level"], values["rate"], values["count"], values["log_frequency"],
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
        if self._exporter is not None:
            self._exporter.shutdown()


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
