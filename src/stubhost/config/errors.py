"""The one error type of the configuration layer."""

from __future__ import annotations


class ConfigError(ValueError):
    """A model configuration that cannot be read or is not valid.

    ``str(err)`` names the file first, then the field, then what is wrong, e.g.
    ``/models/add_sub/config.pbtxt: input 'INPUT0': dims: model input 'INPUT0' must specify
    'dims' for add_sub``. Where the text-format parser reported a position, the file is followed
    by ``:line:column``, as compilers do.

    Attributes: ``source`` (file or other origin), ``field`` (path of the offending field, or
    None), ``message`` (the bare complaint), ``line`` and ``column`` (1-based, or None).
    """

    def __init__(
        self,
        source: str,
        message: str,
        *,
        field: str | None = None,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        self.source = source
        self.field = field
        self.message = message
        self.line = line
        self.column = column
        where = source if line is None else f"{source}:{line}:{column}"
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")
