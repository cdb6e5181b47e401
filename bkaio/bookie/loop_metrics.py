"""Histograms and counters updated only from one event loop: no lock, no Python bucket loop.

prometheus-client's `Histogram.observe` walks its buckets in Python and takes a lock for every
increment, and `Counter.inc` takes a lock: together about 2 µs per add, a measurable share of
a bookie's per-entry CPU. A shard worker touches its request metrics only from its event-loop
thread, so these keep plain lists and ints (`bisect` finds the bucket in C) and turn them into
ordinary metric families when the registry is collected. The exposition is the same as a
prometheus-client Histogram/Counter of the same name and labels.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString


class LoopHistogramChild:
    """One label set of a `LoopHistogram`: bucket counts, sum and count."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # The last slot is +Inf.
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bound's bucket (le is <=).
        self.counts[bisect_left(self._bounds, value)] += 1
        self.sum += value

    def observe_many(self, value: float, count: int) -> None:
        """`observe(value)` `count` times (a batch of requests that took as long)."""
        self.counts[bisect_left(self._bounds, value)] += count
        self.sum += value * count


class LoopHistogram(Collector):
    """A histogram with fixed label names whose children are created up front."""

    def __init__(
        self,
        name: str,
        documentation: str,
        label_names: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.label_names = tuple(label_names)
        self.bounds = tuple(float(b) for b in buckets)
        assert list(self.bounds) == sorted(set(self.bounds)), "buckets must increase"
        self._children: dict[tuple[str, ...], LoopHistogramChild] = {}
        registry.register(self)

    def labels(self, *values: str, **by_name: str) -> LoopHistogramChild:
        key = values or tuple(by_name[name] for name in self.label_names)
        assert len(key) == len(self.label_names), key
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = LoopHistogramChild(self.bounds)
        return child

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.label_names)
        edges = [str(floatToGoString(b)) for b in self.bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        for key, child in self._children.items():
            cumulative, buckets = 0, []
            for edge, count in zip(edges, child.counts, strict=True):
                cumulative += count
                buckets.append((edge, float(cumulative)))
            family.add_metric(list(key), buckets, child.sum)
        yield family

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.label_names)


class LoopCounter(Collector):
    """A counter without labels; `inc` is one integer addition."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.value = 0
        registry.register(self)

    def inc(self, amount: int = 1) -> None:
        assert amount >= 0, amount  # Counters only go up.
        self.value += amount

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation, value=self.value)

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation)
