"""Class labels of a model's outputs, for the classification extension.

An output's ``label_filename`` names a text file in the model's folder with one label per line:
line i labels class index i. Labels are read once, when the model loads; a file that cannot be
read fails the load, as in Triton. The file must lie inside the model's folder: a configuration
sent with a load request cannot make the server read (and hand out) any other file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from stubhost.config import ConfigError, ModelConfig


class LabelFileError(Exception):
    """A label file that cannot be read, worded as Triton words it (its model fails to load)."""


class OutputClasses(NamedTuple):
    """What classifying a model's outputs needs: whether their first dimension is the batch,
    and the labels of each output that has a label file."""

    batched: bool
    labels: Mapping[str, tuple[str, ...]]


def read_output_classes(model_dir: Path, config: ModelConfig, source: str) -> OutputClasses:
    """The labels named by `config`'s outputs, read from `model_dir`; ConfigError (naming
    `source` and the output) for a file outside the model's folder, LabelFileError for one that
    cannot be read."""
    labels: dict[str, tuple[str, ...]] = {}
    for output in config.output:
        if not output.label_filename:
            continue
        field = f"output '{output.name}': label_filename"
        path = (model_dir / output.label_filename).resolve()
        if not path.is_relative_to(model_dir.resolve()):
            raise ConfigError(source, f"'{output.label_filename}' is outside the model's folder", field=field)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise LabelFileError(f"failed to open text file for read {path}: {reason}") from None
        labels[output.name] = tuple(text.splitlines())
    return OutputClasses(config.max_batch_size > 0, labels)
