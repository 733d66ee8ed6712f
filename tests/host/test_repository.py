"""Repository scanning: models are visible subfolders, versions are positive-integer subfolders,
and the model file path honours default_model_filename without escaping the version folder."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from stubhost.config import ConfigError, parse_config_text
from stubhost.host.repository import ModelDir, RepositoryNotFoundError, model_file, scan_repository


def _tree(root: Path, paths: list[str]) -> None:
    """Creates folders (ending in '/') and empty files under root."""
    for p in paths:
        target = root / p
        if p.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("")


def test_scan_finds_models_configs_and_versions(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        [
            "add_sub/config.pbtxt",
            "add_sub/1/model.py",
            "add_sub/3/model.py",
            "add_sub/10/model.py",
            "no_config/2/model.py",
            "no_versions/config.pbtxt",
            ".hidden/1/model.py",
            "README.md",
        ],
    )
    models = scan_repository(tmp_path)
    assert list(models) == ["add_sub", "no_config", "no_versions"]
    assert models["add_sub"] == ModelDir(
        name="add_sub", path=tmp_path / "add_sub", config_path=tmp_path / "add_sub/config.pbtxt", versions=(1, 3, 10)
    )
    assert models["no_config"].config_path is None
    assert models["no_config"].versions == (2,)
    assert models["no_versions"].versions == ()


def test_only_positive_integer_folders_are_versions(tmp_path: Path) -> None:
    _tree(
        tmp_path,
        [
            "m/1/",
            "m/007/",  # leading zeros: ignored, as Triton ignores them
            "m/0/",
            "m/-1/",
            "m/1abc/",
            "m/warmup/",
            "m/initial_state/",
            "m/２/",  # a non-ASCII digit
            "m/5",  # a file, not a folder
            "m/12/",
        ],
    )
    assert scan_repository(tmp_path)["m"].versions == (1, 12)


def test_symlinked_model_folders_count(tmp_path: Path) -> None:
    _tree(tmp_path, ["real/m/1/model.py"])
    repo = tmp_path / "repo"
    repo.mkdir()
    os.symlink(tmp_path / "real" / "m", repo / "m")
    assert scan_repository(repo)["m"].versions == (1,)


def test_config_pbtxt_that_is_a_folder_is_not_a_config(tmp_path: Path) -> None:
    _tree(tmp_path, ["m/config.pbtxt/", "m/1/"])
    assert scan_repository(tmp_path)["m"].config_path is None


def test_missing_repository_is_a_file_not_found_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(RepositoryNotFoundError) as info:
        scan_repository(missing)
    assert isinstance(info.value, FileNotFoundError)
    assert str(info.value) == f"model repository '{missing}' does not exist"


def test_a_file_is_not_a_repository(tmp_path: Path) -> None:
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(FileNotFoundError, match=r"is not a directory$"):
        scan_repository(str(f))


def test_model_dir_is_frozen(tmp_path: Path) -> None:
    _tree(tmp_path, ["m/1/"])
    m = scan_repository(tmp_path)["m"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.name = "x"  # type: ignore[misc]


def _model(tmp_path: Path) -> ModelDir:
    _tree(tmp_path, ["m/config.pbtxt", "m/2/model.py"])
    return scan_repository(tmp_path)["m"]


def test_model_file_defaults_to_model_py(tmp_path: Path) -> None:
    m = _model(tmp_path)
    assert model_file(m, 2, parse_config_text('name: "m"', "c")) == tmp_path / "m/2/model.py"


def test_model_file_honours_default_model_filename(tmp_path: Path) -> None:
    m = _model(tmp_path)
    cfg = parse_config_text('name: "m" default_model_filename: "entry.py"', "c")
    assert model_file(m, 7, cfg) == tmp_path / "m/7/entry.py"


@pytest.mark.parametrize("name", ["../model.py", "sub/model.py", "/etc/passwd", "..", ".", "a\\b.py"])
def test_model_file_refuses_names_that_leave_the_version_folder(tmp_path: Path, name: str) -> None:
    m = _model(tmp_path)
    cfg = parse_config_text(f'name: "m" default_model_filename: "{name.replace(chr(92), chr(92) * 2)}"', "c")
    with pytest.raises(ConfigError) as info:
        model_file(m, 2, cfg)
    assert str(info.value) == (
        f"{tmp_path / 'm/config.pbtxt'}: default_model_filename: '{name}' is not a plain file name; "
        "the model file must lie in the version folder"
    )


def test_model_file_refuses_non_positive_versions(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^model 'm': version must be a positive integer, got 0$"):
        model_file(_model(tmp_path), 0, parse_config_text("", "c"))
