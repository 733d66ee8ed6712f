"""The data flow of an ensemble's steps, checked when its configuration is read, as Triton's
``ValidateEnsembleSchedulingConfig`` checks it (before any composing model is looked at): every
ensemble input is read by a step, every ensemble output is written by a step that can run from
the inputs, and every other ensemble tensor can be produced and is read. Messages are Triton's,
stray quote included."""

from __future__ import annotations

from typing import Any

from stubhost.config._check import Check
from stubhost.config.model_config_pb2 import ModelConfig


def check_ensemble_flow(cfg: ModelConfig, check: Check) -> None:
    """Raises ConfigError (Triton's text) for the first data-flow fault of the ensemble's steps."""
    name = check.model
    steps = cfg.ensemble_scheduling.step
    read = {tensor for step in steps for tensor in step.input_map.values()}
    producer = {tensor: step for step in steps for tensor in step.output_map.values()}
    inputs = [i.name for i in cfg.input]
    outputs = [o.name for o in cfg.output]
    for tensor in inputs:
        if tensor not in read and tensor not in producer:
            check.fail("input", f"ensemble input '{tensor}' for ensemble {name}' is not used")
    for tensor in outputs:
        if tensor not in read and tensor not in producer:
            check.fail("output", f"ensemble output '{tensor}' for ensemble {name}' is not used")
    ready = set(inputs)
    waiting = list(steps)
    progress = True
    while progress:  # a step runs once every tensor it reads is ready
        progress = False
        for step in list(waiting):
            if set(step.input_map.values()) <= ready:
                ready.update(step.output_map.values())
                waiting.remove(step)
                progress = True
    for tensor in outputs:
        if tensor not in ready:
            check.fail("output", f"output '{tensor}' for ensemble '{name}' is not written"
                                 f"{_unconnected(tensor, producer, ready)}")
    for tensor in sorted(read | set(producer)):
        if tensor not in ready or (tensor not in read and tensor not in outputs):
            check.fail("ensemble_scheduling", f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


def _unconnected(output: str, producer: dict[str, Any], ready: set[str]) -> str:
    """Triton's hint for an output that is not written: the tensor found by walking up, from the
    output, through the first input of each producing step that is not ready, until a tensor that
    nothing produces (or that a cycle leads back from)."""
    tensor, seen = output, {output}
    while (step := producer.get(tensor)) is not None:
        following = next((t for t in step.input_map.values() if t not in ready and t not in seen), None)
        if following is None:
            break
        seen.add(following)
        tensor = following
    return "" if tensor == output else f": at least one of its depending tensors, '{tensor}', is not connected"
