"""What a finished inference returns through the in-process API."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stubhost.host.errors import InferenceError


@dataclass(slots=True)
class InferResponse:
    """A response: its outputs by name (views of the stub's pool), the response parameters the
    model set (``InferenceResponse(parameters=...)``), and the version that answered.

    A streamed response (decoupled models) also says whether it is the request's last
    (``final``), whether it is only that flag with no response (``empty``), and carries the
    error the model sent in it, if any.
    """

    outputs: dict[str, Any]  # numpy arrays; RegionOutput for outputs the stub wrote into a client region
    parameters: dict[str, Any] = field(default_factory=dict)
    model_version: int = 0
    final: bool = True
    empty: bool = False
    error: InferenceError | None = None
