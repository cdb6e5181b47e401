"""The journal counts each group commit's write+sync time in fixed buckets (exported by the
bookie as the histogram bkaio_journal_sync_latency_seconds)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from bkaio.bookie.metrics import JournalStatsCollector
from bkaio.journal import JournalStats
from bkaio.journal.stats import SYNC_LATENCY_BUCKETS


def _group() -> Any:
    return SimpleNamespace(ends=[10], data=b"x" * 10, new_file=False)


def test_sync_times_land_in_their_buckets_and_are_exported_cumulatively() -> None:
    stats = JournalStats()
    for seconds in (0.0001, 0.0005, 0.003, 0.003, 7.0):
        stats.count_group(_group(), seconds, synced=True)
    histogram = stats.sync_latency_histogram
    assert len(histogram) == len(SYNC_LATENCY_BUCKETS) + 1 and sum(histogram) == 5
    assert histogram[0] == 2  # 0.1 ms and exactly 0.5 ms: "<= 0.0005".
    assert histogram[SYNC_LATENCY_BUCKETS.index(0.005)] == 2
    assert histogram[-1] == 1  # Slower than every bound.

    other = JournalStats()
    other.count_group(_group(), 0.003, synced=True)
    [family] = [
        f
        for f in JournalStatsCollector(lambda: [stats, other]).collect()
        if f.name == "bkaio_journal_sync_latency_seconds"
    ]
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    assert buckets["0.0005"] == 2 and buckets["0.005"] == 5 and buckets["+Inf"] == 6
    total = next(s.value for s in family.samples if s.name.endswith("_sum"))
    assert abs(total - (0.0001 + 0.0005 + 0.003 * 3 + 7.0)) < 1e-9
