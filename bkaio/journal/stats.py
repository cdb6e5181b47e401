"""`JournalStats`: one journal's counters, updated once per group on the loop thread and
exported by the bookie (`bkaio.bookie.metrics.JournalStatsCollector`)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Final

from bkaio.journal.writer import Group

# Group sizes are counted in power-of-two buckets: 1, 2, 4, ... up to this many records.
_GROUP_BUCKETS: Final = 16
# Upper bounds (seconds) of the write+sync latency buckets of group commits; one more bucket
# counts the slower ones. Exported as the histogram bkaio_journal_sync_latency_seconds.
SYNC_LATENCY_BUCKETS: Final = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip


@dataclass(slots=True)
class JournalStats:
    """Counters of one journal, updated once per group on the loop thread."""

    records: int = 0
    bytes_written: int = 0
    groups: int = 0
    syncs: int = 0
    rolls: int = 0
    # Why each group was handed to the writer (BookKeeper counts the same triggers).
    trigger_bytes: int = 0  # It reached max_group_bytes.
    trigger_entries: int = 0  # It reached max_group_entries.
    trigger_queue_empty: int = 0  # The writer was free (the usual case, no timer).
    trigger_wait: int = 0  # The adaptive wait ran out.
    holds: int = 0  # Groups that waited for the next append (`adaptive_wait_us`).
    holds_fruitless: int = 0  # Of those, the ones whose wait caught nothing.
    max_group_records: int = 0
    max_group_bytes: int = 0
    sync_seconds_total: float = 0.0
    max_sync_seconds: float = 0.0
    # group_records_histogram[i]: groups of 2**(i-1) < records <= 2**i (the last: any more).
    group_records_histogram: list[int] = field(default_factory=lambda: [0] * _GROUP_BUCKETS)
    # sync_latency_histogram[i]: groups whose write+sync took <= SYNC_LATENCY_BUCKETS[i] and
    # more than the bound before (the last: more than every bound).
    sync_latency_histogram: list[int] = field(
        default_factory=lambda: [0] * (len(SYNC_LATENCY_BUCKETS) + 1)
    )

    def count_group(self, group: Group, sync_seconds: float, *, synced: bool) -> None:
        records = len(group.ends)
        self.records += records
        self.bytes_written += len(group.data)
        self.groups += 1
        self.syncs += 1 if synced else 0
        self.rolls += 1 if group.new_file else 0
        self.max_group_records = max(self.max_group_records, records)
        self.max_group_bytes = max(self.max_group_bytes, len(group.data))
        self.sync_seconds_total += sync_seconds
        self.max_sync_seconds = max(self.max_sync_seconds, sync_seconds)
        bucket = min((records - 1).bit_length(), _GROUP_BUCKETS - 1)
        self.group_records_histogram[bucket] += 1
        self.sync_latency_histogram[bisect.bisect_left(SYNC_LATENCY_BUCKETS, sync_seconds)] += 1
