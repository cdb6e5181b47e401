"""DATA_UNKNOWN from a bookie in limbo is no answer: recovery neither takes it as absence nor
as presence; it fails retryably while too few others answer, and never seals short."""

from __future__ import annotations

import pytest

from bkaio.errors import BookieUnavailableError, DataUnknownError
from bkaio.ledger_client.errors import LedgerRecoveryError
from bkaio.meta.ledger_metadata import LedgerState
from tests.unit.ledger_client.cluster import FakeCluster
from tests.unit.ledger_client.cluster import fake_cluster as _fake_cluster


def fake_cluster(bookies: int) -> FakeCluster:
    """No explicit-LAC timer: the writer is left open for recovery, and its timer's WRITE_LAC
    (0.1 s later, so only on a slow run) would hand the wiped b2 LAC 3; recovery would then
    seal at 3 without the re-write these tests look at."""
    return _fake_cluster(bookies, explicit_lac_interval=0)


async def _ledger_acked_by_b1_b2_only(cluster: object) -> tuple[int, str, str, str]:
    """E3 Qw3 Qa2: entries 0..2 on all three, entry 3 on b1 and b2 only."""
    lh = await cluster.client.create_ledger(3, 3, 2, password=b"pw")  # type: ignore[attr-defined]
    for payload in (b"a", b"b", b"c", b"d"):
        await lh.append(payload)
    b0, b1, b2 = lh.metadata.ensembles[0][1]
    del cluster.bookie(b0).ledgers[lh.ledger_id].entries[3]  # type: ignore[attr-defined]
    return lh.ledger_id, b0, b1, b2


async def test_recovery_fails_retryably_instead_of_sealing_short() -> None:
    cluster = fake_cluster(3)
    ledger_id, _b0, b1, b2 = await _ledger_acked_by_b1_b2_only(cluster)
    cluster.bookie(b2).reformat()  # Entry 3 is gone from b2 too; it knows it may be.
    cluster.ops.down.add(b1)
    recoverer = cluster.second_client()
    for _ in range(2):
        with pytest.raises(LedgerRecoveryError, match="entry 3") as raised:
            await recoverer.open_ledger(ledger_id, b"pw", recovery=True)
        assert raised.value.retriable
    assert cluster.store.records[ledger_id].state is LedgerState.IN_RECOVERY
    cluster.ops.down.clear()  # b1 is back: it holds entry 3.
    handle = await recoverer.open_ledger(ledger_id, b"pw", recovery=True)
    assert handle.is_closed and handle.last_entry_id == 3
    assert [e.payload for e in await handle.read(0, 3)] == [b"a", b"b", b"c", b"d"]
    assert 3 in cluster.bookie(b2).ledgers[ledger_id].entries  # Re-written by recovery.


async def test_a_read_does_not_take_data_unknown_for_absence() -> None:
    cluster = fake_cluster(3)
    ledger_id, b0, b1, b2 = await _ledger_acked_by_b1_b2_only(cluster)
    del cluster.bookie(b0).ledgers[ledger_id].entries[1]  # Within the LAC a reader sees.
    cluster.bookie(b2).reformat()
    cluster.ops.down.add(b1)
    reader = await cluster.second_client().open_ledger(ledger_id, b"pw", recovery=False)
    with pytest.raises(BookieUnavailableError, match="too few bookies answered"):
        await reader.read(1, 1)  # b0 "no", b2 "unknown": undecided, not "no such entry".
    with pytest.raises(DataUnknownError):
        await cluster.ops.read_entry(b2, ledger_id, 0)
    assert (await reader.read(0, 0))[0].payload == b"a"  # b0 still has it.


async def test_an_unreadable_last_add_confirmed_entry_fails_recovery_retryably() -> None:
    """When the fenced LAC itself is the entry nobody can serve (b0 learnt LAC 3 but lacks
    entry 3, b1 is down, b2 in limbo), the attempt fails as a recovery error, retryably."""
    cluster = fake_cluster(3)
    ledger_id, b0, b1, b2 = await _ledger_acked_by_b1_b2_only(cluster)
    cluster.bookie(b0).ledgers[ledger_id].explicit_lac = 3
    cluster.bookie(b2).reformat()
    cluster.ops.down.add(b1)
    recoverer = cluster.second_client()
    with pytest.raises(LedgerRecoveryError, match="entry 3") as raised:
        await recoverer.open_ledger(ledger_id, b"pw", recovery=True)
    assert raised.value.retriable
    assert cluster.store.records[ledger_id].state is LedgerState.IN_RECOVERY
    cluster.ops.down.clear()
    handle = await recoverer.open_ledger(ledger_id, b"pw", recovery=True)
    assert handle.is_closed and handle.last_entry_id == 3
