"""Write path review: defects found in the ledger client's add path and its connections, each
with the test that showed it."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from bkaio.errors import BKError, BookieUnavailableError, LedgerClosedError
from bkaio.ledger_client.connections import BookiePool
from bkaio.ledger_client.types import ClientConfig
from bkaio.meta.bookies import BookieInfo
from tests.unit.ledger_client.cluster import fake_cluster


class _Listener(asyncio.Protocol):
    """A port that counts the connections it accepts and closes each at once."""

    def __init__(self, accepted: list[str], name: str) -> None:
        self._accepted = accepted
        self._name = name

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._accepted.append(self._name)
        transport.close()


async def test_a_bookie_registered_at_a_new_address_is_reconnected_there() -> None:
    """A bookie restarted elsewhere under the same id (bookie.bookie_id set, its host or port
    changed) is reached at the address it registers now: the connection kept dialling the
    address it was created with, so this client never reached that bookie again."""
    loop = asyncio.get_running_loop()
    accepted: list[str] = []
    old = await loop.create_server(lambda: _Listener(accepted, "old"), "127.0.0.1", 0)
    new = await loop.create_server(lambda: _Listener(accepted, "new"), "127.0.0.1", 0)
    old_port = old.sockets[0].getsockname()[1]
    new_port = new.sockets[0].getsockname()[1]
    known = {"bookie-1": BookieInfo(bookie_id="bookie-1", host="127.0.0.1", port=old_port)}
    config = ClientConfig(reconnect_backoff_min=0.001, reconnect_backoff_max=0.002)
    pool = BookiePool(config, known.get)
    try:
        with contextlib.suppress(BookieUnavailableError):  # The listener hangs up.
            await pool.read_lac("bookie-1", 7)
        assert set(accepted) == {"old"}  # (Twice: a close before HELLO is diagnosed.)
        old.close()
        await old.wait_closed()
        # The registry now says where the bookie is (the watch's `set_bookies`).
        known["bookie-1"] = BookieInfo(bookie_id="bookie-1", host="127.0.0.1", port=new_port)
        for _attempt in range(200):  # Past the reconnect backoff, whatever the machine's pace.
            with contextlib.suppress(BookieUnavailableError):
                await pool.read_lac("bookie-1", 7)
            if "new" in accepted:
                break
            await asyncio.sleep(0.005)
        assert "new" in accepted
    finally:
        await pool.close()
        new.close()
        await new.wait_closed()


async def test_waiting_for_capacity_behind_a_cancelled_append_does_not_spin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The caller cancelled the oldest append's future (`asyncio.wait_for(lh.append(x), t)`
    timing out does): the add goes on, so `wait_for_capacity` waits for it to leave the queue.
    It awaited that done future again and again, a busy loop for as long as the add took (up
    to `add_timeout`, then an ensemble change)."""
    cluster = fake_cluster(3, max_outstanding_adds=2)
    lh = await cluster.client.create_ledger(3, 3, 2)
    for bookie_id in cluster.ops.bookies:
        cluster.ops.hold(bookie_id)
    first = lh.append(b"a")
    second = lh.append(b"b")
    first.cancel()
    waits = 0
    real_wait = asyncio.wait

    async def counted_wait(*args: Any, **kwargs: Any) -> Any:
        nonlocal waits
        waits += 1
        return await real_wait(*args, **kwargs)

    monkeypatch.setattr(asyncio, "wait", counted_wait)
    capacity = asyncio.ensure_future(lh.wait_for_capacity())
    for _ in range(50):  # Loop iterations, not time: a spin awaits on every one of them.
        await asyncio.sleep(0)
    assert not capacity.done()
    assert waits <= 1, waits
    monkeypatch.undo()
    for bookie_id in list(cluster.ops.held):
        cluster.ops.release(bookie_id)
    await asyncio.wait_for(capacity, 5)
    assert await second == 1
    await lh.close()


async def test_a_closed_pool_makes_no_new_connection() -> None:
    """A request after `BookiePool.close` (a handle still writing or reading after its client
    closed) fails at once: it opened a new connection, kept in a pool already closed, so
    nothing ever closed it."""
    loop = asyncio.get_running_loop()
    accepted: list[str] = []
    server = await loop.create_server(lambda: _Listener(accepted, "b"), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    known = {"bookie-1": BookieInfo(bookie_id="bookie-1", host="127.0.0.1", port=port)}
    pool = BookiePool(ClientConfig(), known.get)
    await pool.close()
    answers: list[BKError | None] = []
    pool.add_entry(
        "bookie-1", 7, 0, recovery=False, master_key=b"k" * 32, lac=-1, length=1, digest=0,
        payload=b"x", callback=answers.append,
    )  # fmt: skip
    with pytest.raises(BookieUnavailableError, match="client is closed"):
        await pool.read_lac("bookie-1", 7)
    with pytest.raises(BookieUnavailableError, match="client is closed"):
        await pool.read_entries("bookie-1", 7, 0, 0, max_count=1, max_bytes=1)
    await asyncio.sleep(0)
    assert len(answers) == 1 and isinstance(answers[0], BookieUnavailableError)
    assert "client is closed" in str(answers[0])
    assert pool._connections == {}
    server.close()
    await server.wait_closed()
    assert accepted == []


async def test_closing_the_client_stops_its_open_writers_without_ensemble_changes() -> None:
    """`BookKeeper.close` with an add in flight: the add fails naming the closed client, and
    nothing is written to the metadata after it. The connections' close failed the add like a
    dead bookie, so the writer changed its ensemble (a metadata write through a closing
    connection), tried every bookie, and told NotEnoughBookiesError ("bookies ... down")."""
    cluster = fake_cluster(4)
    ops = cluster.ops
    lh = await cluster.client.create_ledger(2, 2, 2)
    assert await lh.append(b"a") == 0
    for bookie_id in ops.bookies:
        ops.hold(bookie_id)
    in_flight = lh.append(b"b")
    updates = cluster.store.updates

    async def close() -> None:  # As the wire pool's: requests in flight fail, later ones too.
        ops.closed = True
        ops.down.update(ops.bookies)
        for bookie_id in list(ops.held):
            ops.release(bookie_id)

    ops.close = close  # type: ignore[method-assign]
    await cluster.client.close()
    with pytest.raises(LedgerClosedError, match="client is closed"):
        await asyncio.wait_for(in_flight, 5)
    with pytest.raises(LedgerClosedError, match="client is closed"):
        lh.append(b"c")
    for _ in range(20):  # Loop iterations in which an ensemble change would have run.
        await asyncio.sleep(0)
    assert cluster.store.updates == updates
    assert len(lh.metadata.ensembles) == 1
    assert lh.last_add_confirmed == 0
