"""The server's models by name, as ensembles need them: the loaded model of a name (read at each
step of each request), and, when an ensemble cannot load, Triton's words for why a composing
model is missing."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from stubhost.host.repository import ModelDir, ensemble_dependencies

if TYPE_CHECKING:
    from stubhost.host.server import Server


class ModelFinder:
    """Finds a server's loaded models (weakly: the server's load options must not keep it alive)."""

    def __init__(self, server: Server) -> None:
        self._server = weakref.ref(server)

    def __call__(self, name: str) -> Any:
        """The loaded model of `name` (a LoadedModel or an EnsembleModel), or None."""
        server = self._server()
        return None if server is None else server._models.get(name)

    def why_missing(self, ensemble: str, names: Sequence[str]) -> str:
        """Triton's text for an ensemble whose composing models `names` (in step order) are not
        loaded, in the order Triton's dependency graph checks: the models in no repository (or in
        several), all together; a cycle of ensembles that leads back to this one; else the first
        model, with its load error if it had one."""
        server = self._server()
        found, duplicates = server.scan() if server is not None else ({}, {})
        unknown = list(dict.fromkeys(n for n in names if n not in found or n in duplicates))
        if unknown:
            return f"ensemble {ensemble} contains models that are not available or ambiguous: {', '.join(unknown)}"
        closing = _closes_cycle(ensemble, found)
        if closing is not None:
            return f"circular dependency between ensembles: {ensemble} -> ... -> {closing} -> {ensemble}"
        name = names[0]
        text = f"ensemble '{ensemble}' depends on '{name}' which has no loaded version."
        error = server.load_errors.get(name) if server is not None else None
        return f"{text} Model '{name}' loading failed with error: {error}" if error else text


def _closes_cycle(ensemble: str, found: Mapping[str, ModelDir]) -> str | None:
    """The ensemble whose step runs `ensemble` again, when the ensembles it runs (through the
    repositories' configurations) lead back to it; None when they do not."""
    seen: set[str] = set()
    stack = [ensemble]
    while stack:
        name = stack.pop()
        for dependency in ensemble_dependencies(found[name]) if name in found else []:
            if dependency == ensemble:
                return name
            if dependency not in seen:
                seen.add(dependency)
                stack.append(dependency)
    return None
