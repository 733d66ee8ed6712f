"""The parent's store of custom metrics (``host/custom_metrics.py``) on its own: handles, reference
counts per owner, release of ended stubs, and refusal of whatever a stub should not send."""

from __future__ import annotations

from typing import Any

import pytest

from stubhost.host.custom_metrics import KIND_CONFLICT, CustomMetrics


class Owner:
    """Stands for a stub process: what it holds goes once it is dead."""

    def __init__(self) -> None:
        self.dead = False


def declare(store: CustomMetrics, owner: Owner, family_id: int, name: str, kind: str = "counter",
            description: str = "help") -> None:
    assert store.apply(owner, {"op": "family", "id": family_id, "name": name, "kind": kind,
                               "description": description}) == 0.0


def metric(store: CustomMetrics, owner: Owner, family_id: int, labels: dict[str, str] | None = None,
           buckets: list[float] | None = None) -> None:
    store.apply(owner, {"op": "metric", "family": family_id, "labels": labels or {}, "buckets": buckets or []})


def add(store: CustomMetrics, owner: Owner, family_id: int, value: float, labels: dict[str, str] | None = None
        ) -> None:
    store.apply(owner, {"op": "add", "family": family_id, "labels": labels or {}, "value": value})


def text(store: CustomMetrics) -> str:
    return "\n".join(store.render())


def test_a_series_stays_while_any_handle_holds_it_and_its_family_goes_with_the_last() -> None:
    store, a, b = CustomMetrics(), Owner(), Owner()
    declare(store, a, 1, "shared_total")
    declare(store, b, 7, "shared_total", description="another description")
    metric(store, a, 1, {"k": "x"})
    metric(store, b, 7, {"k": "x"})
    metric(store, a, 1, {"k": "a_only"})
    add(store, a, 1, 2, {"k": "x"})
    add(store, b, 7, 3, {"k": "x"})
    assert "# HELP shared_total help" in text(store)  # the first description stays
    assert 'shared_total{k="x"} 5' in text(store)
    store.apply(a, {"op": "drop", "family": 1})
    assert 'shared_total{k="x"} 5' in text(store)
    assert "a_only" not in text(store)
    store.apply(b, {"op": "drop", "family": 7})
    assert "shared_total" not in text(store)
    declare(store, a, 2, "shared_total", kind="gauge")  # nobody holds the name any more
    with pytest.raises(ValueError, match="unknown metric family id 1"):
        add(store, a, 1, 1, {"k": "x"})


def test_a_family_without_metrics_is_not_exported() -> None:
    store, a = CustomMetrics(), Owner()
    declare(store, a, 1, "empty_total")
    assert store.render() == []
    metric(store, a, 1)
    assert store.render() == ["# HELP empty_total help", "# TYPE empty_total counter", "empty_total 0"]


def test_a_dead_owner_releases_everything_it_held() -> None:
    store, a, b = CustomMetrics(), Owner(), Owner()
    for owner, family_id in ((a, 1), (b, 1)):  # ids are per owner
        declare(store, owner, family_id, "depth", kind="gauge")
        metric(store, owner, family_id, {"model": "m"})
    metric(store, a, 1, {"instance": "a"})
    store.apply(a, {"op": "set", "family": 1, "labels": {"model": "m"}, "value": 4})
    a.dead = True
    assert 'depth{model="m"} 4' in text(store)
    assert "instance" not in text(store)
    with pytest.raises(ValueError, match="gone"):  # what it still had queued
        add(store, a, 1, 1, {"model": "m"})
    b.dead = True
    assert store.render() == []
    c = Owner()
    declare(store, c, 1, "depth", kind="counter")  # the name is free again


def test_release_lets_go_at_once() -> None:
    store, a = CustomMetrics(), Owner()
    declare(store, a, 1, "x_total")
    metric(store, a, 1)
    store.release(a)
    assert store.render() == []


def test_the_same_labels_are_one_series_and_the_first_buckets_stay() -> None:
    store, a = CustomMetrics(), Owner()
    declare(store, a, 1, "lat", kind="histogram")
    declare(store, a, 2, "lat", kind="histogram")
    metric(store, a, 1, {"m": "x"}, buckets=[1.0, 2.0])
    metric(store, a, 2, {"m": "x"}, buckets=[5.0])
    store.apply(a, {"op": "observe", "family": 2, "labels": {"m": "x"}, "value": 1.5})
    assert 'lat_bucket{m="x",le="2"} 1' in text(store)
    assert 'le="5"' not in text(store)
    store.apply(a, {"op": "drop", "family": 1})
    assert 'lat_count{m="x"} 1' in text(store)


def test_another_kind_under_a_taken_name_is_refused_with_tritons_words() -> None:
    store, a, b = CustomMetrics(), Owner(), Owner()
    declare(store, a, 1, "taken")
    with pytest.raises(ValueError, match=KIND_CONFLICT):
        declare(store, b, 1, "taken", kind="gauge")
    with pytest.raises(ValueError, match="unknown metric family id"):  # the refused id was not kept
        metric(store, b, 1)


@pytest.mark.parametrize("update", [
    "not a dict",
    {"op": "family", "id": 0, "name": "x", "kind": "counter"},
    {"op": "family", "id": True, "name": "x", "kind": "counter"},
    {"op": "family", "id": 2**64, "name": "x", "kind": "counter"},
    {"op": "family", "id": 5, "name": "bad name", "kind": "counter"},
    {"op": "family", "id": 5, "name": "x", "kind": "summary"},
    {"op": "family", "id": 5, "name": "x", "kind": "counter", "description": 3},
    {"op": "family", "id": 1, "name": "x", "kind": "counter"},            # id 1 is in use
    {"op": "metric", "family": 99, "labels": {}},                         # not this owner's
    {"op": "metric", "family": 1, "labels": {"bad-key": "v"}},
    {"op": "metric", "family": 1, "labels": {"k": 3}},
    {"op": "metric", "family": 1, "labels": ["k"]},
    {"op": "metric", "family": 1, "labels": {}, "buckets": [1.0]},        # a counter has none
    {"op": "metric", "family": 2, "labels": {}, "buckets": [2.0, 1.0]},
    {"op": "metric", "family": 2, "labels": {}, "buckets": [1.0, float("inf")]},
    {"op": "metric", "family": 2, "labels": {}, "buckets": "1,2"},
    {"op": "add", "family": 1, "labels": {"never": "made"}, "value": 1},
    {"op": "add", "family": 1, "labels": {}, "value": -1},
    {"op": "add", "family": 1, "labels": {}, "value": float("nan")},
    {"op": "add", "family": 1, "labels": {}, "value": "1"},
    {"op": "set", "family": 1, "labels": {}, "value": 1},                 # a counter is not set
    {"op": "observe", "family": 1, "labels": {}, "value": 1},
    {"op": "value", "family": 2, "labels": {}},                           # a histogram has no value
    {"op": "drop", "family": 3},
    {"op": "bogus", "family": 1, "labels": {}},
])
def test_what_a_stub_should_not_send_is_refused_and_changes_nothing(update: Any) -> None:
    store, a = CustomMetrics(), Owner()
    declare(store, a, 1, "c_total")
    declare(store, a, 2, "h", kind="histogram")
    metric(store, a, 1)
    metric(store, a, 2, buckets=[1.0])
    before = store.render()
    with pytest.raises((ValueError, TypeError)):
        store.apply(a, update)
    assert store.render() == before


def test_help_and_label_values_cannot_inject_lines() -> None:
    store, a = CustomMetrics(), Owner()
    declare(store, a, 1, "g", kind="gauge", description='two\nlines \\ here')
    metric(store, a, 1, {"k": 'a"b\nc'})
    assert store.render() == ["# HELP g two\\nlines \\\\ here", "# TYPE g gauge", 'g{k="a\\"b\\nc"} 0']
