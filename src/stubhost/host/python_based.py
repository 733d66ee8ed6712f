"""Triton's Python-based backends: a backend written as a ``model.py`` in
``<backend directory>/<backend>/model.py`` (``--backend-directory``, by default
``/opt/tritonserver/backends``), serving every model whose config.pbtxt says ``backend:
"<backend>"``. The vLLM backend is one. The model's own folder holds its config.pbtxt and version
folders with whatever files the backend reads (``pb_utils.get_model_dir()`` is the version
folder), and no model.py.

A backend is resolved as Triton's core resolves it (core src/backend_model.cc):

- ``runtime: "model.py"`` in the configuration: the backend's ``model.py`` must exist;
- no ``runtime``: a C++ library ``libtriton_<backend>.so`` in the backend's folder makes it a C++
  backend, else its ``model.py`` makes it Python-based and the configuration gets ``runtime:
  "model.py"``;
- any other ``runtime`` names a C++ library.

stubhost cannot run C++ backends: such a model fails to load, before any stub imports anything.

The backend's ``model.py`` is imported as the top-level module ``model`` with its folder on
``sys.path`` (so it can import the modules next to it, as vLLM's ``utils`` package), and an
execution environment ``pb_exec_env_model.py.tar.gz`` next to it is used by the models that do
not name one.
"""

from __future__ import annotations

import os
from pathlib import Path

from stubhost.config import ModelConfig
from stubhost.config.defaults import DEFAULT_MODEL_FILENAME as RUNTIME
from stubhost.config.defaults import PYTHON_BACKEND
from stubhost.config.errors import ConfigError
from stubhost.config.validate import unsupported_backend
from stubhost.host.execution_env import ENV_PARAMETER

DEFAULT_BACKEND_DIRECTORY = "/opt/tritonserver/backends"
EXECUTION_ENV_FILE = "pb_exec_env_model.py.tar.gz"


def backend_model_file(cfg: ModelConfig, model_name: str, backend_directory: str | os.PathLike[str],
                       source: str) -> Path | None:
    """The ``model.py`` of the Python-based backend `cfg` names, or None for a python-backend
    model or an ensemble. Sets ``runtime`` (and a default execution environment) as Triton does;
    raises ConfigError with Triton's words when the backend cannot be found, and for a C++
    backend."""
    backend = cfg.backend
    if not backend or (backend == PYTHON_BACKEND and cfg.runtime != RUNTIME):
        return None
    folder = Path(backend_directory) / backend
    if "/" in backend or backend in (".", ".."):
        raise ConfigError(source, f"backend library name '{folder}' escapes backend directory '{backend_directory}', "
                                  f"for model '{model_name}', check model config runtime field", field="backend")
    if cfg.runtime and cfg.runtime != RUNTIME:  # a C++ library
        raise ConfigError(source, unsupported_backend(backend, model_name), field="backend")
    file = folder / RUNTIME
    if cfg.runtime == RUNTIME:
        if not file.is_file():
            raise ConfigError(source, f"unable to find Python backend based backend library '{RUNTIME}' for model "
                                      f"'{model_name}', searched: '{file}'", field="runtime")
    elif (folder / f"libtriton_{backend}.so").is_file():
        raise ConfigError(source, unsupported_backend(backend, model_name), field="backend")
    elif file.is_file():
        cfg.runtime = RUNTIME
    else:
        raise ConfigError(source, f"unable to find backend library for backend '{backend}', try specifying runtime "
                                  "on the model configuration.", field="backend")
    environment = folder / EXECUTION_ENV_FILE
    if ENV_PARAMETER not in cfg.parameters and environment.is_file():
        cfg.parameters[ENV_PARAMETER].string_value = str(environment)
    return file
