"""Loop-only metrics expose exactly what prometheus-client's Histogram and Counter would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from bkaio.bookie.loop_metrics import LoopCounter, LoopHistogram

BUCKETS = (0.001, 0.01, 0.1, 1.0)
VALUES = (0.0005, 0.001, 0.0011, 0.05, 0.1, 2.0, 7.5)  # Includes values equal to bounds.


def _exposition(registry: CollectorRegistry) -> list[str]:
    lines = generate_latest(registry).decode().splitlines()
    return sorted(line for line in lines if not line.startswith("#") and "_created" not in line)


def test_histogram_exposition_matches_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop_histogram = LoopHistogram("req_seconds", "help", ["op", "ok"], BUCKETS, ours)
    reference = Histogram("req_seconds", "help", ["op", "ok"], buckets=BUCKETS, registry=theirs)
    for value in VALUES:
        loop_histogram.labels(op="add", ok="true").observe(value)
        reference.labels(op="add", ok="true").observe(value)
    loop_histogram.labels("read", "false").observe(0.02)
    reference.labels("read", "false").observe(0.02)
    assert _exposition(ours) == _exposition(theirs)


def test_counter_exposition_matches_prometheus_client() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop_counter = LoopCounter("payload_bytes", "help", ours)
    reference = Counter("payload_bytes", "help", registry=theirs)
    for amount in (1024, 1, 0, 99):
        loop_counter.inc(amount)
        reference.inc(amount)
    assert _exposition(ours) == _exposition(theirs)
