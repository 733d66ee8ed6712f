"""The server's log in tritonserver's format, its settings, and the logging extension's rules.

    I1123 16:39:47.123456 1234 model.py:12] "message"                  (--log-format default)
    2024-11-23T16:39:47Z I 1234 model.py:12] "message"                 (--log-format ISO8601)

As in Triton (triton-inference-server/common ``logging.h``/``logging.cc``): the level letter is
E, W or I (verbose lines are I too), times are UTC, the pid is the server's, the location is the
file name and line of the code that logged (for ``pb_utils.Logger`` lines and model output, the
model's file). The message is written as a JSON string (quoted, newlines as ``\\n``) so that one
record is one line, unless ``TRITON_SERVER_ESCAPE_LOG_MESSAGES=0``; a preformatted block such as
the model table is written as is (log it with ``extra=UNESCAPED``).

:class:`LogSettings` are Triton's six settings. One :class:`LogControl` holds the current ones
and applies them to the ``"stubhost"`` logger tree at run time: verbose lines only at
``log_verbose_level >= 1``, ``log_info=False`` hides INFO lines (not verbose ones, as in
Triton), and so on. ``configure_logging`` sets up ``stubhost serve``'s log from its flags
(``add_log_arguments``); ``update_settings`` is the logging extension's one entry point.

This module also defines the line a stub writes to its pipe for each log record it sends to the
parent (``encode_model_line`` / ``decode_model_line``), so both ends share one definition.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from stubhost.protocol import LOG_MARKER

ESCAPE_ENVIRONMENT_VARIABLE = "TRITON_SERVER_ESCAPE_LOG_MESSAGES"  # "0": messages are written raw
FORMATS = ("default", "ISO8601")
LOGGER_NAME = "stubhost"
UNESCAPED = {"stubhost_unescaped": True}  # ``extra=`` for a preformatted block (a table)
MAX_VERBOSE_LEVEL = (1 << 32) - 1         # the extension's uint32
SETTING_NAMES = ("log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format")


class LogSettingsError(ValueError):
    """A refused settings change: ``code`` is the TritonError code name, ``message`` Triton's text."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# ---- levels ---------------------------------------------------------------------------------------
def verbose_level_of(levelno: int) -> int:
    """The Triton verbose level of a Python level below INFO: DEBUG is 1, DEBUG - 1 is 2, ..."""
    return max(1, logging.DEBUG - levelno + 1)


def python_level_of_verbose(verbose: int) -> int:
    """The lowest Python level shown at Triton verbose level `verbose` (>= 1)."""
    return max(1, logging.DEBUG - (verbose - 1))


def _level_letter(levelno: int) -> str:
    if levelno >= logging.ERROR:
        return "E"
    return "W" if levelno >= logging.WARNING else "I"


# ---- settings -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LogSettings:
    """Triton's log settings, with tritonserver's defaults. Immutable: a change makes a new one."""

    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    def as_dict(self) -> dict[str, Any]:
        """The logging extension's answer: every setting, in Triton's order."""
        return {name: getattr(self, name) for name in SETTING_NAMES}

    def changed(self, changes: Mapping[str, Any]) -> LogSettings:
        """These settings with `changes` (a setting's new value; None leaves it as it is) applied.

        Raises LogSettingsError with Triton's words for the first bad entry; nothing is applied
        then (Triton applies the entries before the bad one).
        """
        values: dict[str, Any] = {}
        for name, value in changes.items():
            if name in SETTING_NAMES and value is None:
                continue  # Triton skips a null value
            values[name] = _checked(name, value)
        return dataclasses.replace(self, **values)

    def allows(self, levelno: int) -> bool:
        """Whether a record of Python level `levelno` is written (Triton's LOG_*_IS_ON)."""
        if levelno >= logging.ERROR:
            return self.log_error
        if levelno >= logging.WARNING:
            return self.log_warning
        if levelno >= logging.INFO:
            return self.log_info
        return self.log_verbose_level >= verbose_level_of(levelno)

    def python_level(self) -> int:
        """The lowest Python level that any enabled category lets through (for Logger.setLevel:
        records below it are not even made)."""
        if self.log_verbose_level >= 1:
            return python_level_of_verbose(self.log_verbose_level)
        for enabled, level in ((self.log_info, logging.INFO), (self.log_warning, logging.WARNING),
                               (self.log_error, logging.ERROR)):
            if enabled:
                return level
        return logging.CRITICAL + 1


def _checked(name: str, value: Any) -> Any:
    """One setting's value, checked as Triton's gRPC handler words it."""
    if name == "log_file":
        # As in Triton: a network client must not choose a file the server appends to.
        raise LogSettingsError("UNSUPPORTED", "log file location can not be updated through network protocol")
    if name in ("log_info", "log_warning", "log_error"):
        if not isinstance(value, bool):
            raise LogSettingsError("INVALID_ARG", f"expect boolean for '{name}'")
        return value
    if name == "log_verbose_level":
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_VERBOSE_LEVEL:
            raise LogSettingsError("INVALID_ARG", f"expect uint32 for '{name}'")
        return value
    if name == "log_format":
        if not isinstance(value, str):
            raise LogSettingsError("INVALID_ARG", f"expect string for '{name}'")
        if value not in FORMATS:
            raise LogSettingsError("INVALID_ARG", f"invalid argument for log_format, got: {value}")
        return value
    # Triton ignores an unknown name; a typo (even Triton's own docs say "log_warnings") would
    # then silently change nothing, so it is refused here.
    raise LogSettingsError("INVALID_ARG", f"unknown log setting '{name}', expected one of: {', '.join(SETTING_NAMES)}")


class LogControl:
    """The current settings and the logger tree they steer.

    Thread safety: ``settings``, ``allows`` and ``filter`` may be called from any thread at any
    time (they read one reference); ``apply`` and ``update`` serialise on a lock.
    """

    def __init__(self, logger_name: str = LOGGER_NAME) -> None:
        self.logger = logging.getLogger(logger_name)
        self._settings = LogSettings()
        self._lock = threading.Lock()

    @property
    def settings(self) -> LogSettings:
        """The settings in force."""
        return self._settings

    def apply(self, settings: LogSettings) -> None:
        """Puts `settings` in force: the logger's level first (so that newly enabled records are
        made), then the settings the handler's filter and formatter read."""
        with self._lock:
            self._put(settings)

    def update(self, changes: Mapping[str, Any]) -> LogSettings:
        """Applies `changes` all or none (see LogSettings.changed) and returns the new settings."""
        with self._lock:
            settings = self._settings.changed(changes)
            self._put(settings)
            return settings

    def _put(self, settings: LogSettings) -> None:
        self.logger.setLevel(settings.python_level())  # setLevel clears the loggers' level caches
        self._settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        """A handler filter: whether the settings in force let `record` through. Only called for
        a record that is being logged, so it costs nothing on a request that logs nothing."""
        return self._settings.allows(record.levelno)


_CONTROL = LogControl()


def control() -> LogControl:
    """The process's LogControl (the one ``configure_logging`` and the extension use)."""
    return _CONTROL


def current_settings() -> LogSettings:
    """The settings in force."""
    return _CONTROL.settings


def update_settings(changes: Mapping[str, Any]) -> LogSettings:
    """The logging extension: applies `changes` all or none; raises LogSettingsError."""
    return _CONTROL.update(changes)


# ---- the line format ------------------------------------------------------------------------------
class TritonFormatter(logging.Formatter):
    """Formats a record as tritonserver does, in the format `control`'s settings name at the
    time the record is written (so a format change through the extension takes effect at once)."""

    def __init__(self, control: LogControl, *, escape: bool = True) -> None:
        super().__init__()
        self.control = control
        self.escape = escape

    def format(self, record: logging.LogRecord) -> str:
        """``<preamble><message>``; an exception's traceback is part of the message."""
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            message = f"{message}\n{record.exc_text}"
        if record.stack_info:
            message = f"{message}\n{self.formatStack(record.stack_info)}"
        if self.escape and not getattr(record, "stubhost_unescaped", False):
            message = json.dumps(message, ensure_ascii=False)
        return self.preamble(record) + message

    def preamble(self, record: logging.LogRecord) -> str:
        """Level, UTC time, pid and ``file:line]`` in the format in force."""
        t = time.gmtime(record.created)
        letter = _level_letter(record.levelno)
        where = f"{record.process} {record.filename}:{record.lineno}] "
        if self.control.settings.log_format == "ISO8601":
            return (f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:"
                    f"{t.tm_sec:02d}Z {letter} {where}")
        usec = int((record.created - int(record.created)) * 1_000_000)
        return (f"{letter}{t.tm_mon:02d}{t.tm_mday:02d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}."
                f"{usec:06d} {where}")


# ---- the command line -----------------------------------------------------------------------------
def flag_bool(text: str) -> bool:
    """A boolean command-line value as tritonserver reads them (true/false, 1/0, yes/no, on/off)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got '{text}'")


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds tritonserver's logging flags, with its defaults."""
    parser.add_argument("--log-verbose", type=int, default=0, metavar="N",
                        help="verbose logging level: 0 disables verbose logging, >= 1 enables it")
    parser.add_argument("--log-info", type=flag_bool, default=True, metavar="BOOL", help="enable/disable INFO lines")
    parser.add_argument("--log-warning", type=flag_bool, default=True, metavar="BOOL",
                        help="enable/disable WARNING lines")
    parser.add_argument("--log-error", type=flag_bool, default=True, metavar="BOOL", help="enable/disable ERROR lines")
    parser.add_argument("--log-format", choices=FORMATS, default="default",
                        help="'default' (LMMDD hh:mm:ss.ssssss) or 'ISO8601' (YYYY-MM-DDThh:mm:ssZ L)")
    parser.add_argument("--log-file", default="", metavar="PATH",
                        help="append the log to this file instead of writing it to stderr")


def settings_from_args(args: argparse.Namespace) -> LogSettings:
    """The settings the flags of ``add_log_arguments`` ask for (a negative level counts as 0,
    as in tritonserver)."""
    return LogSettings(log_file=args.log_file or "", log_info=args.log_info, log_warning=args.log_warning,
                       log_error=args.log_error, log_verbose_level=max(0, args.log_verbose),
                       log_format=args.log_format)


def _open_handler(path: str) -> logging.Handler:
    if not path:
        return logging.StreamHandler(sys.stderr)
    try:
        return logging.FileHandler(path, mode="a", encoding="utf-8")  # appends, as Triton does
    except OSError as e:
        raise SystemExit(f"error: failed to open log file '{path}': {e.strerror or e}") from None


def log_handler(settings: LogSettings, control: LogControl | None = None) -> logging.Handler:
    """A handler writing Triton's lines to ``settings.log_file`` (appended) or stderr, filtered
    and formatted by `control`'s settings in force (default: the process's). Exits
    (SystemExit, code 1) on a log file it cannot open."""
    control = control or _CONTROL
    handler = _open_handler(settings.log_file)
    handler.setFormatter(TritonFormatter(control, escape=os.environ.get(ESCAPE_ENVIRONMENT_VARIABLE) != "0"))
    handler.addFilter(control.filter)
    return handler


def configure_logging(args: argparse.Namespace) -> LogControl:
    """Sets up ``stubhost serve``'s log from its flags: one ``log_handler`` on the root logger
    (so that other libraries' warnings share the format) and the flags' settings in force.
    Exits (SystemExit, code 1) on a log file it cannot open. Call once, before anything logs."""
    settings = settings_from_args(args)
    handler = log_handler(settings)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)  # other libraries: warnings and errors only; "stubhost" has its own level
    logging.captureWarnings(True)   # warnings.warn(...) in the server process becomes a W line
    _CONTROL.apply(settings)
    return _CONTROL


# ---- stub -> parent log lines ---------------------------------------------------------------------
# A record a stub sends is one line on its output pipe:
#     LOG_MARKER \t <pb_utils.LogLevel> \t <line number> \t <file path> \t <text> \n
# with backslash, newline, tab and carriage return escaped in the path and the text.
MODEL_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}  # LogLevel -> Python
_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"})
_UNESCAPES = {"\\": "\\", "n": "\n", "t": "\t", "r": "\r"}
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)


def encode_model_line(level: int, path: str, line: int, text: str) -> bytes:
    """The pipe line for one record (`level` is a pb_utils.LogLevel value)."""
    return (f"{LOG_MARKER}\t{int(level)}\t{int(line)}\t{path.translate(_ESCAPES)}\t{text.translate(_ESCAPES)}\n"
            .encode("utf-8", "replace"))


def _unescape(text: str) -> str:
    return _ESCAPED.sub(lambda m: _UNESCAPES.get(m.group(1), m.group(1)), text) if "\\" in text else text


def decode_model_line(line: str) -> tuple[int, str, int, str] | None:
    """(Python level, file path, line, text) of a pipe line without its newline; None for a line
    that is not a well-formed record (raw output)."""
    if not line.startswith(LOG_MARKER):
        return None
    parts = line.split("\t", 4)
    if len(parts) != 5 or parts[0] != LOG_MARKER or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return MODEL_LEVELS.get(int(parts[1]), logging.INFO), _unescape(parts[3]), int(parts[2]), _unescape(parts[4])
