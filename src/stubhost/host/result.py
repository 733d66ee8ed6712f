"""What a finished inference returns through the in-process API."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any



@dataclass(slots=True)
class InferResponse:
    """A response: its outputs by name (views of the stub's pool), the response parameters the
    model set (``InferenceResponse(parameters=...)``), and the version that answered."""

    outputs: dict[str, Any]  # numpy arrays; RegionOutput for outputs the stub wrote into a client region
    parameters: dict[str, Any] = field(default_factory=dict)
    model_version: int = 0
