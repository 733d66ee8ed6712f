"""The one error type of the configuration layer."""

from __future__ import annotations


class ConfigError(ValueError):
    """A model configuration that cannot be read or is not valid.

    ``str(err)`` names the file first, then the field, then what is wrong, e.g.
    ``/models/add_sub/config.pbtxt: input 'INPUT0': dims: model input 'INPUT0' must specify
    'dims' for add_sub``. Where a position is known, the file is followed by ``:line:column``, as
    compilers do.

    A text that is not valid protobuf text format (``parse_error=True``) reads as Triton's two
    messages for it instead: ``failed to read text proto from <source>: Error parsing text-format
    inference.ModelConfig: <line>:<column>: <message>``.

    Attributes: ``source`` (file or other origin), ``field`` (path of the offending field, or
    None), ``message`` (the bare complaint), ``line`` and ``column`` (1-based, or None),
    ``parse_error``.
    """

    def __init__(
        self,
        source: str,
        message: str,
        *,
        field: str | None = None,
        line: int | None = None,
        column: int | None = None,
        parse_error: bool = False,
    ) -> None:
        self.source = source
        self.field = field
        self.message = message
        self.line = line
        self.column = column
        self.parse_error = parse_error
        if parse_error:
            # Triton's load error, then the line C++ protobuf logs: users grep logs for either.
            at = "" if line is None else f"{line}:{column}: "
            text = f"failed to read text proto from {source}: Error parsing text-format inference.ModelConfig: "
            super().__init__(f"{text}{at}{message}")
            return
        where = source if line is None else f"{source}:{line}:{column}"
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")
