"""validate_config: every rule fires with its exact message (Triton's wording where Triton has the
rule), and the real-world samples pass."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stubhost.config import ConfigError, fill_defaults, parse_config_text, validate_config
from stubhost.config.validate_io import reshape_mismatch
from tests.config import samples

SOURCE = "/repo/m/config.pbtxt"
IO = """
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
PY = f'name: "m" backend: "python" max_batch_size: 8 {IO}'
PY0 = f'name: "m" backend: "python" max_batch_size: 0 {IO}'
ENS = f"""name: "m" platform: "ensemble" max_batch_size: 8 {IO}
ensemble_scheduling {{ step [ {{ model_name: "a" input_map {{ key: "x" value: "IN" }}
                                 output_map {{ key: "y" value: "OUT" }} }} ] }}"""


def _error(text: str, *, fill: bool = True, folder: str = "m", gpus: tuple[int, ...] = ()) -> str:
    cfg = parse_config_text(text, SOURCE)
    if fill:
        fill_defaults(cfg, folder, available_gpus=gpus)
    with pytest.raises(ConfigError) as info:
        validate_config(cfg, model_dir_name=folder, source=SOURCE)
    assert info.value.source == SOURCE
    return str(info.value)


def _valid(text: str, *, folder: str = "m", gpus: tuple[int, ...] = ()) -> None:
    cfg = parse_config_text(text, SOURCE)
    fill_defaults(cfg, folder, available_gpus=gpus)
    validate_config(cfg, model_dir_name=folder, source=SOURCE)


@pytest.mark.parametrize("name", [n for n, (_, folder) in samples.ALL.items() if folder])
def test_real_world_configs_validate(name: str) -> None:
    text, folder = samples.ALL[name]
    assert folder is not None
    _valid(text, folder=folder)


def test_minimal_python_config_validates_after_defaults() -> None:
    _valid(f'backend: "python" {IO}')
    _valid(IO)  # no name, no backend: both come from fill_defaults


def test_a_python_model_may_carry_a_platform_label_that_names_no_framework() -> None:
    _valid(f'{PY} platform: "custom"')  # as Triton's QA model wrong_model does, and Triton loads


def test_gpu_group_validates_when_gpus_are_available() -> None:
    _valid(f'{PY} instance_group [ {{ kind: KIND_GPU }} ]', gpus=(0,))


def test_dynamic_batching_without_batching_is_accepted_like_triton() -> None:
    # Triton builds a dynamic batcher for max_batch_size 0 too: queue policies and priorities
    # apply, requests are never merged.
    _valid(f"{PY0} dynamic_batching {{ priority_levels: 2 default_priority_level: 1 }}")


@pytest.mark.parametrize("mbs", [0, 8])
def test_dims_may_not_be_empty_whatever_max_batch_size_is(mbs: int) -> None:
    text = f'name: "m" backend: "python" max_batch_size: {mbs} input [ {{ name: "IN" data_type: TYPE_FP32 }} ]'
    assert _error(text) == f"{SOURCE}: input 'IN': dims: model input 'IN' must specify 'dims' for m"


def test_empty_name_is_reported_when_defaults_were_not_filled() -> None:
    text = f'backend: "python" version_policy {{ latest {{ num_versions: 1 }} }} {IO}'
    assert _error(text, fill=False) == f"{SOURCE}: name: model configuration must specify 'name'"


def test_missing_version_policy_is_reported_when_defaults_were_not_filled() -> None:
    assert _error(PY, fill=False) == f"{SOURCE}: version_policy: must specify 'version policy' for m"


RAW = 'version_policy { latest { num_versions: 1 } }'  # for the cases validated without defaults

CASES = {
    # identity
    "name_differs_from_folder": (
        PY.replace('name: "m"', 'name: "other"'),
        "name: unexpected directory name 'm' for model 'other', directory name must equal model name",
    ),
    "foreign_backend": (
        PY.replace('"python"', '"onnxruntime"'),
        "backend: unsupported backend 'onnxruntime' for m: stubhost serves 'python' backend models, "
        "Python-based backends and 'ensemble' platform models only",
    ),
    "platform_without_backend": (
        PY.replace('backend: "python"', 'platform: "pytorch_libtorch"'),
        "backend: unexpected platform type 'pytorch_libtorch' for m",
    ),
    "python_with_platform_handler": (
        PY + 'platform: "pytorch_libtorch"',
        "platform: unsupported platform 'pytorch_libtorch' for python backend model m: stubhost runs "
        "the model's own Python file and has no platform handlers",
    ),
    "ensemble_with_backend": (
        ENS + 'backend: "python"',
        "backend: Ensemble model 'm' must have platform type 'ensemble' and empty backend type",
    ),
    # top-level numbers and files
    "negative_max_batch_size": (
        PY.replace("max_batch_size: 8", "max_batch_size: -1"),
        "max_batch_size: 'max_batch_size' must be non-negative value for m",
    ),
    "version_zero": (
        PY + "version_policy { specific { versions: [ 2, 0 ] } }",
        "version_policy: specific: versions: version 0 is not a positive integer for m",
    ),
    "model_file_outside_version_folder": (
        PY + 'default_model_filename: "../../etc/evil.py"',
        "default_model_filename: '../../etc/evil.py' is not a plain file name; the model file must lie "
        "in the version folder of m",
    ),
    # inputs and outputs
    "input_without_name": (
        PY.replace('name: "IN" ', ""),
        "input[0]: model input must specify 'name' for m",
    ),
    "input_without_data_type": (
        PY.replace('name: "IN" data_type: TYPE_FP32', 'name: "IN"'),
        "input 'IN': data_type: model input 'IN' must specify 'data_type' for m",
    ),
    "zero_dim": (
        PY.replace("dims: [ 4 ] } ]\noutput", "dims: [ 4, 0 ] } ]\noutput"),
        "input 'IN': dims: model input 'IN' dimension must be integer >= 1, or -1 to indicate a "
        "variable-size dimension for m",
    ),
    "negative_dim_other_than_wildcard": (
        'name: "m" backend: "python" input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ] '
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -2 ] } ]',
        "output 'OUT': dims: model output 'OUT' dimension must be integer >= 1, or -1 to indicate a "
        "variable-size dimension for m",
    ),
    "duplicate_input": (
        PY.replace("] } ]\noutput", '] }, { name: "IN" data_type: TYPE_INT8 dims: [ 1 ] } ]\noutput'),
        "input 'IN': duplicate input name 'IN'",
    ),
    "empty_reshape_without_batching": (
        PY0.replace("dims: [ 4 ] } ]\noutput", "dims: [ 1 ] reshape: { shape: [ ] } } ]\noutput"),
        "input 'IN': reshape: model input 'IN' cannot have empty reshape for non-batching model as "
        "scalar tensors are not supported for m",
    ),
    "zero_in_reshape": (
        PY.replace("dims: [ 4 ] } ]\noutput", "dims: [ 4 ] reshape: { shape: [ 0 ] } } ]\noutput"),
        "input 'IN': reshape: model input 'IN' reshape dimensions must be integer >= 1, or -1 to "
        "indicate a variable-size dimension for m",
    ),
    "reshape_changes_element_count": (
        PY.replace("dims: [ 4 ] } ]\noutput", "dims: [ 4 ] reshape: { shape: [ 5 ] } } ]\noutput"),
        "input 'IN': reshape: model input 'IN' has different size for dims and reshape for m",
    ),
    "reshape_changes_variable_dims": (
        PY.replace("dims: [ 4 ] } ]\noutput", "dims: [ -1, 2, -1 ] reshape: { shape: [ -1, 2 ] } } ]\noutput"),
        "input 'IN': reshape: model input 'IN' has different number of variable-size dimensions for "
        "dims and reshape for m",
    ),
    "image_format_needs_three_dims": (
        PY.replace("dims: [ 4 ] } ]\noutput", "dims: [ 4 ] format: FORMAT_NCHW } ]\noutput"),
        "input 'IN': format: model input NHWC/NCHW require 3 dims for m",
    ),
    "shape_tensor": (
        PY.replace("dims: [ 4 ] } ]\noutput", "dims: [ 4 ] is_shape_tensor: true } ]\noutput"),
        "input 'IN': is_shape_tensor: shape tensors are only supported for TensorRT platform for m",
    ),
    "non_linear_io": (
        'name: "m" backend: "python" input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ] '
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] is_non_linear_format_io: true } ]',
        "output 'OUT': is_non_linear_format_io: Non-linear IO format is only supported for the "
        "TensorRT platform for m",
    ),
    "batch_input_two_sources": (
        PY + 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT32 '
        'source_input: [ "IN", "IN" ] } ]',
        "batch_input[0]: source_input: batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, "
        "got 2 for m",
    ),
    "batch_input_type": (
        PY + 'batch_input [ { target_name: "N" data_type: TYPE_FP16 source_input: "IN" } ]',
        "batch_input[0]: data_type: batch input data type must be TYPE_INT32 or TYPE_FP32 for m",
    ),
    "batch_input_unknown_source": (
        PY + 'batch_input [ { target_name: "N" data_type: TYPE_INT32 source_input: "NOPE" } ]',
        "batch_input[0]: source_input: unknown source input name 'NOPE' for m",
    ),
    "batch_output_unknown_target": (
        PY + 'batch_output [ { target_name: "NOPE" source_input: "IN" } ]',
        "batch_output[0]: target_name: unknown target output name 'NOPE' for m",
    ),
    "batch_output_target_twice": (
        PY + 'batch_output [ { target_name: [ "OUT", "OUT" ] source_input: "IN" } ]',
        "batch_output[0]: target_name: target output name 'OUT' can only be specified once for m",
    ),
    # instance groups
    "cpu_group_with_gpus": (
        PY + "instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]",
        "instance_group 'm_0': gpus: instance group m_0 of model m has kind KIND_CPU but specifies "
        "one or more GPUs",
    ),
    "model_group_with_gpus": (
        PY + 'instance_group [ { name: "g" kind: KIND_MODEL gpus: [ 1 ] } ]',
        "instance_group 'g': gpus: instance group g of model m has kind KIND_MODEL but specifies one "
        "or more GPUs",
    ),
    "gpu_group_without_gpus": (
        PY + "instance_group [ { kind: KIND_GPU } ]",
        "instance_group 'm_0': gpus: instance group m_0 of model m has kind KIND_GPU but specifies no GPUs",
    ),
    "negative_gpu_id": (
        PY + "instance_group [ { kind: KIND_GPU gpus: [ -1 ] } ]",
        "instance_group 'm_0': gpus: instance group m_0 of model m specifies invalid or unsupported "
        "gpu id -1",
    ),
    "tensorrt_profile": (
        PY + 'instance_group [ { kind: KIND_CPU profile: [ "0" ] } ]',
        "instance_group 'm_0': profile: instance group m_0 of model m specifies profile field which is "
        "only supported for TensorRT models",
    ),
    # dynamic batching
    "preferred_size_zero": (
        PY + "dynamic_batching { preferred_batch_size: [ 0 ] }",
        "dynamic_batching: preferred_batch_size: dynamic batching preferred size must be positive for m",
    ),
    "preferred_size_above_max": (
        PY + "dynamic_batching { preferred_batch_size: [ 4, 16 ] }",
        "dynamic_batching: preferred_batch_size: dynamic batching preferred size must be <= max batch "
        "size for m",
    ),
    "preferred_size_without_batching": (
        PY0 + "dynamic_batching { preferred_batch_size: [ 1 ] }",
        "dynamic_batching: preferred_batch_size: dynamic batching preferred size must be <= max batch "
        "size for m",
    ),
    "default_priority_out_of_range": (
        PY + "dynamic_batching { priority_levels: 2 }",
        "dynamic_batching: default_priority_level: default priority level must be in range [1, 2] for m",
    ),
    "queue_policy_priority_out_of_range": (
        PY + "dynamic_batching { priority_levels: 2 default_priority_level: 2 "
        "priority_queue_policy { key: 3 value { max_queue_size: 1 } } }",
        "dynamic_batching: priority_queue_policy: priority queue policy must have priority level in "
        "range [1, 2] for m",
    ),
    "preserve_ordering_with_priorities": (
        PY + "dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }",
        "dynamic_batching: preserve_ordering: Only one priority level is allowed when "
        "'preserve_ordering' is true for m",
    ),
    "preserve_ordering_with_delay": (
        PY + "dynamic_batching { preserve_ordering: true default_queue_policy { timeout_action: DELAY "
        "default_timeout_microseconds: 10 } }",
        "dynamic_batching: preserve_ordering: Queue policy can not have DELAY as timeout action when "
        "'preserve_ordering' is true for m",
    ),
    # sequence batching
    "control_without_name": (
        PY + "sequence_batching { control_input [ { control [ { kind: CONTROL_SEQUENCE_START "
        "int32_false_true: [ 0, 1 ] } ] } ] }",
        "sequence_batching: control_input: sequence batching control tensor must have a name for m",
    ),
    "control_tensor_twice": (
        PY + 'sequence_batching { control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
        'int32_false_true: [ 0, 1 ] } ] }, { name: "S" control [ { kind: CONTROL_SEQUENCE_END '
        "int32_false_true: [ 0, 1 ] } ] } ] }",
        "sequence_batching: control_input 'S': sequence batching control tensor 'S' is specified for "
        "multiple control kinds for m",
    ),
    "control_kind_twice": (
        PY + 'sequence_batching { control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_START '
        'int32_false_true: [ 0, 1 ] } ] }, { name: "B" control [ { kind: CONTROL_SEQUENCE_START '
        "int32_false_true: [ 0, 1 ] } ] } ] }",
        "sequence_batching: control_input: sequence batching specifies multiple CONTROL_SEQUENCE_START "
        "tensors for m",
    ),
    "control_without_values": (
        PY + 'sequence_batching { control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_READY } ] } ] }',
        "sequence_batching: control_input 'S': sequence batching must specify either "
        "'int32_false_true', 'fp32_false_true' or 'bool_false_true' for CONTROL_SEQUENCE_READY for m",
    ),
    "control_with_two_value_kinds": (
        PY + 'sequence_batching { control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_END '
        "int32_false_true: [ 0, 1 ] fp32_false_true: [ 0, 1 ] } ] } ] }",
        "sequence_batching: control_input 'S': sequence batching specifies more than one from "
        "'int32_false_true', 'fp32_false_true' and 'bool_false_true' for CONTROL_SEQUENCE_END for m",
    ),
    "control_with_one_value": (
        PY + 'sequence_batching { control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
        "bool_false_true: [ true ] } ] } ] }",
        "sequence_batching: control_input 'S': sequence batching control 'bool_false_true' must have "
        "exactly 2 entries for CONTROL_SEQUENCE_START for m",
    ),
    "corrid_with_values": (
        PY + 'sequence_batching { control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID '
        "data_type: TYPE_UINT64 int32_false_true: [ 0, 1 ] } ] } ] }",
        "sequence_batching: control_input 'C': sequence batching must not specify either "
        "'int32_false_true', 'fp32_false_true' or 'bool_false_true' for CONTROL_SEQUENCE_CORRID for m",
    ),
    "corrid_float": (
        PY + 'sequence_batching { control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID '
        "data_type: TYPE_FP32 } ] } ] }",
        "sequence_batching: control_input 'C': unexpected data type for control CONTROL_SEQUENCE_CORRID "
        "for m. Allowed data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
    ),
    "oldest_preferred_above_max": (
        PY + "sequence_batching { oldest { preferred_batch_size: [ 9 ] } }",
        "sequence_batching: oldest: preferred_batch_size: sequence batching preferred batch size must "
        "be <= max batch size for m",
    ),
    "oldest_preferred_zero": (
        PY + "sequence_batching { oldest { preferred_batch_size: [ 0 ] } }",
        "sequence_batching: oldest: preferred_batch_size: sequence batching preferred batch size must "
        "be positive for m",
    ),
    "slot_utilization_above_one": (
        PY + "sequence_batching { direct { minimum_slot_utilization: 1.5 } }",
        "sequence_batching: direct: minimum_slot_utilization: sequence batching minimum slot "
        "utilization must be in range (0.0, 1.0] for m",
    ),
    "response_cache_with_sequences": (
        PY + "sequence_batching { } response_cache { enable: true }",
        "response_cache: Response Cache does not currently support model m with sequence batching "
        "scheduler. Please disable the response cache.",
    ),
    "response_cache_with_decoupled": (
        PY + "model_transaction_policy { decoupled: true } response_cache { enable: true }",
        "response_cache: Response Cache does not currently support model m with 'decoupled' "
        "transaction policy. Please disable the response cache.",
    ),
    # ensembles
    "ensemble_scheduling_on_python_model": (
        PY + 'ensemble_scheduling { step [ { model_name: "a" } ] }',
        "ensemble_scheduling: ensemble scheduling cannot be set for model 'm' whose platform is not ensemble",
    ),
    "ensemble_without_scheduling": (
        PY.replace('backend: "python"', 'platform: "ensemble"'),
        "ensemble_scheduling: ensemble scheduling must be set for ensemble m whose platform is ensemble",
    ),
    "ensemble_with_instance_group": (
        ENS + "instance_group [ { kind: KIND_CPU } ]",
        "instance_group: instance group should not be specified for ensemble 'm'",
    ),
    "ensemble_with_optimization": (
        ENS + "optimization { priority: PRIORITY_MAX }",
        "optimization: optimization should not be specified for ensemble 'm'",
    ),
    "ensemble_with_warmup": (
        ENS + 'model_warmup [ { name: "w" } ]',
        "model_warmup: model_warmup can not be specified for ensemble 'm'",
    ),
    "ensemble_without_steps": (
        f'name: "m" platform: "ensemble" {IO} ensemble_scheduling {{ }}',
        "ensemble_scheduling: must specify 'step' for ensemble 'm'",
    ),
    "ensemble_step_without_model": (
        f'name: "m" platform: "ensemble" {IO} ensemble_scheduling {{ step [ {{ }} ] }}',
        "ensemble_scheduling: step[0]: must specify 'model_name' in step 0 of ensemble 'm'",
    ),
    "ensemble_step_without_outputs": (
        f'name: "m" platform: "ensemble" {IO} ensemble_scheduling {{ step [ {{ model_name: "b" '
        'input_map { key: "x" value: "IN" } } ] }',
        "ensemble_scheduling: step[0]: must specify 'output_map' in step 0 of ensemble 'm'",
    ),
    "ensemble_tensor_written_twice": (
        f'name: "m" platform: "ensemble" {IO} ensemble_scheduling {{ step [ '
        '{ model_name: "a" input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" } }, '
        '{ model_name: "b" input_map { key: "x" value: "IN" } output_map { key: "z" value: "OUT" } } ] }',
        "ensemble_scheduling: step[1]: output_map: ensemble tensor 'OUT' can appear in an output map "
        "only once for ensemble 'm' step 1",
    ),
    # metrics
    "metric_control_without_family": (
        PY + "model_metrics { metric_control [ { metric_identifier { } histogram_options { buckets: [ 1 ] } } ] }",
        "model_metrics: metric_control[0]: metric identifier must specify non-empty 'family'",
    ),
    "metric_control_without_buckets": (
        PY + 'model_metrics { metric_control [ { metric_identifier { family: "f" } histogram_options { } } ] }',
        "model_metrics: metric_control[0]: histogram options must specify non-empty 'buckets'",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_fires_with_its_message(case: str) -> None:
    text, expected = CASES[case]
    assert _error(text) == f"{SOURCE}: {expected}"


RAW_CASES = {
    "no_instance_group": (
        f"{PY} {RAW}",
        "instance_group: must specify one or more 'instance group's for m",
    ),
    "count_zero": (
        f'{PY} {RAW} instance_group [ {{ name: "g" kind: KIND_CPU }} ]',
        "instance_group 'g': count: instance group g of model m has count 0; count must be >= 1",
    ),
    "unresolved_auto_kind": (
        f'{PY} {RAW} instance_group [ {{ name: "g" count: 1 }} ]',
        "instance_group 'g': kind: instance group g of model m has unexpected kind KIND_AUTO",
    ),
    "unnamed_group": (
        f"{PY} {RAW} instance_group [ {{ count: 1 kind: KIND_CPU gpus: [ 0 ] }} ]",
        "instance_group[0]: gpus: instance group  of model m has kind KIND_CPU but specifies one or more GPUs",
    ),
}


@pytest.mark.parametrize("case", sorted(RAW_CASES))
def test_rules_that_only_unfilled_configs_can_break(case: str) -> None:
    text, expected = RAW_CASES[case]
    assert _error(text, fill=False) == f"{SOURCE}: {expected}"


# ---- reshape arithmetic ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("dims", "shape", "ok"),
    [
        ([4], [2, 2], True),
        ([1], [], True),
        ([1, 1], [], True),
        ([2], [], False),
        ([-1], [], False),
        ([2, 4, -1, 6], [8, -1, 1, 6], True),
        ([2, 4, -1, 6], [8, -1, 2, 3], True),
        ([2, 4, -1, 6], [4, -1, 2, 6], False),
        ([-1, 3], [3, -1], False),
        ([-1, 3], [-1, -1], False),
        ([-1], [6], False),
        ([6], [-1], False),
        ([-1, 2, -1], [-1, 2, -1], True),
    ],
)
def test_reshape_rules(dims: list[int], shape: list[int], ok: bool) -> None:
    assert (reshape_mismatch(dims, shape) is None) is ok


fixed_dims = st.lists(st.integers(1, 6), min_size=1, max_size=4)


@given(fixed_dims, st.randoms(use_true_random=False))
def test_any_reordering_of_fixed_dims_is_a_valid_reshape(dims: list[int], rnd: object) -> None:
    shape = list(dims)
    rnd.shuffle(shape)  # type: ignore[attr-defined]
    assert reshape_mismatch(dims, shape) is None


@given(fixed_dims, st.integers(2, 5))
def test_a_reshape_with_another_element_count_is_rejected(dims: list[int], factor: int) -> None:
    assert reshape_mismatch(dims, [*dims, factor]) == "has different size for dims and reshape"
