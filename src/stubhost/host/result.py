"""What a finished inference returns through the in-process API."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class InferResponse:
    """A response: its outputs by name (views of the stub's pool), the response parameters the
    model set (``InferenceResponse(parameters=...)``), and the version that answered."""

    outputs: dict[str, np.ndarray]
    parameters: dict[str, Any] = field(default_factory=dict)
    model_version: int = 0
