"""Restricted API groups: Triton's ``--http-restricted-api`` / ``--grpc-restricted-protocol``.

A group names API categories and a header that requests to them must carry with an exact value:

    --http-restricted-api=model-repository,shared-memory:admin-key=secret

HTTP checks the header ``admin-key``; gRPC checks the metadata key
``triton-grpc-protocol-admin-key``, as Triton does. A category may belong to one group only.
Off by default: with no group, nothing is restricted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

CATEGORIES = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
              "statistics", "trace", "logging")
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


@dataclass(frozen=True)
class Restriction:
    """The header (lower-case, as both HTTP/2 and our HTTP server see it) and its value."""

    header: str
    value: str


class Restrictions:
    """Which categories need which header; built from the command-line specs."""

    def __init__(self, by_category: dict[str, Restriction] | None = None) -> None:
        self.by_category = dict(by_category or {})

    @classmethod
    def parse(cls, specs: Iterable[str], *, grpc: bool) -> Restrictions:
        """Parses ``<category>[,<category>...]:<key>=<value>`` specs; raises ValueError with the
        offending spec named."""
        flag = "--grpc-restricted-protocol" if grpc else "--http-restricted-api"
        by_category: dict[str, Restriction] = {}
        for spec in specs:
            categories, sep, pair = spec.partition(":")
            key, eq, value = pair.partition("=")
            if not sep or not eq or not categories or not key.strip():
                raise ValueError(f"{flag} '{spec}': expected <api>[,<api>...]:<key>=<value>")
            header = (GRPC_HEADER_PREFIX if grpc else "") + key.strip().lower()
            for category in (c.strip() for c in categories.split(",")):
                if category not in CATEGORIES:
                    raise ValueError(f"{flag} '{spec}': unknown API '{category}' (known: {', '.join(CATEGORIES)})")
                if category in by_category:
                    raise ValueError(f"{flag} '{spec}': API '{category}' is already in another restricted group")
                by_category[category] = Restriction(header, value)
        return cls(by_category)

    def __bool__(self) -> bool:
        return bool(self.by_category)

    def call_refusal(self, category: str, metadata: Callable[[], Iterable[tuple[str, Any]] | None]) -> str | None:
        """The refusal of a gRPC call of `category`, whose metadata `metadata()` gives (read only
        when something is restricted); None when it may proceed."""
        if not self.by_category:
            return None
        return self.refusal(category, dict(metadata() or ()).get, grpc=True)

    def refusal(self, category: str, header_value: Callable[[str], str | None], *, grpc: bool) -> str | None:
        """The message refusing a request of `category` whose headers (looked up by
        `header_value`) lack the restriction's header and value; None when it may proceed."""
        restriction = self.by_category.get(category)
        if restriction is None or header_value(restriction.header) == restriction.value:
            return None
        what = "protocol" if grpc else "API"
        return f"This {what} is restricted, expecting header '{restriction.header}'"
