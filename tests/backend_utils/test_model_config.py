"""pb_utils.ModelConfig, the object auto_complete_config works on: Triton's behaviour and
messages for every setter, plus stubhost's extra tensor properties."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stubhost.backend_utils.model_config import ModelConfig
from stubhost.config import config_from_dict, config_to_dict, fill_defaults, parse_config_text, validate_config


def _config(text: str = "", folder: str = "m") -> ModelConfig:
    """The object a model receives: the filled config in its Triton JSON form."""
    cfg = parse_config_text(text, f"{folder}/config.pbtxt")
    fill_defaults(cfg, folder)
    return ModelConfig(json.dumps(config_to_dict(cfg)))


def test_built_from_json_and_as_dict_is_the_live_dict() -> None:
    mc = ModelConfig('{"name": "m", "max_batch_size": 0, "input": [], "output": []}')
    d = mc.as_dict()
    assert d == {"name": "m", "max_batch_size": 0, "input": [], "output": []}
    mc.set_max_batch_size(4)
    assert d["max_batch_size"] == 4 and mc.as_dict() is d


def test_a_model_can_build_its_whole_config() -> None:
    mc = _config("")
    mc.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
    mc.add_input({"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4], "optional": True})
    mc.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
    mc.set_max_batch_size(8)
    mc.set_dynamic_batching()
    mc.set_model_transaction_policy({"decoupled": True})
    cfg = config_from_dict(mc.as_dict(), "auto-complete")
    fill_defaults(cfg, "m")
    validate_config(cfg, model_dir_name="m", source="auto-complete")
    assert [(i.name, list(i.dims), i.optional) for i in cfg.input] == [("INPUT0", [4], False), ("INPUT1", [4], True)]
    assert cfg.max_batch_size == 8
    assert list(cfg.dynamic_batching.preferred_batch_size) == [8]
    assert cfg.model_transaction_policy.decoupled is True


# ---- set_max_batch_size ---------------------------------------------------------------------------

def test_max_batch_size_may_be_raised_from_the_configured_value() -> None:
    mc = _config("max_batch_size: 4")
    mc.set_max_batch_size(4)
    mc.set_max_batch_size(16)
    assert mc.as_dict()["max_batch_size"] == 16


def test_max_batch_size_below_the_configured_value_is_refused() -> None:
    mc = _config("max_batch_size: 8")
    with pytest.raises(ValueError) as info:
        mc.set_max_batch_size(4)
    assert str(info.value) == (
        "configuration specified max_batch_size 8, but in auto-complete-config function for model "
        "'m' specified max_batch_size 4"
    )
    assert mc.as_dict()["max_batch_size"] == 8


# ---- set_dynamic_batching -------------------------------------------------------------------------

def test_set_dynamic_batching_adds_an_empty_section_once() -> None:
    mc = _config("max_batch_size: 2")
    mc.set_dynamic_batching()
    assert mc.as_dict()["dynamic_batching"] == {}
    mc.as_dict()["dynamic_batching"]["max_queue_delay_microseconds"] = 5
    mc.set_dynamic_batching()
    assert mc.as_dict()["dynamic_batching"] == {"max_queue_delay_microseconds": 5}


@pytest.mark.parametrize("scheduler", ["sequence_batching", "ensemble_scheduling"])
def test_set_dynamic_batching_refuses_another_scheduler(scheduler: str) -> None:
    mc = ModelConfig(json.dumps({"name": "m", scheduler: {}}))
    with pytest.raises(ValueError) as info:
        mc.set_dynamic_batching()
    assert str(info.value) == (
        f"Configuration specified scheduling_choice as '{scheduler}', but auto-complete-config "
        "function for model 'm' tries to set scheduling_choice as 'dynamic_batching'"
    )


# ---- add_input / add_output -----------------------------------------------------------------------

@pytest.mark.parametrize(
    ("method", "tensor", "expected"),
    [
        (
            "add_input",
            {"data_type": "TYPE_FP32", "dims": [1]},
            "input in auto-complete-config function for model 'm' is missing 'name' property.",
        ),
        (
            "add_input",
            {"name": "I", "dims": [1]},
            "input 'I' in auto-complete-config function for model 'm' is missing 'data_type' property.",
        ),
        (
            "add_output",
            {"name": "O", "data_type": "TYPE_FP32"},
            "output 'O' in auto-complete-config function for model 'm' is missing 'dims' property.",
        ),
        (
            "add_input",
            {"name": "I", "data_type": "TYPE_FP32", "dims": [1], "label_filename": "x"},
            "input 'I' in auto-complete-config function for model 'm' contains property other than "
            "'name', 'data_type', 'dims', 'optional', 'format', 'reshape', 'is_shape_tensor' and "
            "'allow_ragged_batch'.",
        ),
        (
            "add_output",
            {"name": "O", "data_type": "TYPE_FP32", "dims": [1], "optional": True},
            "output 'O' in auto-complete-config function for model 'm' contains property other than "
            "'name', 'data_type', 'dims', 'reshape' and 'is_shape_tensor'.",
        ),
    ],
)
def test_tensor_properties_are_checked(method: str, tensor: dict[str, Any], expected: str) -> None:
    mc = _config()
    with pytest.raises(ValueError) as info:
        getattr(mc, method)(tensor)
    assert str(info.value) == expected
    assert mc.as_dict()["input"] == [] and mc.as_dict()["output"] == []


def test_new_tensors_are_appended_with_their_extra_properties() -> None:
    mc = _config("max_batch_size: 4")
    mc.add_input(
        {
            "name": "X",
            "data_type": "TYPE_FP32",
            "dims": (1,),
            "reshape": {"shape": []},
            "allow_ragged_batch": True,
            "format": "FORMAT_NONE",
        }
    )
    mc.add_output({"name": "Y", "data_type": "TYPE_STRING", "dims": [-1]})
    assert mc.as_dict()["input"] == [
        {
            "name": "X",
            "data_type": "TYPE_FP32",
            "dims": [1],
            "reshape": {"shape": []},
            "allow_ragged_batch": True,
            "format": "FORMAT_NONE",
        }
    ]
    cfg = config_from_dict(mc.as_dict(), "auto")
    assert list(cfg.input[0].reshape.shape) == [] and cfg.input[0].HasField("reshape")
    assert cfg.output[0].data_type == 13  # TYPE_STRING


CONFIGURED = 'input [ { name: "I" data_type: TYPE_FP32 dims: [ 4 ] } ] output [ { name: "O" data_type: TYPE_INT32 dims: [ 2 ] } ]'


def test_a_configured_tensor_is_completed_not_duplicated() -> None:
    mc = _config('input [ { name: "I" } ] output [ { name: "O" dims: [ 2 ] } ]')
    mc.add_input({"name": "I", "data_type": "TYPE_FP32", "dims": [4], "is_shape_tensor": False})
    mc.add_output({"name": "O", "data_type": "TYPE_INT32", "dims": [2]})
    (i,) = mc.as_dict()["input"]
    (o,) = mc.as_dict()["output"]
    assert (i["name"], i["data_type"], i["dims"]) == ("I", "TYPE_FP32", [4])
    assert (o["name"], o["data_type"], o["dims"]) == ("O", "TYPE_INT32", [2])


def test_a_configured_tensor_with_another_data_type_is_refused() -> None:
    mc = _config(CONFIGURED)
    with pytest.raises(ValueError) as info:
        mc.add_input({"name": "I", "data_type": "TYPE_FP64", "dims": [4]})
    assert str(info.value) == (
        "unable to load model 'm', configuration expects datatype TYPE_FP32 for input 'I', model provides TYPE_FP64"
    )
    with pytest.raises(ValueError) as info:
        mc.add_output({"name": "O", "data_type": "TYPE_FP64", "dims": [2]})
    assert str(info.value) == (
        "unable to load model 'm', configuration expects datatype TYPE_INT32 for output 'O', model provides TYPE_FP64"
    )


def test_a_configured_tensor_with_other_dims_is_refused() -> None:
    mc = _config(CONFIGURED)
    with pytest.raises(ValueError) as info:
        mc.add_input({"name": "I", "data_type": "TYPE_FP32", "dims": [4, 1]})
    assert str(info.value) == (
        "model 'm', tensor 'I': the model expects dims [4, 1] but the model configuration specifies dims [4]"
    )


def test_optional_is_compared_whenever_both_sides_give_it_like_triton() -> None:
    # The configuration JSON always carries "optional" (false unless set), so a model that
    # declares an input optional must say so in config.pbtxt too, as with Triton.
    mc = _config(CONFIGURED)
    with pytest.raises(ValueError) as info:
        mc.add_input({"name": "I", "data_type": "TYPE_FP32", "dims": [4], "optional": True})
    assert str(info.value) == (
        "model 'm', tensor 'I': the model expects optional True but the model configuration specifies optional False"
    )
    mc.add_input({"name": "I", "data_type": "TYPE_FP32", "dims": [4], "optional": False})


def test_extra_properties_conflict_only_when_the_file_set_them() -> None:
    mc = _config('max_batch_size: 2 input [ { name: "I" data_type: TYPE_FP32 dims: [ 4 ] allow_ragged_batch: true } ]')
    mc.add_input({"name": "I", "data_type": "TYPE_FP32", "dims": [4], "format": "FORMAT_NHWC"})
    assert mc.as_dict()["input"][0]["format"] == "FORMAT_NHWC"  # the file left it at its default
    with pytest.raises(ValueError) as info:
        mc.add_input({"name": "I", "data_type": "TYPE_FP32", "dims": [4], "allow_ragged_batch": False})
    assert str(info.value) == (
        "model 'm', tensor 'I': the model expects allow_ragged_batch False but the model "
        "configuration specifies allow_ragged_batch True"
    )


# ---- set_model_transaction_policy -----------------------------------------------------------------

def test_transaction_policy_sets_decoupled() -> None:
    mc = ModelConfig('{"name": "m"}')
    mc.set_model_transaction_policy({"decoupled": True})
    assert mc.as_dict()["model_transaction_policy"] == {"decoupled": True}
    mc.set_model_transaction_policy({"decoupled": True})


def test_transaction_policy_refuses_other_properties() -> None:
    with pytest.raises(ValueError) as info:
        _config().set_model_transaction_policy({"decoupled": True, "ordered": True})
    assert str(info.value) == (
        "model transaction property in auto-complete-config function for model 'm' contains "
        "property other than 'decoupled'."
    )


def test_transaction_policy_refuses_to_flip_a_configured_value() -> None:
    mc = _config("")  # the JSON form carries no model_transaction_policy unless the file has one
    mc.set_model_transaction_policy({"decoupled": True})
    mc = _config("model_transaction_policy { decoupled: false }")
    with pytest.raises(ValueError) as info:
        mc.set_model_transaction_policy({"decoupled": True})
    assert str(info.value) == (
        "trying to change decoupled property in auto-complete-config for model 'm', which is already set to 'False'."
    )
