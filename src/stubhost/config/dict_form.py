"""The JSON form of a model configuration, as Triton shows it.

This is the dict a Python model gets (as JSON) in ``initialize(args)["model_config"]`` and the
body of the KServe ``GET v2/models/<name>/config`` reply: protobuf's JSON mapping with the proto
field names kept (``max_batch_size``, not ``maxBatchSize``), every field that has no presence
printed even at its default value, enums as their names, and 64-bit integers as JSON numbers
rather than the strings protobuf's mapping uses (Triton rewrites those, and so do we).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from stubhost.config.errors import ConfigError
from stubhost.config.model_config_pb2 import ModelConfig

_INT64_TYPES = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)


def config_to_dict(cfg: ModelConfig) -> dict[str, Any]:
    """The Triton JSON shape of ``cfg`` as plain Python values (``json.dumps`` it for the wire).

    Map keys stay strings, as JSON requires, including the uint64 keys of
    ``dynamic_batching.priority_queue_policy`` (Triton leaves those as strings too).
    """
    data = json_format.MessageToDict(
        cfg, always_print_fields_with_no_presence=True, preserving_proto_field_name=True
    )
    _int64s_to_numbers(cfg.DESCRIPTOR, data)
    return data


def config_from_dict(d: Mapping[str, Any], source: str) -> ModelConfig:
    """Builds a ``ModelConfig`` from its JSON form (numbers or strings accepted for 64-bit fields).

    Unknown fields are errors, as in Triton. Raises :class:`ConfigError` naming ``source``.
    """
    if not isinstance(d, Mapping):
        raise ConfigError(source, f"model configuration must be a JSON object, not {type(d).__name__}")
    config = ModelConfig()
    try:
        json_format.ParseDict(dict(d), config)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise ConfigError(source, str(exc)) from None
    return config


def _int64s_to_numbers(descriptor: Descriptor, data: dict[str, Any]) -> None:
    """Rewrites, in place, every 64-bit integer in the JSON form of a ``descriptor`` message from
    a string to an int, walking nested messages, repeated fields and map values."""
    for key, value in data.items():
        field = descriptor.fields_by_name.get(key)
        if field is None:  # cannot happen for MessageToDict output; be lenient anyway
            continue
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            data[key] = {k: _converted(entry.fields_by_name["value"], v) for k, v in value.items()}
        elif isinstance(value, list):
            data[key] = [_converted(field, item) for item in value]
        else:
            data[key] = _converted(field, value)


def _converted(field: FieldDescriptor, value: Any) -> Any:
    """One value of ``field`` with its 64-bit integers turned into ints."""
    if field.message_type is not None:
        _int64s_to_numbers(field.message_type, value)
        return value
    if field.cpp_type in _INT64_TYPES:
        return int(value)
    return value
