"""``pb_utils.ModelConfig``: what a model's ``auto_complete_config`` receives and returns.

The stub builds one from the model configuration JSON (the Triton JSON form, see
``stubhost.config.config_to_dict``), hands it to ``TritonPythonModel.auto_complete_config``, and
sends ``as_dict()`` of the returned object back to the parent, which parses and validates it::

    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

Behaviour and error messages follow Triton's Python backend (``triton_python_backend_utils.py``),
with one extension: besides Triton's ``name``, ``data_type``, ``dims`` and (inputs) ``optional``,
a tensor may carry ``format``, ``reshape``, ``is_shape_tensor`` and ``allow_ragged_batch``
(inputs) or ``reshape`` and ``is_shape_tensor`` (outputs); they are merged like ``optional``.
"""

from __future__ import annotations

import json
from typing import Any

_REQUIRED = ("name", "data_type", "dims")
# Triton's own optional property, then stubhost's extensions, with the value each has when unset.
_INPUT_EXTRAS: dict[str, Any] = {
    "optional": False,
    "format": "FORMAT_NONE",
    "reshape": None,
    "is_shape_tensor": False,
    "allow_ragged_batch": False,
}
_OUTPUT_EXTRAS: dict[str, Any] = {"reshape": None, "is_shape_tensor": False}


class ModelConfig:
    """A model configuration being completed by the model itself.

    Only ``max_batch_size``, the inputs and outputs, ``dynamic_batching`` and
    ``model_transaction_policy`` can be changed, and only in ways that agree with what the
    configuration file already says: each setter raises ValueError, in Triton's words, on a
    conflict.
    """

    def __init__(self, model_config: str | bytes) -> None:
        self._model_config: dict[str, Any] = json.loads(model_config)

    def as_dict(self) -> dict[str, Any]:
        """The configuration as a dict (the object itself; treat it as read-only)."""
        return self._model_config

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Sets ``max_batch_size``. Raises ValueError if the configuration already asks for a
        larger value (a file may cap the batch size the model supports, never raise it)."""
        configured = self._model_config.get("max_batch_size", 0)
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in "
                f"auto-complete-config function for model '{self._name}' specified "
                f"max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Makes the dynamic batcher the scheduler (no change if it already is). Raises ValueError
        if the configuration already chose ``sequence_batching`` or ``ensemble_scheduling``."""
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's parameter name
        """Declares an input (``name``, ``data_type``, ``dims`` required). If the configuration
        already has an input of that name, the two must agree: a data type other than
        ``TYPE_INVALID``, non-empty dims, and any extra property already given must be equal;
        the input is then completed in place. Otherwise the input is appended."""
        self._add_tensor("input", input, _INPUT_EXTRAS)

    def add_output(self, output: dict[str, Any]) -> None:
        """Declares an output; the same rules as :meth:`add_input`."""
        self._add_tensor("output", output, _OUTPUT_EXTRAS)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Sets ``model_transaction_policy`` (only ``decoupled`` may be given). Raises ValueError
        for another property, or if the configuration already sets ``decoupled`` differently."""
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{self._name}' contains property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name}', which is already set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted

    def _add_tensor(self, kind: str, tensor: dict[str, Any], extras: dict[str, Any]) -> None:
        """add_input / add_output: check the properties, then merge or append."""
        where = f"in auto-complete-config function for model '{self._name}'"
        if "name" not in tensor:
            raise ValueError(f"{kind} {where} is missing 'name' property.")
        name = tensor["name"]
        allowed = (*_REQUIRED, *extras)
        for key in tensor:
            if key not in allowed:
                listed = ", ".join(f"'{k}'" for k in allowed[:-1]) + f" and '{allowed[-1]}'"
                raise ValueError(f"{kind} '{name}' {where} contains property other than {listed}.")
        for key in _REQUIRED[1:]:
            if key not in tensor:
                raise ValueError(f"{kind} '{name}' {where} is missing '{key}' property.")
        dims = list(tensor["dims"])
        for current in self._model_config.setdefault(kind, []):
            if current.get("name") != name:
                continue
            self._check_agrees(kind, current, tensor, dims, extras)
            current["data_type"] = tensor["data_type"]
            current["dims"] = dims
            for key in extras:
                if key in tensor:
                    current[key] = tensor[key]
            return
        self._model_config[kind].append({**tensor, "dims": dims})

    def _check_agrees(
        self,
        kind: str,
        current: dict[str, Any],
        tensor: dict[str, Any],
        dims: list[int],
        extras: dict[str, Any],
    ) -> None:
        """Raises ValueError if ``tensor`` contradicts the configured ``current`` entry."""
        name = tensor["name"]
        configured_type = current.get("data_type", "TYPE_INVALID")
        if configured_type != "TYPE_INVALID" and configured_type != tensor["data_type"]:
            raise ValueError(
                f"unable to load model '{self._name}', configuration expects datatype "
                f"{configured_type} for {kind} '{name}', model provides {tensor['data_type']}"
            )
        configured_dims = list(current.get("dims") or [])
        if configured_dims and configured_dims != dims:
            raise ValueError(
                f"model '{self._name}', tensor '{name}': the model expects dims {dims} but the "
                f"model configuration specifies dims {configured_dims}"
            )
        for key, unset in extras.items():
            if key not in tensor or key not in current:
                continue
            configured = current[key]
            # Triton compares 'optional' whenever both sides give it (the configuration JSON always
            # does); stubhost's extra properties conflict only when the file set them.
            if key != "optional" and configured == unset:
                continue
            if configured != tensor[key]:
                raise ValueError(
                    f"model '{self._name}', tensor '{name}': the model expects {key} "
                    f"{tensor[key]} but the model configuration specifies {key} {configured}"
                )
