"""config.pbtxt syntax errors read as Triton and C++ protobuf word them: Triton's
``failed to read text proto from <file>`` and the ``Error parsing text-format
inference.ModelConfig: <line>:<column>: <message>`` line C++ protobuf logs, with C++'s message in
place of Python protobuf's."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stubhost.config import ConfigError, load_config_file, parse_config_text
from stubhost.config.model_config_pb2 import ModelConfig

SOURCE = "m/config.pbtxt"
PREFIX = "failed to read text proto from m/config.pbtxt: Error parsing text-format inference.ModelConfig: "

# (config.pbtxt text, what Python protobuf says, line, column, what C++ protobuf says)
TRANSLATED = [
    pytest.param(
        "max_batch_sizee: 4",
        'Message type "inference.ModelConfig" has no field named "max_batch_sizee".',
        1, 1,
        'Message type "inference.ModelConfig" has no field named "max_batch_sizee".',
        id="unknown-field",
    ),
    pytest.param(
        'input [ { name: "I" data_type: TYPE_FOO dims: [1] } ]',
        'Enum type "inference.DataType" has no value named TYPE_FOO.',
        1, 32,
        'Unknown enumeration value of "TYPE_FOO" for field "data_type".',
        id="bad-enum",
    ),
    pytest.param(
        "version_policy { latest { num_versions: -1 } }",
        "Value out of range: -1",
        1, 41,
        "Expected integer, got: -",
        id="negative-for-uint32",
    ),
    pytest.param(
        "dynamic_batching { max_queue_delay_microseconds: -5 }",
        "Value out of range: -5",
        1, 50,
        "Expected integer, got: -",
        id="negative-for-uint64",
    ),
    pytest.param(
        'max_batch_size: "x"',
        "Couldn't parse integer: \"x\"",
        1, 17,
        'Expected integer, got: "x"',
        id="string-for-int",
    ),
    pytest.param(
        "max_batch_size: 12345678901",
        "Value out of range: 12345678901",
        1, 17,
        "Integer out of range (12345678901)",
        id="out-of-range-int32",
    ),
    pytest.param(
        "max_batch_size: -12345678901",
        "Value out of range: -12345678901",
        1, 17,
        "Integer out of range (12345678901)",
        id="negative-out-of-range-int32",
    ),
    pytest.param(
        "version_policy { latest { num_versions: 12345678901 } }",
        "Value out of range: 12345678901",
        1, 41,
        "Integer out of range (12345678901)",
        id="out-of-range-uint32",
    ),
    pytest.param(
        "max_batch_size: 0x1FFFFFFFF",
        "Value out of range: 8589934591",
        1, 17,
        "Integer out of range (0x1FFFFFFFF)",
        id="out-of-range-hex-as-written",
    ),
    pytest.param(
        "max_batch_size: 4\nmax_batch_size: 8",
        'Message type "inference.ModelConfig" should not have multiple "max_batch_size" fields.',
        2, 17,
        'Non-repeated field "max_batch_size" is specified multiple times.',
        id="non-repeated-twice",
    ),
    pytest.param(
        'name: "a" input [ { name: "I" ',
        'Expected "}".',
        1, 27,
        "Expected identifier, got: ",
        id="missing-closing-brace",
    ),
    pytest.param(
        "max_batch_size: four",
        "Couldn't parse integer: four",
        1, 17,
        "Expected integer, got: four",
        id="bare-word-for-int",
    ),
    pytest.param(
        "max_batch_size: -four",
        "Couldn't parse integer: -four",
        1, 17,
        "Expected integer, got: four",
        id="minus-bare-word-for-int",
    ),
    pytest.param(
        "name: foo",
        "Expected string but found: 'foo'",
        1, 7,
        "Expected string, got: foo",
        id="bare-word-for-string",
    ),
    pytest.param(
        "dynamic_batching: foo",
        'Expected "{".',
        1, 19,
        'Expected "{", found "foo".',
        id="bare-word-for-message",
    ),
    pytest.param(
        'input [ { name: "I" optional: maybe } ]',
        'Expected "true" or "false".',
        1, 31,
        'Invalid value for boolean field "optional". Value: "maybe".',
        id="bad-bool",
    ),
    pytest.param(
        "input { optional: 2 }",
        'Expected "true" or "false".',
        1, 19,
        "Integer out of range (2)",
        id="bool-number-above-one",
    ),
    pytest.param(
        "max_batch_size 4",
        'Expected ":".',
        1, 16,
        'Expected ":", found "4".',
        id="missing-colon",
    ),
    pytest.param(
        "}",
        "Expected identifier or number, got }.",
        1, 1,
        "Expected identifier, got: }",
        id="stray-closing-brace",
    ),
    pytest.param(
        "dynamic_batching {} sequence_batching {}",
        'Field "sequence_batching" is specified along with field "dynamic_batching", another member of oneof '
        '"scheduling_choice" for message type "inference.ModelConfig".',
        1, 21,
        'Field "sequence_batching" is specified along with field "dynamic_batching", another member of oneof '
        '"scheduling_choice".',
        id="two-oneof-members",
    ),
    pytest.param(
        'input { data_type: "TYPE_FP32" }',
        'Enum type "inference.DataType" has no value named "TYPE_FP32".',
        1, 20,
        'Expected integer or identifier, got: "TYPE_FP32"',
        id="quoted-enum",
    ),
    pytest.param(
        "4: 5",
        'Message type "inference.ModelConfig" has no field named "4".',
        1, 1,
        "Expected identifier, got: 4",
        id="number-as-field-name",
    ),
    pytest.param(
        "input { dims: [1, 2 3] }",
        'Expected ",".',
        1, 21,
        'Expected ",", found "3".',
        id="list-without-comma",
    ),
    pytest.param(
        "sequence_batching { control_input { control { fp32_false_true: [0, Maybe] } } }",
        "Couldn't parse float: Maybe",
        1, 68,
        "Expected double, got: maybe",
        id="bare-word-for-float",
    ),
]


def _python_message(text: str) -> str:
    with pytest.raises(text_format.ParseError) as info:
        text_format.Parse(text, ModelConfig())
    return str(info.value)


@pytest.mark.parametrize(("text", "python", "line", "column", "cpp"), TRANSLATED)
def test_parse_errors_read_as_cpp_protobuf_words_them(text: str, python: str, line: int, column: int, cpp: str) -> None:
    # The Python wording this row translates is what the installed protobuf really says.
    assert _python_message(text).endswith(python)
    with pytest.raises(ConfigError) as info:
        parse_config_text(text, SOURCE)
    err = info.value
    assert (err.source, err.line, err.column, err.field) == (SOURCE, line, column, None)
    assert err.message == cpp
    assert err.parse_error is True
    assert str(err) == f"{PREFIX}{line}:{column}: {cpp}"
    assert isinstance(err, ValueError)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # Python's tokenizer puts "'<the line>': " before its messages: that goes, the rest stays.
        ('name: "abc', "String missing ending quote: '\"abc'"),
        # C++ reads "- 4" as -4: no C++ message to give, so Python's stays.
        ("max_batch_size: - 4", "Couldn't parse integer: -"),
        # "4abc" draws an error from C++'s tokenizer itself: not one of these translations.
        ("max_batch_size: 4abc", "Couldn't parse integer: 4abc"),
        ("[foo]: 1", 'Message type "inference.ModelConfig" does not have extensions.'),
    ],
)
def test_messages_without_a_reliable_cpp_form_keep_pythons_words(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config_text(text, SOURCE)
    assert info.value.message == message
    assert str(info.value).startswith(PREFIX)


def test_enum_number_out_of_int32_is_found_and_worded_as_cpp() -> None:
    """upb raises a bare ValueError, without a position, for this one."""
    text = 'name: "m"\ninput { name: "I" data_type: 99999999999 }'
    with pytest.raises(ValueError, match="^Value out of range: 99999999999$"):
        text_format.Parse(text, ModelConfig())
    with pytest.raises(ConfigError) as info:
        parse_config_text(text, SOURCE)
    assert (info.value.line, info.value.column, info.value.message) == (2, 30, "Integer out of range (99999999999)")
    assert str(info.value) == f"{PREFIX}2:30: Integer out of range (99999999999)"


def test_load_config_file_reports_the_file_in_triton_words(tmp_path: Path) -> None:
    path = tmp_path / "add_sub" / "config.pbtxt"
    path.parent.mkdir()
    path.write_text('name: "add_sub"\nbackend: "python"\ninput [\n  {\n    name: "INPUT0"\n'
                    "    data_type: TYPE_FLOAT32\n    dims: [ 4 ]\n  }\n]\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert info.value.source == str(path)
    assert str(info.value) == (
        f"failed to read text proto from {path}: Error parsing text-format inference.ModelConfig: 6:16: "
        'Unknown enumeration value of "TYPE_FLOAT32" for field "data_type".'
    )


def test_errors_that_are_not_parse_errors_keep_their_shape() -> None:
    err = ConfigError(SOURCE, "must specify 'dims'", field="input 'I': dims")
    assert str(err) == "m/config.pbtxt: input 'I': dims: must specify 'dims'"
    assert err.parse_error is False


# ---- property: whatever the text, parse_config_text raises ConfigError or nothing ---------------


def _schema_words() -> list[str]:
    words: set[str] = set()
    pending, seen = [ModelConfig.DESCRIPTOR], set()
    while pending:
        message = pending.pop()
        if message.full_name in seen:
            continue
        seen.add(message.full_name)
        for field in message.fields:
            words.add(field.name)
            if field.message_type is not None:
                pending.append(field.message_type)
            if field.enum_type is not None:
                words.update(value.name for value in field.enum_type.values)
    return sorted(words)


_PIECES = st.one_of(
    st.sampled_from(_schema_words()),
    st.sampled_from(list("{}[]<>:,;-+.#\"'\t\n") + ["true", "maybe", "inf", "0x", "0x1F", "010", "09", "1e", "1_0"]),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True).map(str),
    st.text(max_size=6).map(repr),
    st.text(max_size=4),
)
_TEXTS = st.one_of(st.text(), st.lists(_PIECES, max_size=30).map(" ".join), st.lists(_PIECES, max_size=30).map("".join))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TEXTS)
def test_any_text_parses_or_raises_config_error(text: str) -> None:
    try:
        parse_config_text(text, SOURCE)
    except ConfigError as err:
        assert err.parse_error and err.source == SOURCE
        assert str(err).startswith(PREFIX)
        if err.line is not None:
            assert str(err) == f"{PREFIX}{err.line}:{err.column}: {err.message}"
