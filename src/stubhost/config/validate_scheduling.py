"""Validation of the scheduler sections: ``dynamic_batching``, ``sequence_batching`` and
``ensemble_scheduling``, and of the settings that conflict with them.

Messages follow Triton's ValidateModelConfig, GetBooleanSequenceControlProperties,
GetTypedSequenceControlProperties and ValidateEnsembleSchedulingConfig wording
(core/src/model_config_utils.cc).
"""

from __future__ import annotations

from collections import Counter

from stubhost.config._check import Check
from stubhost.config.defaults import ENSEMBLE_PLATFORM
from stubhost.config.ensemble_flow import check_ensemble_flow
from stubhost.config.model_config_pb2 import (
    DataType,
    ModelConfig,
    ModelQueuePolicy,
    ModelSequenceBatching,
)

Control = ModelSequenceBatching.Control
_CORRID_TYPES = (
    DataType.TYPE_UINT64,
    DataType.TYPE_INT64,
    DataType.TYPE_UINT32,
    DataType.TYPE_INT32,
    DataType.TYPE_STRING,
)


def validate_scheduling(cfg: ModelConfig, check: Check) -> None:
    """Checks whichever scheduler is configured, and the response-cache conflicts."""
    if cfg.HasField("dynamic_batching"):
        _validate_dynamic_batching(cfg, check)
    if cfg.HasField("sequence_batching"):
        if cfg.response_cache.enable:
            check.fail(
                "response_cache",
                f"Response Cache does not currently support model {check.model} with sequence "
                "batching scheduler. Please disable the response cache.",
            )
        _validate_sequence_batching(cfg, check)
    if cfg.HasField("ensemble_scheduling"):
        validate_ensemble(cfg, check)
    elif cfg.platform == ENSEMBLE_PLATFORM:
        check.fail(
            "ensemble_scheduling",
            f"ensemble scheduling must be set for ensemble {check.model} whose platform is "
            f"{ENSEMBLE_PLATFORM}",
        )
    if cfg.model_transaction_policy.decoupled and cfg.response_cache.enable:
        check.fail(
            "response_cache",
            f"Response Cache does not currently support model {check.model} with 'decoupled' "
            "transaction policy. Please disable the response cache.",
        )


def _validate_dynamic_batching(cfg: ModelConfig, check: Check) -> None:
    """Preferred sizes in [1, max_batch_size]; priority levels in range; no preserve_ordering with
    several priority levels or with DELAY queue policies.

    ``max_batch_size: 0`` with ``dynamic_batching`` is accepted, as Triton accepts it: requests are
    queued (with the queue and priority policies) but never batched together.
    """
    batching = cfg.dynamic_batching
    suffix = f" for {check.model}"
    for size in batching.preferred_batch_size:
        if size <= 0:
            check.fail(
                "dynamic_batching: preferred_batch_size",
                f"dynamic batching preferred size must be positive{suffix}",
            )
        if size > cfg.max_batch_size:
            check.fail(
                "dynamic_batching: preferred_batch_size",
                f"dynamic batching preferred size must be <= max batch size{suffix}",
            )
    levels = batching.priority_levels
    if levels != 0:
        if not 1 <= batching.default_priority_level <= levels:
            check.fail(
                "dynamic_batching: default_priority_level",
                f"default priority level must be in range [1, {levels}]{suffix}",
            )
        for level in batching.priority_queue_policy:
            if not 1 <= level <= levels:
                check.fail(
                    "dynamic_batching: priority_queue_policy",
                    f"priority queue policy must have priority level in range [1, {levels}]{suffix}",
                )
    if batching.preserve_ordering:
        if levels > 1:
            check.fail(
                "dynamic_batching: preserve_ordering",
                f"Only one priority level is allowed when 'preserve_ordering' is true{suffix}",
            )
        policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
        for policy in policies:
            if policy.default_timeout_microseconds != 0 and policy.timeout_action == ModelQueuePolicy.DELAY:
                check.fail(
                    "dynamic_batching: preserve_ordering",
                    "Queue policy can not have DELAY as timeout action when 'preserve_ordering' "
                    f"is true{suffix}",
                )


def _validate_sequence_batching(cfg: ModelConfig, check: Check) -> None:
    """Control inputs, then the strategy's own settings."""
    sequence = cfg.sequence_batching
    suffix = f" for {check.model}"
    _validate_controls(sequence, check)
    if sequence.HasField("oldest"):
        for size in sequence.oldest.preferred_batch_size:
            if size <= 0:
                check.fail(
                    "sequence_batching: oldest: preferred_batch_size",
                    f"sequence batching preferred batch size must be positive{suffix}",
                )
            if size > cfg.max_batch_size:
                check.fail(
                    "sequence_batching: oldest: preferred_batch_size",
                    f"sequence batching preferred batch size must be <= max batch size{suffix}",
                )
    if sequence.HasField("direct"):
        utilization = sequence.direct.minimum_slot_utilization
        if not 0.0 <= utilization <= 1.0:
            check.fail(
                "sequence_batching: direct: minimum_slot_utilization",
                f"sequence batching minimum slot utilization must be in range (0.0, 1.0]{suffix}",
            )


def _validate_controls(sequence: ModelSequenceBatching, check: Check) -> None:
    """Each control tensor is named once; each control kind appears at most once; START, END and
    READY give exactly one two-entry false/true list; CORRID gives none and a permitted type."""
    suffix = f" for {check.model}"
    field = "sequence_batching: control_input"
    names: set[str] = set()
    for control_input in sequence.control_input:
        if not control_input.name:
            check.fail(field, f"sequence batching control tensor must have a name{suffix}")
        if control_input.name in names:
            check.fail(
                f"{field} '{control_input.name}'",
                f"sequence batching control tensor '{control_input.name}' is specified for "
                f"multiple control kinds{suffix}",
            )
        names.add(control_input.name)
    kinds = Counter(c.kind for ci in sequence.control_input for c in ci.control)
    for kind, count in kinds.items():
        if count > 1:
            check.fail(
                field, f"sequence batching specifies multiple {Control.Kind.Name(kind)} tensors{suffix}"
            )
    for control_input in sequence.control_input:
        for control in control_input.control:
            _validate_control(control, f"{field} '{control_input.name}'", check)


def _validate_control(control: Control, field: str, check: Check) -> None:
    kind = Control.Kind.Name(control.kind)
    suffix = f" for {kind} for {check.model}"
    lists = {
        "int32_false_true": len(control.int32_false_true),
        "fp32_false_true": len(control.fp32_false_true),
        "bool_false_true": len(control.bool_false_true),
    }
    given = [name for name, length in lists.items() if length]
    if control.kind == Control.CONTROL_SEQUENCE_CORRID:
        if given:
            check.fail(
                field,
                "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' "
                f"or 'bool_false_true'{suffix}",
            )
        if control.data_type not in _CORRID_TYPES:
            check.fail(
                field,
                f"unexpected data type for control {kind} for {check.model}. Allowed data types "
                "are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
            )
        return
    if not given:
        check.fail(
            field,
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
            f"'bool_false_true'{suffix}",
        )
    if len(given) > 1:
        check.fail(
            field,
            "sequence batching specifies more than one from 'int32_false_true', "
            f"'fp32_false_true' and 'bool_false_true'{suffix}",
        )
    if lists[given[0]] != 2:
        check.fail(
            field, f"sequence batching control '{given[0]}' must have exactly 2 entries{suffix}"
        )


def validate_ensemble(cfg: ModelConfig, check: Check) -> None:
    """Structural checks of an ensemble: the platform, no instance groups / optimization / warmup,
    every step names a model and maps inputs and outputs, each ensemble tensor written once, and
    the data flow of the steps (``ensemble_flow``).

    The maps against the composing models (their inputs, outputs, data types, shapes, batch
    sizes) are checked when the ensemble loads, against the models as loaded then
    (``stubhost.host.ensemble_wiring``).
    """
    name = check.model
    if cfg.platform != ENSEMBLE_PLATFORM:
        check.fail(
            "ensemble_scheduling",
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not "
            f"{ENSEMBLE_PLATFORM}",
        )
    if cfg.instance_group:
        check.fail("instance_group", f"instance group should not be specified for ensemble '{name}'")
    if cfg.HasField("optimization"):
        check.fail("optimization", f"optimization should not be specified for ensemble '{name}'")
    if cfg.model_warmup:
        check.fail("model_warmup", f"model_warmup can not be specified for ensemble '{name}'")
    steps = cfg.ensemble_scheduling.step
    if not steps:
        check.fail("ensemble_scheduling", f"must specify 'step' for ensemble '{name}'")
    written: set[str] = set()
    for index, step in enumerate(steps):
        field = f"ensemble_scheduling: step[{index}]"
        for required in ("model_name", "input_map", "output_map"):
            if not getattr(step, required):
                check.fail(field, f"must specify '{required}' in step {index} of ensemble '{name}'")
        for tensor in step.output_map.values():
            if tensor in written:
                check.fail(
                    f"{field}: output_map",
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{name}' step {index}",
                )
            written.add(tensor)
    check_ensemble_flow(cfg, check)
