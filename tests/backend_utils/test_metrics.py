"""pb_utils.MetricFamily / Metric on the stub's side, against a recording sink: what they send,
when a family lets go (its object's deletion, not a Metric's), and Triton's errors."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from stubhost.backend_utils import metrics
from stubhost.backend_utils.errors import TritonModelException
from stubhost.backend_utils.metrics import FAMILY_DELETED, MetricFamily


class Sink:
    """Records one-way messages; answers round trips with 0.0 or refuses them with `refuse`."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.asked: list[dict[str, Any]] = []
        self.refuse: str | None = None

    def metric(self, payload: dict[str, Any]) -> None:
        self.sent.append(payload)

    def metric_value(self, payload: dict[str, Any]) -> float:
        self.asked.append(payload)
        if self.refuse:
            raise TritonModelException(self.refuse)
        return 0.0


@pytest.fixture
def sink() -> Iterator[Sink]:
    sink = Sink()
    metrics.set_sink(sink, "unit_0_0")
    yield sink
    metrics.set_sink(metrics._Unattached())


def ops(sink: Sink) -> list[str]:
    return [m["op"] for m in sink.sent]


def test_a_family_and_a_metric_are_round_trips_and_the_familys_deletion_lets_go_of_it(sink: Sink) -> None:
    family = MetricFamily("x_total", "help", MetricFamily.COUNTER)
    family_id = sink.asked[0]["id"]
    assert sink.asked == [{"op": "family", "id": family_id, "name": "x_total", "description": "help",
                           "kind": "counter"}]
    metric = family.Metric(labels={"k": "v"})
    assert sink.asked[1] == {"op": "metric", "family": family_id, "labels": {"k": "v"}, "buckets": []}
    metric.increment(2)
    del metric  # Triton's family keeps its metrics: nothing is sent
    assert ops(sink) == ["add"]
    del family
    gc.collect()
    assert sink.sent[-1] == {"op": "drop", "family": family_id}


def test_a_metric_does_not_keep_its_family_and_then_raises_tritons_error(sink: Sink) -> None:
    family = MetricFamily("g", "help", MetricFamily.GAUGE)
    metric = family.Metric()
    del family
    for call, action in ((lambda: metric.increment(1), "increment"), (lambda: metric.set(1), "set"),
                         (lambda: metric.observe(1), "observe"), (metric.value, "get")):
        with pytest.raises(TritonModelException) as e:
            call()
        assert str(e.value) == f"Failed to {action} metric value: {FAMILY_DELETED}"
    assert ops(sink) == ["drop"]


def test_a_refused_family_raises_tritons_wording_and_lets_nothing_go(sink: Sink) -> None:
    sink.refuse = "Family name already exists with different type"
    with pytest.raises(TritonModelException, match="^Error when creating MetricFamily: Failed to process the request "
                                                   "for model 'unit_0_0', message: Family name already exists "
                                                   "with different type$"):
        MetricFamily("taken", "help", MetricFamily.GAUGE)
    gc.collect()
    assert sink.sent == []


def test_a_refused_metric_raises_tritons_wording(sink: Sink) -> None:
    family = MetricFamily("h", "help", MetricFamily.GAUGE)
    sink.refuse = "unknown metric family id 7"
    with pytest.raises(TritonModelException, match="^Error when creating Metric: Failed to process the request for "
                                                   "model 'unit_0_0', message: unknown metric family id 7$"):
        family.Metric(labels={"k": "v"})


def test_value_refused_by_the_server_is_worded_as_triton_words_it(sink: Sink) -> None:
    metric = MetricFamily("v", "help", MetricFamily.GAUGE).Metric()  # the family goes at once...
    with pytest.raises(TritonModelException, match="^Failed to get metric value: Invalid metric operation"):
        metric.value()  # ...and the metric knows it
    family = MetricFamily("w", "help", MetricFamily.GAUGE)
    metric = family.Metric()
    sink.refuse = "the instance is gone"
    with pytest.raises(TritonModelException, match="^Failed to get metric value: Failed to process the request for "
                                                   "model 'unit_0_0', message: the instance is gone$"):
        metric.value()


def test_histogram_buckets_as_triton_takes_them(sink: Sink) -> None:
    family = MetricFamily("h", "help", MetricFamily.HISTOGRAM)
    family.Metric(buckets=[])  # only +Inf, as in Triton
    assert sink.asked[-1]["buckets"] == []
    for buckets, text in ((None, "^Failed to create metric. Missing required buckets.$"),
                          ([1.0, float("inf")], "finite"),
                          ([2.0, 1.0], "Bucket Boundaries must be strictly sorted$"),
                          ([1.0, 1.0], "Bucket Boundaries must be strictly sorted$")):
        with pytest.raises(TritonModelException, match=text):
            family.Metric(buckets=buckets)


def test_outside_a_stub_metrics_refuse_with_their_own_words() -> None:
    with pytest.raises(TritonModelException, match="^metrics are only available inside a model instance$"):
        MetricFamily("x", "help", MetricFamily.COUNTER)
