"""The sequence control inputs of a rescheduled request, on the stub's side.

The parent adds the control tensors (``sequence_batching { control_input [...] }``) to each
request it sends (``host/sequence_controls.py``). A request the model reschedules
(``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``) never goes back to the parent: the stub runs it
again itself. Triton's iterative sequencer re-enqueues such a request with its flags cleared,
so from its second run on its START and END controls read false; this module makes them so.
READY stays true and CORRID keeps the request's id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from stubhost.backend_utils.request import InferenceRequest
from stubhost.backend_utils.tensor import Tensor

_CLEARED_KINDS = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END")
_VALUE_FIELDS = ("int32_false_true", "fp32_false_true", "bool_false_true")


def cleared_controls(config: Mapping[str, Any]) -> dict[str, Any]:
    """The START and END control inputs of a model config (Triton's JSON form), by tensor name,
    each with its false value. Empty for a model without them."""
    cleared: dict[str, Any] = {}
    for control_input in (config.get("sequence_batching") or {}).get("control_input") or []:
        for control in control_input.get("control") or []:
            if control.get("kind") not in _CLEARED_KINDS:
                continue
            for field in _VALUE_FIELDS:
                values = control.get(field)
                if values:
                    cleared[control_input["name"]] = values[0]
                    break
    return cleared


def clear_start_and_end(request: InferenceRequest, cleared: Mapping[str, Any]) -> None:
    """Gives a rescheduled request its START and END controls with their false values (same
    name, shape and dtype as the tensors the parent sent)."""
    if not cleared:
        return
    inputs = []
    for tensor in request._inputs:
        false = cleared.get(tensor.name())
        if false is not None and tensor.is_cpu():
            current = tensor.as_numpy()
            tensor = Tensor(tensor.name(), np.full(current.shape, false, current.dtype))
        inputs.append(tensor)
    request._inputs = inputs
