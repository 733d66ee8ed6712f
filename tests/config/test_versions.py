"""Version selection: latest N (default 1), all, specific; ascending; only versions present."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stubhost.config import parse_config_text, select_versions
from stubhost.config.model_config_pb2 import ModelConfig


def _policy(text: str) -> ModelConfig:
    return parse_config_text(f'name: "m" {text}', "m/config.pbtxt")


@pytest.mark.parametrize(
    ("policy", "available", "expected"),
    [
        ("", [3, 1, 2], [3]),
        ("version_policy: { latest: { num_versions: 2 } }", [1, 5, 3], [3, 5]),
        ("version_policy: { latest: { num_versions: 9 } }", [2, 1], [1, 2]),
        ("version_policy: { latest: { } }", [1, 2], [2]),
        ("version_policy: { all: { } }", [4, 1, 2], [1, 2, 4]),
        ("version_policy: { specific: { versions: [ 4, 1, 7 ] } }", [1, 2, 3, 4], [1, 4]),
        ("version_policy: { specific: { versions: [ 7 ] } }", [1, 2], []),
        ("", [], []),
        ("version_policy: { all: { } }", [2, 2, 1], [1, 2]),
    ],
)
def test_select_versions(policy: str, available: list[int], expected: list[int]) -> None:
    assert select_versions(_policy(policy), available) == expected


version_sets = st.lists(st.integers(1, 10_000), max_size=30)


@given(version_sets, st.integers(1, 40))
def test_latest_takes_the_highest_n_ascending(available: list[int], n: int) -> None:
    cfg = _policy(f"version_policy: {{ latest: {{ num_versions: {n} }} }}")
    assert select_versions(cfg, available) == sorted(set(available))[-n:]


@given(version_sets, st.lists(st.integers(1, 10_000), max_size=10))
def test_specific_is_the_ascending_intersection(available: list[int], wanted: list[int]) -> None:
    cfg = ModelConfig()
    cfg.version_policy.specific.versions.extend(wanted)
    assert select_versions(cfg, available) == sorted(set(available) & set(wanted))


@given(version_sets)
def test_all_is_every_version_once_ascending(available: list[int]) -> None:
    cfg = ModelConfig()
    cfg.version_policy.all.SetInParent()
    assert select_versions(cfg, available) == sorted(set(available))
