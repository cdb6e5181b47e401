"""minPartitions halves the largest partition until there are that many: the work that takes
grows with the partitions made, not with their square (minPartitions=10000 kept the planner
busy for minutes, recounting every partition's entries before each halving). Counted in
evaluations of ReadRange.entry_count, not timed."""

from __future__ import annotations

import itertools

import pytest

from bkaio.spark.planner import ReadRange, plan_partitions

WANTED = 2000


def test_min_partitions_costs_work_in_proportion_to_the_partitions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    counted = 0

    def counting(self: ReadRange) -> int:
        nonlocal counted
        counted += 1
        return self.last_entry_id - self.first_entry_id + 1

    monkeypatch.setattr(ReadRange, "entry_count", property(counting))
    ranges = [ReadRange("ns/s", 7, 0, 999_999, 0), ReadRange("ns/s", 8, 0, 499_999, 1_000_000)]
    partitions = plan_partitions(
        ranges, max_entries=10_000_000, max_bytes=1 << 40, min_partitions=WANTED
    )
    monkeypatch.undo()
    assert counted < 20 * WANTED  # Was about WANTED ** 2 / 2.
    assert len(partitions) == WANTED
    pieces = [r for p in partitions for r in p]
    assert [(r.first_seq, r.entry_count) for r in pieces] == sorted(
        (r.first_seq, r.entry_count) for r in pieces
    )  # In seq order,
    assert sum(r.entry_count for r in pieces) == 1_500_000  # every entry once (no overlap:
    assert all(  # each piece starts where the previous one ended),
        b.first_seq == a.first_seq + a.entry_count for a, b in itertools.pairwise(pieces)
    )
    sizes = [sum(r.entry_count for r in p) for p in partitions]
    assert max(sizes) - min(sizes) <= max(sizes) // 2 + 1  # and about even.
