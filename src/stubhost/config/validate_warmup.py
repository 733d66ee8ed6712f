"""Validation of ``model_warmup``: what can be known about the warmup requests from the
configuration alone.

Triton has no config-time check of ``model_warmup`` (``model_config_utils.cc`` only refuses it
for ensembles). It finds these problems when it builds the warmup requests of each instance
(``TritonModelInstance::GenerateWarmupData`` in ``core/src/backend_model_instance.cc``) and
normalizes them (``InferenceRequest::Normalize`` in ``core/src/infer_request.cc``), and the load
fails with that text. stubhost checks the same things, in the same order, with the same texts,
before any instance starts; what depends on files (``input_data_file``) is checked when the
requests are built (``stubhost.host.warmup``).

What Triton does not check is not checked here either: ``batch_size`` is how many requests of
batch 1 one warmup execution holds, so it is not compared with ``max_batch_size``; an input the
model does not declare is sent along as an extra input (Triton adds it as an override input,
the way sequence control inputs are given).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from stubhost.config._check import Check
from stubhost.config.dtypes import config_dtype_to_triton
from stubhost.config.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelInput,
    ModelWarmup,
)
from stubhost.config.validate_io import BATCH_NOTE, dims_text, input_count_text

_ID = "[request id: <id_unknown>] "  # Triton's LogRequest() of a request without an id


def protocol_name(data_type: int) -> str:
    """Triton's DataTypeToProtocolString: ``FP32``, ``BYTES`` for strings, ``<invalid>``."""
    if data_type == DataType.TYPE_INVALID:
        return "<invalid>"
    return config_dtype_to_triton(DataType.Name(data_type))


def sample_field(index: int, sample: ModelWarmup) -> str:
    """The field path of a warmup sample in messages."""
    return f"model_warmup '{sample.name}'" if sample.name else f"model_warmup[{index}]"


def validate_warmup(cfg: ModelConfig, check: Check) -> None:
    """Checks every warmup sample that runs (a ``batch_size`` of 0 is skipped, as in Triton)."""
    declared = {i.name: i for i in cfg.input}
    for index, sample in enumerate(cfg.model_warmup):
        if sample.batch_size == 0:
            continue
        field = sample_field(index, sample)
        names = sorted(sample.inputs)
        for name in names:  # Triton's first pass: every size must be known
            dims = list(sample.inputs[name].dims)
            if any(d == -1 for d in dims):
                check.fail(
                    f"{field}: inputs '{name}': dims",
                    "warmup setting expects all variable-size dimensions are specified for input "
                    f"'{name}'",
                )
            if any(d < -1 for d in dims):
                check.fail(
                    f"{field}: inputs '{name}': dims",
                    f"warmup setting has invalid dimension {min(dims)} for input '{name}'; "
                    "dimensions must be >= 0",
                )
        for name in names:
            _check_input(
                cfg,
                declared.get(name),
                name,
                sample.inputs[name],
                f"{field}: inputs '{name}'",
                check,
            )
        _check_request(cfg, declared, sample, field, check)


def _check_input(
    cfg: ModelConfig,
    declared: ModelInput | None,
    name: str,
    entry: ModelWarmup.Input,
    field: str,
    check: Check,
) -> None:
    """One input's own settings: how its data is made, and (an extra input) its type and dims."""
    kind = entry.WhichOneof("input_data_type")
    if kind is None:
        check.fail(
            field,
            f"{_ID}warmup setting expects input '{name}' to have input_data_type set",
        )
    if kind == "input_data_file":
        path = PurePosixPath(entry.input_data_file)
        if (
            not entry.input_data_file
            or path.is_absolute()
            or ".." in path.parts
            or "\\" in entry.input_data_file
        ):
            check.fail(
                f"{field}: input_data_file",
                f"'{entry.input_data_file}' is not a file inside the warmup folder of {cfg.name}: "
                "input_data_file must be a relative path without '..'",
            )
    if declared is not None:
        return
    # An extra input: Triton passes it to the model as given, so it must be a real tensor.
    if entry.data_type == DataType.TYPE_INVALID:
        check.fail(
            f"{field}: data_type",
            f"warmup setting expects input '{name}' to specify 'data_type'",
        )
    if not entry.dims:
        check.fail(
            f"{field}: dims", f"warmup setting expects input '{name}' to specify 'dims'"
        )


def _check_request(
    cfg: ModelConfig,
    declared: dict[str, ModelInput],
    sample: ModelWarmup,
    field: str,
    check: Check,
) -> None:
    """Triton's normalization of one warmup request (batch 1 when the model batches)."""
    model = cfg.name
    given = sorted(n for n in sample.inputs if n in declared)
    required = [i.name for i in cfg.input if not i.optional]
    if len(given) < len(required):
        missing = [n for n in required if n not in sample.inputs]
        check.fail(f"{field}: inputs", _ID + input_count_text(model, len(cfg.input), len(required), given, missing))
    batching = cfg.max_batch_size > 0
    for name in given:
        entry, config_input = sample.inputs[name], declared[name]
        if entry.data_type != config_input.data_type:
            check.fail(
                f"{field}: inputs '{name}': data_type",
                f"{_ID}inference input '{name}' data-type is '{protocol_name(entry.data_type)}', but model "
                f"'{model}' expects '{protocol_name(config_input.data_type)}'",
            )
        dims, expected = list(entry.dims), list(config_input.dims)
        if len(dims) != len(expected) or any(
            e != -1 and e != d for e, d in zip(expected, dims)
        ):
            full = ([-1] if batching else []) + expected
            shape = ([1] if batching else []) + dims
            check.fail(
                f"{field}: inputs '{name}': dims",
                f"{_ID}unexpected shape for input '{name}' for model '{model}'. Expected {dims_text(full)}, got "
                f"{dims_text(shape)}. {BATCH_NOTE if batching else ''}",
            )
