"""fill_defaults: what a config.pbtxt may leave out is filled the way Triton fills it."""

from __future__ import annotations

from stubhost.config import fill_defaults, parse_config_text
from stubhost.config.model_config_pb2 import ModelConfig, ModelInstanceGroup

CPU, GPU, AUTO, MODEL = (
    ModelInstanceGroup.KIND_CPU,
    ModelInstanceGroup.KIND_GPU,
    ModelInstanceGroup.KIND_AUTO,
    ModelInstanceGroup.KIND_MODEL,
)


def _filled(text: str, folder: str = "m", gpus: tuple[int, ...] = ()) -> ModelConfig:
    cfg = parse_config_text(text, "m/config.pbtxt")
    fill_defaults(cfg, folder, available_gpus=gpus)
    return cfg


def _groups(cfg: ModelConfig) -> list[tuple[str, int, int, list[int]]]:
    return [(g.name, g.kind, g.count, list(g.gpus)) for g in cfg.instance_group]


def test_empty_config_gets_name_backend_file_policy_and_one_cpu_group() -> None:
    cfg = _filled("", folder="add_sub")
    assert cfg.name == "add_sub"
    assert cfg.backend == "python"
    assert cfg.default_model_filename == "model.py"
    assert cfg.version_policy.WhichOneof("policy_choice") == "latest"
    assert cfg.version_policy.latest.num_versions == 1
    # Triton names the group it adds after the model itself.
    assert _groups(cfg) == [("add_sub", CPU, 1, [])]
    assert cfg.optimization.input_pinned_memory.enable is True
    assert cfg.optimization.output_pinned_memory.enable is True


def test_given_values_are_kept() -> None:
    cfg = _filled(
        'name: "other" default_model_filename: "main.py" version_policy { all { } } '
        "optimization { input_pinned_memory { enable: false } }"
    )
    assert cfg.name == "other"  # validate_config reports the mismatch; filling never hides it
    assert cfg.default_model_filename == "main.py"
    assert cfg.version_policy.WhichOneof("policy_choice") == "all"
    assert cfg.optimization.input_pinned_memory.enable is False
    assert cfg.optimization.output_pinned_memory.enable is True


def test_unnamed_groups_are_numbered_and_counts_default_to_one() -> None:
    cfg = _filled('instance_group [ { kind: KIND_CPU }, { name: "keep" kind: KIND_MODEL count: 3 }, { kind: KIND_CPU count: -2 } ]')
    assert _groups(cfg) == [("m_0", CPU, 1, []), ("keep", MODEL, 3, []), ("m_2", CPU, 1, [])]


def test_auto_kind_resolves_against_available_gpus() -> None:
    text = "instance_group [ { kind: KIND_AUTO }, { kind: KIND_AUTO gpus: [ 1 ] }, { kind: KIND_AUTO gpus: [ 5 ] } ]"
    assert _groups(_filled(text)) == [("m_0", CPU, 1, []), ("m_1", CPU, 1, [1]), ("m_2", CPU, 1, [5])]
    assert _groups(_filled(text, gpus=(0, 1))) == [
        ("m_0", GPU, 1, [0, 1]),
        ("m_1", GPU, 1, [1]),
        ("m_2", CPU, 1, [5]),
    ]


def test_default_group_uses_gpus_when_there_are_some() -> None:
    assert _groups(_filled("", gpus=(1, 0))) == [("m", GPU, 1, [0, 1])]


def test_gpu_group_without_gpus_gets_every_available_gpu() -> None:
    assert _groups(_filled("instance_group [ { kind: KIND_GPU count: 2 } ]", gpus=(0, 2))) == [
        ("m_0", GPU, 2, [0, 2])
    ]
    assert _groups(_filled("instance_group [ { kind: KIND_GPU } ]")) == [("m_0", GPU, 1, [])]


def test_preferred_batch_sizes_default_to_max_batch_size() -> None:
    cfg = _filled("max_batch_size: 8 dynamic_batching { }")
    assert list(cfg.dynamic_batching.preferred_batch_size) == [8]
    cfg = _filled("max_batch_size: 0 dynamic_batching { }")
    assert list(cfg.dynamic_batching.preferred_batch_size) == []
    cfg = _filled("max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 2 ] }")
    assert list(cfg.dynamic_batching.preferred_batch_size) == [2]
    cfg = _filled("max_batch_size: 4 sequence_batching { oldest { } }")
    assert list(cfg.sequence_batching.oldest.preferred_batch_size) == [4]


def test_sequence_idle_time_defaults_to_one_second() -> None:
    assert _filled("sequence_batching { }").sequence_batching.max_sequence_idle_microseconds == 1_000_000
    cfg = _filled("sequence_batching { max_sequence_idle_microseconds: 7 }")
    assert cfg.sequence_batching.max_sequence_idle_microseconds == 7


def test_ensembles_get_no_instance_groups_optimization_or_backend() -> None:
    cfg = _filled('platform: "ensemble" ensemble_scheduling { step [ { model_name: "a" } ] }')
    assert cfg.backend == ""
    assert cfg.default_model_filename == ""
    assert list(cfg.instance_group) == []
    assert not cfg.HasField("optimization")


def test_a_foreign_platform_gets_no_python_backend() -> None:
    cfg = _filled('platform: "onnxruntime_onnx"')
    assert cfg.backend == ""
    assert cfg.default_model_filename == ""


def test_filling_twice_changes_nothing() -> None:
    cfg = _filled("max_batch_size: 4 dynamic_batching { } instance_group [ { kind: KIND_AUTO } ]", gpus=(0,))
    again = ModelConfig()
    again.CopyFrom(cfg)
    fill_defaults(again, "m", available_gpus=(0,))
    assert again == cfg
