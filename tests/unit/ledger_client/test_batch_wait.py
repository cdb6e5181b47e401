"""The adaptive batching wait of a ledger handle (`ClientConfig.add_batch_wait_us`).

A burst (two appends or more in one loop iteration) waits for the next append, so that the next
burst leaves in the same batch per bookie; a lone append never waits; a wait that caught nothing
pauses waiting. Waits that must not run out are an hour long, so no assertion depends on how
fast the box runs.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from bkaio.errors import ConfigError
from bkaio.ledger_client.bookkeeper import BookKeeper
from bkaio.ledger_client.types import ClientConfig
from tests.unit.ledger_client.fakes import FakeBookie, FakeBookieOps, FakeLedgerStore

PASSWORD = b"batch-wait"
HOUR_US = 3_600_000_000


def _client(wait_us: int, **options: Any) -> tuple[BookKeeper, FakeBookieOps]:
    ids = [f"127.0.0.1:{3181 + 10 * i}" for i in range(3)]
    ops = FakeBookieOps([FakeBookie(bookie_id) for bookie_id in ids])
    config = ClientConfig(add_timeout=5.0, read_timeout=5.0, add_batch_wait_us=wait_us, **options)
    client = BookKeeper(ledgers=FakeLedgerStore(), ops=ops, config=config, rng=random.Random(1))
    client.set_bookies([ops.info(bookie_id) for bookie_id in ids])
    return client, ops


@pytest.fixture
def hour_long_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bkaio.ledger_client.types.MAX_ADD_BATCH_WAIT_US", HOUR_US)


async def _iterations(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def _batches_per_bookie(ops: FakeBookieOps) -> dict[str, list[list[int]]]:
    per_bookie: dict[str, list[list[int]]] = {}
    for bookie, entry_ids, _ in ops.batches:
        per_bookie.setdefault(bookie, []).append(entry_ids)
    return per_bookie


@pytest.mark.usefixtures("hour_long_waits")
async def test_a_burst_waits_for_the_next_append_and_leaves_with_it() -> None:
    client, ops = _client(HOUR_US)
    handle = await client.create_ledger(3, 3, 2, password=PASSWORD)
    first = [handle.append(b"a%d" % i) for i in range(3)]
    await _iterations()
    assert ops.batches == []  # Waiting for more.
    second = [handle.append(b"b%d" % i) for i in range(2)]
    assert await asyncio.gather(*first, *second) == list(range(5))
    per_bookie = _batches_per_bookie(ops)
    assert len(per_bookie) == 3
    assert all(batches == [[0, 1, 2, 3, 4]] for batches in per_bookie.values())
    await handle.close()


@pytest.mark.usefixtures("hour_long_waits")
async def test_a_lone_append_never_waits() -> None:
    """A serial writer (or one append per loop iteration) must not wait for an append that
    only its own answer would bring."""
    client, ops = _client(HOUR_US)
    handle = await client.create_ledger(3, 3, 2, password=PASSWORD)
    for entry_id in range(3):
        assert await handle.append(b"x") == entry_id
    assert all(batches == [[0], [1], [2]] for batches in _batches_per_bookie(ops).values())
    await handle.close()


@pytest.mark.usefixtures("hour_long_waits")
async def test_close_sends_a_waiting_burst() -> None:
    client, ops = _client(HOUR_US)
    handle = await client.create_ledger(3, 3, 2, password=PASSWORD)
    futures = [handle.append(b"c%d" % i) for i in range(4)]
    await _iterations()
    assert ops.batches == []
    await handle.close()
    assert await asyncio.gather(*futures) == list(range(4))
    assert handle.last_add_confirmed == 3


@pytest.mark.usefixtures("hour_long_waits")
async def test_a_waiting_burst_carries_the_lac_its_acks_moved_instead_of_a_write_lac() -> None:
    """`explicit_lac_on_ack`: when acknowledgements move the LAC while a burst waits for
    company, the burst leaves at once carrying that LAC (digest recomputed), and no WRITE_LAC
    goes beside it."""
    client, ops = _client(HOUR_US, explicit_lac_on_ack=True, explicit_lac_interval=0)
    write_lacs: list[int] = []

    async def record_write_lac(bookie_id: str, ledger_id: int, key: bytes, lac: int) -> None:
        write_lacs.append(lac)

    ops.write_lac = record_write_lac  # type: ignore[method-assign,assignment]
    handle = await client.create_ledger(3, 3, 2, password=PASSWORD)
    bookies = handle.metadata.ensembles[0][1]
    for bookie_id in bookies:
        ops.hold(bookie_id)  # The first burst's acknowledgements wait.
    first = [handle.append(b"a%d" % i) for i in range(2)]
    await _iterations()
    first.append(handle.append(b"a2"))  # Joins the waiting burst: the three leave.
    await _iterations()
    second = [handle.append(b"b%d" % i) for i in range(2)]  # Waits for company ...
    await _iterations()
    assert all(len(batches) == 1 for batches in _batches_per_bookie(ops).values())
    for bookie_id in bookies:
        ops.release(bookie_id)  # ... until the first burst's acks move the LAC to 2.
    assert await asyncio.gather(*first, *second) == [0, 1, 2, 3, 4]
    assert all(batches == [[0, 1, 2], [3, 4]] for batches in _batches_per_bookie(ops).values())
    stored = ops.bookies[bookies[0]].ledgers[handle.ledger_id].entries
    assert [stored[entry_id].lac for entry_id in (3, 4)] == [2, 2]
    assert write_lacs == []
    await handle.close()
    data = await (await client.open_ledger(handle.ledger_id, password=PASSWORD)).read(0, 4)
    assert [entry.payload for entry in data] == [b"a0", b"a1", b"a2", b"b0", b"b1"]


async def test_a_wait_that_catches_nothing_sends_and_pauses_waiting() -> None:
    client, ops = _client(1000)
    handle = await client.create_ledger(3, 3, 2, password=PASSWORD)
    assert await asyncio.gather(*(handle.append(b"d") for _ in range(2))) == [0, 1]  # Timed out.
    later = [handle.append(b"e") for _ in range(2)]
    await _iterations()
    # Waiting is paused: the second burst left at once (it did not wait for the timer).
    assert all(len(batches) == 2 for batches in _batches_per_bookie(ops).values())
    assert await asyncio.gather(*later) == [2, 3]
    await handle.close()


def test_the_wait_is_bounded() -> None:
    with pytest.raises(ConfigError, match="add_batch_wait_us"):
        ClientConfig(add_batch_wait_us=20_000)
    with pytest.raises(ConfigError, match="add_batch_wait_us"):
        ClientConfig(add_batch_wait_us=-1)
