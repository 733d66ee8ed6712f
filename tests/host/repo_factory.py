"""Builds small Triton model repositories from strings, and the helpers tests use to watch stubs.

    repo = tmp_path / "models"
    write_model(repo, "echo", ECHO_PY, config_pbtxt("echo", [io("INPUT0", "TYPE_FP32", [-1])],
                                                    [io("OUTPUT0", "TYPE_FP32", [-1])]))
    with stubhost.Server(repo) as server: ...

Model sources are written as given (``textwrap.dedent``-ed); ``{version}`` placeholders are not
expanded, a per-version source is given as ``{1: SRC, 2: SRC}``.
"""

from __future__ import annotations

import os
import shutil
import textwrap
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

SHM_DIR = "/dev/shm"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "models"


# ---- writing a repository ---------------------------------------------------------------------
def io(name: str, data_type: str, dims: Sequence[int], *, optional: bool = False) -> str:
    """One input/output entry of config.pbtxt."""
    text = f'{{ name: "{name}" data_type: {data_type} dims: [ {", ".join(str(d) for d in dims)} ]'
    if optional:
        text += " optional: true"
    return text + " }"


def config_pbtxt(name: str, inputs: Iterable[str] = (), outputs: Iterable[str] = (), *, max_batch_size: int = 0,
                 extra: str = "") -> str:
    """A config.pbtxt for the python backend with the given io() entries (``extra`` is appended)."""
    lines = [f'name: "{name}"', 'backend: "python"', f"max_batch_size: {max_batch_size}"]
    inputs, outputs = list(inputs), list(outputs)
    if inputs:
        lines.append("input [\n  " + ",\n  ".join(inputs) + "\n]")
    if outputs:
        lines.append("output [\n  " + ",\n  ".join(outputs) + "\n]")
    if extra:
        lines.append(textwrap.dedent(extra))
    return "\n".join(lines) + "\n"


def write_model(repo: Path, name: str, model: str | Mapping[int, str] | None, config: str | None = None, *,
                filename: str = "model.py", files: Mapping[str, str] | None = None) -> Path:
    """Writes ``repo/name/config.pbtxt`` (unless ``config`` is None) and ``repo/name/<v>/<filename>``.

    ``model`` is one source for version 1, or ``{version: source}``; ``files`` maps paths relative to
    the model folder (``"1/helper.py"``) to extra files. Returns the model folder.
    """
    model_dir = Path(repo) / name
    model_dir.mkdir(parents=True, exist_ok=True)
    if config is not None:
        write_atomically(model_dir / "config.pbtxt", textwrap.dedent(config))
    sources: Mapping[int, str] = {} if model is None else ({1: model} if isinstance(model, str) else model)
    for version, source in sources.items():
        (model_dir / str(version)).mkdir(exist_ok=True)
        write_atomically(model_dir / str(version) / filename, textwrap.dedent(source))
    for rel, text in (files or {}).items():
        path = model_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, textwrap.dedent(text))
    return model_dir


def write_atomically(path: Path, text: str) -> None:
    """Writes ``path`` through a hidden temporary file and a rename, so that a server polling the
    repository never reads it half-written (an empty config.pbtxt is a valid, input-less model)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def copy_examples(repo: Path, *names: str) -> Path:
    """Copies example models (examples/models/<name>) into `repo`, so that tests never write there."""
    for name in names:
        shutil.copytree(EXAMPLES / name, Path(repo) / name, ignore=shutil.ignore_patterns("__pycache__"))
    return Path(repo)


# ---- model sources used by several suites ---------------------------------------------------------
# OUTPUT0 = INPUT0 (FP32 [-1]), PID = the stub's pid; parameters: {"touch": path} creates `path` when
# execute starts, {"exit": code} os._exit()s, {"sleep": s} sleeps before answering.
SLEEPY_PY = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.version = int(args["model_version"])

    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            if "touch" in params:
                open(params["touch"], "w").close()
            if "exit" in params:
                os._exit(int(params["exit"]))
            time.sleep(float(params.get("sleep", 0)))
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", x.copy()),
                pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
            ]))
        return responses
"""


def sleepy_config(name: str, *, extra: str = "") -> str:
    """Config of SLEEPY_PY: INPUT0 FP32 [-1] -> OUTPUT0 FP32 [-1], PID INT64 [1]."""
    return config_pbtxt(name, [io("INPUT0", "TYPE_FP32", [-1])],
                        [io("OUTPUT0", "TYPE_FP32", [-1]), io("PID", "TYPE_INT64", [1])], extra=extra)


# Waits (up to "wait" seconds) for the request to be cancelled, touching "started" first and
# "cancelled" when it sees the cancellation; a cancelled request ends with Triton's CANCELLED.
WAITER_PY = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            if "started" in params:
                open(params["started"], "w").close()
            deadline = time.monotonic() + float(params.get("wait", 0))
            while not request.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.002)
            if request.is_cancelled():
                if "cancelled" in params:
                    open(params["cancelled"], "w").close()
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "the request was cancelled", pb_utils.TritonError.CANCELLED)))
                continue
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + 1)]))
        return responses
"""

def waiter_config(name: str, extra: str = "") -> str:
    """Config of WAITER_PY: INPUT0 INT32 [1] -> OUTPUT0 INT32 [1]."""
    return config_pbtxt(name, [io("INPUT0", "TYPE_INT32", [1])], [io("OUTPUT0", "TYPE_INT32", [1])], extra=extra)


# ---- watching stubs -------------------------------------------------------------------------------
def instance(server: Any, model: str, version: int = 1, index: int = 0) -> Any:
    """The ModelInstance object of a loaded model (internal: tests use it to find the stub's pid)."""
    return server._models[model].versions[version][index]


def stub_pids(server: Any) -> list[int]:
    """Pids of every stub of every loaded model."""
    return [inst.process.pid for m in server._models.values() for inst in m.instances()]


def pool_names(server: Any) -> list[str]:
    """/dev/shm names (no leading slash) of every stub's pool."""
    return [inst.process.pool.name.lstrip("/") for m in server._models.values() for inst in m.instances()]


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, waiting for a parent that never reaps it, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def child_stub_pids(parent: int | None = None) -> set[int]:
    """Pids of running stub processes whose parent is `parent` (default: this process)."""
    parent = os.getpid() if parent is None else parent
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] not in ("Z", "X") and b"stubhost.stub" in cmdline:
            found.add(int(entry))
    return found


def shm_entries(prefix: str) -> set[str]:
    """Names in /dev/shm starting with `prefix` (leading slash ignored)."""
    prefix = prefix.lstrip("/")
    return {n for n in os.listdir(SHM_DIR) if n.startswith(prefix)}


def own_shm_entries() -> set[str]:
    """This process's stubhost segments in /dev/shm."""
    return shm_entries(f"stubhost_{os.getpid()}_")


def wait_until(predicate: Callable[[], Any], timeout: float, period: float = 0.01) -> bool:
    """Polls `predicate` until it is true (returns True) or `timeout` seconds pass (returns False)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(period)
