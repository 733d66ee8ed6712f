"""Where the instances of an ``instance_group`` run: their kind, device and index.

Triton places ``count`` instances per group on the CPU (``KIND_CPU``, ``KIND_MODEL``), or
``count`` on each GPU a ``KIND_GPU`` group lists. Indices run on across GPUs so that instance
names (``<group>_<index>``) stay unique.
"""

from __future__ import annotations

from typing import Any

from stubhost.config import ConfigError, ModelConfig
from stubhost.config.model_config_pb2 import ModelInstanceGroup
from stubhost.gpu import cuda
from stubhost.host.repository import ModelDir

__all__ = ["instance_placements"]

_KINDS = {"KIND_CPU": "CPU", "KIND_MODEL": "MODEL", "KIND_AUTO": "CPU"}


def instance_placements(group: ModelInstanceGroup, model_dir: ModelDir) -> list[tuple[str, int, int]]:
    """(kind, device id, index) of each instance of a group: ``count`` instances, and for
    ``KIND_GPU`` that many on each listed GPU (indices run on across GPUs, so names stay unique)."""
    kind = _KINDS.get(ModelInstanceGroup.Kind.Name(group.kind))
    if kind is not None:
        return [(kind, 0, index) for index in range(group.count)]
    available = cuda.device_ids()
    source = str(model_dir.config_path or model_dir.path)
    if not available:
        raise ConfigError(source, f"instance group '{group.name}' asks for GPU instances, but no GPU support "
                                  f"is available ({cuda.unavailable_reason()})", field="instance_group")
    for gpu in group.gpus:
        if gpu not in available:
            # Triton's words for a GPU id it cannot use.
            raise ConfigError(source, f"instance group {group.name} of model {model_dir.name} specifies invalid "
                                      f"or unsupported gpu id {gpu}. GPUs with at least the minimum required CUDA "
                                      f"compute compatibility of 6.0 are: "
                                      f"{' '.join(str(g) for g in available)}", field="instance_group")
    devices = list(group.gpus) or available
    return [("GPU", gpu, i * group.count + c) for i, gpu in enumerate(devices) for c in range(group.count)]


def with_groups(cfg: ModelConfig, model_dir: ModelDir, instances: list[Any]) -> list[tuple[Any, ModelInstanceGroup]]:
    """Each instance (ModelInstance) with its instance group (the instances come in
    ``LoadedModel._instance_specs``' order)."""
    versions = dict.fromkeys(inst.spec.version for inst in instances)
    groups = [group for _ in versions for group in cfg.instance_group for _ in instance_placements(group, model_dir)]
    return list(zip(instances, groups))
