"""Prometheus families of several registries shown as one page, each family once.

A registry's samples become plain JSON-able data (`snapshot_registry`: what a bookie's shard
worker sends its parent over the control pipe); `merge_snapshots` sums the same series across
snapshots, so a family present in several registries (`bkaio_task_failures_total` in a
service's own registry and in the process's default one) is rendered once, with every series.
`BkaioOnly` is the `bkaio_*` part of a registry (the default one also holds `process_*` and
`gc_*`); `MergedRegistries` is a collector over registries merged that way at scrape time (the
page of `bkaio autorecovery`). Imports nothing of bkaio.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

SnapshotFamily = dict[str, Any]  # {"name", "type", "help", "samples": [[name, labels, value]]}


def snapshot_registry(registries: Sequence[Any]) -> list[SnapshotFamily]:
    """Every sample of `registries` as JSON-able data (what a worker sends to the parent)."""
    families: list[SnapshotFamily] = []
    for registry in registries:
        for metric in registry.collect():
            families.append(
                {
                    "name": metric.name,
                    "type": metric.type,
                    "help": metric.documentation,
                    "samples": [
                        [sample.name, dict(sample.labels), float(sample.value)]
                        for sample in metric.samples
                        if not sample.name.endswith("_created")
                    ],
                }
            )
    return families


def merge_snapshots(snapshots: Iterable[list[SnapshotFamily]]) -> list[Metric]:
    """Sum the same series across snapshots (and across families of one name within one);
    families keep their type and help text (the first seen)."""
    merged: dict[str, tuple[str, str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
    for families in snapshots:
        for family in families:
            name = str(family["name"])
            if name not in merged:
                merged[name] = (str(family["type"]), str(family["help"]), {})
            series = merged[name][2]
            for sample_name, labels, value in family["samples"]:
                key = (str(sample_name), tuple(sorted((str(k), str(v)) for k, v in labels.items())))
                series[key] = series.get(key, 0.0) + float(value)
    metrics: list[Metric] = []
    for name, (metric_type, help_text, series) in merged.items():
        metric = Metric(name, help_text, metric_type)
        for (sample_name, labels), value in sorted(series.items(), key=_sample_order):
            metric.add_sample(sample_name, dict(labels), value)
        metrics.append(metric)
    return metrics


def _sample_order(item: tuple[tuple[str, tuple[tuple[str, str], ...]], float]) -> tuple[Any, ...]:
    """Histogram buckets in ascending `le` order (Prometheus requires it), others by name."""
    (sample_name, labels), _ = item
    rest = tuple((k, v) for k, v in labels if k != "le")
    le = next((float(v) for k, v in labels if k == "le"), 0.0)
    return (rest, sample_name, le)


class BkaioOnly:
    """The bkaio_* families of a registry (the default one also holds process_* and gc_*)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Any:
        return [m for m in self._registry.collect() if m.name.startswith("bkaio_")]


class MergedRegistries(Collector):
    """The families of several registries (or collectors), merged at each scrape: a family in
    more than one appears once, its series summed."""

    def __init__(self, registries: Sequence[Any]) -> None:
        self._registries = list(registries)

    def collect(self) -> Iterable[Metric]:
        return merge_snapshots([snapshot_registry(self._registries)])
