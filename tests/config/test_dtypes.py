"""Data-type names: config enum names <-> Triton / KServe v2 names."""

from __future__ import annotations

import pytest

from stubhost.config import config_dtype_to_triton, triton_to_config_dtype
from stubhost.config.model_config_pb2 import DataType

PAIRS = [
    ("TYPE_BOOL", "BOOL"),
    ("TYPE_UINT8", "UINT8"),
    ("TYPE_UINT16", "UINT16"),
    ("TYPE_UINT32", "UINT32"),
    ("TYPE_UINT64", "UINT64"),
    ("TYPE_INT8", "INT8"),
    ("TYPE_INT16", "INT16"),
    ("TYPE_INT32", "INT32"),
    ("TYPE_INT64", "INT64"),
    ("TYPE_FP16", "FP16"),
    ("TYPE_FP32", "FP32"),
    ("TYPE_FP64", "FP64"),
    ("TYPE_STRING", "BYTES"),
    ("TYPE_BF16", "BF16"),
]


@pytest.mark.parametrize(("config", "triton"), PAIRS)
def test_dtype_names_map_both_ways(config: str, triton: str) -> None:
    assert config_dtype_to_triton(config) == triton
    assert triton_to_config_dtype(triton) == config


def test_every_valid_enum_value_is_mapped() -> None:
    assert sorted(c for c, _ in PAIRS) == sorted(n for n in DataType.keys() if n != "TYPE_INVALID")


@pytest.mark.parametrize("name", ["TYPE_INVALID", "FP32", "TYPE_FLOAT", ""])
def test_unknown_config_dtype_raises(name: str) -> None:
    with pytest.raises(ValueError, match=f"^unknown model configuration data type '{name}'$"):
        config_dtype_to_triton(name)


@pytest.mark.parametrize("name", ["STRING", "TYPE_FP32", "INVALID", "fp32"])
def test_unknown_triton_dtype_raises(name: str) -> None:
    with pytest.raises(ValueError, match=f"^unknown Triton data type '{name}'$"):
        triton_to_config_dtype(name)
