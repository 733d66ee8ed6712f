"""Data-type names: the model config's ``TYPE_*`` enum names and the KServe v2 / Triton names.

The two differ only by the ``TYPE_`` prefix, except that ``TYPE_STRING`` is ``BYTES`` on the wire.
"""

from __future__ import annotations

from stubhost.config.model_config_pb2 import DataType


def _wire_name(config_name: str) -> str:
    return "BYTES" if config_name == "TYPE_STRING" else config_name.removeprefix("TYPE_")


_CONFIG_TO_TRITON: dict[str, str] = {
    name: _wire_name(name) for name in DataType.keys() if name != "TYPE_INVALID"
}
_TRITON_TO_CONFIG: dict[str, str] = {wire: name for name, wire in _CONFIG_TO_TRITON.items()}


def config_dtype_to_triton(name: str) -> str:
    """``"TYPE_FP32"`` -> ``"FP32"``, ``"TYPE_STRING"`` -> ``"BYTES"``. Raises ValueError for
    ``TYPE_INVALID`` and for names that are not config data types."""
    try:
        return _CONFIG_TO_TRITON[name]
    except KeyError:
        raise ValueError(f"unknown model configuration data type '{name}'") from None


def triton_to_config_dtype(name: str) -> str:
    """``"FP32"`` -> ``"TYPE_FP32"``, ``"BYTES"`` -> ``"TYPE_STRING"``. Raises ValueError for names
    that are not Triton data types."""
    try:
        return _TRITON_TO_CONFIG[name]
    except KeyError:
        raise ValueError(f"unknown Triton data type '{name}'") from None
