"""The Triton JSON form: field names kept, defaults printed, enums by name, 64-bit integers as
numbers (everywhere, found by walking the schema), and a lossless round trip back."""

from __future__ import annotations

import json
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stubhost.config import ConfigError, config_from_dict, config_to_dict, fill_defaults, parse_config_text
from stubhost.config.model_config_pb2 import ModelConfig
from tests.config import samples

ADD_SUB_JSON = {
    "name": "add_sub",
    "platform": "",
    "backend": "python",
    "runtime": "",
    "version_policy": {"latest": {"num_versions": 1}},
    "max_batch_size": 0,
    "input": [
        {
            "name": name,
            "data_type": "TYPE_FP32",
            "format": "FORMAT_NONE",
            "dims": [4],
            "is_shape_tensor": False,
            "allow_ragged_batch": False,
            "optional": False,
            "is_non_linear_format_io": False,
        }
        for name in ("INPUT0", "INPUT1")
    ],
    "output": [
        {
            "name": name,
            "data_type": "TYPE_FP32",
            "dims": [4],
            "label_filename": "",
            "is_shape_tensor": False,
            "is_non_linear_format_io": False,
        }
        for name in ("OUTPUT0", "OUTPUT1")
    ],
    "batch_input": [],
    "batch_output": [],
    "optimization": {
        "priority": "PRIORITY_DEFAULT",
        "input_pinned_memory": {"enable": True},
        "output_pinned_memory": {"enable": True},
        "gather_kernel_buffer_threshold": 0,
        "eager_batching": False,
    },
    "instance_group": [
        {
            "name": "add_sub_0",
            "kind": "KIND_CPU",
            "count": 1,
            "gpus": [],
            "secondary_devices": [],
            "profile": [],
            "passive": False,
            "host_policy": "",
        }
    ],
    "default_model_filename": "model.py",
    "cc_model_filenames": {},
    "metric_tags": {},
    "parameters": {},
    "model_warmup": [],
}


def test_add_sub_has_the_shape_triton_hands_to_initialize() -> None:
    cfg = parse_config_text(samples.ADD_SUB, "add_sub/config.pbtxt")
    fill_defaults(cfg, "add_sub")
    assert config_to_dict(cfg) == ADD_SUB_JSON


def test_64_bit_fields_are_numbers_in_nested_repeated_and_map_fields() -> None:
    cfg = parse_config_text(samples.DYNAMIC_BATCHING, "batched/config.pbtxt")
    cfg.version_policy.specific.versions.extend([1, 2**40])
    d = config_to_dict(cfg)
    assert d["input"][0]["dims"] == [-1]
    assert d["version_policy"]["specific"]["versions"] == [1, 2**40]
    batching = d["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 100
    assert batching["priority_levels"] == 2
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 5_000_000
    # JSON object keys must be strings; the uint64 map keys stay strings, as in Triton.
    assert batching["priority_queue_policy"]["2"]["default_timeout_microseconds"] == 1_000_000

    sink = config_to_dict(parse_config_text(samples.KITCHEN_SINK, "k"))
    assert sink["model_warmup"][0]["inputs"]["IMAGE"]["dims"] == [3, 224, 224]
    spec = sink["optimization"]["cuda"]["graph_spec"][0]
    assert spec["input"]["IMAGE"]["dim"] == [3, 224, 224]
    assert spec["graph_lower_bound"]["input"]["IMAGE"]["dim"] == [3, 64, 64]
    assert sink["instance_group"][0]["secondary_devices"][0]["device_id"] == 1
    state = sink["sequence_batching"]["state"][0]
    assert state["dims"] == [-1] and state["initial_state"][0]["dims"] == [4]
    assert sink["sequence_batching"]["direct"]["max_queue_delay_microseconds"] == 200


def test_ensemble_step_versions_are_numbers() -> None:
    d = config_to_dict(parse_config_text(samples.ENSEMBLE, "pipeline/config.pbtxt"))
    assert [s["model_version"] for s in d["ensemble_scheduling"]["step"]] == [-1, 3]


@pytest.mark.parametrize("name", sorted(samples.ALL))
def test_real_world_configs_round_trip_through_json(name: str) -> None:
    text, folder = samples.ALL[name]
    cfg = parse_config_text(text, name)
    if folder:
        fill_defaults(cfg, folder)
    wire = json.dumps(config_to_dict(cfg))
    assert config_from_dict(json.loads(wire), name) == cfg


def test_config_from_dict_accepts_64_bit_values_as_strings() -> None:
    cfg = config_from_dict({"name": "m", "input": [{"name": "I", "dims": ["-1", "3"]}]}, "s")
    assert list(cfg.input[0].dims) == [-1, 3]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ([1, 2], "api: model configuration must be a JSON object, not list"),
        (
            {"max_batch_size": "x"},
            "api: Failed to parse max_batch_size field: invalid literal for int() with base 10: 'x'.",
        ),
        (
            {"input": [{"data_type": "TYPE_NOPE"}]},
            "api: Failed to parse input field: Failed to parse data_type field: Invalid enum value "
            "TYPE_NOPE for enum type inference.DataType at ModelConfig.input[0].data_type..",
        ),
    ],
)
def test_config_from_dict_errors_name_the_source(data: Any, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, "api")
    assert str(info.value) == expected


def test_config_from_dict_rejects_unknown_fields() -> None:
    with pytest.raises(ConfigError, match=r'^api: Message type "inference.ModelConfig" has no field named "bogus"'):
        config_from_dict({"name": "m", "bogus": 1}, "api")


# ---- property: any ModelConfig survives the round trip, with no 64-bit value left a string -----

_INTS = {
    FieldDescriptor.CPPTYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    FieldDescriptor.CPPTYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.CPPTYPE_UINT32: st.integers(0, 2**32 - 1),
    FieldDescriptor.CPPTYPE_UINT64: st.integers(0, 2**64 - 1),
}


def _scalars(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    cpp = field.cpp_type
    if cpp in _INTS:
        return _INTS[cpp]
    if cpp == FieldDescriptor.CPPTYPE_BOOL:
        return st.booleans()
    if cpp == FieldDescriptor.CPPTYPE_FLOAT:
        return st.floats(width=32, allow_nan=False, allow_infinity=False)
    if cpp == FieldDescriptor.CPPTYPE_DOUBLE:
        return st.floats(allow_nan=False, allow_infinity=False)
    if cpp == FieldDescriptor.CPPTYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values])
    return st.text(max_size=8)


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


@st.composite
def _fill(draw: st.DrawFn, message: Message, depth: int) -> Message:
    """Sets a random subset of the fields of ``message`` to random values, nesting up to depth."""
    descriptor: Descriptor = message.DESCRIPTOR
    for field in descriptor.fields:
        if not draw(st.booleans()):
            continue
        if _is_map(field):
            if depth == 0:
                continue
            key_field = field.message_type.fields_by_name["key"]
            value_field = field.message_type.fields_by_name["value"]
            container = getattr(message, field.name)
            for key in draw(st.lists(_scalars(key_field), max_size=2, unique=True)):
                if value_field.message_type is not None:
                    draw(_fill(container[key], depth - 1))
                else:
                    container[key] = draw(_scalars(value_field))
        elif field.message_type is not None:
            if depth == 0:
                continue
            if field.label == FieldDescriptor.LABEL_REPEATED:
                for _ in range(draw(st.integers(0, 2))):
                    draw(_fill(getattr(message, field.name).add(), depth - 1))
            else:
                sub = getattr(message, field.name)
                sub.SetInParent()
                draw(_fill(sub, depth - 1))
        elif field.label == FieldDescriptor.LABEL_REPEATED:
            getattr(message, field.name).extend(draw(st.lists(_scalars(field), max_size=3)))
        else:
            setattr(message, field.name, draw(_scalars(field)))
    return message


def _assert_no_int64_strings(descriptor: Descriptor, data: dict[str, Any]) -> None:
    for key, value in data.items():
        field = descriptor.fields_by_name[key]
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            values = list(value.values())
        else:
            value_field = field
            values = value if isinstance(value, list) else [value]
        for v in values:
            if value_field.message_type is not None:
                _assert_no_int64_strings(value_field.message_type, v)
            elif value_field.cpp_type in (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64):
                assert type(v) is int, (key, v)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_config_round_trips_and_prints_64_bit_values_as_numbers(data: st.DataObject) -> None:
    cfg = data.draw(_fill(ModelConfig(), depth=4))
    d = config_to_dict(cfg)
    _assert_no_int64_strings(ModelConfig.DESCRIPTOR, d)
    assert config_from_dict(json.loads(json.dumps(d)), "prop") == cfg
