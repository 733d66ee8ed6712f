"""Reading config.pbtxt: protobuf text format into a ``ModelConfig`` message."""

from __future__ import annotations

import os
import re

from google.protobuf import text_format

from stubhost.config.errors import ConfigError
from stubhost.config.model_config_pb2 import ModelConfig

# text_format prefixes its messages with "line:column : " when it knows the position.
_POSITION_PREFIX = re.compile(r"^\d+:\d+ : ")


def parse_config_text(text: str, source: str) -> ModelConfig:
    """Parses config.pbtxt text. ``source`` names the text in errors (normally the file's path).

    Parsing is strict, as Triton's is: an unknown field, a bad enum name or a non-repeated field
    given twice is an error. Raises :class:`ConfigError` carrying the line and column the parser
    reported.
    """
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        line, column = exc.GetLine(), exc.GetColumn()
        message = _POSITION_PREFIX.sub("", str(exc)) if line is not None else str(exc)
        raise ConfigError(source, message, line=line, column=column) from None
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
