"""Loads a model's ``model.py`` the way Triton's Python backend does.

The model's folder and its version folder go on ``sys.path`` and the file is imported as the
module ``<version>.<stem>`` (the version folder acting as a package), so both relative imports
(``from .utils import f``) and plain imports of files next to ``model.py`` work. A Python-based
backend's ``model.py`` is imported as the top-level module ``model``, its folder on ``sys.path``,
as Triton imports it (its folder may be named like an installed package: ``vllm``).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import stubhost.backend_utils as backend_utils


def install_backend_utils() -> None:
    """Makes ``import triton_python_backend_utils`` resolve to stubhost's pb_utils."""
    sys.modules.setdefault("triton_python_backend_utils", backend_utils)


def load_model_module(model_file: str, *, top_level: bool = False) -> ModuleType:
    """Imports `model_file` (``<model dir>/<version>/<name>.py``; with `top_level`, a
    Python-based backend's ``model.py``) and returns the module."""
    path = Path(model_file)
    if not path.is_file():
        raise FileNotFoundError(f"model file '{path}' does not exist")
    if top_level:
        if str(path.parent) not in sys.path:
            sys.path.append(str(path.parent))
        install_backend_utils()
        importlib.invalidate_caches()
        return importlib.import_module(path.stem)
    version_dir = path.parent
    model_dir = version_dir.parent
    for entry in (str(model_dir), str(version_dir)):
        if entry not in sys.path:
            sys.path.append(entry)
    install_backend_utils()
    importlib.invalidate_caches()
    return importlib.import_module(f"{version_dir.name}.{path.stem}")
