"""``pb_utils.Logger``: model log lines that reach the server's log with the model's name.

Inside a stub, lines go to the parent through the stub's log channel (set by the stub runtime);
outside one (unit tests, notebooks) they go to Python's ``logging``.
"""

from __future__ import annotations

import enum
import logging
import sys
from collections.abc import Callable


class LogLevel(enum.IntEnum):
    """Log levels of ``pb_utils.Logger`` (``pb_utils.LogLevel.INFO`` ...)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_PYTHON_LEVEL = {LogLevel.INFO: logging.INFO, LogLevel.WARNING: logging.WARNING, LogLevel.ERROR: logging.ERROR,
                 LogLevel.VERBOSE: logging.DEBUG}


def _log_to_python(message: str, level: LogLevel, filename: str, line: int) -> None:
    logging.getLogger("stubhost.model").log(_PYTHON_LEVEL[level], "%s:%d] %s", filename, line, message)


_sink: Callable[[str, LogLevel, str, int], None] = _log_to_python


def set_log_sink(sink: Callable[[str, LogLevel, str, int], None]) -> None:
    """Where Logger lines go (the stub runtime installs its channel to the parent)."""
    global _sink
    _sink = sink


class Logger:
    """Static logging methods for model code: ``pb_utils.Logger.log_info("...")``."""

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: LogLevel = LogLevel.INFO) -> None:
        """Logs `message` at `level`, tagged with the caller's file and line."""
        frame = sys._getframe(1)
        while frame.f_back is not None and frame.f_code.co_filename == __file__:
            frame = frame.f_back
        _sink(str(message), LogLevel(level), frame.f_code.co_filename.rsplit("/", 1)[-1], frame.f_lineno)

    @staticmethod
    def log_info(message: str) -> None:
        """Logs at INFO."""
        Logger.log(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        """Logs at WARNING."""
        Logger.log(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        """Logs at ERROR."""
        Logger.log(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        """Logs at VERBOSE (shown when the server's verbose logging is on)."""
        Logger.log(message, LogLevel.VERBOSE)
