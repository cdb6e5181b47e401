"""`process_*` metrics for a service made of several processes (a bookie and its shard workers,
a standalone): prometheus-client's process collector, once per process, labelled `process`.

Reads /proc only (in memory; no disk I/O), at scrape time. Imports nothing of bkaio.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.registry import Collector


class ProcessesCollector(Collector):
    """`process_*` (CPU, memory, open files, start time) of every process of a service, labelled
    `process` ("parent", "shard-0", ...), read from /proc by the parent at scrape time.

    prometheus-client's ProcessCollector reads one pid and labels nothing; this one runs it once
    per process and adds the label, so that the parent's /metrics covers its shard workers too
    without asking them (a stuck worker still shows its CPU and memory). A process that is gone
    is left out.
    """

    def __init__(self, processes: Callable[[], list[tuple[str, int]]]) -> None:
        self._processes = processes
        self._collectors: dict[int, ProcessCollector] = {}

    def _collector(self, pid: int) -> ProcessCollector:
        collector = self._collectors.get(pid)
        if collector is None:
            collector = ProcessCollector(pid=lambda: pid, registry=None)
            self._collectors[pid] = collector
        return collector

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        live: set[int] = set()
        for label, pid in self._processes():
            live.add(pid)
            for metric in self._collector(pid).collect():
                family = families.get(metric.name)
                if family is None:
                    family = Metric(metric.name, metric.documentation, metric.type)
                    families[metric.name] = family
                for sample in metric.samples:
                    labels = {**sample.labels, "process": label}
                    family.add_sample(sample.name, labels, sample.value)
        for pid in set(self._collectors) - live:  # Restarted workers have new pids.
            del self._collectors[pid]
        return list(families.values())
