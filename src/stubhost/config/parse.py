"""Reading config.pbtxt: protobuf text format into a ``ModelConfig`` message."""

from __future__ import annotations

import os

from google.protobuf import text_format

from stubhost.config.errors import ConfigError
from stubhost.config.model_config_pb2 import ModelConfig
from stubhost.config.parse_errors import triton_parse_problem


def parse_config_text(text: str, source: str) -> ModelConfig:
    """Parses config.pbtxt text. ``source`` names the text in errors (normally the file's path).

    Parsing is strict, as Triton's is: an unknown field, a bad enum name or a non-repeated field
    given twice is an error. Raises :class:`ConfigError` (``parse_error=True``) worded as Triton
    and C++ protobuf word it, with the line and column the parser reported.
    """
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except (text_format.ParseError, ValueError) as exc:
        # ValueError: upb checks an enum number's range only as it stores it, outside the parser's
        # own error handling, so that one arrives bare.
        problem = triton_parse_problem(exc, text)
        raise ConfigError(
            source, problem.message, line=problem.line, column=problem.column, parse_error=True
        ) from None
    return config


def load_config_file(path: str | os.PathLike[str]) -> ModelConfig:
    """Reads and parses one config.pbtxt (UTF-8). Any failure, including a missing or unreadable
    file, raises :class:`ConfigError` naming the file."""
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(source, f"unable to read model configuration: {reason}") from exc
    return parse_config_text(text, source)
