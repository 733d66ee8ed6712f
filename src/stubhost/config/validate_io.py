"""Validation of the tensor declarations: ``input``, ``output``, ``batch_input``, ``batch_output``.

Messages follow Triton's ValidateIOShape / ValidateModelInput / ValidateModelOutput /
ValidateBatchIO wording (core/src/model_config_utils.cc), with Triton's trailing
" for <model>"; the field path in front says which tensor and which of its fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

from stubhost.config._check import Check
from stubhost.config.model_config_pb2 import (
    BatchInput,
    BatchOutput,
    DataType,
    ModelConfig,
    ModelInput,
    ModelOutput,
)

WILDCARD_DIM = -1
TENSORRT_PLATFORM = "tensorrt_plan"

Tensor = Union[ModelInput, ModelOutput]


def validate_io(cfg: ModelConfig, check: Check) -> None:
    """Checks every input and output, then the batch inputs and outputs."""
    for kind, tensors in (("input", cfg.input), ("output", cfg.output)):
        seen: set[str] = set()
        for index, tensor in enumerate(tensors):
            _validate_tensor(kind, index, tensor, cfg, check)
            if tensor.name in seen:
                check.fail(f"{kind} '{tensor.name}'", f"duplicate {kind} name '{tensor.name}'")
            seen.add(tensor.name)
    _validate_batch_io(cfg, check)


def _validate_tensor(kind: str, index: int, io: Tensor, cfg: ModelConfig, check: Check) -> None:
    """Name, data type, dims and reshape of one tensor, plus the input/output-only flags."""
    what = f"model {kind}"
    suffix = f" for {check.model}"
    if not io.name:
        check.fail(f"{kind}[{index}]", f"{what} must specify 'name'{suffix}")
    field = f"{kind} '{io.name}'"
    named = f"{what} '{io.name}'"
    if io.data_type == DataType.TYPE_INVALID:
        check.fail(f"{field}: data_type", f"{named} must specify 'data_type'{suffix}")
    if not io.dims:
        check.fail(f"{field}: dims", f"{named} must specify 'dims'{suffix}")
    has_reshape = io.HasField("reshape")
    if has_reshape and not io.reshape.shape and cfg.max_batch_size == 0:
        check.fail(
            f"{field}: reshape",
            f"{named} cannot have empty reshape for non-batching model as scalar tensors are "
            f"not supported{suffix}",
        )
    if not _all_valid_dims(io.dims):
        check.fail(
            f"{field}: dims",
            f"{named} dimension must be integer >= 1, or {WILDCARD_DIM} to indicate a "
            f"variable-size dimension{suffix}",
        )
    if has_reshape:
        if not _all_valid_dims(io.reshape.shape):
            check.fail(
                f"{field}: reshape",
                f"{named} reshape dimensions must be integer >= 1, or {WILDCARD_DIM} to indicate "
                f"a variable-size dimension{suffix}",
            )
        problem = reshape_mismatch(io.dims, io.reshape.shape)
        if problem:
            check.fail(f"{field}: reshape", f"{named} {problem}{suffix}")
    if isinstance(io, ModelInput) and io.format in (ModelInput.FORMAT_NHWC, ModelInput.FORMAT_NCHW):
        if len(io.dims) != 3:
            check.fail(f"{field}: format", f"model input NHWC/NCHW require 3 dims{suffix}")
    if io.is_shape_tensor and cfg.platform != TENSORRT_PLATFORM:
        check.fail(
            f"{field}: is_shape_tensor",
            f"shape tensors are only supported for TensorRT platform{suffix}",
        )
    if io.is_non_linear_format_io and cfg.platform != TENSORRT_PLATFORM:
        check.fail(
            f"{field}: is_non_linear_format_io",
            f"Non-linear IO format is only supported for the TensorRT platform{suffix}",
        )


BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to "
    "be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)


def names_text(names: Sequence[str]) -> str:
    """Triton's list of input names, built as it builds it: ``['A','B']``; an empty list of
    missing inputs comes out as ``]``, as in Triton."""
    text = "[" + "".join(f"'{n}'," for n in names)
    return text[:-1] + "]"


def input_count_text(model: str, declared: int, required: int, given: Sequence[str], missing: Sequence[str]) -> str:
    """Triton's words for a request with fewer inputs than the model requires or more than it
    declares (`given`: the request's input names, `missing`: the required ones it lacks)."""
    counts = (f"expected {declared} inputs" if required == declared
              else f"expected number of inputs between {required} and {declared}")
    got = names_text(given) if given else "[]"
    return (f"{counts} but got {len(given)} inputs for model '{model}'. Got input(s) {got}, but missing required "
            f"input(s) {names_text(missing)}. Please provide all required input(s).")


def dims_text(dims: Sequence[int]) -> str:
    """Triton's DimsListToString, as its messages print shapes: ``[1,3,-1]``."""
    return "[" + ",".join(str(d) for d in dims) + "]"


def _all_valid_dims(dims: Sequence[int]) -> bool:
    return all(d >= 1 or d == WILDCARD_DIM for d in dims)


def reshape_mismatch(dims: Sequence[int], shape: Sequence[int]) -> str | None:
    """Why ``shape`` is not a valid reshape of ``dims``, or None when it is.

    Without variable-size dimensions the element counts must be equal; an empty reshape (a
    scalar) fits dims whose element count is 1. With variable-size dimensions both must have the
    same number of them, and the fixed runs between them must have equal element counts (so
    [2, 4, -1, 6] may become [8, -1, 1, 6]).
    """
    if not shape:
        if WILDCARD_DIM in dims or _product(dims) != 1:
            return "has different size for dims and reshape"
        return None
    dim_runs, shape_runs = _runs(dims), _runs(shape)
    if len(dim_runs) == 1 and len(shape_runs) == 1:
        return None if dim_runs == shape_runs else "has different size for dims and reshape"
    if len(dim_runs) == 1 or len(shape_runs) == 1:
        return "has different size for dims and reshape"
    if len(dim_runs) != len(shape_runs):
        return "has different number of variable-size dimensions for dims and reshape"
    return None if dim_runs == shape_runs else "has different size for dims and reshape"


def _runs(dims: Sequence[int]) -> list[int]:
    """Element counts of the fixed-size runs between variable-size dimensions."""
    runs, current = [], 1
    for d in dims:
        if d == WILDCARD_DIM:
            runs.append(current)
            current = 1
        else:
            current *= d
    runs.append(current)
    return runs


def _product(dims: Sequence[int]) -> int:
    result = 1
    for d in dims:
        result *= d
    return result


def _validate_batch_io(cfg: ModelConfig, check: Check) -> None:
    """Each batch input/output names exactly one known source input; targets are known outputs
    named once; batch inputs are INT32 or FP32."""
    inputs = {io.name for io in cfg.input}
    outputs = {io.name for io in cfg.output}
    suffix = f" for {check.model}"
    for index, batch_input in enumerate(cfg.batch_input):
        field = f"batch_input[{index}]"
        kind = BatchInput.Kind.Name(batch_input.kind)
        _check_one_source("batch input", kind, batch_input.source_input, field, suffix, check)
        if batch_input.data_type not in (DataType.TYPE_INT32, DataType.TYPE_FP32):
            check.fail(
                f"{field}: data_type", f"batch input data type must be TYPE_INT32 or TYPE_FP32{suffix}"
            )
        _check_sources(batch_input.source_input, inputs, f"{field}: source_input", check)
    for index, batch_output in enumerate(cfg.batch_output):
        field = f"batch_output[{index}]"
        kind = BatchOutput.Kind.Name(batch_output.kind)
        _check_one_source("batch output", kind, batch_output.source_input, field, suffix, check)
        _check_sources(batch_output.source_input, inputs, f"{field}: source_input", check)
        targets: set[str] = set()
        for target in batch_output.target_name:
            if target not in outputs:
                check.fail(f"{field}: target_name", f"unknown target output name '{target}'{suffix}")
            if target in targets:
                check.fail(
                    f"{field}: target_name",
                    f"target output name '{target}' can only be specified once{suffix}",
                )
            targets.add(target)


def _check_one_source(what: str, kind: str, sources: Sequence[str], field: str, suffix: str,
                      check: Check) -> None:
    """Batch inputs and outputs of every kind take exactly one source input."""
    if len(sources) != 1:
        check.fail(f"{field}: source_input", f"{what} kind '{kind}' expects 1 source input, got {len(sources)}{suffix}")


def _check_sources(sources: Sequence[str], inputs: set[str], field: str, check: Check) -> None:
    for name in sources:
        if name not in inputs:
            check.fail(field, f"unknown source input name '{name}' for {check.model}")
