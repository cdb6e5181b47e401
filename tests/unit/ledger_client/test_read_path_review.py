"""The read path against bookies that misbehave in ways the other read tests do not cover: a
range answer that holds an entry past where it says it stopped looking (an older bookie's
READ_RANGE with a gap, or a wrong READ_ENTRY answer, as the pool packs them), a bookie dying
after answering part of a range, a closed ledger whose last segment is empty, and a tailing
reader across a recovery by another client."""

from __future__ import annotations

from typing import Any

import pytest

from bkaio.ledger_client.types import EntriesAnswer
from bkaio.protocol.records import scan_records
from tests.unit.ledger_client.cluster import fake_cluster
from tests.unit.ledger_client.test_range_reads import closed_ledger, payloads


@pytest.mark.parametrize(("ensemble", "qw"), [(3, 3), (5, 2)])
async def test_an_answer_with_a_gap_below_an_entry_past_its_end_misplaces_nothing(
    ensemble: int, qw: int
) -> None:
    # An older bookie's READ_RANGE that skips a missing entry (the protocol says it stops
    # there), or a READ_ENTRY of a stride answered with the wrong entry, reach the reader as
    # records holding entry first + 2 * stride with `next_entry_id` first + 2 * stride
    # (`BookiePool._read_entries_by_older_ops` counts the entries it got). Entry first +
    # stride must not be delivered with the payload of the one after it.
    cluster = fake_cluster(5, read_batch_entries=100)
    ledger_id = await closed_ledger(cluster, 20, ensemble, qw)
    rh = await cluster.client.open_ledger(ledger_id)
    genuine = cluster.ops.read_entries
    bent: list[str] = []

    async def with_a_gap(
        bookie_id: str, ledger: int, first: int, last: int, **options: Any
    ) -> EntriesAnswer:
        answer = await genuine(bookie_id, ledger, first, last, **options)
        stride = options.get("stride", 1)
        if bent or first != 0:
            return answer
        scan = scan_records(answer.records, ledger, first, stride, last)
        # Entries first and first + 2 * stride, as the older path packs two entries.
        records = answer.records
        kept = records[: scan.offsets[1]] + records[scan.offsets[2] : scan.offsets[3]]
        bent.append(bookie_id)
        return EntriesAnswer(answer.lac, first + 2 * stride, kept)

    cluster.ops.read_entries = with_a_gap  # type: ignore[method-assign,assignment]
    assert [e.payload for e in await rh.read(0, 19)] == payloads(20)
    assert bent
