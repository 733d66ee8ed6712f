"""An ensemble's maps checked against its composing models as they are loaded, as Triton's
``ValidateEnsembleConfig`` checks them when the ensemble loads (``ensemble_utils.cc``): each
step's model allows the ensemble's batch size, its maps name its inputs and outputs, every input
it needs is mapped, each ensemble tensor has one data type and one shape wherever it is used, and
no step (nor the ensemble's outputs) mixes tensors that come from different decoupled steps.
Messages are Triton's; each failure is INVALID_ARG.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stubhost.config import ModelConfig
from stubhost.config.model_config_pb2 import DataType
from stubhost.host.errors import InferenceError
from stubhost.host.model_finder import ModelFinder


@dataclass(frozen=True)
class _Tensor:
    """What the first model that uses an ensemble tensor says of it."""

    data_type: int
    dims: tuple[int, ...]
    full_dims: tuple[int, ...]  # with the batch dimension (-1) when that model batches
    model: str

    @classmethod
    def of(cls, io: Any, batching: bool, model: str, reshape: bool = False) -> _Tensor:
        """An input or output of a model config; `reshape`: its reshape's shape counts (ensemble I/O)."""
        dims = tuple(io.reshape.shape) if reshape and io.HasField("reshape") else tuple(io.dims)
        return cls(io.data_type, dims, ((-1,) + dims) if batching else dims, model)


def _fail(message: str) -> InferenceError:
    return InferenceError("INVALID_ARG", message)


def _same_dims(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Triton's CompareDimsWithWildcard: equal rank, -1 matches anything."""
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


def _dims_text(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _agree(known: _Tensor, seen: _Tensor, prefix: str) -> None:
    """Triton's ValidateTensorConsistency: the same data type, and the same shape with or without
    the batch dimension."""
    if known.data_type != seen.data_type:
        raise _fail(f"{prefix}inconsistent data type: {DataType.Name(known.data_type)} is inferred from model "
                    f"{known.model} while {DataType.Name(seen.data_type)} is inferred from model {seen.model}")
    if not _same_dims(known.dims, seen.dims) and not _same_dims(known.full_dims, seen.full_dims):
        raise _fail(f"{prefix}inconsistent shape: {_dims_text(known.full_dims)} is inferred from model {known.model} "
                    f"while {_dims_text(seen.full_dims)} is inferred from model {seen.model}")


def check_wiring(name: str, cfg: ModelConfig, steps: Sequence[Any], lookup: ModelFinder) -> bool:
    """Checks the ensemble's steps (host.ensemble.EnsembleStep) against the loaded models `lookup`
    finds; returns whether a step is decoupled. Raises InferenceError (INVALID_ARG)."""
    batching = cfg.max_batch_size > 0
    tensors: dict[str, _Tensor] = {}
    for io in [*cfg.input, *cfg.output]:
        tensors.setdefault(io.name, _Tensor.of(io, batching, name, reshape=True))
    models = [lookup(step.model) for step in steps]
    missing = [step.model for step, model in zip(steps, models) if model is None]
    if missing:
        raise _fail(lookup.why_missing(name, missing))
    for step, model in zip(steps, models):
        config: ModelConfig = model.config
        if config.max_batch_size != 0 and config.max_batch_size < cfg.max_batch_size:
            raise _fail(f"ensemble {name} allows maximum batch size {cfg.max_batch_size}, but it contains model "
                        f"{step.model} which only allows maximum batch size to be {config.max_batch_size}")
        _check_step(name, step, config, tensors)
    _check_decoupled(name, cfg, steps, models, tensors)
    return any(bool(model.decoupled) for model in models)


def _check_step(name: str, step: Any, config: ModelConfig, tensors: dict[str, _Tensor]) -> None:
    """Triton's ValidateTensorMapping for one step."""
    batching = config.max_batch_size > 0
    inputs = {i.name: i for i in config.input}
    outputs = {o.name: o for o in config.output}
    for model_input, tensor in step.inputs.items():
        if model_input not in inputs:
            raise _fail(f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing input "
                        f"{model_input} in model {step.model}")
    for model_input, io in inputs.items():
        tensor = step.inputs.get(model_input)
        if tensor is None:
            if io.optional:
                continue
            raise _fail(f"in ensemble {name}, input {model_input} in model {step.model} is not mapped to any "
                        "ensemble tensors")
        _register(name, tensor, _Tensor.of(io, batching, step.model), tensors)
    for model_output, tensor in step.outputs.items():
        if model_output not in outputs:
            raise _fail(f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing output "
                        f"{model_output} in model {step.model}")
    for model_output, io in outputs.items():
        tensor = step.outputs.get(model_output)
        if tensor is not None:
            _register(name, tensor, _Tensor.of(io, batching, step.model), tensors)


def _register(name: str, tensor: str, seen: _Tensor, tensors: dict[str, _Tensor]) -> None:
    known = tensors.setdefault(tensor, seen)
    if known is not seen:
        _agree(known, seen, f"in ensemble {name}, ensemble tensor {tensor}: ")


def _check_decoupled(name: str, cfg: ModelConfig, steps: Sequence[Any], models: Sequence[Any],
                     tensors: dict[str, _Tensor]) -> None:
    """Each tensor carries where its data comes from: the ensemble's inputs (0) or one decoupled
    step (each of its outputs gets that step's label); a step that is not decoupled passes on the
    label of its inputs, which must agree, and so must the ensemble's outputs (Triton's walk)."""
    labels = {i.name: 0 for i in cfg.input}
    pending = list(zip(steps, models))
    fresh = 0
    while pending:
        runnable = [(s, m) for s, m in pending if all(t in labels for t in s.inputs.values())]
        if not runnable:
            return  # what cannot run was refused with the data flow (config.ensemble_flow)
        for step, model in runnable:
            pending.remove((step, model))
            found = {labels[t] for t in step.inputs.values()}
            if len(found) > 1:
                first = next(iter(step.outputs.values()), None)
                raise _fail(f"in ensemble {name}, step of model '{tensors[first].model if first else step.model}' "
                            "receives inputs originated from different decoupled models")
            if model.decoupled:
                fresh += 1
            label = fresh if model.decoupled else next(iter(found), 0)
            for tensor in step.outputs.values():
                labels[tensor] = label
    if len({labels.get(o.name, 0) for o in cfg.output}) > 1:
        raise _fail(f"in ensemble {name}, step of model '{name}' receives inputs originated from different "
                    "decoupled models")
