"""Bad arguments to the client API are an InvalidArgumentError naming them, raised before
anything is sent or stored: ledger ids (open, delete, metadata), entry ids (reads, tails),
timeouts, counts and quorum sizes. An int is an int here, not a bool, a float or a str.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from bkaio.errors import InvalidArgumentError
from bkaio.ledger_client.read_handle import ReadHandle
from tests.unit.ledger_client.cluster import FakeCluster, fake_cluster

BAD_IDS = [-1, 2**63, 2**64, "1", 1.5, math.nan, True, None]


def _requests(cluster: FakeCluster) -> tuple[int, int, int]:
    """What the fake bookies were asked so far (adds, range reads, entry reads)."""
    ops = cluster.ops
    return sum(ops.add_count.values()), len(ops.range_reads), ops.entry_reads


async def _reader(cluster: FakeCluster, entries: int = 3) -> ReadHandle:
    lh = await cluster.client.create_ledger(3, 2, 2)
    for i in range(entries):
        await lh.append(b"e%d" % i)
    return await cluster.client.open_ledger(lh.ledger_id, recovery=False)


@pytest.mark.parametrize("ledger_id", BAD_IDS)
async def test_a_bad_ledger_id_is_refused_by_open_delete_and_metadata(ledger_id: Any) -> None:
    """-1 and 2**63 used to reach an assert in the metadata layer, '1' a TypeError, 1.5 a
    ValueError of a format code (and the fake store here a NoSuchLedgerError)."""
    cluster = fake_cluster()
    client = cluster.client
    message = r"ledger id must be an int in \[0, 2\*\*63 - 1\]"
    with pytest.raises(InvalidArgumentError, match=message):
        await client.open_ledger(ledger_id)
    with pytest.raises(InvalidArgumentError, match=message):
        await client.open_ledger(ledger_id, recovery=False)
    with pytest.raises(InvalidArgumentError, match=message):
        await client.get_ledger_metadata(ledger_id)
    with pytest.raises(InvalidArgumentError, match=message):
        await client.delete_ledger(ledger_id)


@pytest.mark.parametrize("entry_id", BAD_IDS)
async def test_a_bad_entry_id_is_refused_by_every_read_before_any_request(entry_id: Any) -> None:
    """An id above 2**63 - 1 used to go out in a frame the bookie cannot decode (it then
    closes the connection, failing this client's other requests on it), one >= 2**64 to
    raise OverflowError from msgpack; a NaN made read() return []."""
    cluster = fake_cluster()
    reader = await _reader(cluster)
    before = _requests(cluster)
    message = r"entry id must be an int in \[0, 2\*\*63 - 1\]"
    with pytest.raises(InvalidArgumentError, match=message):
        await reader.wait_for_entry(entry_id, timeout=0.01)
    with pytest.raises(InvalidArgumentError, match=message):
        await reader.wait_for_entries(entry_id, timeout=0.01)
    with pytest.raises(InvalidArgumentError, match=message):
        await reader.read(entry_id, 1)
    with pytest.raises(InvalidArgumentError, match=message):
        await reader.read(0, entry_id)
    with pytest.raises(InvalidArgumentError, match=message):
        async for _ in reader.read_iter(entry_id, 2):
            pass
    with pytest.raises(InvalidArgumentError, match=message):
        async for _ in reader.read_batches(0, entry_id):
            pass
    assert _requests(cluster) == before
    assert [entry.entry_id for entry in await reader.read(0, 1)] == [0, 1]  # Still fine.


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -1, "1", True, 10**400])
async def test_a_tail_timeout_must_be_a_finite_number_of_seconds(seconds: Any) -> None:
    """wait_for_entry(10, timeout=nan) used to wait forever (no deadline ever passes)."""
    cluster = fake_cluster()
    reader = await _reader(cluster)
    async with asyncio.timeout(5):
        with pytest.raises(InvalidArgumentError, match=r"timeout=.* must be a finite number"):
            await reader.wait_for_entry(10, timeout=seconds)
    assert await reader.wait_for_entry(1, timeout=0) is not None  # 0: what is there now.


@pytest.mark.parametrize("count", [0, -1, 1.5, True, "2"])
async def test_entry_counts_must_be_ints_of_at_least_one(count: Any) -> None:
    cluster = fake_cluster()
    reader = await _reader(cluster)
    with pytest.raises(InvalidArgumentError, match=r"max_entries=.* must be an int >= 1"):
        await reader.wait_for_entries(0, max_entries=count)
    with pytest.raises(InvalidArgumentError, match=r"batch_entries=.* must be an int >= 1"):
        async for _ in reader.read_batches(0, 2, batch_entries=count):
            pass


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ((True, True, True), "ensemble_size=True must be an int >= 1"),
        (("3", 2, 2), "ensemble_size='3' must be an int >= 1"),
        ((3, 2.0, 2), r"write_quorum=2\.0 must be an int >= 1"),
        ((3, 2, False), "ack_quorum=False must be an int >= 1"),
        ((3, 2, 0), "ack_quorum=0 must be an int >= 1"),
        ((2, 3, 2), r"need ensemble_size \(2\) >= write_quorum \(3\)"),
    ],
)
async def test_quorum_sizes_are_ints_with_the_quorum_rules(
    sizes: tuple[Any, Any, Any], message: str
) -> None:
    """create_ledger(True, True, True) used to create a ledger, ("3", 2, 2) to raise a
    TypeError."""
    cluster = fake_cluster()
    with pytest.raises(InvalidArgumentError, match=message):
        await cluster.client.create_ledger(*sizes)
    assert cluster.store.records == {}


@pytest.mark.parametrize("password", ["secret", None, 7])
async def test_a_password_that_is_not_bytes_is_refused_before_the_metadata_is_asked(
    password: Any,
) -> None:
    """create_ledger took a ledger id from the metadata first and then failed with ConfigError
    from the master key; open_ledger read the metadata first, and without recovery on a ledger
    with no password accepted a str."""
    cluster = fake_cluster()
    asked: list[str] = []
    store = cluster.store
    real_next_id, real_get = store.next_id, store.get

    async def next_id() -> int:
        asked.append("next_id")
        return await real_next_id()

    async def get(ledger_id: int) -> Any:
        asked.append("get")
        return await real_get(ledger_id)

    store.next_id = next_id  # type: ignore[method-assign]
    store.get = get  # type: ignore[method-assign]
    with pytest.raises(InvalidArgumentError, match="password must be bytes, got"):
        await cluster.client.create_ledger(3, 2, 2, password=password)
    for recovery in (True, False):
        with pytest.raises(InvalidArgumentError, match="password must be bytes, got"):
            await cluster.client.open_ledger(1, password=password, recovery=recovery)
    assert asked == []
    assert store.records == {}
