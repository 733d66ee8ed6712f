"""The error-raising helper shared by the validation modules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from stubhost.config.errors import ConfigError


@dataclass(frozen=True)
class Check:
    """What every validation message needs: the file being validated and the model's name."""

    source: str
    model: str

    def fail(self, field: str | None, message: str) -> NoReturn:
        """Raises :class:`ConfigError` for ``field`` (a path such as ``"input 'X': dims"``)."""
        raise ConfigError(self.source, message, field=field)
