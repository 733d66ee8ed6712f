"""Execution environments: a model's own Python environment (``EXECUTION_ENV_PATH``), as in Triton.

A model config may name a packed environment (a ``conda-pack`` ``.tar.gz``) or an unpacked one
(a folder) in its ``EXECUTION_ENV_PATH`` parameter; ``$$TRITON_MODEL_DIRECTORY`` in the value
stands for the model's folder. The model's stubs then run that environment's interpreter, with
the environment activated: its ``bin/activate`` script is sourced once per environment and the
variables it sets (``PATH``, ``CONDA_PREFIX``, what ``activate.d`` scripts export ...) are given
to every stub, with ``<env>/lib`` first on ``LD_LIBRARY_PATH``, as Triton's stub launcher does.

Archives are unpacked once per server into a private temporary folder and reused by every
model that names the same file, until the file changes (another modification time or size:
it is unpacked again, into a new folder, since stubs of the previous load may still run in
the old one). The folders are removed when the server closes.

The stub needs ``stubhost`` (put on the path by the server), ``numpy`` (which the environment
must provide, as Triton requires too) and the same Python minor version as the server, since
stubhost's native module is built for it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY_VARIABLE = "$$TRITON_MODEL_DIRECTORY"
ACTIVATE_TIMEOUT_S = 60.0


class ExecutionEnvError(Exception):
    """An execution environment that cannot be used: the message says which and why."""


@dataclass(frozen=True)
class ExecutionEnv:
    """An unpacked, activated environment: its folder, its interpreter, and the variables its
    ``activate`` script sets."""

    root: Path
    python: str
    variables: Mapping[str, str]
    removed: frozenset[str] = frozenset()  # variables the script unset (a venv's PYTHONHOME, say)

    def stub_environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """`base` (the server's environment for its stubs) with this environment activated."""
        env = {k: v for k, v in base.items() if k not in self.removed}
        env.update(self.variables)
        lib = str(self.root / "lib")
        previous = env.get("LD_LIBRARY_PATH", "")
        env["LD_LIBRARY_PATH"] = f"{lib}{os.pathsep}{previous}" if previous else lib
        return env


def env_path_of(value: str, model_dir: str | os.PathLike[str]) -> str:
    """The path a model's ``EXECUTION_ENV_PATH`` value names, ``$$TRITON_MODEL_DIRECTORY``
    replaced by the model's folder."""
    return value.replace(MODEL_DIRECTORY_VARIABLE, os.fspath(model_dir))


class ExecutionEnvs:
    """The execution environments of one server: unpacks archives once, activates each
    environment once, and removes what it unpacked on ``close()``. Thread-safe: models load
    in parallel."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._base: str | None = None
        self._unpacked: dict[tuple[str, int, int], Path] = {}  # (archive, mtime_ns, size) -> folder
        self._activated: dict[tuple[Path, tuple[tuple[str, str], ...]], ExecutionEnv] = {}

    def get(self, path: str, base: Mapping[str, str]) -> ExecutionEnv:
        """The environment at `path` (an archive or a folder), activated over `base`."""
        with self._lock:
            canonical = os.path.realpath(path)
            if not os.path.exists(canonical):
                raise ExecutionEnvError(f"Failed to get the canonical path for {path}.")
            root = Path(canonical) if os.path.isdir(canonical) else self._unpack(canonical)
            key = (root, tuple(sorted(base.items())))
            env = self._activated.get(key)
            if env is None:
                env = self._activated[key] = _activate(root, base)
            return env

    def close(self) -> None:
        """Removes every unpacked environment (stubs that run in them must be stopped first)."""
        with self._lock:
            base, self._base = self._base, None
            self._unpacked.clear()
            self._activated.clear()
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)

    def _unpack(self, archive: str) -> Path:
        stat = os.stat(archive)
        key = (archive, stat.st_mtime_ns, stat.st_size)
        folder = self._unpacked.get(key)
        if folder is not None:
            return folder
        if self._base is None:
            self._base = tempfile.mkdtemp(prefix="stubhost_python_env_")
        folder = Path(self._base) / str(len(self._unpacked))
        folder.mkdir()
        try:
            with tarfile.open(archive, "r:*") as tar:
                _extract(tar, folder)
        except (tarfile.TarError, OSError, EOFError) as e:
            shutil.rmtree(folder, ignore_errors=True)
            raise ExecutionEnvError(f"failed to extract the Python execution environment '{archive}': {e}") from None
        self._unpacked[key] = folder
        return folder


def _extract(tar: tarfile.TarFile, folder: Path) -> None:
    """Unpacks `tar` into `folder`, refusing members that would land outside it. Links that
    point outside are accepted, as Triton's extraction does (conda environments may hold some)."""
    if hasattr(tarfile, "tar_filter"):
        tar.extractall(folder, filter="tar")
        return
    for member in tar.getmembers():  # Pythons before extraction filters (3.10.11 and older)
        target = os.path.realpath(folder / member.name)
        if os.path.isabs(member.name) or os.path.commonpath([target, os.path.realpath(folder)]) != \
                os.path.realpath(folder):
            raise tarfile.TarError(f"member '{member.name}' would be written outside the environment's folder")
    tar.extractall(folder)


def _activate(root: Path, base: Mapping[str, str]) -> ExecutionEnv:
    """Checks an unpacked environment and runs its activate script once, in bash, to learn the
    variables it sets."""
    activate = root / "bin" / "activate"
    if not activate.is_file():
        raise ExecutionEnvError(f"Path {activate} does not exist. The Python environment should contain an "
                                f"'activate' script.")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not (root / "lib" / version).is_dir():
        found = sorted(p.name for p in (root / "lib").glob("python3*")) if (root / "lib").is_dir() else []
        raise ExecutionEnvError(
            f"the Python execution environment '{root}' has no {version} (lib/{version} is missing; found: "
            f"{', '.join(found) or 'none'}): stubhost's stub needs the Python version the server runs on")
    python = next((str(root / "bin" / name) for name in (version, "python3", "python")
                   if os.access(root / "bin" / name, os.X_OK)), None)
    if python is None:
        raise ExecutionEnvError(f"the Python execution environment '{root}' has no interpreter in bin/")
    # `env -0` after sourcing: NUL-separated, so values with newlines survive.
    script = 'source "$1" >/dev/null && exec env -0'
    try:
        done = subprocess.run(["bash", "-c", script, "activate", str(activate)], env=dict(base), cwd=root,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=ACTIVATE_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ExecutionEnvError(f"failed to activate the Python execution environment '{root}': {e}") from None
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip()[-2000:]
        raise ExecutionEnvError(f"failed to activate the Python execution environment '{root}': "
                                f"'source {activate}' exited with {done.returncode}: {detail}")
    after = dict(item.split("=", 1) for item in done.stdout.decode(errors="surrogateescape").split("\0")
                 if "=" in item)
    # Only what the script set or changed; bash's own bookkeeping (SHLVL, _) is not the env's.
    shell = ("SHLVL", "_", "PWD", "OLDPWD")
    variables = {k: v for k, v in after.items() if base.get(k) != v and k not in shell}
    removed = frozenset(k for k in base if k not in after and k not in shell)
    return ExecutionEnv(root=root, python=python, variables=variables, removed=removed)
