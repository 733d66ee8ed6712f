"""Errors of the in-process API."""

from __future__ import annotations


class InferenceError(Exception):
    """A failed call: ``code`` is a TritonError code name ("INVALID_ARG", "UNAVAILABLE", ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"InferenceError(code={self.code!r}, message={self.message!r})"
