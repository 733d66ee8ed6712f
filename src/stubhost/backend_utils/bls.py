"""How ``pb_utils.InferenceRequest.exec()`` reaches other models (BLS): through the stub.

The request object does not know the way: the stub installs a caller (``set_caller``) that
sends the request to the parent and turns the answer into an ``InferenceResponse``. Outside a
stub (or outside ``execute``) the call is refused with Triton's text.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

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
    """Loads (or reloads) a model; the server must allow model control
    (``--model-control-mode explicit``). ``config`` (the model configuration as JSON text)
    replaces its config.pbtxt; ``files`` (``{"file:1/model.py": b"..."}``) replace its whole
    folder and need ``config``."""
    request: dict[str, Any] = {"op": "load", "name": str(model_name)}
    if config:
        request["config"] = json.dumps(config) if isinstance(config, dict) else str(config)
    if files:
        if not isinstance(files, dict) or not all(isinstance(v, (bytes, bytearray, memoryview))
                                                  for v in files.values()):
            raise TritonModelException("files must be a dict mapping 'file:<version>/<path>' to the file's bytes")
        request["files"] = {str(k): base64.b64encode(bytes(v)).decode("ascii") for k, v in files.items()}
    _caller.control(request)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unloads a model; ``unload_dependents`` also unloads an ensemble's composing models."""
    _caller.control({"op": "unload", "name": str(model_name), "unload_dependents": bool(unload_dependents)})


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """True when the model (version) is loaded and ready."""
    return bool(_caller.control({"op": "ready", "name": str(model_name), "version": str(model_version)}))
