"""How a server loads its models: the options every model of it shares, and the environment
its stubs start in."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import stubhost
from stubhost._core import IPCMessage
from stubhost.config import ModelConfig
from stubhost.host.model_finder import ModelFinder
from stubhost.host.errors import InferenceError
from stubhost.host.execution_env import ENV_PARAMETER, ExecutionEnvError, ExecutionEnvs, env_path_of
from stubhost.host.instance_spec import RestartPolicy
from stubhost.host.python_based import DEFAULT_BACKEND_DIRECTORY
from stubhost.host.rate_limiter import RateLimiter
from stubhost.host.response_cache import ResponseCache
from stubhost.host.stats import LatencySummary
from stubhost.host.stub_process import StubProcess, StubSettings


PYTHON_PARAMETER = "STUBHOST_PYTHON_EXECUTABLE"  # config parameter: the model's own interpreter


@dataclass
class LoadOptions:
    """How models are loaded (shared by every model of a server)."""

    python: str | None = None
    env: dict[str, str] | None = None
    auto_complete: bool = True
    init_timeout_s: float = 120.0
    finalize_timeout_s: float = 30.0
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    on_call: Callable[[StubProcess, IPCMessage], None] | None = None  # serves stubs' BLS calls
    lookup: ModelFinder | None = None  # the server's loaded models by name (ensembles run them)
    stub: StubSettings = field(default_factory=StubSettings)
    envs: ExecutionEnvs = field(default_factory=ExecutionEnvs)  # models' EXECUTION_ENV_PATH environments
    response_cache: ResponseCache | None = None  # the server's response cache (None: the server has none)
    rate_limiter: RateLimiter | None = None  # the server's rate limiter (None: --rate-limit off)
    load_retry_count: int = 0  # attempts after a failed one before a load fails (--model-load-retry-count)
    backend_directory: str = DEFAULT_BACKEND_DIRECTORY  # where Python-based backends live (--backend-directory)
    # makes each latency summary of a model version (None: none kept; --metrics-config summary_latencies)
    latency_summary: Callable[[], LatencySummary] | None = None

    def __post_init__(self) -> None:
        count = self.load_retry_count
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"model_load_retry_count must be a non-negative integer, got {count!r}")

    def stub_launch(self, cfg: ModelConfig, model_dir: str | os.PathLike[str]) -> tuple[str | None, dict[str, str]]:
        """The interpreter (None: this one) and the environment a model's stubs start with: its
        ``EXECUTION_ENV_PATH`` environment, activated, or the interpreter its
        ``STUBHOST_PYTHON_EXECUTABLE`` parameter names, or the server's. Raises InferenceError."""
        params = cfg.parameters
        python = params[PYTHON_PARAMETER].string_value if PYTHON_PARAMETER in params else None
        env_path = params[ENV_PARAMETER].string_value if ENV_PARAMETER in params else None
        if not env_path:
            python = python or self.python
            return python, self.stub_env(python)
        if python:
            raise InferenceError("INVALID_ARG", f"model '{cfg.name or os.path.basename(model_dir)}' sets both "
                                                f"{ENV_PARAMETER} and {PYTHON_PARAMETER}: set one")
        try:
            env = self.envs.get(env_path_of(env_path, model_dir), self._base_env())
        except ExecutionEnvError as e:
            raise InferenceError("INTERNAL", str(e)) from None
        return env.python, env.stub_environment(self.stub_env(env.python))

    def _base_env(self) -> dict[str, str]:
        return dict(self.env if self.env is not None else os.environ)

    def stub_env(self, python: str | None) -> dict[str, str]:
        """The server's environment for a stub run by `python` (None: this interpreter).

        Output is unbuffered so that a model's prints reach the log as they happen. Another
        interpreter gets stubhost (and nothing else of ours) on its path, through a folder that
        holds only a link to this package, so its own packages are the ones it imports.
        """
        env = self._base_env()
        env["PYTHONUNBUFFERED"] = "1"
        if python is not None and os.path.abspath(python) != os.path.abspath(sys.executable):
            paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
            env["PYTHONPATH"] = os.pathsep.join([_package_link_dir(), *paths])
        return env


_package_link: str | None = None


def _package_link_dir() -> str:
    """A per-process folder holding only a link named ``stubhost`` to this package."""
    global _package_link
    if _package_link is None:
        folder = tempfile.mkdtemp(prefix="stubhost-path-")
        os.symlink(Path(stubhost.__file__).resolve().parent, os.path.join(folder, "stubhost"))
        atexit.register(shutil.rmtree, folder, True)
        _package_link = folder
    return _package_link
