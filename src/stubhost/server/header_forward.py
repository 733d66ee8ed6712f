"""Request headers forwarded to the model as request parameters: tritonserver's
``--http-header-forward-pattern`` and ``--grpc-header-forward-pattern``.

Each HTTP header (gRPC: metadata entry) of an inference request whose name the pattern matches
anywhere (RE2's PartialMatch, here ``re.search``) becomes a string parameter of the request, named
and valued as received, so ``request.parameters()`` shows it to the model. As in tritonserver,
matching ignores case unless the pattern starts with ``(?-i)`` (tritonserver prefixes every
pattern with ``(?i)``), and the parameters are added after the request's own have been read: a
forwarded ``priority`` or ``sequence_id`` header is a plain string parameter, never a control,
and a forwarded header replaces a request parameter of the same name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_CASE_SENSITIVE = "(?-i)"


class HeaderForward:
    """A compiled forward pattern; ``select`` picks the headers it forwards."""

    def __init__(self, pattern: str) -> None:
        if pattern.startswith(_CASE_SENSITIVE):
            self.regex = re.compile(pattern[len(_CASE_SENSITIVE):])
        else:
            self.regex = re.compile(pattern, re.IGNORECASE)

    @classmethod
    def parse(cls, flag: str, pattern: str) -> HeaderForward | None:
        """None for an empty pattern (nothing is forwarded); ValueError naming `flag` for a
        pattern that does not compile."""
        if not pattern:
            return None
        try:
            return cls(pattern)
        except re.error as e:
            raise ValueError(f"{flag}: invalid regular expression '{pattern}': {e}") from None

    def select(self, headers: Iterable[tuple[str | bytes, str | bytes]]) -> dict[str, str]:
        """The headers to forward, as parameters (a later header of one name wins)."""
        chosen: dict[str, str] = {}
        for key, value in headers:
            name = key.decode("latin-1") if isinstance(key, bytes) else key
            if self.regex.search(name):
                # HTTP header values arrive as bytes, as do gRPC "-bin" metadata values.
                chosen[name] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        return chosen
