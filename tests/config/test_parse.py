"""config.pbtxt parsing: real-world files parse, every schema section is understood, and a bad
file fails with the file, line and column in the message."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from google.protobuf import text_format

from stubhost.config import ConfigError, load_config_file, parse_config_text
from stubhost.config.model_config_pb2 import DataType, ModelConfig, ModelInstanceGroup, ModelQueuePolicy
from tests.config import samples

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "models"


@pytest.mark.parametrize("name", sorted(samples.ALL))
def test_real_world_configs_parse(name: str) -> None:
    text, _ = samples.ALL[name]
    cfg = parse_config_text(text, f"{name}/config.pbtxt")
    assert cfg.name
    # Text format round trip: what we print, we read back identically.
    assert parse_config_text(text_format.MessageToString(cfg), "printed") == cfg


def test_add_sub_fields_are_read() -> None:
    cfg = parse_config_text(samples.ADD_SUB, "add_sub/config.pbtxt")
    assert cfg.name == "add_sub"
    assert cfg.backend == "python"
    assert cfg.max_batch_size == 0
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [
        ("INPUT0", DataType.TYPE_FP32, [4]),
        ("INPUT1", DataType.TYPE_FP32, [4]),
    ]
    assert [o.name for o in cfg.output] == ["OUTPUT0", "OUTPUT1"]
    assert len(cfg.instance_group) == 1
    assert cfg.instance_group[0].kind == ModelInstanceGroup.KIND_CPU
    assert cfg.instance_group[0].count == 0  # omitted: filled to 1 by fill_defaults


def test_dynamic_batching_queue_policies_are_read() -> None:
    cfg = parse_config_text(samples.DYNAMIC_BATCHING, "batched/config.pbtxt")
    batching = cfg.dynamic_batching
    assert list(batching.preferred_batch_size) == [4, 8]
    assert batching.max_queue_delay_microseconds == 100
    assert batching.default_queue_policy.default_timeout_microseconds == 5_000_000
    assert batching.default_queue_policy.allow_timeout_override is True
    assert dict(batching.priority_queue_policy).keys() == {2}
    assert batching.priority_queue_policy[2].timeout_action == ModelQueuePolicy.DELAY
    assert cfg.input[0].allow_ragged_batch is True


def test_sequence_batching_controls_and_state_are_read() -> None:
    cfg = parse_config_text(samples.SEQUENCE_BATCHING, "accumulate/config.pbtxt")
    sequence = cfg.sequence_batching
    assert sequence.WhichOneof("strategy_choice") == "oldest"
    assert sequence.oldest.max_candidate_sequences == 4
    controls = {ci.name: ci.control[0] for ci in sequence.control_input}
    assert list(controls["START"].fp32_false_true) == [0.0, 1.0]
    assert list(controls["END"].int32_false_true) == [0, 1]
    assert list(controls["READY"].bool_false_true) == [False, True]
    assert controls["CORRID"].data_type == DataType.TYPE_UINT64
    state = sequence.state[0]
    assert (state.input_name, state.output_name, list(state.dims)) == ("INPUT_STATE", "OUTPUT_STATE", [1])
    assert state.initial_state[0].WhichOneof("state_data") == "zero_data"


def test_ensemble_steps_are_read() -> None:
    cfg = parse_config_text(samples.ENSEMBLE, "pipeline/config.pbtxt")
    steps = cfg.ensemble_scheduling.step
    assert [(s.model_name, s.model_version) for s in steps] == [("preprocess", -1), ("classifier", 3)]
    assert dict(steps[0].input_map) == {"INPUT_0": "IMAGE"}
    assert dict(steps[1].output_map) == {"output": "SCORES"}


def test_parameters_map_accepts_both_text_forms() -> None:
    cfg = parse_config_text(samples.GPU_GROUPS_AND_PARAMETERS, "on_gpus/config.pbtxt")
    assert {k: v.string_value for k, v in cfg.parameters.items()} == {
        "EXECUTION_ENV_PATH": "$$TRITON_MODEL_DIRECTORY/env.tar.gz",
        "tokenizer": "bert-base-uncased",
        "max_length": "128",
    }
    assert [(g.name, list(g.gpus), g.count) for g in cfg.instance_group] == [
        ("gpu_group", [0, 1], 2),
        ("", [], 1),
    ]


def test_decoupled_accepts_capitalised_true() -> None:
    cfg = parse_config_text(samples.DECOUPLED, "repeat_int32/config.pbtxt")
    assert cfg.model_transaction_policy.decoupled is True


def test_project_examples_parse() -> None:
    files = sorted(EXAMPLES.glob("*/config.pbtxt"))
    assert len(files) >= 4, f"examples/models should hold the example configs, found {files}"
    for path in files:
        assert load_config_file(path).name == path.parent.name


@pytest.mark.parametrize(
    ("text", "position", "message"),
    [
        (
            'name: "a"\n  bogus_field: 3\n',
            "2:3",
            'Message type "inference.ModelConfig" has no field named "bogus_field".',
        ),
        ('name: "a"\nname: "b"', "2:7", 'Non-repeated field "name" is specified multiple times.'),
        ('name: "a" input [ { name: "I" ', "1:27", "Expected identifier, got: "),
        (
            'name: "a"\ninput [ { name: "I" data_type: TYPE_FLOAT32 } ]',
            "2:32",
            'Unknown enumeration value of "TYPE_FLOAT32" for field "data_type".',
        ),
        ("max_batch_size: 99999999999", "1:17", "Integer out of range (99999999999)"),
    ],
)
def test_parse_errors_name_file_line_and_column(text: str, position: str, message: str) -> None:
    """Worded as Triton and C++ protobuf word them (tests/config/test_parse_errors.py has the rest)."""
    with pytest.raises(ConfigError) as info:
        parse_config_text(text, "m/config.pbtxt")
    assert str(info.value) == (
        f"failed to read text proto from m/config.pbtxt: Error parsing text-format inference.ModelConfig: "
        f"{position}: {message}"
    )
    assert info.value.source == "m/config.pbtxt"
    assert info.value.message == message
    assert (info.value.line, info.value.column) == tuple(int(x) for x in position.split(":"))
    assert isinstance(info.value, ValueError)


def test_load_config_file_reads_utf8(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "m"\nparameters { key: "greeting" value { string_value: "grüß dich" } }\n', encoding="utf-8")
    assert load_config_file(path).parameters["greeting"].string_value == "grüß dich"
    assert load_config_file(str(path)).name == "m"


def test_load_config_file_missing_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "nope" / "config.pbtxt"
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert str(info.value) == f"{path}: unable to read model configuration: No such file or directory"


def test_load_config_file_rejects_non_utf8(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_bytes(b'name: "\xff"\n')
    with pytest.raises(ConfigError, match=r"unable to read model configuration: 'utf-8' codec can't decode"):
        load_config_file(path)


def test_schema_coexists_with_another_inference_model_config_in_the_default_pool() -> None:
    """tritonclient registers its own `inference.ModelConfig` in protobuf's default pool; ours
    lives in a private pool, so a process can import both (in either order)."""
    script = textwrap.dedent(
        """
        from google.protobuf import descriptor_pb2, descriptor_pool
        other = descriptor_pb2.FileDescriptorProto(name="model_config.proto", package="inference")
        other.message_type.add(name="ModelConfig").field.add(
            name="name", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
            label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
        descriptor_pool.Default().Add(other)
        from stubhost.config import parse_config_text
        print(parse_config_text('name: "x" max_batch_size: 2', "s").max_batch_size)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=dict(os.environ)
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2"


def test_generated_module_matches_the_proto_file() -> None:
    """The committed model_config_pb2 must come from the committed .proto (run
    scripts/gen_protos.sh after editing it): every message and field of the source is there."""
    proto = (Path(__file__).resolve().parents[2] / "src/stubhost/config/model_config.proto").read_text()
    declared = set()
    for line in proto.splitlines():
        stripped = line.split("//")[0].strip()
        if stripped.endswith(";") and "=" in stripped and not stripped.startswith(("syntax", "package")):
            name = stripped.split("=")[0].split()[-1]
            declared.add(name)
    generated = set()

    def walk(descriptor) -> None:  # type: ignore[no-untyped-def]
        generated.update(f.name for f in descriptor.fields)
        for enum in descriptor.enum_types:
            generated.update(v.name for v in enum.values)
        for nested in descriptor.nested_types:
            if not nested.GetOptions().map_entry:
                walk(nested)

    file = ModelConfig.DESCRIPTOR.file
    for message in file.message_types_by_name.values():
        walk(message)
    for enum in file.enum_types_by_name.values():
        generated.update(v.name for v in enum.values)
    assert declared == generated
