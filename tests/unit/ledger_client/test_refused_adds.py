"""An entry no bookie takes is no bookie's fault: `append` refuses a payload above the client's
entry limit (max_frame_bytes - 4096) before it takes an entry id; an add one bookie refuses for
what it is (BAD_REQUEST: above its own, smaller max_entry_bytes) replaces that bookie, as a
failed add does, and a second bookie refusing the same entry fails the handle clearly instead
of replacing healthy bookies one after the other.
"""

from __future__ import annotations

import asyncio

import pytest

from bkaio.errors import InvalidArgumentError, ProtocolError
from bkaio.ledger_client.errors import RequestRefusedError
from bkaio.meta.ledger_metadata import LedgerMetadata, LedgerState
from bkaio.protocol.codes import FRAME_ENVELOPE_BYTES
from tests.unit.ledger_client.cluster import FakeCluster, fake_cluster

LIMIT = 1000  # Payload bytes the fake bookies take, as their server.max_entry_bytes.


def _bookies_refusing_large_adds(cluster: FakeCluster) -> None:
    for bookie_id in cluster.ops.bookies:
        cluster.ops.max_entry_bytes[bookie_id] = LIMIT


async def test_an_append_above_the_entry_limit_is_refused_and_the_handle_goes_on() -> None:
    """Client limit = bookies' limit (the defaults' relation): the oversized append raises
    InvalidArgumentError without an entry id; earlier and later appends are unaffected, the
    ensemble is unchanged and the ledger seals with every other entry."""
    cluster = fake_cluster(5, max_frame_bytes=LIMIT + FRAME_ENVELOPE_BYTES)
    _bookies_refusing_large_adds(cluster)
    assert cluster.client.config.max_entry_bytes == LIMIT
    lh = await cluster.client.create_ledger(3, 3, 2)
    first = lh.append(b"a")
    with pytest.raises(
        InvalidArgumentError, match=f"1001 bytes is above the entry limit of {LIMIT}"
    ):
        lh.append(b"x" * (LIMIT + 1))
    with pytest.raises(InvalidArgumentError, match="above the entry limit"):
        lh.append(bytearray(LIMIT + 1))  # type: ignore[arg-type]  # Bytes-like: copied, checked.
    assert lh.last_add_pushed == 0
    assert list(await asyncio.gather(first, lh.append(b"b" * LIMIT), lh.append(b"c"))) == [0, 1, 2]
    await lh.close()
    md = cluster.store.records[lh.ledger_id]
    assert (md.state, md.last_entry_id, len(md.ensembles)) == (LedgerState.CLOSED, 2, 1)
    assert md.length == 1 + LIMIT + 1


async def test_an_entry_every_bookie_refuses_fails_the_handle_after_one_change_at_most() -> None:
    """Bookies whose max_entry_bytes is below the client's limit answer BAD_REQUEST: the first
    to refuse is replaced like a failed bookie, a second one refusing the same entry shows the
    entry itself is refused, and the handle fails with a RequestRefusedError (a ProtocolError)
    naming both; close() seals the ledger at its LAC. (It used to replace one healthy bookie
    after the other until NotEnoughBookiesError.)"""
    cluster = fake_cluster(5)
    _bookies_refusing_large_adds(cluster)
    lh = await cluster.client.create_ledger(3, 3, 2)
    ensemble = list(lh.metadata.ensembles[0][1])
    assert await lh.append(b"a") == 0
    big, after = lh.append(b"x" * (LIMIT + 1)), lh.append(b"b")
    for future in (big, after):
        with pytest.raises(RequestRefusedError, match="refused entry 1 itself") as caught:
            await future
        assert isinstance(caught.value, ProtocolError)
        assert "BAD_REQUEST" in str(caught.value) and "max_entry_bytes" in str(caught.value)
    with pytest.raises(RequestRefusedError):
        lh.append(b"c")
    await lh.close()
    md = cluster.store.records[lh.ledger_id]
    assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, 0, 1)
    assert _segments(md)[0] == (0, ensemble) and len(md.ensembles) <= 2


async def test_one_bookie_with_a_smaller_limit_is_replaced_and_the_handle_goes_on() -> None:
    """Only one bookie of the write set refuses (its max_entry_bytes is smaller than the
    others', as during a rolling change of it): it is replaced like a failed bookie, as
    BookKeeper's client does, and the entry completes on its replacement."""
    cluster = fake_cluster(4)
    lh = await cluster.client.create_ledger(3, 3, 3)
    ensemble = list(lh.metadata.ensembles[0][1])
    cluster.ops.max_entry_bytes[ensemble[0]] = LIMIT
    assert await lh.append(b"x" * LIMIT) == 0
    assert await lh.append(b"x" * (LIMIT + 1)) == 1
    assert await lh.append(b"y") == 2
    await lh.close()
    md = cluster.store.records[lh.ledger_id]
    assert (md.state, md.last_entry_id) == (LedgerState.CLOSED, 2)
    (_, first), (start, second) = _segments(md)
    assert first == ensemble and start == 1 and ensemble[0] not in second


async def test_a_refusal_after_the_ack_quorum_keeps_the_entry_and_replaces_the_bookie() -> None:
    """The entry completed on Qa bookies before the third refused it: it stays acknowledged,
    and the refusing bookie is replaced before later entries depend on it (BookKeeper's
    delayed write failure); the handle goes on."""
    cluster = fake_cluster(4)
    lh = await cluster.client.create_ledger(3, 3, 2)
    ensemble = list(lh.metadata.ensembles[0][1])
    cluster.ops.max_entry_bytes[ensemble[0]] = LIMIT
    cluster.ops.hold(ensemble[0])
    assert await lh.append(b"x" * (LIMIT + 1)) == 0
    cluster.ops.release(ensemble[0])
    assert await lh.append(b"y") == 1
    await lh.close()
    md = cluster.store.records[lh.ledger_id]
    assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, 1, LIMIT + 2)
    assert ensemble[0] not in _segments(md)[-1][1]


def _segments(md: LedgerMetadata) -> list[tuple[int, list[str]]]:
    return [(start, list(bookies)) for start, bookies in md.ensembles]
