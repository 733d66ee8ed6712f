"""The model repository on disk: which models and versions it holds, and where their files are.

Layout (Triton's)::

    <repository>/<model>/config.pbtxt          optional for models that auto-complete their config
    <repository>/<model>/<version>/model.py    version: a positive integer folder name

Scanning only reads the directory tree; parsing and validating each config.pbtxt is the
caller's step (``stubhost.config``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from stubhost.config import ConfigError, ModelConfig
from stubhost.config.defaults import DEFAULT_MODEL_FILENAME
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
