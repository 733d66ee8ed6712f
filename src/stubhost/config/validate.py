"""Validation of a whole model configuration for stubhost (Python-backend and ensemble models).

Where Triton rejects the same thing, the message is Triton's (core/src/model_config_utils.cc,
model_repository_manager.cc), so an error reads the same on both servers; the rules stubhost adds
have messages of its own. Every error is a :class:`ConfigError` naming the file and the field.
"""

from __future__ import annotations

from stubhost.config._check import Check
from stubhost.config.defaults import DEFAULT_MODEL_FILENAME, ENSEMBLE_PLATFORM, PYTHON_BACKEND
from stubhost.config.model_config_pb2 import ModelConfig, ModelInstanceGroup
from stubhost.config.validate_io import validate_io
from stubhost.config.validate_scheduling import validate_scheduling
from stubhost.config.validate_warmup import validate_warmup

Kind = ModelInstanceGroup.Kind


def unsupported_backend(backend: str, name: str) -> str:
    """The refusal of a model whose backend is neither the Python backend nor a Python-based one."""
    return (f"unsupported backend '{backend}' for {name}: stubhost serves '{PYTHON_BACKEND}' backend models, "
            f"Python-based backends and '{ENSEMBLE_PLATFORM}' platform models only")


def validate_config(cfg: ModelConfig, *, model_dir_name: str, source: str) -> None:
    """Raises :class:`ConfigError` (naming ``source`` and the field) if stubhost cannot serve
    ``cfg`` as the model in folder ``model_dir_name``.

    Expects a configuration completed by :func:`~stubhost.config.fill_defaults` (as Triton
    validates only after normalizing): an empty ``name``, a missing ``version_policy``, a missing
    ``instance_group`` or a ``KIND_AUTO`` group are reported as errors here, not filled in.

    The rules, in the order they are checked:

    - ``name`` is non-empty and equals the folder name.
    - A ``platform: "ensemble"`` model has no ``backend``; any other model has ``backend:
      "python"``, or another backend with ``runtime: "model.py"`` (a Python-based backend, as
      host/python_based.py resolves it), and no framework ``platform`` (``onnxruntime_onnx``, ...).
    - ``max_batch_size`` >= 0; a ``version_policy`` is set and ``specific`` versions are > 0.
    - ``default_model_filename`` is a plain file name (no folders, no ``..``).
    - The scheduler sections (see :mod:`stubhost.config.validate_scheduling`).
    - Non-ensembles: at least one instance group; each has ``count`` >= 1 and a resolved kind
      (``KIND_CPU``/``KIND_MODEL`` without GPUs, ``KIND_GPU`` with GPUs >= 0) and no TensorRT
      ``profile``.
    - Inputs and outputs (see :mod:`stubhost.config.validate_io`): non-empty unique names, a real
      data type, non-empty ``dims`` whose entries are >= 1 or -1, a consistent ``reshape``.
      ``dims`` may never be empty, whatever ``max_batch_size`` is (Triton's rule): a scalar per
      request is written ``dims: [ 1 ]`` with ``reshape: { shape: [ ] }`` on a batching model.
    - Metric overrides name a family and give histogram buckets.
    - ``model_warmup`` samples (see :mod:`stubhost.config.validate_warmup`): the warmup requests
      Triton would build from them pass its checks.
    """
    check = Check(source, cfg.name)
    _validate_identity(cfg, model_dir_name, check)
    if cfg.max_batch_size < 0:
        check.fail("max_batch_size", f"'max_batch_size' must be non-negative value for {cfg.name}")
    _validate_version_policy(cfg, check)
    _validate_model_filename(cfg, check)
    validate_scheduling(cfg, check)
    _validate_metrics(cfg, check)
    if not cfg.HasField("ensemble_scheduling"):
        _validate_instance_groups(cfg, check)
    validate_io(cfg, check)
    validate_warmup(cfg, check)


def _validate_identity(cfg: ModelConfig, model_dir_name: str, check: Check) -> None:
    """The name matches the folder; the backend/platform pair is one stubhost serves."""
    name = cfg.name
    if not name:
        check.fail("name", "model configuration must specify 'name'")
    if name != model_dir_name:
        check.fail(
            "name",
            f"unexpected directory name '{model_dir_name}' for model '{name}', directory name "
            "must equal model name",
        )
    if cfg.platform == ENSEMBLE_PLATFORM:
        if cfg.backend:
            check.fail(
                "backend",
                f"Ensemble model '{name}' must have platform type '{cfg.platform}' and empty "
                "backend type",
            )
        return
    if not cfg.backend:
        check.fail("backend", f"unexpected platform type '{cfg.platform}' for {name}")
    if cfg.backend != PYTHON_BACKEND and cfg.runtime != DEFAULT_MODEL_FILENAME:  # not a Python-based backend
        check.fail("backend", unsupported_backend(cfg.backend, name))
    if cfg.platform in FRAMEWORK_PLATFORMS:
        check.fail(
            "platform",
            f"unsupported platform '{cfg.platform}' for {PYTHON_BACKEND} backend model {name}: "
            "stubhost runs the model's own Python file and has no platform handlers",
        )


# The platforms of Triton's framework backends, which stubhost cannot honour; another platform name
# on a Python model is a label (Triton's QA models use "custom").
FRAMEWORK_PLATFORMS = frozenset({"tensorrt_plan", "tensorflow_graphdef", "tensorflow_savedmodel", "onnxruntime_onnx",
                                 "pytorch_libtorch", "openvino"})


def _validate_version_policy(cfg: ModelConfig, check: Check) -> None:
    if not cfg.HasField("version_policy"):
        check.fail("version_policy", f"must specify 'version policy' for {cfg.name}")
    for version in cfg.version_policy.specific.versions:
        if version <= 0:
            check.fail(
                "version_policy: specific: versions",
                f"version {version} is not a positive integer for {cfg.name}",
            )


def is_plain_file_name(name: str) -> bool:
    """True for a name that stays inside the folder it is joined to: no path separator, not "."
    or "..". ``default_model_filename`` must be one, or it could point the stub at any file."""
    return bool(name) and "/" not in name and "\\" not in name and name not in (".", "..")


def _validate_model_filename(cfg: ModelConfig, check: Check) -> None:
    filename = cfg.default_model_filename
    if filename and not is_plain_file_name(filename):
        check.fail(
            "default_model_filename",
            f"'{filename}' is not a plain file name; the model file must lie in the version "
            f"folder of {cfg.name}",
        )


def _validate_instance_groups(cfg: ModelConfig, check: Check) -> None:
    """Triton's ValidateInstanceGroup rules, less the check of GPU ids against the GPUs present
    (the launcher's job), plus count >= 1."""
    if not cfg.instance_group:
        check.fail("instance_group", f"must specify one or more 'instance group's for {cfg.name}")
    for index, group in enumerate(cfg.instance_group):
        field = f"instance_group '{group.name}'" if group.name else f"instance_group[{index}]"
        which = f"instance group {group.name} of model {cfg.name}"
        if group.count < 1:
            check.fail(f"{field}: count", f"{which} has count {group.count}; count must be >= 1")
        if group.kind in (Kind.KIND_CPU, Kind.KIND_MODEL):
            if group.gpus:
                check.fail(
                    f"{field}: gpus",
                    f"{which} has kind {Kind.Name(group.kind)} but specifies one or more GPUs",
                )
        elif group.kind == Kind.KIND_GPU:
            if not group.gpus:
                check.fail(f"{field}: gpus", f"{which} has kind KIND_GPU but specifies no GPUs")
            for gpu in group.gpus:
                if gpu < 0:
                    check.fail(
                        f"{field}: gpus", f"{which} specifies invalid or unsupported gpu id {gpu}"
                    )
        else:
            check.fail(f"{field}: kind", f"{which} has unexpected kind {Kind.Name(group.kind)}")
        if group.profile:
            check.fail(
                f"{field}: profile",
                f"{which} specifies profile field which is only supported for TensorRT models",
            )


def _validate_metrics(cfg: ModelConfig, check: Check) -> None:
    """Triton's ValidateModelMetrics: each override names a family and gives buckets."""
    for index, control in enumerate(cfg.model_metrics.metric_control):
        field = f"model_metrics: metric_control[{index}]"
        if not control.HasField("metric_identifier"):
            check.fail(field, "metric control must specify 'metric_identifier'")
        if not control.metric_identifier.family:
            check.fail(field, "metric identifier must specify non-empty 'family'")
        if not control.HasField("histogram_options"):
            check.fail(field, "metric control must specify 'histogram_options'")
        if not control.histogram_options.buckets:
            check.fail(field, "histogram options must specify non-empty 'buckets'")
