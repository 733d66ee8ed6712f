"""What starts one model instance: its description (InstanceSpec), its restart policy, and the
Initialize call that turns a started stub into a loaded model."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stubhost import _core
from stubhost._core import Command, IPCMessage
from stubhost.host.errors import VersionLoadError
from stubhost.host.stub_process import StubCallError, StubGoneError, StubProcess, StubSettings
from stubhost.protocol import write_payload

log = logging.getLogger("stubhost")

__all__ = ["InstanceSpec", "RestartPolicy", "initialize_stub", "load_error"]


@dataclass
class RestartPolicy:
    """Automatic restart of crashed or hung stubs, with backoff; a crash loop ends in FAILED."""

    enabled: bool = True
    max_restarts: int = 5          # within `window_s`; one more crash and the instance is FAILED
    window_s: float = 60.0
    backoff_s: float = 0.1         # doubled per recent crash, capped at `max_backoff_s`
    max_backoff_s: float = 5.0


@dataclass
class InstanceSpec:
    """Everything needed to start and initialize one instance."""

    model_name: str
    version: int
    instance_name: str
    kind: str                       # "CPU", "MODEL" or "GPU" (host/instance_groups.py)
    device_id: int
    model_file: str
    model_dir: str
    config: dict[str, Any]
    python: str | None = None
    env: dict[str, str] | None = None
    init_timeout_s: float = 120.0
    finalize_timeout_s: float = 30.0
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    on_call: Callable[[StubProcess, IPCMessage], None] | None = None  # serves the stub's BLS calls
    stub: StubSettings = field(default_factory=StubSettings)
    python_based: bool = False  # model_file is a Python-based backend's model.py (host/python_based.py)

    @property
    def decoupled(self) -> bool:
        """True when the model uses the decoupled transaction policy."""
        return bool(self.config.get("model_transaction_policy", {}).get("decoupled", False))

    def initialize_args(self) -> dict[str, str]:
        """Exactly the keys Triton's Python backend passes to ``initialize(args)``."""
        return {
            "model_config": json.dumps(self.config),
            "model_instance_kind": self.kind,
            "model_instance_name": self.instance_name,
            "model_instance_device_id": str(self.device_id),
            "model_repository": self.model_dir,
            "model_version": str(self.version),
            "model_name": self.model_name,
        }

    def load_payload(self) -> dict[str, Any]:
        """What the stub needs to import the model file."""
        return load_payload(self.model_file, self.model_dir, self.version, self.python_based)


def load_payload(model_file: str, model_dir: str, version: int, python_based: bool) -> dict[str, Any]:
    """What a stub needs to import a model file: the file, how to import it (a Python-based
    backend's as the top-level module ``model``) and what ``pb_utils.get_model_dir()`` answers
    (the version folder, as in Triton)."""
    return {"model_file": model_file, "version_dir": os.path.join(model_dir, str(version)), "top_level": python_based}


def load_error(spec: InstanceSpec, e: BaseException) -> VersionLoadError:
    """An instance's load failure as Triton words it: the model's traceback for its error, and
    ``Stub process '<instance>' is not healthy.`` for a stub that died."""
    return failed_version(spec.model_name, spec.version, spec.instance_name, e)


def failed_version(model_name: str, version: int, instance_name: str, e: BaseException) -> VersionLoadError:
    """The load failure of a model version whose stub `instance_name` failed with `e`."""
    if isinstance(e, StubGoneError):
        log.error("%s", e)  # Triton's words below do not say how it ended: its exit code does
        return VersionLoadError(model_name, version, f"Stub process '{instance_name}' is not healthy.")
    return VersionLoadError(model_name, version, str(e))


def initialize_stub(process: StubProcess, spec: InstanceSpec) -> bool:
    """Sends Initialize and waits for it; raises InferenceError on any failure (stub killed).

    Returns whether the model defines ``is_ready()``.
    """
    try:
        payload = {**spec.load_payload(), "args": spec.initialize_args(), "decoupled": spec.decoupled}
        process.control.decoupled = spec.decoupled
        reply = process.call(Command.INITIALIZE_REQUEST, write_payload(process.pool, payload), spec.init_timeout_s)
    except (StubCallError, StubGoneError, TimeoutError, _core.CoreError) as e:
        process.close()
        raise load_error(spec, e) from None
    return isinstance(reply, dict) and bool(reply.get("is_ready"))
