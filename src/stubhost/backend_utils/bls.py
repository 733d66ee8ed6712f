"""How ``pb_utils.InferenceRequest.exec()`` reaches other models (BLS): through the stub.

The request object does not know the way: the stub installs a caller (``set_caller``) that
sends the request to the parent and turns the answer into an ``InferenceResponse``. Outside a
stub (or outside ``execute``) the call is refused with Triton's text.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from stubhost.backend_utils.errors import TritonModelException

if TYPE_CHECKING:
    from stubhost.backend_utils.request import InferenceRequest
    from stubhost.backend_utils.response import InferenceResponse

BLS_OUTSIDE_EXECUTE = "BLS is only supported during the 'execute' function."


class BlsCaller(Protocol):
    """What the stub provides to run BLS requests."""

    def infer(self, request: InferenceRequest) -> InferenceResponse:
        """Runs `request` on the model it names and returns its response (errors inside)."""

    def stream(self, request: InferenceRequest) -> Iterator[InferenceResponse]:
        """Runs `request` and returns an iterator over its responses (decoupled models)."""

    def control(self, payload: dict[str, object]) -> object:
        """Runs a model-control call in the server (load, unload, ready)."""


class _Unattached:
    def infer(self, request: InferenceRequest) -> InferenceResponse:
        raise TritonModelException(BLS_OUTSIDE_EXECUTE)

    def stream(self, request: InferenceRequest) -> Iterator[InferenceResponse]:
        raise TritonModelException(BLS_OUTSIDE_EXECUTE)

    def control(self, payload: dict[str, object]) -> object:
        raise TritonModelException("model control is only supported during the 'execute' function.")


_caller: BlsCaller = _Unattached()


def set_caller(caller: BlsCaller) -> None:
    """Installs the stub's caller."""
    global _caller
    _caller = caller


def caller() -> BlsCaller:
    """The installed caller."""
    return _caller


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Loads (or reloads) a model of the server's repository; the server must allow model control
    (``--model-control-mode explicit``). A config or file override is not supported yet."""
    if config or files:
        raise TritonModelException("loading a model with an overriding config or files is not supported yet")
    _caller.control({"op": "load", "name": str(model_name)})


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unloads a model (``unload_dependents`` has no meaning without ensembles: it is ignored)."""
    _caller.control({"op": "unload", "name": str(model_name)})


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """True when the model (version) is loaded and ready."""
    return bool(_caller.control({"op": "ready", "name": str(model_name), "version": str(model_version)}))
