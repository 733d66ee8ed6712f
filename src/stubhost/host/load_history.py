"""What a server remembers of the models it does not serve: the error of a failed load (and the
version it was about), and the versions of a model unloaded since. Triton's repository index
lists them, and its "has no available versions" tells them from models it never knew."""

from __future__ import annotations

import logging
from typing import Any

from stubhost.host.errors import InferenceError, VersionLoadError

log = logging.getLogger("stubhost")


class LoadHistory:
    """Failed loads and unloaded models, by name (the caller serialises changes)."""

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}  # name -> the reason the index shows
        self._failed_versions: dict[str, int] = {}  # name -> the version a VersionLoadError was about
        self._unloaded: dict[str, list[str]] = {}  # name -> its versions when it was unloaded

    def failed(self, name: str, error: BaseException | str) -> None:
        """A load of `name` failed: logged (Triton's line for a version that failed) and kept."""
        if isinstance(error, VersionLoadError):
            log.error("failed to load '%s' version %d: %s", name, error.version, error.reason)
            self.errors[name] = error.reason
            self._failed_versions[name] = error.version
            return
        reason = error.message if isinstance(error, InferenceError) else str(error)
        log.error("%s", reason)
        self.errors[name] = reason
        self._failed_versions.pop(name, None)

    def loaded(self, name: str) -> None:
        """`name` loaded: nothing about it is kept."""
        self.errors.pop(name, None)
        self._failed_versions.pop(name, None)
        self._unloaded.pop(name, None)

    def unloaded(self, name: str, versions: list[int] | None) -> None:
        """`name` was unloaded (`versions`: those it served; None when it was not loaded)."""
        self.errors.pop(name, None)
        self._failed_versions.pop(name, None)
        if versions is not None:
            self._unloaded[name] = [str(v) for v in sorted(versions)]

    def forget(self, name: str) -> None:
        """`name` left the repositories."""
        self.errors.pop(name, None)
        self._failed_versions.pop(name, None)
        self._unloaded.pop(name, None)

    def known(self, name: str) -> bool:
        """True when `name` failed to load or was unloaded (Triton's model manager knows it)."""
        return name in self.errors or name in self._unloaded

    def index_entries(self, name: str) -> list[dict[str, Any]]:
        """The repository index entries of `name`, not loaded, as Triton lists them: the version
        that failed with its reason, the versions unloaded, or (never loaded) the name alone."""
        reason = self.errors.get(name)
        if reason is not None:
            version = self._failed_versions.get(name)
            return [{"name": name, "version": "" if version is None else str(version), "state": "UNAVAILABLE",
                     "reason": reason}]
        return ([{"name": name, "version": version, "state": "UNAVAILABLE", "reason": "unloaded"}
                 for version in self._unloaded[name]] if name in self._unloaded else [{"name": name}])
