"""Errors of the in-process API."""

from __future__ import annotations


class InferenceError(Exception):
    """A failed call: ``code`` is a TritonError code name ("INVALID_ARG", "UNAVAILABLE", ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.refused = False  # the model refused the request before running it (its checks)

    def __repr__(self) -> str:
        return f"InferenceError(code={self.code!r}, message={self.message!r})"


class AnsweredError(InferenceError):
    """An error response the model answered a request with (``InferenceResponse(error=...)``), as
    opposed to an ``execute`` that failed: Triton counts the request as a success in its
    statistics. ``sent``, ``exec_start`` and ``exec_end`` time it as an ExecuteResult does."""

    def __init__(self, code: str, message: str, sent: int = 0, exec_start: int = 0, exec_end: int = 0) -> None:
        super().__init__(code, message)
        self.sent, self.exec_start, self.exec_end = sent, exec_start, exec_end


class VersionLoadError(InferenceError):
    """A model version that failed to load because its model failed (``initialize`` or
    ``auto_complete_config`` raised, its stub died or hung): worded as Triton's load API words it,
    ``INVALID_ARG`` with ``load failed for model '<m>': version <v> is at UNAVAILABLE state:
    Internal: <text>;``. ``reason`` is what the repository index shows for it."""

    def __init__(self, model_name: str, version: int, text: str) -> None:
        self.model_name = model_name
        self.version = version
        self.reason = f"Internal: {text}"
        super().__init__("INVALID_ARG", f"load failed for model '{model_name}': version {version} is at "
                                        f"UNAVAILABLE state: {self.reason};\n")


class UnknownModelError(InferenceError):
    """NOT_FOUND for a model, or a version of it, that is not loaded (BLS words it as Triton's
    Python backend does, see bls.py). A model the server knows (it failed to load, or was
    unloaded) ``has no available versions``, in Triton's words; another ``is not found``."""

    def __init__(self, model_name: str, version: int | None = None, known: bool = False) -> None:
        named = f"'{model_name}'" if version is None else f"'{model_name}' version {version}"
        state = "has no available versions" if known and version is None else "is not found"
        super().__init__("NOT_FOUND", f"Request for unknown model: {named} {state}")
        self.model_name = model_name
