"""What a model-control call loads, and in which order: the models an ensemble needs, the waves
in which plain models and ensembles load, and a load request's overriding config."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from stubhost.config import ConfigError, ModelConfig, config_from_dict
from stubhost.host.errors import InferenceError
from stubhost.host.repository import ModelDir, ensemble_dependencies


def override_config(name: str, config: str | Mapping[str, Any] | None) -> ModelConfig | None:
    """A load request's "config" parameter as a ModelConfig (None: none given)."""
    if config is None or config == "":
        return None
    if isinstance(config, (str, bytes)):
        try:
            config = json.loads(config)
        except ValueError as e:
            raise InferenceError("INVALID_ARG", f"failed to load '{name}': the 'config' parameter is not valid "
                                                f"JSON: {e}") from None
    try:
        return config_from_dict(config, "the overriding config")  # type: ignore[arg-type]
    except ConfigError as e:
        raise InferenceError("INVALID_ARG", f"failed to load '{name}': {e}") from None


def with_dependencies(names: list[str], found: Mapping[str, ModelDir]) -> list[str]:
    """`names` and, after them, the models their ensembles run (as Triton loads those too)."""
    out = list(dict.fromkeys(names))
    for name in out:  # grows while it is walked: dependencies of dependencies join the walk
        if name in found:
            out.extend(d for d in ensemble_dependencies(found[name]) if d not in out)
    return out


def ensemble_models(model: Any) -> list[str]:
    """The models an ensemble runs, nested ensembles' included, depth first (none for others)."""
    steps = getattr(model, "steps", None)
    if not steps:
        return []
    out: list[str] = []
    for step in steps:
        if step.model not in out:
            out.append(step.model)
            lookup = model._lookup(step.model)
            out.extend(n for n in ensemble_models(lookup) if n not in out)
    return out


def load_waves(names: Sequence[str], found: Mapping[str, ModelDir]) -> list[list[str]]:
    """`names` in groups that may load in parallel: plain models first, then each ensemble once
    the ensembles it runs are in an earlier group (a cycle ends up in the last group, whose
    loads then fail naming what they lack)."""
    needs = {name: [d for d in ensemble_dependencies(found[name]) if d in names] for name in names}
    waves: list[list[str]] = []
    placed: set[str] = set()
    while len(placed) < len(names):
        wave = [n for n in names if n not in placed and all(d in placed for d in needs[n])]
        if not wave:
            wave = [n for n in names if n not in placed]
        waves.append(wave)
        placed.update(wave)
    return waves
