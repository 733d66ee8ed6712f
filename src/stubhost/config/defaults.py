"""Filling in what a config.pbtxt may leave out, the way Triton does before it validates."""

from __future__ import annotations

from collections.abc import Sequence

from stubhost.config.model_config_pb2 import ModelConfig, ModelInstanceGroup

PYTHON_BACKEND = "python"
ENSEMBLE_PLATFORM = "ensemble"
DEFAULT_MODEL_FILENAME = "model.py"
# Triton's default for sequence_batching.max_sequence_idle_microseconds when it is 0: one second.
DEFAULT_SEQUENCE_IDLE_MICROSECONDS = 1_000_000


def fill_defaults(
    cfg: ModelConfig, model_dir_name: str, *, available_gpus: Sequence[int] = ()
) -> None:
    """Completes ``cfg`` in place. Call it after the model's ``auto_complete_config`` (if any) and
    before :func:`~stubhost.config.validate_config`, which expects these fields filled.

    - ``name``: the model folder's name when empty (a different non-empty name is left for
      validation to reject).
    - ``backend``: ``"python"`` when both ``backend`` and ``platform`` are empty (Triton infers it
      from the ``model.py`` in the version folder; stubhost serves nothing else), and
      ``default_model_filename``: ``"model.py"`` for Python models when empty.
    - ``version_policy``: ``latest { num_versions: 1 }`` when absent.
    - ``dynamic_batching.preferred_batch_size`` and ``sequence_batching.oldest.preferred_batch_size``:
      ``[max_batch_size]`` when empty and ``max_batch_size > 0``;
      ``sequence_batching.max_sequence_idle_microseconds``: one second when 0.
    - ``optimization.input_pinned_memory`` / ``output_pinned_memory``: ``enable: true`` when absent
      (not for ensembles).
    - ``instance_group`` (not for ensembles): see :func:`fill_instance_groups`.
    """
    if not cfg.name:
        cfg.name = model_dir_name
    if not cfg.backend and not cfg.platform:
        cfg.backend = PYTHON_BACKEND
    if cfg.backend == PYTHON_BACKEND and not cfg.default_model_filename:
        cfg.default_model_filename = DEFAULT_MODEL_FILENAME
    if not cfg.HasField("version_policy"):
        cfg.version_policy.latest.num_versions = 1
    _fill_scheduling(cfg)
    if not cfg.HasField("ensemble_scheduling"):
        optimization = cfg.optimization
        for pinned in ("input_pinned_memory", "output_pinned_memory"):
            if not optimization.HasField(pinned):
                getattr(optimization, pinned).enable = True
        fill_instance_groups(cfg, available_gpus=available_gpus)


def fill_instance_groups(cfg: ModelConfig, *, available_gpus: Sequence[int] = ()) -> None:
    """Completes ``cfg.instance_group`` in place, as Triton's instance-group normalization does.

    - No group at all: one group named after the model (``"<model>"``, Triton's choice for the
      group it adds) of kind ``KIND_AUTO``, resolved as below.
    - A group without a name is named ``"<model>_<index>"`` (index of the group in the list).
    - ``KIND_AUTO`` becomes ``KIND_GPU`` when GPUs are available and every GPU the group lists is
      among them, else ``KIND_CPU``. With no ``available_gpus`` (the default) every group that
      does not ask for GPUs explicitly runs on the CPU.
    - ``count`` < 1 (0 is also what an omitted count reads as) becomes 1, Triton's default for
      the Python backend.
    - A ``KIND_GPU`` group that lists no GPUs gets every available GPU.
    """
    gpus = sorted(set(available_gpus))
    if not cfg.instance_group:
        cfg.instance_group.add(name=cfg.name, kind=ModelInstanceGroup.KIND_AUTO)
    for index, group in enumerate(cfg.instance_group):
        if not group.name:
            group.name = f"{cfg.name}_{index}"
        if group.kind == ModelInstanceGroup.KIND_AUTO:
            on_gpu = bool(gpus) and all(g in gpus for g in group.gpus)
            group.kind = ModelInstanceGroup.KIND_GPU if on_gpu else ModelInstanceGroup.KIND_CPU
        if group.count < 1:
            group.count = 1
        if group.kind == ModelInstanceGroup.KIND_GPU and not group.gpus:
            group.gpus.extend(gpus)


def _fill_scheduling(cfg: ModelConfig) -> None:
    """Scheduler defaults: preferred batch sizes and the sequence idle timeout."""
    if cfg.HasField("dynamic_batching"):
        batching = cfg.dynamic_batching
        if not batching.preferred_batch_size and cfg.max_batch_size > 0:
            batching.preferred_batch_size.append(cfg.max_batch_size)
    if cfg.HasField("sequence_batching"):
        sequence = cfg.sequence_batching
        if sequence.max_sequence_idle_microseconds == 0:
            sequence.max_sequence_idle_microseconds = DEFAULT_SEQUENCE_IDLE_MICROSECONDS
        if sequence.HasField("oldest"):
            oldest = sequence.oldest
            if not oldest.preferred_batch_size and cfg.max_batch_size > 0:
                oldest.preferred_batch_size.append(cfg.max_batch_size)
