"""validate_config on ``model_warmup``: the checks Triton makes when it builds and normalizes the
warmup requests (GenerateWarmupData, InferenceRequest::Normalize), with their texts."""

from __future__ import annotations

import pytest

from stubhost.config import ConfigError, fill_defaults, parse_config_text, validate_config

SOURCE = "/repo/m/config.pbtxt"
IO = """
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "S" data_type: TYPE_STRING dims: [ -1 ] optional: true } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
PY = f'name: "m" backend: "python" max_batch_size: 8 {IO}'
PY0 = f'name: "m" backend: "python" max_batch_size: 0 {IO}'
ID = "[request id: <id_unknown>] "
NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim "
    "in your input dims config, try setting max_batch_size to zero. See the model configuration "
    "docs for more info on max_batch_size."
)


def warmup(*inputs: str, batch_size: int = 1, name: str = "w") -> str:
    entries = " ".join(f"inputs {{ {i} }}" for i in inputs)
    label = f'name: "{name}" ' if name else ""
    return f"model_warmup [ {{ {label}batch_size: {batch_size} {entries} }} ]"


def inp(key: str, value: str) -> str:
    return f'key: "{key}" value: {{ {value} }}'


GOOD_IN = inp("IN", "data_type: TYPE_FP32 dims: [ 4 ] zero_data: true")


def _error(text: str) -> str:
    cfg = parse_config_text(text, SOURCE)
    fill_defaults(cfg, "m")
    with pytest.raises(ConfigError) as info:
        validate_config(cfg, model_dir_name="m", source=SOURCE)
    return str(info.value).removeprefix(f"{SOURCE}: ")


def _valid(text: str) -> None:
    cfg = parse_config_text(text, SOURCE)
    fill_defaults(cfg, "m")
    validate_config(cfg, model_dir_name="m", source=SOURCE)


@pytest.mark.parametrize("base", [PY, PY0])
def test_valid_samples(base: str) -> None:
    _valid(base + warmup(GOOD_IN))
    _valid(base + warmup(GOOD_IN, inp("S", 'data_type: TYPE_STRING dims: [ 2 ] input_data_file: "s.bin"')))
    _valid(base + warmup(inp("IN", "data_type: TYPE_FP32 dims: [ 4 ] random_data: true")))
    # an input the model does not declare is passed along (Triton's override inputs)
    _valid(base + warmup(GOOD_IN, inp("START", "data_type: TYPE_INT32 dims: [ 1 ] zero_data: true")))
    # a file in a subfolder of warmup/
    _valid(base + warmup(inp("IN", 'data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "sub/in.bin"')))


def test_batch_size_is_not_compared_with_max_batch_size() -> None:
    # batch_size is how many requests of batch 1 one warmup execution holds
    _valid(PY + warmup(GOOD_IN, batch_size=64))
    _valid(PY0 + warmup(GOOD_IN, batch_size=3))


def test_inputs_are_counted_as_triton_counts_them() -> None:
    # Triton only compares the number of declared inputs given with the number of required ones:
    # the optional S alone makes one input, as many as the one required, so it passes (and the
    # model gets a request without IN).
    _valid(PY + warmup(inp("S", "data_type: TYPE_STRING dims: [ 1 ] zero_data: true")))


def test_a_sample_of_batch_size_0_is_skipped_unchecked() -> None:
    _valid(PY + warmup(inp("IN", "dims: [ -1 ]"), batch_size=0))


CASES = {
    "variable_dims": (
        PY + warmup(inp("IN", "data_type: TYPE_FP32 dims: [ -1 ] zero_data: true")),
        "model_warmup 'w': inputs 'IN': dims: warmup setting expects all variable-size dimensions are "
        "specified for input 'IN'",
    ),
    "negative_dims": (
        PY + warmup(inp("IN", "data_type: TYPE_FP32 dims: [ -3 ] zero_data: true")),
        "model_warmup 'w': inputs 'IN': dims: warmup setting has invalid dimension -3 for input 'IN'; "
        "dimensions must be >= 0",
    ),
    "no_input_data_type": (
        PY + warmup(inp("IN", "data_type: TYPE_FP32 dims: [ 4 ]")),
        f"model_warmup 'w': inputs 'IN': {ID}warmup setting expects input 'IN' to have input_data_type set",
    ),
    "file_outside_the_warmup_folder": (
        PY + warmup(inp("IN", 'data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "../config.pbtxt"')),
        "model_warmup 'w': inputs 'IN': input_data_file: '../config.pbtxt' is not a file inside the warmup "
        "folder of m: input_data_file must be a relative path without '..'",
    ),
    "absolute_file": (
        PY + warmup(inp("IN", 'data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "/etc/passwd"')),
        "model_warmup 'w': inputs 'IN': input_data_file: '/etc/passwd' is not a file inside the warmup "
        "folder of m: input_data_file must be a relative path without '..'",
    ),
    "missing_data_type": (
        PY + warmup(inp("IN", "dims: [ 4 ] zero_data: true")),
        f"model_warmup 'w': inputs 'IN': data_type: {ID}inference input 'IN' data-type is '<invalid>', but "
        "model 'm' expects 'FP32'",
    ),
    "wrong_data_type": (
        PY + warmup(inp("IN", "data_type: TYPE_INT32 dims: [ 4 ] zero_data: true")),
        f"model_warmup 'w': inputs 'IN': data_type: {ID}inference input 'IN' data-type is 'INT32', but "
        "model 'm' expects 'FP32'",
    ),
    "string_data_type_name": (
        PY + warmup(GOOD_IN, inp("S", "data_type: TYPE_INT8 dims: [ 2 ] zero_data: true")),
        f"model_warmup 'w': inputs 'S': data_type: {ID}inference input 'S' data-type is 'INT8', but "
        "model 'm' expects 'BYTES'",
    ),
    "missing_dims_batching": (
        PY + warmup(inp("IN", "data_type: TYPE_FP32 zero_data: true")),
        f"model_warmup 'w': inputs 'IN': dims: {ID}unexpected shape for input 'IN' for model 'm'. "
        f"Expected [-1,4], got [1]. {NOTE}",
    ),
    "wrong_dims_not_batching": (
        PY0 + warmup(inp("IN", "data_type: TYPE_FP32 dims: [ 1, 4 ] zero_data: true")),
        f"model_warmup 'w': inputs 'IN': dims: {ID}unexpected shape for input 'IN' for model 'm'. "
        "Expected [4], got [1,4]. ",
    ),
    "no_declared_input_at_all": (
        PY + warmup(inp("X", "data_type: TYPE_INT32 dims: [ 1 ] zero_data: true"), name=""),
        f"model_warmup[0]: inputs: {ID}expected number of inputs between 1 and 2 but got 0 inputs for "
        "model 'm'. Got input(s) [], but missing required input(s) ['IN']. Please provide all "
        "required input(s).",
    ),
    "extra_input_without_data_type": (
        PY + warmup(GOOD_IN, inp("START", "dims: [ 1 ] zero_data: true")),
        "model_warmup 'w': inputs 'START': data_type: warmup setting expects input 'START' to specify "
        "'data_type'",
    ),
    "extra_input_without_dims": (
        PY + warmup(GOOD_IN, inp("START", "data_type: TYPE_INT32 zero_data: true")),
        "model_warmup 'w': inputs 'START': dims: warmup setting expects input 'START' to specify 'dims'",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_rule_fires_with_its_message(case: str) -> None:
    text, expected = CASES[case]
    assert _error(text) == expected


def test_all_required_inputs_message_without_optional_inputs() -> None:
    io = """input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] },
                    { name: "B" data_type: TYPE_FP32 dims: [ 1 ] } ]
            output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]"""
    text = f'name: "m" backend: "python" {io}' + warmup(inp("B", "data_type: TYPE_FP32 dims: [ 1 ] zero_data: true"))
    assert _error(text) == (
        f"model_warmup 'w': inputs: {ID}expected 2 inputs but got 1 inputs for model 'm'. Got input(s) "
        "['B'], but missing required input(s) ['A']. Please provide all required input(s)."
    )


def test_variable_dims_are_reported_before_anything_else() -> None:
    # Triton's first pass sizes every input before it looks at how each one's data is made
    text = PY + warmup(inp("A", "data_type: TYPE_FP32 dims: [ 1 ]"), inp("IN", "data_type: TYPE_FP32 dims: [ -1 ]"))
    assert "all variable-size dimensions are specified for input 'IN'" in _error(text)


def test_ensemble_warmup_keeps_its_own_message() -> None:
    ens = f"""name: "m" platform: "ensemble" max_batch_size: 8 {IO}
    ensemble_scheduling {{ step [ {{ model_name: "a" input_map {{ key: "x" value: "IN" }}
                                     output_map {{ key: "y" value: "OUT" }} }} ] }}"""
    assert _error(ens + warmup(GOOD_IN)) == "model_warmup: model_warmup can not be specified for ensemble 'm'"
