"""The model repository on disk: which models and versions it holds, and where their files are.

Layout (Triton's)::

    <repository>/<model>/config.pbtxt          optional for models that auto-complete their config
    <repository>/<model>/<version>/model.py    version: a positive integer folder name

Scanning only reads the directory tree; parsing and validating each config.pbtxt is the
caller's step (``stubhost.config``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from stubhost.config import ConfigError, ModelConfig, load_config_file
from stubhost.config.defaults import DEFAULT_MODEL_FILENAME, ENSEMBLE_PLATFORM
from stubhost.config.validate import is_plain_file_name

CONFIG_FILENAME = "config.pbtxt"


class RepositoryNotFoundError(FileNotFoundError):
    """The model repository path does not exist or is not a directory."""


@dataclass(frozen=True)
class ModelDir:
    """One model folder of a repository.

    ``config_path`` is None when the folder has no config.pbtxt. ``versions`` are the version
    folders present, ascending (which of them are served is the version policy's business, see
    ``stubhost.config.select_versions``).
    """

    name: str
    path: Path
    config_path: Path | None
    versions: tuple[int, ...]


def scan_repository(path: str | os.PathLike[str]) -> dict[str, ModelDir]:
    """The models in the repository at ``path``, by name, in name order.

    Every non-hidden subdirectory (symlinks to directories included) is a model; files and names
    starting with "." are skipped. Raises :class:`RepositoryNotFoundError` if ``path`` is not an
    existing directory.
    """
    root = Path(path)
    if not root.exists():
        raise RepositoryNotFoundError(f"model repository '{root}' does not exist")
    if not root.is_dir():
        raise RepositoryNotFoundError(f"model repository '{root}' is not a directory")
    models: dict[str, ModelDir] = {}
    for entry in sorted(root.iterdir(), key=lambda p: p.name):
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        config = entry / CONFIG_FILENAME
        models[entry.name] = ModelDir(
            name=entry.name,
            path=entry,
            config_path=config if config.is_file() else None,
            versions=_versions(entry),
        )
    return models


def scan_repositories(paths: Iterable[str | os.PathLike[str]]) -> tuple[dict[str, ModelDir], dict[str, str]]:
    """The models of several repositories, by name, and the names that cannot be served because
    more than one repository holds them (name -> why), as Triton refuses such duplicates."""
    models: dict[str, ModelDir] = {}
    duplicates: dict[str, str] = {}
    for path in paths:
        for name, found in scan_repository(path).items():
            if name in models:
                # Triton's log line, then its index reason: users grep for either.
                duplicates[name] = (f"failed to poll model '{name}': not unique across all model repositories "
                                    f"(model appears in two or more repositories: '{models[name].path.parent}' "
                                    f"and '{found.path.parent}')")
            else:
                models[name] = found
    for name in duplicates:
        del models[name]
    return models, duplicates


def fingerprint(model_dir: ModelDir) -> tuple[tuple[str, int, int], ...]:
    """What poll mode compares to see that a model changed: every file's relative path, size and
    modification time (hidden entries skipped, as scanning skips them)."""
    entries: list[tuple[str, int, int]] = []
    for root, dirs, files in os.walk(model_dir.path, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        for name in files:
            if name.startswith("."):
                continue
            full = os.path.join(root, name)
            try:
                info = os.stat(full)
            except OSError:  # removed while walking: the next poll sees the settled tree
                continue
            entries.append((os.path.relpath(full, model_dir.path), info.st_size, info.st_mtime_ns))
    return tuple(sorted(entries))


def ensemble_dependencies(model_dir: ModelDir, config: ModelConfig | None = None) -> list[str]:
    """The models an ensemble's steps run (none for a model that is not an ensemble, or whose
    config.pbtxt cannot be read: loading it reports that). ``config`` overrides the file."""
    if config is None:
        if model_dir.config_path is None:
            return []
        try:
            config = load_config_file(model_dir.config_path)
        except (ConfigError, OSError):
            return []
    if config.platform != ENSEMBLE_PLATFORM:
        return []
    return list(dict.fromkeys(step.model_name for step in config.ensemble_scheduling.step))


FILE_PARAMETER_PREFIX = "file:"


def override_directory(name: str, files: Mapping[str, bytes]) -> ModelDir:
    """A temporary model folder holding exactly the override files of a load request.

    Keys are Triton's ``file:<version>/<path>`` parameter names; a path that is absolute, climbs
    out with "..", or is not inside a version folder is refused. The caller removes the folder
    (``remove_override_directory``) when the model it served is gone.
    """
    root = Path(tempfile.mkdtemp(prefix="stubhost-override-"))
    folder = root / name
    try:
        folder.mkdir()
        for key, content in files.items():
            relative = _override_path(key)
            target = folder.joinpath(*relative.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return ModelDir(name=name, path=folder, config_path=None, versions=_versions(folder))


def _override_path(key: str) -> PurePosixPath:
    if not key.startswith(FILE_PARAMETER_PREFIX):
        raise ValueError(f"unexpected load parameter '{key}': override files are named 'file:<version>/<path>'")
    relative = PurePosixPath(key[len(FILE_PARAMETER_PREFIX):])
    if relative.is_absolute() or ".." in relative.parts or len(relative.parts) < 2 or "\\" in str(relative):
        raise ValueError(f"invalid override file '{key}': the path must lie inside a version folder of the model, "
                         f"as in 'file:1/model.py'")
    return relative


def remove_override_directory(model_dir: ModelDir) -> None:
    """Removes a folder made by ``override_directory`` (and the temporary folder around it)."""
    root = model_dir.path.parent
    if root.name.startswith("stubhost-override-"):
        shutil.rmtree(root, ignore_errors=True)


def _versions(model_path: Path) -> tuple[int, ...]:
    """Version folders of a model, ascending.

    A version folder's name is a positive decimal integer without leading zeros. Other entries
    are ignored, as Triton ignores them (it warns about leading zeros and non-numbers; unlike
    Triton's ``stoll``, "1abc" is not read as version 1, and 0 is not a version).
    """
    found = []
    for entry in model_path.iterdir():
        name = entry.name
        if name.isascii() and name.isdigit() and not name.startswith("0") and entry.is_dir():
            found.append(int(name))
    return tuple(sorted(found))


def model_file(model_dir: ModelDir, version: int, cfg: ModelConfig) -> Path:
    """Path of the Python file to load for ``version``: ``<model>/<version>/<default_model_filename>``,
    ``model.py`` when the config leaves ``default_model_filename`` empty.

    Only computes the path (existence is the loader's check). Raises :class:`ConfigError` if the
    configured name is not a plain file name (a path separator or ".." would let the config point
    outside the version folder), and ValueError for a version that is not a positive integer.
    """
    if version <= 0:
        raise ValueError(f"model '{model_dir.name}': version must be a positive integer, got {version}")
    filename = cfg.default_model_filename or DEFAULT_MODEL_FILENAME
    if not is_plain_file_name(filename):
        source = str(model_dir.config_path or model_dir.path)
        raise ConfigError(
            source,
            f"'{filename}' is not a plain file name; the model file must lie in the version folder",
            field="default_model_filename",
        )
    return model_dir.path / str(version) / filename
