"""Request and response parameters, which pb_utils hands out as JSON object text."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def parameters_json(parameters: Mapping[str, Any] | str | None) -> str:
    """JSON object text of `parameters`: a mapping is serialized, a str is taken as JSON text."""
    if parameters is None:
        return "{}"
    if isinstance(parameters, str):
        return parameters
    return json.dumps(dict(parameters))
